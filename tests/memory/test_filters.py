"""Filter tokens: keyed digests of (field path, value), the same whichever way they are computed."""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

import pytest
from django.conf import settings

from checkpoints.storage import codec
from memory import filters


def hmac_token(path: tuple[Any, ...], value: Any) -> int:
    """A token as memory.filters defines it, spelled out with the standard library: the first 8
    bytes of HMAC-SHA256, keyed for the filter domain, of [path, value] as canonical JSON."""
    key = hashlib.sha256(b"quicksave-memory-filter-v1:" + settings.QUICKSAVE_INTEGRITY_KEY.encode()).digest()
    message = json.dumps([list(path), value], sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    return int.from_bytes(hmac.digest(key, message, "sha256")[:8], "big", signed=True)


@pytest.mark.parametrize(
    "value",
    ["red", "café ☕ \x7f \u2028", "", 0, -7, 2**63 - 1, 2**70, True, False, None, {"b": 1, "a": [1, "x"]}, [3, 2]],
)
def test_a_token_is_the_keyed_digest_of_its_path_and_value(value: Any) -> None:
    assert filters.token(("owner", "name"), value) == hmac_token(("owner", "name"), value)


def test_a_whole_number_is_one_token_whether_written_as_an_integer_or_a_float() -> None:
    assert filters.token(("n",), 3.0) == filters.token(("n",), 3) == hmac_token(("n",), 3)
    assert filters.token(("n",), 2.5) == hmac_token(("n",), 2.5)


def test_a_value_s_tokens_are_its_fields_down_to_the_token_depth_masked_by_namespace() -> None:
    where = {"city": "Oslo", "deep": {"x": 1}}
    owner = {"name": "al", "where": where}
    value = {"kind": "note", "n": 3, "owner": owner}
    mask = filters.namespace_mask(17)
    expected = {
        hmac_token(path, part) ^ mask
        for path, part in [
            (("kind",), "note"), (("n",), 3), (("owner",), owner), (("owner", "name"), "al"),
            (("owner", "where"), where), (("owner", "where", "city"), "Oslo"),
            (("owner", "where", "deep"), {"x": 1}),
        ]
    }  # fmt: skip
    assert filters.value_tokens(value, 17) == sorted(expected)
    assert filters.value_tokens({}, 17) == []
    assert filters.value_tokens(["not", "an", "object"], 17) == []


def test_keyed_digests_are_hmac_sha256_under_the_domain_s_key() -> None:
    key = hashlib.sha256(b"some-domain:" + settings.QUICKSAVE_INTEGRITY_KEY.encode()).digest()
    messages = [b"", b"x" * 200, bytes(range(256))]
    expected = [hmac.digest(key, message, "sha256") for message in messages]
    assert [codec.keyed_digest(b"some-domain:", message) for message in messages] == expected
    assert codec.keyed_digests(b"some-domain:", messages) == expected
