"""Materialised heads: a cold read of a branch head saves its state, the next cold read starts there."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from checkpoints import storage
from checkpoints.models import Checkpoint, MaterialisedHead, Thread
from checkpoints.storage import codec, crypto, payloads, reads
from checkpoints.storage.errors import IntegrityFailure
from quicksave_agents.models import Agent
from tests.checkpoints.test_store import grow
from tests.conftest import message


def a_fresh_process() -> None:
    """Forget what this process materialised and opened, as another server process never knew it."""
    storage.clear_caches()
    crypto.forget_keys()


@pytest.fixture
def verified(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The seqs of the rows each replay checks, in order."""
    seqs: list[int] = []
    original = payloads.verify_row

    def counting(row: Any, *, parent_integrity: bytes | None) -> None:
        seqs.append(row.seq)
        original(row, parent_integrity=parent_integrity)

    monkeypatch.setattr(reads, "verify_row", counting)
    return seqs


def extend(thread: Thread, parent: Checkpoint, steps: int) -> list[Checkpoint]:
    """`steps` more checkpoints after `parent`, each adding the next message."""
    written = []
    assert parent.step is not None
    for step in range(parent.step + 1, parent.step + steps + 1):
        ops: list[dict[str, Any]] = [
            {"op": "add", "path": "/messages/-", "value": message(step)},
            {"op": "replace", "path": "/step", "value": step},
        ]
        parent = storage.append_checkpoint(thread=thread, parent=parent, patch=ops, step=step)
        written.append(parent)
    return written


def grow_long_chain(thread: Thread) -> list[Checkpoint]:
    """Checkpoints up to a head far enough from its snapshot that a cold read saves its state."""
    written = grow(thread, 40)
    while written[-1].chain_bytes * reads.REPLAY_COST_PER_BYTE * 2 <= written[-1].state_bytes:
        written += extend(thread, written[-1], 1)
    assert written[-1].chain_length >= 5
    return written


def head_branch(thread: Thread) -> int:
    assert thread.active_branch_id is not None
    return thread.active_branch_id


def cold_latest(thread: Thread) -> dict[str, Any]:
    storage.clear_caches()
    return storage.latest_state(thread=thread)[1]


def test_a_cold_read_that_replays_many_deltas_saves_the_head_and_the_next_starts_there(
    thread: Thread, verified: list[int]
) -> None:
    written = grow_long_chain(thread)
    verified.clear()

    first = cold_latest(thread)
    assert len(verified) == written[-1].chain_length + 1  # replayed from the last snapshot
    saved = MaterialisedHead.objects.get(branch_id=head_branch(thread))
    assert (saved.checkpoint_id, saved.seq) == (written[-1].pk, written[-1].seq)

    verified.clear()
    assert cold_latest(thread) == first
    assert verified == []  # nothing replayed: the saved state is the head's


def test_a_fresh_process_reads_a_saved_head_in_four_queries_replaying_no_delta(
    thread: Thread, verified: list[int]
) -> None:
    written = grow_long_chain(thread)
    a_fresh_process()
    storage.latest_state(thread=thread)  # replays, then saves the head

    a_fresh_process()
    verified.clear()
    with CaptureQueriesContext(connection) as queries:
        head_id, state = storage.latest_state(thread=thread)

    assert head_id == written[-1].pk and state["step"] == written[-1].step
    assert state["messages"][-1] == message(written[-1].step)
    assert verified == []  # no row replayed, though the head is far from its snapshot
    sql = [query["sql"] for query in queries.captured_queries]
    # The branch and its head, the head row with its saved state, that row again as the one-row range
    # from the saved head, and the thread's data key.
    assert len(sql) == 4, sql
    assert sum("checkpoints_materialisedhead" in statement for statement in sql) == 1


def test_a_later_write_makes_the_saved_head_a_starting_point_not_the_answer(
    thread: Thread, verified: list[int]
) -> None:
    written = grow_long_chain(thread)
    cold_latest(thread)
    later = extend(thread, written[-1], 3)

    verified.clear()
    state = cold_latest(thread)

    assert state["step"] == later[-1].step and state["messages"][-1] == message(state["step"])
    assert verified == [row.seq for row in later]  # only the deltas after the saved head
    storage.clear_caches()
    assert storage.state_at(written[-1])["step"] == written[-1].step  # its own checkpoint reads from it too


def test_a_forged_saved_head_is_ignored(agent: Agent, settings: Any, verified: list[int]) -> None:
    settings.QUICKSAVE_ENCRYPT = False  # nothing sealed: the head's MAC alone refuses the forgery
    thread = storage.create_thread(agent=agent)[0]
    written = grow_long_chain(thread)
    honest = cold_latest(thread)
    forged = codec.encode(codec.to_canonical_bytes({**honest, "step": 999}))
    MaterialisedHead.objects.filter(branch_id=head_branch(thread)).update(payload=forged)

    verified.clear()
    assert cold_latest(thread) == honest
    assert len(verified) == written[-1].chain_length + 1  # replayed from the snapshot instead


def test_a_row_altered_after_the_saved_head_still_fails_its_check(thread: Thread) -> None:
    written = grow_long_chain(thread)
    cold_latest(thread)
    later = extend(thread, written[-1], 2)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE checkpoints_checkpoint SET payload = %s WHERE id = %s",
            [b"\x00" + b'[{"op":"replace","path":"/step","value":999}]', later[0].pk],
        )

    with pytest.raises(IntegrityFailure):
        cold_latest(thread)


def test_a_saved_head_whose_checkpoint_was_rewritten_is_ignored(thread: Thread, verified: list[int]) -> None:
    written = grow_long_chain(thread)
    honest = cold_latest(thread)
    # The head row no longer carries the MAC the saved state was materialised from (as after a
    # compaction rewrote it, or an edit behind the store's back).
    Checkpoint.objects.filter(pk=written[-1].pk).update(integrity=b"\x00" * 32)

    verified.clear()
    with pytest.raises(IntegrityFailure):
        cold_latest(thread)  # replayed from the snapshot, which now finds the altered row
    assert verified and honest["step"] == written[-1].step
