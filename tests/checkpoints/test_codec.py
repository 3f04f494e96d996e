"""The codec: stored JSON parses as the standard library would parse it, and MACs keep their bytes."""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import random
import struct
import threading
import zlib
from datetime import UTC, datetime, timedelta, timezone
from typing import Any
from uuid import UUID

import orjson
import pytest
import zstandard
from django.conf import settings
from django.test import override_settings
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from checkpoints import storage
from checkpoints.models import Checkpoint, CheckpointStatus, Thread
from checkpoints.storage import codec, crypto, dictionaries
from quicksave_agents.models import Agent


def test_an_integer_beyond_64_bits_parses_exactly() -> None:
    text = b'{"big":123456789012345678901234567890,"deep":[{"neg":-98765432109876543210}],"u64":18446744073709551615}'
    assert isinstance(orjson.loads(text)["big"], float)  # what the fallback is for: orjson rounds it

    expected = {"big": 123456789012345678901234567890, "deep": [{"neg": -98765432109876543210}], "u64": 2**64 - 1}
    assert codec.loads(text) == expected
    assert codec.loads(memoryview(text)) == expected
    assert type(codec.loads(b"[1e19]")[0]) is float  # a float written that large stays a float


def test_floats_parse_to_the_same_doubles_as_the_standard_library() -> None:
    text = b"[0.1,-0.0,1e-320,2.2250738585072014e-308,1.7976931348623157e308,123456789.123456789,5e-324]"
    assert codec.loads(text) == json.loads(text)
    assert [math.copysign(1, x) for x in codec.loads(text)] == [math.copysign(1, x) for x in json.loads(text)]


def test_a_lone_surrogate_escape_parses_as_the_standard_library_parses_it() -> None:
    assert codec.loads(b'["\\ud800"]') == ["\ud800"]


def test_invalid_json_still_fails_as_the_standard_library_fails() -> None:
    with pytest.raises(json.JSONDecodeError):
        codec.loads(b'{"a": }')


def test_a_state_with_integers_beyond_64_bits_survives_a_cold_read(thread: Thread) -> None:
    first = storage.append_checkpoint(thread=thread, parent=None, state={"ledger": [2**80, -(2**70)], "pad": "x" * 300})
    second = storage.append_checkpoint(
        thread=thread, parent=first, patch=[{"op": "add", "path": "/ledger/-", "value": 2**65 + 1}]
    )
    storage.clear_caches()

    assert storage.state_at(second)["ledger"] == [2**80, -(2**70), 2**65 + 1]


def _reference_mac(**kwargs: Any) -> bytes:
    """The MAC as first written (hmac.new fed piece by piece): rows stored then must still verify."""
    key = hashlib.sha256(b"quicksave-integrity:" + settings.QUICKSAVE_INTEGRITY_KEY.encode()).digest()
    mac = hmac.new(key, digestmod=hashlib.sha256)
    mac.update(kwargs["parent_integrity"] or b"\x00" * 32)
    parent_id = kwargs["parent_id"]
    mac.update(
        kwargs["checkpoint_id"].bytes + kwargs["thread_id"].bytes + (parent_id.bytes if parent_id else b"\x00" * 16)
    )
    mac.update(struct.pack(">qqB", kwargs["branch_id"], kwargs["seq"], kwargs["kind"]))
    fields = json.dumps(kwargs["fields"], sort_keys=True, separators=(",", ":"), default=str).encode()
    mac.update(struct.pack(">I", len(fields)) + fields)
    mac.update(kwargs["payload"])
    return mac.digest()


def _mac_arguments(parent: UUID | None) -> dict[str, Any]:
    return {
        "parent_integrity": b"\x01" * 32 if parent else None, "checkpoint_id": UUID(int=1), "thread_id": UUID(int=2),
        "branch_id": 3, "parent_id": parent, "seq": 4, "kind": 1, "payload": b"\x01payload",
        "fields": {"step": 4, "label": "café", "metadata": {"k": [1, 2.5, None]}, "seed": 2**70, "id": UUID(int=9)},
    }  # fmt: skip


@pytest.mark.parametrize("parent", [None, UUID(int=7)])
def test_a_version_1_integrity_mac_covers_the_same_bytes_as_before(parent: UUID | None) -> None:
    arguments = _mac_arguments(parent)
    assert codec.legacy_integrity_mac(**arguments) == _reference_mac(**arguments)
    created_at = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    assert codec.integrity_matches(_reference_mac(**arguments), **arguments, created_at=created_at)


@pytest.mark.parametrize("parent", [None, UUID(int=7)])
def test_a_version_2_integrity_mac_covers_created_at_to_the_microsecond(parent: UUID | None) -> None:
    arguments = _mac_arguments(parent)
    created_at = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    mac = codec.integrity_mac(**arguments, created_at=created_at)

    assert codec.integrity_matches(mac, **arguments, created_at=created_at)
    assert codec.integrity_matches(mac, **arguments, created_at=created_at.astimezone(timezone(timedelta(hours=5))))
    assert not codec.integrity_matches(mac, **arguments, created_at=created_at - timedelta(microseconds=1))
    assert not codec.integrity_matches(mac, **arguments, created_at=created_at - timedelta(days=3))
    # Neither version verifies as the other.
    assert mac != codec.legacy_integrity_mac(**arguments)


# The characters where json and orjson could part: quotes, escapes, controls, DEL, non-ASCII.
field_text = st.text(st.sampled_from('a"\\/\x00\x1f\x7f\né€') | st.characters(exclude_categories=["Cs"]), max_size=6)
field_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False) | field_text,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(field_text, children, max_size=3),
    max_leaves=8,
)  # fmt: skip


@hypothesis_settings(max_examples=300, deadline=None, database=None)
@given(fields=st.dictionaries(field_text, field_values, max_size=5), status=st.sampled_from(list(CheckpointStatus)))
def test_the_macs_fields_encode_to_the_standard_librarys_bytes(fields: dict[str, Any], status: str) -> None:
    # Stored MACs were made over json's bytes; the fast path must not change a single one.
    for value in (fields, {**fields, "status": status}, {**fields, "status": str(status)}):
        assert codec._fields_json(value) == codec._FIELDS_ENCODER.encode(value).encode()


def test_payloads_worth_compressing_are_zstd_frames_with_a_dictionary_and_tiny_ones_raw() -> None:
    words = " ".join(f"word{i % 997} and some more text" for i in range(5000)).encode()
    tiny, delta, snapshot = words[: codec.COMPRESS_FROM - 1], words[:1200], words
    assert codec.encode(tiny) == codec.RAW + tiny
    for payload, tag in ((delta, codec.ZSTD_DICT + bytes([dictionaries.CURRENT])), (snapshot, codec.ZSTD)):
        framed = codec.encode(payload)
        assert framed.startswith(tag) and len(framed) < len(payload) // 2
        assert codec.unframe(framed) == payload
    assert len(snapshot) >= codec.DICTIONARY_BELOW  # large values: zstd's own parameters for their size
    incompressible = random.Random(1).randbytes(512)
    assert codec.encode(incompressible) == codec.RAW + incompressible


def test_a_short_chat_message_delta_compresses_with_the_dictionary_and_a_long_one_by_more() -> None:
    short = b'[{"op":"add","path":"/items/-","value":{"content":"Book me a ferry to Hydra","role":"user"}}]'
    text = " ".join(f"word{i % 97}" for i in range(150))
    long = (
        b'[{"op":"add","path":"/items/-","value":{"content":[{"annotations":[],"logprobs":[],"text":"'
        + text.encode()
        + b'","type":"output_text"}],"id":"msg_1","role":"assistant","status":"completed","type":"message"}}]'
    )
    plain = zstandard.ZstdCompressor(level=codec.ZSTD_LEVEL)
    assert len(codec.encode(short)) < len(short) * 2 // 3  # a plain zstd frame was larger than the delta
    assert len(codec.encode(long)) + 60 < len(plain.compress(long))
    assert [codec.unframe(codec.encode(value)) for value in (short, long)] == [short, long]


def test_a_plain_zstd_frame_of_any_size_opens() -> None:
    """Payloads written before the dictionary frames were plain zstd frames, as large ones are."""
    value = b'{"text":"' + b"an older delta " * 40 + b'"}'
    assert codec.unframe(codec.ZSTD + zstandard.ZstdCompressor(level=3).compress(value)) == value


def test_a_frame_naming_an_unknown_dictionary_is_refused_as_a_bad_value() -> None:
    framed = codec.encode(b'{"text":"' + b"a delta " * 40 + b'"}')
    with pytest.raises(ValueError, match="no known dictionary"):
        codec.unframe(framed[:1] + b"\xff" + framed[2:])


def test_a_stored_zlib_frame_of_any_size_still_opens() -> None:
    """Payloads written before zstd were zlib frames (level 6, and level 1 from 64 KiB)."""
    large = b'{"text":"' + b"older snapshot " * 10_000 + b'"}'
    assert codec.unframe(codec.ZLIB + zlib.compress(large, 1)) == large


def test_a_corrupt_zstd_frame_is_refused_as_a_bad_value() -> None:
    framed = codec.encode(b"x" * 1000)
    with pytest.raises(ValueError, match="corrupt zstd payload"):
        codec.unframe(framed[:-8] + b"\x00" * 8)


@pytest.mark.parametrize("encrypted", [False, True], ids=["plain", "sealed"])
def test_a_large_state_is_stored_as_zstd_and_reads_back_cold(agent: Agent, encrypted: bool) -> None:
    """A plain zstd frame must not be mistaken for a sealed value (crypto.SEALED is 0x02)."""
    with override_settings(QUICKSAVE_ENCRYPT=encrypted):
        thread, _ = storage.create_thread(agent=agent)
    state = {"notes": [f"note {i}: the ferry leaves the harbour at dawn" for i in range(4000)]}
    first = storage.append_checkpoint(thread=thread, parent=None, state=state)
    stored = bytes(Checkpoint.objects.values_list("payload", flat=True).get(pk=first.pk))
    assert stored[:1] == (bytes([crypto.SEALED]) if encrypted else codec.ZSTD)
    storage.clear_caches()
    crypto.forget_keys()

    assert storage.state_at(first) == state


def test_frames_written_on_threads_that_come_one_after_another_share_one_compressor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # LangGraph starts new executor threads for every run: a zstd context per thread would be
    # made for nearly every checkpoint.
    made: list[zstandard.ZstdCompressor] = []
    make = zstandard.ZstdCompressor

    def counted(**kwargs: Any) -> zstandard.ZstdCompressor:
        made.append(compressor := make(**kwargs))
        return compressor

    monkeypatch.setattr(zstandard, "ZstdCompressor", counted)
    payload = b"a checkpoint's delta, long enough to compress. " * 20
    frames: list[bytes] = []
    for _ in range(4):
        thread = threading.Thread(target=lambda: frames.append(codec.encode(payload)))
        thread.start()
        thread.join()

    assert [codec.unframe(frame) for frame in frames] == [payload] * 4
    assert frames[0].startswith(codec.ZSTD_DICT)
    assert len(made) <= 1  # none when an earlier test left one free
