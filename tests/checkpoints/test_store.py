"""The checkpoint store: deltas and snapshots, optimistic concurrency, integrity, refused input."""

from __future__ import annotations

import enum
import itertools
import random
import threading
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, connections

from checkpoints import live, storage
from checkpoints.models import Checkpoint, Event, PayloadKind, Thread, ThreadStatus
from checkpoints.storage.errors import (
    IntegrityFailure,
    InvalidPatch,
    InvalidState,
    NotFound,
    StaleParent,
    StateTooLarge,
)
from checkpoints.storage.jsonpatch import canonical_size
from quicksave_agents.models import Agent
from tests.conftest import message


def grow(thread: Thread, steps: int, *, start: Checkpoint | None = None, use_patch: bool = True) -> list[Checkpoint]:
    """Append `steps` checkpoints that each add one message and bump `step`."""
    parent = start or storage.append_checkpoint(thread=thread, parent=None, state={"messages": [], "step": 0})
    written = [parent]
    state = storage.state_at(parent)
    for i in range(1, steps + 1):
        if use_patch:
            ops: list[dict[str, Any]] = [
                {"op": "add", "path": "/messages/-", "value": message(i)},
                {"op": "replace", "path": "/step", "value": i},
            ]
            parent = storage.append_checkpoint(thread=thread, parent=parent, patch=ops, step=i)
        else:
            state = {**state, "messages": [*state["messages"], message(i)], "step": i}
            parent = storage.append_checkpoint(thread=thread, parent=parent, state=state, step=i)
        written.append(parent)
    return written


def test_first_checkpoint_is_a_snapshot_of_the_given_state(thread: Thread) -> None:
    checkpoint = storage.append_checkpoint(thread=thread, parent=None, state={"plan": ["fly"], "budget": 900})

    assert checkpoint.kind == PayloadKind.SNAPSHOT
    assert checkpoint.seq == 1
    storage.clear_caches()
    assert storage.state_at(checkpoint) == {"plan": ["fly"], "budget": 900}


def test_patch_and_full_state_writes_materialise_the_same_states(agent: Agent) -> None:
    by_patch = grow(storage.create_thread(agent=agent)[0], 30, use_patch=True)
    by_state = grow(storage.create_thread(agent=agent)[0], 30, use_patch=False)
    storage.clear_caches()

    for left, right in zip(by_patch, by_state, strict=True):
        assert storage.state_at(left) == storage.state_at(right)
    assert storage.state_at(by_patch[-1])["messages"][-1] == message(30)


def test_most_checkpoints_are_deltas_and_snapshots_come_when_replay_would_cost_more(thread: Thread) -> None:
    written = grow(thread, 300)

    rows = list(Checkpoint.objects.filter(thread=thread).order_by("seq"))
    snapshots = [row.seq for row in rows if row.kind == PayloadKind.SNAPSHOT]
    assert len(snapshots) <= 12, snapshots  # spaced geometrically for an append-only state
    deltas = [row for row in rows if row.kind == PayloadKind.DELTA]
    assert max(len(bytes(row.payload)) for row in deltas) < 1000  # one message, not the whole state
    for row in rows:
        assert row.chain_bytes <= row.state_bytes
    storage.clear_caches()
    assert [len(storage.state_at(c)["messages"]) for c in written] == list(range(301))


def test_snapshots_of_a_growing_log_are_twice_apart_in_state_size(thread: Thread) -> None:
    parent = storage.append_checkpoint(thread=thread, parent=None, state={"messages": []})
    for i in range(1, 400):  # messages of a kilobyte: the patches' own words are a few percent of them
        parent = storage.append_checkpoint(thread=thread, parent=parent, patch=[
            {"op": "add", "path": "/messages/-", "value": {"text": f"{i} " + "words " * 170}}])  # fmt: skip

    rows = Checkpoint.objects.filter(thread=thread, kind=PayloadKind.SNAPSHOT).order_by("seq")
    sizes = [row.state_bytes for row in rows if row.seq > 1]
    # Each snapshot holds about half the state at the next: storage stays linear in the log's
    # length (the snapshots add up to about twice the final state) and no replay reads more
    # delta bytes than half the state it builds.
    assert len(sizes) >= 5, sizes
    for before, after in itertools.pairwise(sizes):
        assert 1.6 * before <= after <= 2.6 * before, sizes
    chains = Checkpoint.objects.filter(thread=thread, kind=PayloadKind.DELTA).values_list("chain_bytes", "state_bytes")
    assert all(chain * storage.REPLAY_COST_PER_BYTE <= storage.REPLAY_BUDGET * state for chain, state in chains)


def test_snapshot_every_n_bounds_the_replay_chain(thread: Thread, settings: Any) -> None:
    settings.QUICKSAVE_SNAPSHOT_EVERY = 5
    grow(thread, 20)

    kinds = list(Checkpoint.objects.filter(thread=thread).order_by("seq").values_list("kind", "chain_length"))
    assert max(length for _, length in kinds) == 4
    for (_, before), (kind, length) in itertools.pairwise(kinds):
        assert length == (0 if kind == PayloadKind.SNAPSHOT else before + 1)


def test_state_bytes_is_the_size_of_the_canonical_state(thread: Thread) -> None:
    written = grow(thread, 10)
    written.append(
        storage.append_checkpoint(thread=thread, parent=written[-1], patch=[{"op": "remove", "path": "/messages/0"}])
    )
    for checkpoint in written:
        assert checkpoint.state_bytes == canonical_size(storage.state_at(checkpoint))


def test_stale_parent_is_rejected_with_head(thread: Thread) -> None:
    first = storage.append_checkpoint(thread=thread, parent=None, state={"n": 0})
    second = storage.append_checkpoint(thread=thread, parent=first, state={"n": 1})

    with pytest.raises(StaleParent) as raised:
        storage.append_checkpoint(thread=thread, parent=first, state={"n": 2})
    assert raised.value.detail["head"] == str(second.pk)
    with pytest.raises(StaleParent):
        storage.append_checkpoint(thread=thread, parent=None, state={"n": 3})
    assert Checkpoint.objects.filter(thread=thread).count() == 2
    thread.refresh_from_db()
    assert thread.event_seq == 3  # thread.created and two checkpoints: a refused write takes no seq


@pytest.mark.django_db(transaction=True)
def test_twenty_concurrent_writers_with_the_same_parent_exactly_one_wins(agent: Agent) -> None:
    thread = storage.create_thread(agent=agent)[0]
    parent = grow(thread, 3)[-1]
    barrier = threading.Barrier(20)
    outcomes: list[str] = []
    lock = threading.Lock()

    def write(n: int) -> None:
        try:
            barrier.wait()
            storage.append_checkpoint(
                thread=thread, parent=parent, patch=[{"op": "replace", "path": "/step", "value": n}]
            )
            result = "won"
        except StaleParent:
            result = "stale"
        finally:
            connections.close_all()
        with lock:
            outcomes.append(result)

    writers = [threading.Thread(target=write, args=(n,)) for n in range(20)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join()

    assert sorted(outcomes) == ["stale"] * 19 + ["won"]
    seqs = list(Checkpoint.objects.filter(thread=thread).order_by("seq").values_list("seq", flat=True))
    assert seqs == [1, 2, 3, 4, 5]
    # The 19 losers took no event seq: thread.created and five checkpoints, numbered without a gap.
    events = [seq for seq, _, _ in storage.events_after(thread_id=thread.pk, seq=0, limit=100)]
    thread.refresh_from_db()
    assert events == [1, 2, 3, 4, 5, 6] and thread.event_seq == 6


@pytest.mark.django_db(transaction=True)
def test_concurrent_writers_that_retry_leave_a_gapless_timeline(agent: Agent) -> None:
    thread = storage.create_thread(agent=agent)[0]
    storage.append_checkpoint(thread=thread, parent=None, state={"log": []})

    def write(n: int) -> None:
        try:
            for i in range(10):
                while True:
                    head, _ = storage.latest_state(thread=thread)
                    try:
                        ops = [{"op": "add", "path": "/log/-", "value": f"{n}.{i}"}]
                        storage.append_checkpoint(thread=thread, parent=head, patch=ops)
                        break
                    except StaleParent:
                        continue
        finally:
            connections.close_all()

    writers = [threading.Thread(target=write, args=(n,)) for n in range(4)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join()

    seqs = list(Checkpoint.objects.filter(thread=thread).order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, 42))
    events = storage.events_after(thread_id=thread.pk, seq=0, limit=100)
    assert [seq for seq, _, _ in events] == list(range(1, 43))  # thread.created, then each checkpoint once
    assert [data["seq"] for _, kind, data in events if kind == "checkpoint.created"] == seqs
    _, state = storage.latest_state(thread=thread)
    assert sorted(state["log"]) == sorted(f"{n}.{i}" for n in range(4) for i in range(10))


def test_state_at_a_random_earlier_checkpoint_replays_from_its_snapshot(thread: Thread) -> None:
    written = grow(thread, 120)
    storage.clear_caches()
    rng = random.Random(3)
    for checkpoint in rng.sample(written, 15):
        state = storage.state_at(checkpoint)
        assert state["step"] == checkpoint.step
        assert len(state["messages"]) == checkpoint.step


def test_returned_state_is_the_callers_own_copy(thread: Thread) -> None:
    checkpoint = storage.append_checkpoint(thread=thread, parent=None, state={"plan": ["fly"]})
    storage.state_at(checkpoint)["plan"].append("tampered")
    assert storage.state_at(checkpoint) == {"plan": ["fly"]}


def test_latest_state_is_the_branch_head(thread: Thread) -> None:
    written = grow(thread, 5)
    head, state = storage.latest_state(thread=thread)
    assert head == written[-1].pk
    assert state["step"] == 5


def test_a_row_altered_with_raw_sql_fails_its_integrity_check(thread: Thread) -> None:
    written = grow(thread, 40)
    kinds = {row.pk: row.kind for row in Checkpoint.objects.filter(thread=thread)}
    index = next(i for i in range(1, 40) if kinds[written[i].pk] == kinds[written[i + 1].pk] == PayloadKind.DELTA)
    victim, child = written[index], written[index + 1]
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE checkpoints_checkpoint SET payload = %s WHERE id = %s",
            [b"\x00" + b'[{"op":"replace","path":"/step","value":999}]', victim.pk],
        )
    storage.clear_caches()

    with pytest.raises(IntegrityFailure):
        storage.state_at(victim)
    with pytest.raises(IntegrityFailure):
        storage.state_at(child)  # its replay passes through the altered row
    assert storage.state_at(written[index - 1])["step"] == index - 1  # rows before the edit still verify


def test_an_edited_label_fails_the_integrity_check(thread: Thread) -> None:
    written = grow(thread, 3)
    Checkpoint.objects.filter(pk=written[2].pk).update(label="approved by nobody")
    storage.clear_caches()
    with pytest.raises(IntegrityFailure):
        storage.state_at(written[2])


def test_verify_integrity_command_reports_the_altered_row(thread: Thread, capsys: Any) -> None:
    written = grow(thread, 6)
    call_command("verify_integrity")
    assert "OK" in capsys.readouterr().out

    with connection.cursor() as cursor:
        cursor.execute("UPDATE checkpoints_checkpoint SET step = 42 WHERE id = %s", [written[3].pk])
    with pytest.raises(CommandError, match="1 checkpoint"):
        call_command("verify_integrity")
    assert f"checkpoint {written[3].pk}" in capsys.readouterr().out


def test_records_model_parameters_metadata_and_schema_version(thread: Thread) -> None:
    checkpoint = storage.append_checkpoint(
        thread=thread,
        parent=None,
        state={"a": 1},
        step=7,
        label="search_flights",
        status="waiting_for_approval",
        model={"name": "gpt-x", "version": "2026-01", "temperature": 0.2, "top_p": 0.9, "seed": 42},
        metadata={"customer": "acme"},
        schema_version=3,
    )
    stored = Checkpoint.objects.get(pk=checkpoint.pk)
    assert stored.model == {"name": "gpt-x", "version": "2026-01", "temperature": 0.2, "top_p": 0.9, "seed": 42}
    assert (stored.step, stored.label, stored.status, stored.schema_version) == (
        7,
        "search_flights",
        "waiting_for_approval",
        3,
    )
    assert stored.metadata == {"customer": "acme"}
    thread.refresh_from_db()
    assert (thread.status, thread.step, thread.head_id) == (ThreadStatus.WAITING_FOR_APPROVAL, 7, checkpoint.pk)
    storage.clear_caches()
    storage.state_at(checkpoint)  # the recorded fields are covered by the integrity MAC


def test_each_checkpoint_is_an_event_in_order(thread: Thread) -> None:
    written = grow(thread, 3)
    events = storage.events_after(thread_id=thread.pk, seq=0, limit=10)
    assert [kind for _, kind, _ in events] == ["thread.created"] + ["checkpoint.created"] * 4
    assert [seq for seq, _, _ in events] == [1, 2, 3, 4, 5]
    assert events[-1][2]["checkpoint"] == str(written[-1].pk)
    thread.refresh_from_db()
    assert thread.event_seq == 5


def test_a_checkpoint_is_its_own_event_with_no_event_row_and_replays_as_it_was_published(
    thread: Thread, monkeypatch: pytest.MonkeyPatch, django_capture_on_commit_callbacks: Any
) -> None:
    published: list[tuple[int, str, dict[str, Any]]] = []
    monkeypatch.setattr(live, "publish", lambda **event: published.append(
        (event["seq"], event["type"], event["data"])))  # fmt: skip
    with django_capture_on_commit_callbacks(execute=True):  # the test's transaction never commits
        root = storage.append_checkpoint(thread=thread, parent=None, state={"n": 0}, step=0, label="start")
        storage.start_branch(thread=thread, at=root, name="aside")
        storage.append_checkpoint(thread=thread, parent=root, patch=[{"op": "replace", "path": "/n", "value": 1}],
                                  branch="aside", label="waits", status=ThreadStatus.WAITING_FOR_APPROVAL)  # fmt: skip

    assert not Event.objects.filter(thread=thread, type="checkpoint.created").exists()  # the rows are the events
    numbered = Checkpoint.objects.filter(thread=thread).order_by("event_seq").values_list("event_seq", flat=True)
    assert list(numbered) == [2, 4]
    assert [kind for _, kind, _ in published] == ["checkpoint.created", "branch.created", "checkpoint.created"]
    assert storage.events_after(thread_id=thread.pk, seq=1, limit=10) == published
    assert storage.events_after(thread_id=thread.pk, seq=2, limit=1) == published[1:2]  # merged by seq, limited


@pytest.mark.parametrize(
    ("kwargs", "error", "fragment"),
    [
        ({"state": {"x": float("nan")}}, InvalidState, "NaN"),
        ({"state": {"x": float("inf")}}, InvalidState, "Infinity"),
        ({"state": {"s": "\ud800"}}, InvalidState, "Unicode"),
        ({"state": ["not", "an", "object"]}, InvalidState, "object"),
        ({"patch": [{"op": "replace", "path": "/missing", "value": 1}]}, InvalidPatch, "/missing"),
        ({"patch": [{"op": "explode", "path": "/a"}]}, InvalidPatch, "op 0"),
        ({"patch": [{"op": "replace", "path": "", "value": 3}]}, InvalidState, "object"),
        ({"state": {"a": 1}, "patch": []}, InvalidState, "exactly one"),
        ({"state": {"a": 1}, "label": "x" * 201}, InvalidState, "label"),
        ({"state": {"a": 1}, "status": "sleeping"}, InvalidState, "status"),
        ({"state": {"a": 1}, "model": {"nme": "typo"}}, InvalidState, "nme"),
        ({"state": {"a": 1}, "step": -1}, InvalidState, "step"),
    ],
)
def test_refused_input_leaves_nothing_behind(
    thread: Thread, kwargs: dict[str, Any], error: type[Exception], fragment: str
) -> None:
    parent = storage.append_checkpoint(thread=thread, parent=None, state={"a": 0})
    before = (Checkpoint.objects.count(), Event.objects.count())

    with pytest.raises(error, match=fragment):
        storage.append_checkpoint(thread=thread, parent=parent, **kwargs)

    assert (Checkpoint.objects.count(), Event.objects.count()) == before
    assert storage.state_at(parent) == {"a": 0}


def test_nesting_deeper_than_64_is_refused(thread: Thread) -> None:
    deep: dict[str, Any] = {}
    node = deep
    for _ in range(64):
        node["d"] = {}
        node = node["d"]
    with pytest.raises(InvalidState, match="limit is 64"):
        storage.append_checkpoint(thread=thread, parent=None, state=deep)
    parent = storage.append_checkpoint(thread=thread, parent=None, state={"a": {}})
    with pytest.raises(InvalidState, match="limit is 64"):
        storage.append_checkpoint(thread=thread, parent=parent, patch=[{"op": "add", "path": "/a/b", "value": deep}])


def test_a_copy_that_nests_the_state_too_deep_is_refused_though_the_patch_is_flat(thread: Thread) -> None:
    # A patch's own brackets bound the depth of what it adds, not of what it copies from the state.
    deep: dict[str, Any] = {}
    node = deep
    for _ in range(60):
        node["d"] = {}
        node = node["d"]
    parent = storage.append_checkpoint(thread=thread, parent=None, state={"a": deep, "b": {"c": {"e": {}}}})
    with pytest.raises(InvalidState, match="limit is 64"):
        storage.append_checkpoint(
            thread=thread, parent=parent, patch=[{"op": "copy", "from": "/a", "path": "/b/c/e/f"}]
        )
    assert Checkpoint.objects.filter(thread=thread).count() == 1


def test_state_bytes_is_the_canonical_size_after_patches_of_floats_big_integers_and_text(thread: Thread) -> None:
    # Plain values are sized by orjson; floats and integers beyond 64 bits are not plain.
    written = [storage.append_checkpoint(thread=thread, parent=None, state={"log": [], "n": 1})]
    for value in (1e16, 0.1, 2**70, -(2**63), "ünïcödé ✓", {"x": [1.5, True, None]}, {"m": {"k": "v"}}, 10**20):
        patch = [{"op": "add", "path": "/log/-", "value": value}, {"op": "replace", "path": "/n", "value": value}]
        written.append(storage.append_checkpoint(thread=thread, parent=written[-1], patch=patch))
    for checkpoint in written:
        assert checkpoint.state_bytes == canonical_size(storage.state_at(checkpoint))
    assert storage.state_at(written[-1])["log"][2] == 2**70


def test_state_above_the_size_limit_is_refused_naming_the_limit(thread: Thread, settings: Any) -> None:
    settings.QUICKSAVE_MAX_STATE_BYTES = 10_000
    parent = storage.append_checkpoint(thread=thread, parent=None, state={"log": []})
    with pytest.raises(StateTooLarge, match="limit is 10000 bytes") as raised:
        storage.append_checkpoint(
            thread=thread, parent=parent, patch=[{"op": "add", "path": "/log/-", "value": "x" * 10_000}]
        )
    assert raised.value.detail["limit"] == 10_000
    assert Checkpoint.objects.filter(thread=thread).count() == 1


def test_parent_from_another_thread_is_not_found(agent: Agent, thread: Thread) -> None:
    elsewhere = storage.create_thread(agent=agent)[0]
    foreign = storage.append_checkpoint(thread=elsewhere, parent=None, state={})
    with pytest.raises(NotFound):
        storage.append_checkpoint(thread=thread, parent=foreign, state={"a": 1})


def test_a_new_branch_starts_at_its_fork_point(thread: Thread) -> None:
    written = grow(thread, 5)
    storage.start_branch(thread=thread, at=written[2], name="retry")
    forked = storage.append_checkpoint(thread=thread, parent=written[2], branch="retry",
                                     patch=[{"op": "replace", "path": "/step", "value": 100}])  # fmt: skip
    assert forked.seq == 1
    assert storage.state_at(forked)["messages"] == storage.state_at(written[2])["messages"]
    after = storage.append_checkpoint(thread=thread, parent=forked, state={"done": True})
    assert (after.seq, storage.get_branch_name(after.branch_id)) == (2, "retry")
    with pytest.raises(StaleParent):
        storage.append_checkpoint(thread=thread, parent=written[1], branch="retry", state={})
    thread.refresh_from_db()
    assert thread.head_id == written[-1].pk  # main stays the active branch


def test_create_thread_returns_the_existing_thread_for_the_same_external_id(agent: Agent) -> None:
    first, created = storage.create_thread(agent=agent, external_id="ext-1", metadata={"a": 1})
    again, created_again = storage.create_thread(agent=agent, external_id="ext-1")
    assert (created, created_again, again.pk) == (True, False, first.pk)


@pytest.mark.django_db(transaction=True)
def test_writing_to_a_thread_deleted_by_another_process_is_not_found(agent: Agent) -> None:
    thread = storage.create_thread(agent=agent)[0]
    storage.append_checkpoint(thread=thread, parent=None, state={"a": 1})
    # Another process deletes the thread; this one still has its branch cached.
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM checkpoints_event WHERE thread_id = %s", [thread.pk])
        cursor.execute("DELETE FROM checkpoints_checkpoint WHERE thread_id = %s", [thread.pk])
        cursor.execute(
            "UPDATE checkpoints_thread SET active_branch_id = NULL, head_id = NULL WHERE id = %s", [thread.pk]
        )
        cursor.execute("DELETE FROM checkpoints_branch WHERE thread_id = %s", [thread.pk])
        cursor.execute("DELETE FROM checkpoints_threadkey WHERE thread_id = %s", [thread.pk])
        cursor.execute("DELETE FROM checkpoints_thread WHERE id = %s", [thread.pk])
    with pytest.raises(NotFound, match="no longer exists"):
        storage.append_checkpoint(thread=thread, parent=None, state={"b": 2})


def test_an_append_is_prepared_once_however_large_its_numbers_grow(thread: Thread) -> None:
    # psycopg would send each int as int2, int4 or int8 by its value, and every new combination
    # of types would be another statement to prepare: sizes and seqs cross those bounds as a
    # thread grows. psycopg prepares a statement once it has run `prepare_threshold` times with
    # the same parameter types.
    parent = storage.append_checkpoint(thread=thread, parent=None, state={"log": []}, step=0)
    threshold = connection.connection.prepare_threshold or 0
    sizes = (10, 200, 40_000, 70_000, 3_000, 5, 90_000, 20)
    assert len(sizes) > threshold
    for step, size in enumerate(sizes, start=1):
        parent = storage.append_checkpoint(
            thread=thread, parent=parent, patch=[{"op": "add", "path": "/log/-", "value": "x" * size}], step=step
        )
    storage.append_checkpoint(thread=thread, parent=parent, patch=[], step=2**31 - 1, model={"seed": 2**62})

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT DISTINCT unnest(parameter_types)::text FROM pg_prepared_statements WHERE statement LIKE %s",
            ["%INTO checkpoints_checkpoint%"],
        )
        types = {row[0] for row in cursor.fetchall()}
    # Every int goes as bigint, so its size never makes a new statement (a null one still does:
    # a root checkpoint has no parent).
    assert "bigint" in types and not types & {"smallint", "integer"}, types


def test_a_status_given_as_any_str_enum_is_recorded_as_its_value(thread: Thread) -> None:
    class Status(str, enum.Enum):  # str() of such a member is "Status.DONE", not its value
        DONE = "completed"

    written = storage.append_checkpoint(thread=thread, parent=None, state={}, status=Status.DONE)
    stored = Checkpoint.objects.get(pk=written.pk)
    events = storage.events_after(thread_id=thread.pk, seq=0, limit=10)
    [published] = [data for _, kind, data in events if kind == "checkpoint.created"]
    assert (stored.status, published["status"]) == ("completed", "completed")
    call_command("verify_integrity")  # the MAC was made over the recorded value


def test_a_second_first_checkpoint_is_refused_naming_the_head_not_a_parent_of_none(thread: Thread) -> None:
    head = storage.append_checkpoint(thread=thread, parent=None, state={"n": 1})
    with pytest.raises(StaleParent, match=f"^No parent is the head of branch 'main'; the head is {head.pk}") as raised:
        storage.append_checkpoint(thread=thread, parent=None, state={"n": 2})
    assert "None" not in str(raised.value)


def test_append_checkpoint_id_writes_the_row_append_checkpoint_would_and_returns_its_id(thread: Thread) -> None:
    first = storage.append_checkpoint(thread=thread, parent=None, state={"messages": [], "step": 0})
    written = storage.append_checkpoint_id(
        thread=thread, parent=first, patch=[{"op": "add", "path": "/messages/-", "value": "hi"}], step=1,
        metadata={"note": "by id"},
    )  # fmt: skip
    then = storage.append_checkpoint(
        thread=thread, parent=written, patch=[{"op": "replace", "path": "/step", "value": 2}]
    )

    row = Checkpoint.objects.get(pk=written)
    assert (row.parent_id, row.seq, row.step, row.metadata) == (first.pk, 2, 1, {"note": "by id"})
    assert then.parent_id == written
    storage.clear_caches()
    assert storage.state_at(row) == {"messages": ["hi"], "step": 0}
    assert storage.state_at(then) == {"messages": ["hi"], "step": 2}
    call_command("verify_integrity")
