"""Snapshots in chunks: a large snapshot shares the chunks of its thread's earlier snapshots, reads
back as the state it holds (across forks and compaction), and a chunk altered outside Quicksave
fails the read."""

from __future__ import annotations

import random
import zlib
from typing import Any

import pytest
from django.db import connection
from django.test import override_settings

from checkpoints import compaction, storage
from checkpoints.models import Checkpoint, PayloadKind, SnapshotChunk, Thread, ThreadStatus
from checkpoints.storage import chunks, codec, crypto, garbage
from checkpoints.storage.errors import IntegrityFailure
from checkpoints.storage.payloads import chunk_digests
from quicksave_agents.models import Agent

WORDS = ("the", "a", "trip", "to", "rome", "flight", "hotel", "booked", "seat", "window", "aisle", "price", "euro",
         "late", "early", "gate", "change", "review")  # fmt: skip


def answer(rng: random.Random) -> dict[str, Any]:
    """A chat answer of some 1,000 characters of varied words (compressible as prose is, not more)."""
    text = " ".join(rng.choice(WORDS) + str(rng.randrange(100)) for _ in range(130))
    return {"content": [{"text": text, "type": "output_text"}], "role": "assistant", "type": "message"}


def chat(
    thread: Thread, turns: int, *, parent: Checkpoint | None = None, branch: str | None = None, seed: int = 1
) -> list[Checkpoint]:
    """`turns` checkpoints after `parent` (a new conversation when None), each adding one answer."""
    rng = random.Random(seed)
    if parent is None:
        parent = storage.append_checkpoint(thread=thread, parent=None, state={"items": []})
    written = [parent]
    for _ in range(turns):
        ops = [{"op": "add", "path": "/items/-", "value": answer(rng)}]
        parent = storage.append_checkpoint(thread=thread, parent=parent, patch=ops, branch=branch)
        written.append(parent)
    return written


def stored_bytes(thread: Thread) -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT coalesce(sum(octet_length(data)), 0) FROM checkpoints_snapshotchunk WHERE thread_id = %s",
            [thread.pk],
        )
        row = cursor.fetchone()
    assert row is not None
    return int(row[0])


def every_state(thread: Thread) -> dict[Any, dict[str, Any]]:
    storage.clear_caches()
    crypto.forget_keys()
    return {c.pk: storage.state_at(c) for c in Checkpoint.objects.filter(thread=thread)}


@pytest.fixture
def thread(agent: Agent) -> Thread:
    return storage.create_thread(agent=agent)[0]


def test_a_snapshot_of_a_grown_log_stores_only_what_was_added_since_the_last(
    thread: Thread, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Chunks of some 16 KiB, so that this short a conversation has a dozen.
    monkeypatch.setattr(chunks, "MIN_CHUNK", 8 * 1024)
    monkeypatch.setattr(chunks, "DIVISOR", 8)
    written = chat(thread, 230)
    # Snapshots twice apart (the replay budget): the last two hold some 110 and 220 answers.
    *_, first, second = (c for c in written[1:] if c.kind == PayloadKind.SNAPSHOT)
    assert second.seq > 200 and chunk_digests(first)
    older = storage.state_at(first)["items"]
    whole = len(codec.encode(codec.to_canonical_bytes(storage.state_at(second))))
    added = whole - len(codec.encode(codec.to_canonical_bytes({"items": older})))

    # The second snapshot names the first one's chunks again and stores about the newer half of the
    # state beside them (a snapshot framed whole stores all of it: twice that).
    assert set(chunk_digests(first)) < set(chunk_digests(second))
    new_chunks = set(chunk_digests(second)) - set(chunk_digests(first))
    new_bytes = sum(len(c.data) for c in SnapshotChunk.objects.filter(thread=thread, digest__in=new_chunks))
    assert len(second.payload) + new_bytes < 1.3 * added < 0.7 * whole
    assert stored_bytes(thread) + len(first.payload) + len(second.payload) < 1.2 * whole
    assert storage.state_at(second)["items"][: len(older)] == older


def test_cold_reads_of_chunked_snapshots_equal_the_states_written_across_forks_and_compaction(
    thread: Thread, settings: Any
) -> None:
    settings.QUICKSAVE_SNAPSHOT_EVERY = 60
    main = chat(thread, 240)
    storage.start_branch(thread=thread, at=main[150], name="alt")
    alt = chat(thread, 90, parent=main[150], branch="alt", seed=2)
    assert Checkpoint.objects.filter(thread=thread, kind=PayloadKind.SNAPSHOT, branch__name="alt").exists()
    written = {c.pk: storage.state_at(c) for c in [*main, *alt]}
    # A fork's snapshots share the chunks of the states it grew from.
    alt_snapshot = next(c for c in alt[1:] if c.kind == PayloadKind.SNAPSHOT)
    main_snapshot = next(c for c in main[1:151] if c.kind == PayloadKind.SNAPSHOT and c.seq > 100)
    assert set(chunk_digests(alt_snapshot)) & set(chunk_digests(main_snapshot))

    assert every_state(thread) == written
    assert list(storage.verify_thread(thread)) == []

    Thread.objects.filter(pk=thread.pk).update(status=ThreadStatus.COMPLETED)
    compaction.compact_thread(thread=thread, keep_every=7)
    remaining = every_state(thread)
    assert remaining == {pk: written[pk] for pk in remaining}
    assert list(storage.verify_thread(thread)) == []


def test_whole_frame_snapshots_written_before_chunks_still_read(
    thread: Thread, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.QUICKSAVE_SNAPSHOT_EVERY = 100
    monkeypatch.setattr(chunks, "CHUNK_FROM", 1 << 40)  # as the store wrote every snapshot before
    old = chat(thread, 150)
    assert not SnapshotChunk.objects.filter(thread=thread).exists()
    monkeypatch.undo()
    new = chat(thread, 100, parent=old[-1], seed=3)
    assert SnapshotChunk.objects.filter(thread=thread).exists()
    expected = {c.pk: storage.state_at(c) for c in [*old, *new]}

    assert every_state(thread) == expected
    assert not any(chunk_digests(c) for c in old)
    assert any(chunk_digests(c) for c in new)


@pytest.mark.parametrize("encrypted", [True, False])
def test_a_chunk_altered_outside_quicksave_fails_the_read(agent: Agent, encrypted: bool) -> None:
    with override_settings(QUICKSAVE_ENCRYPT=encrypted):
        thread = storage.create_thread(agent=agent)[0]
    written = chat(thread, 150)
    snapshot = next(c for c in reversed(written) if chunk_digests(c))
    digest = chunk_digests(snapshot)[0]
    chunk = SnapshotChunk.objects.get(thread=thread, digest=digest)
    data = bytearray(chunk.data)
    data[-1] ^= 1
    SnapshotChunk.objects.filter(thread=thread, digest=digest).update(data=bytes(data))
    storage.clear_caches()

    with pytest.raises(IntegrityFailure):
        storage.state_at(snapshot)


def test_prune_collects_the_chunks_no_snapshot_names_and_thread_deletion_takes_them_all(
    thread: Thread, settings: Any
) -> None:
    settings.QUICKSAVE_SNAPSHOT_EVERY = 100
    written = chat(thread, 300)
    named = {d for c in written if c.kind == PayloadKind.SNAPSHOT for d in chunk_digests(c)}
    assert set(SnapshotChunk.objects.filter(thread=thread).values_list("digest", flat=True)) == named
    Thread.objects.filter(pk=thread.pk).update(status=ThreadStatus.COMPLETED)
    compaction.compact_thread(thread=thread, keep_every=50)
    still_named = {d for c in Checkpoint.objects.filter(thread=thread) for d in chunk_digests(c)}
    assert still_named < named

    assert garbage.collect_garbage(grace_seconds=3600).chunks == 0  # all used within the grace period
    SnapshotChunk.objects.filter(thread=thread).update(used_at="2020-01-01T00:00Z")
    collected = garbage.collect_garbage(grace_seconds=3600)

    assert collected.chunks == len(named - still_named)
    assert set(SnapshotChunk.objects.filter(thread=thread).values_list("digest", flat=True)) == still_named
    assert every_state(thread)  # every remaining state still reads
    storage.delete_thread(thread)
    assert not SnapshotChunk.objects.filter(thread_id=thread.pk).exists()


def test_a_snapshot_holding_the_same_piece_twice_stores_it_once(thread: Thread) -> None:
    rng = random.Random(4)
    block = [answer(rng) for _ in range(150)]
    state = {"first": block, "second": block, "third": block}

    written = storage.append_checkpoint(thread=thread, parent=None, state=state)

    digests = chunk_digests(written)
    assert len(digests) > len(set(digests)) == SnapshotChunk.objects.filter(thread=thread).count()
    storage.clear_caches()
    assert storage.state_at(written) == state


def cut_by_the_rule(canonical: bytes) -> list[bytes]:
    """The module docstring's rule, as directly as it reads: every `},` or `],`, in order."""
    pieces, start = [], 0
    for end in (i + 2 for i in range(chunks.MIN_CHUNK, len(canonical) - 1) if canonical[i : i + 2] in (b"},", b"],")):
        if end - start < chunks.MIN_CHUNK:
            continue
        if end - start >= chunks.MAX_CHUNK or zlib.crc32(canonical[end - chunks.WINDOW : end]) % chunks.DIVISOR == 0:
            while end - start > chunks.MAX_CHUNK:
                pieces.append(canonical[start : start + chunks.MAX_CHUNK])
                start += chunks.MAX_CHUNK
            pieces.append(canonical[start:end])
            start = end
    while len(canonical) - start > chunks.MAX_CHUNK:
        pieces.append(canonical[start : start + chunks.MAX_CHUNK])
        start += chunks.MAX_CHUNK
    return [*pieces, canonical[start:]]


@pytest.mark.parametrize("seed", range(12))
def test_cut_places_are_the_documented_ones_in_dense_sparse_and_placeless_stretches(seed: int) -> None:
    rng = random.Random(seed)
    parts: list[bytes] = []
    while sum(map(len, parts)) < 900_000:
        kind = rng.random()
        if kind < 0.05:  # a stretch longer than MAX_CHUNK without a cut place
            parts.append(b"x" * rng.randrange(chunks.MAX_CHUNK, chunks.MAX_CHUNK * 2))
        elif kind < 0.5:  # places close together, lone brackets and commas among them
            parts.append(bytes(rng.choice(b"}],x") for _ in range(rng.randrange(1, 4000))))
        else:
            parts.append(codec.to_canonical_bytes([answer(rng) for _ in range(rng.randrange(1, 40))]))
    canonical = b"".join(parts)

    pieces = chunks.cut(canonical)

    assert b"".join(pieces) == canonical
    assert pieces == cut_by_the_rule(canonical)
