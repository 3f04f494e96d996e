"""Retention: per-agent policies, `manage.py prune` (deleting and compacting) and `manage.py retention`."""

from __future__ import annotations

import io
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.utils import timezone

from approvals.models import ApprovalRequest, ApprovalStatus
from approvals.services import request_approval
from audit.models import AuditEntry
from checkpoints import compaction, export, retention, storage
from checkpoints.export import import_thread
from checkpoints.models import (
    Blob,
    Checkpoint,
    MaterialisedHead,
    PayloadKind,
    Thread,
    ThreadKey,
    ThreadStatus,
    ToolResult,
)
from checkpoints.storage import nodes
from checkpoints.storage.tool_results import put_tool_result
from checkpoints.storage.verify import verify_thread
from quicksave_agents.keys import get_or_create_agent
from quicksave_agents.models import Agent, Run, RunReason, RunStatus
from tests.checkpoints.test_materialised_head import a_fresh_process


@pytest.fixture(autouse=True)
def private_blob_storage(settings: Any, tmp_path: Path) -> Path:
    # prune collects unreferenced blob files; it must never see another database's files.
    settings.STORAGES = {
        **settings.STORAGES,
        "quicksave_blobs": {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": str(tmp_path), "allow_overwrite": True},
        },
    }
    return tmp_path


def finished(agent: Agent, *, status: str, days_old: float, steps: int = 3) -> Thread:
    """A thread with a few checkpoints, in `status`, last updated `days_old` days ago."""
    thread = storage.create_thread(agent=agent)[0]
    parent = None
    for i in range(steps):
        parent = storage.append_checkpoint(thread=thread, parent=parent, state={"step": i}, step=i)
    Thread.objects.filter(pk=thread.pk).update(status=status, updated_at=timezone.now() - timedelta(days=days_old))
    return Thread.objects.get(pk=thread.pk)


def head_of(thread: Thread) -> Checkpoint:
    return Checkpoint.objects.filter(thread=thread).order_by("-seq").first() or pytest.fail("no checkpoint")


def long_history(
    thread: Thread, steps: int, *, start: Checkpoint | None = None, branch: str | None = None
) -> list[Checkpoint]:
    """`steps` checkpoints that append a message, replace a scratch object and swap a note: a state
    that both grows and churns, so a delta across a gap carries the messages and the last scratch."""
    written = []
    parent = start
    line = branch or "main"
    for i in range(steps):
        if parent is None:
            first = {"messages": [], "step": 0, "scratch": {}, "notes": {}}
            parent = storage.append_checkpoint(thread=thread, parent=None, state=first)
            written.append(parent)
            continue
        ops: list[dict[str, Any]] = [
            {"op": "add", "path": "/messages/-", "value": {"role": "assistant", "text": f"{line} {i} " * 8}},
            {"op": "replace", "path": "/step", "value": i},
            {"op": "replace", "path": "/scratch", "value": {"draft": f"draft {i} " * 20, "n": i}},
            {"op": "add", "path": f"/notes/{line}{i}", "value": f"note {i}"},
        ]
        if i % 3 == 0 and i > 2:
            ops.append({"op": "remove", "path": f"/notes/{line}{i - 2}"})
        parent = storage.append_checkpoint(thread=thread, parent=parent, patch=ops, step=i, branch=branch)
        written.append(parent)
    return written


def every_state(thread: Thread) -> dict[UUID, dict[str, Any]]:
    storage.clear_caches()
    return {c.pk: storage.state_at(c) for c in Checkpoint.objects.filter(thread=thread)}


def rows_of(thread: Thread) -> list[tuple[Any, ...]]:
    return list(
        Checkpoint.objects.filter(thread=thread)
        .order_by("branch_id", "seq")
        .values_list("id", "parent_id", "kind", "payload", "chain_length", "integrity")
    )


# --------------------------------------------------------------------------- deleting


def test_expired_threads_are_deleted_and_fresh_or_busy_ones_kept(agent: Agent) -> None:
    retention.set_policy(agent=agent, completed_days=30, failed_days=7)
    old_completed = finished(agent, status=ThreadStatus.COMPLETED, days_old=31)
    old_failed = finished(agent, status=ThreadStatus.FAILED, days_old=8)
    fresh_completed = finished(agent, status=ThreadStatus.COMPLETED, days_old=29)
    fresh_failed = finished(agent, status=ThreadStatus.FAILED, days_old=6)
    old_cancelled = finished(agent, status=ThreadStatus.CANCELLED, days_old=400)  # no rule for cancelled
    old_running = finished(agent, status=ThreadStatus.RUNNING, days_old=400)
    old_waiting = finished(agent, status=ThreadStatus.WAITING_FOR_APPROVAL, days_old=400)
    with_queued_run = finished(agent, status=ThreadStatus.COMPLETED, days_old=400)
    Run.objects.create(agent=agent, thread=with_queued_run, checkpoint=head_of(with_queued_run),
                       reason=RunReason.MANUAL, status=RunStatus.QUEUED)  # fmt: skip
    with_pending_approval = finished(agent, status=ThreadStatus.FAILED, days_old=400)
    request_approval(thread=with_pending_approval, checkpoint=head_of(with_pending_approval), action="book", args={})
    Thread.objects.filter(pk=with_pending_approval.pk).update(status=ThreadStatus.FAILED)
    other_agent = get_or_create_agent(name="no-policy")
    unmanaged = finished(other_agent, status=ThreadStatus.COMPLETED, days_old=4000)

    report = retention.prune()

    remaining = set(Thread.objects.values_list("pk", flat=True))
    assert old_completed.pk not in remaining and old_failed.pk not in remaining
    assert {fresh_completed.pk, fresh_failed.pk, old_cancelled.pk, old_running.pk, old_waiting.pk,
            with_queued_run.pk, with_pending_approval.pk, unmanaged.pk} <= remaining  # fmt: skip
    assert not ThreadKey.objects.filter(thread_id__in=[old_completed.pk, old_failed.pk]).exists()  # shredded
    assert not Checkpoint.objects.filter(thread_id__in=[old_completed.pk, old_failed.pk]).exists()
    assert (report.threads_deleted, report.checkpoints_removed) == (2, 6)
    assert report.bytes_freed > 0
    assert set(report.deleted) == {str(old_completed.pk), str(old_failed.pk)}


def test_age_counts_from_the_last_update(agent: Agent) -> None:
    retention.set_policy(agent=agent, completed_days=30)
    thread = finished(agent, status=ThreadStatus.COMPLETED, days_old=31)
    Thread.objects.filter(pk=thread.pk).update(updated_at=timezone.now() - timedelta(days=29, hours=23))

    assert retention.prune().threads_deleted == 0
    assert Thread.objects.filter(pk=thread.pk).exists()


def test_dry_run_changes_nothing_and_reports_the_same_counts(agent: Agent, settings: Any) -> None:
    settings.QUICKSAVE_SNAPSHOT_EVERY = 30
    retention.set_policy(agent=agent, completed_days=10, compact_after=50, keep_every=5)
    for _ in range(2):
        finished(agent, status=ThreadStatus.COMPLETED, days_old=11)
    long = storage.create_thread(agent=agent)[0]
    long_history(long, 120)
    Thread.objects.filter(pk=long.pk).update(status=ThreadStatus.PAUSED, updated_at=timezone.now() - timedelta(days=2))
    before_threads = set(Thread.objects.values_list("pk", flat=True))
    before_rows = rows_of(long)
    audits = AuditEntry.objects.count()

    dry = retention.prune(dry_run=True)

    assert set(Thread.objects.values_list("pk", flat=True)) == before_threads
    assert rows_of(long) == before_rows
    assert AuditEntry.objects.count() == audits
    assert dry.threads_deleted == 2 and dry.threads_compacted == 1 and dry.checkpoints_removed > 90

    real = retention.prune()

    assert {**real.counts(), "dry_run": True} == dry.counts()
    assert sorted(real.deleted) == sorted(dry.deleted)
    assert Checkpoint.objects.filter(thread=long).count() == 120 - dry.checkpoints_removed + 6


# --------------------------------------------------------------------------- compacting


def test_compaction_keeps_every_remaining_state_and_the_checkpoints_things_point_at(
    agent: Agent, settings: Any
) -> None:
    settings.QUICKSAVE_SNAPSHOT_EVERY = 40  # stored snapshots along the way, some of them removed
    thread = storage.create_thread(agent=agent)[0]
    main = long_history(thread, 300)
    fork_point = main[136]  # seq 137
    storage.start_branch(thread=thread, at=fork_point, name="alt")
    alt = long_history(thread, 40, start=fork_point, branch="alt")
    approval = request_approval(thread=thread, checkpoint=main[149], action="book", args={"flight": "LH 400"})
    ApprovalRequest.objects.filter(pk=approval.pk).update(status=ApprovalStatus.APPROVED)
    run = Run.objects.create(agent=agent, thread=thread, checkpoint=main[204], reason=RunReason.APPROVAL,
                             status=RunStatus.COMPLETED)  # fmt: skip
    put_tool_result(thread=thread, key="quote-1", result={"price": 420}, tool="quote", checkpoint=main[222].pk)
    Thread.objects.filter(pk=thread.pk).update(status=ThreadStatus.COMPLETED)
    assert Checkpoint.objects.filter(thread=thread, kind=PayloadKind.SNAPSHOT).count() >= 8
    before = every_state(thread)
    assert len(before) == 340

    result = compaction.compact_thread(thread=thread, keep_every=10)

    # seqs 1, 11, …, 291 of main and 1, 11, 21, 31 of alt; both heads; the fork point (137),
    # the approval's checkpoint (150) and the run's (205).
    expected = {c.pk for c in main if (c.seq - 1) % 10 == 0} | {c.pk for c in alt if (c.seq - 1) % 10 == 0}
    expected |= {main[-1].pk, alt[-1].pk, fork_point.pk, main[149].pk, main[204].pk}
    assert len(expected) == 39
    remaining = set(Checkpoint.objects.filter(thread=thread).values_list("pk", flat=True))
    assert remaining == expected
    assert result.removed == 340 - 39 and result.bytes_freed > 0
    stored = {pk: (branch, seq, kind, length) for pk, branch, seq, kind, length in Checkpoint.objects.filter(
        thread=thread).values_list("pk", "branch__name", "seq", "kind", "chain_length")}  # fmt: skip
    # Relinked rows became deltas across the gaps where a snapshot did not pay (the store reads those
    # chains as a seq range) and snapshots where it did; on the fork, chains cross the fork point.
    assert any(b == "main" and k == PayloadKind.DELTA and length >= 20 for b, _, k, length in stored.values())
    assert any(b == "main" and k == PayloadKind.SNAPSHOT and seq > 1 for b, seq, k, _ in stored.values())
    assert any(b == "alt" and k == PayloadKind.DELTA and length >= seq > 1 for b, seq, k, length in stored.values())
    after = every_state(thread)
    assert after == {pk: before[pk] for pk in expected}
    assert list(verify_thread(thread)) == []
    out = io.StringIO()
    call_command("verify_integrity", "--thread", str(thread.pk), stdout=out)
    assert "OK" in out.getvalue()
    assert ApprovalRequest.objects.get(pk=approval.pk).checkpoint_id == main[149].pk
    assert Run.objects.get(pk=run.pk).checkpoint_id == main[204].pk
    assert ToolResult.objects.get(thread=thread, key="quote-1").checkpoint_id is None
    thread.refresh_from_db()
    assert thread.head_id == main[-1].pk

    # A compacted thread exports, and imports into a thread with the same states.
    copy = import_thread(file=io.BytesIO(b"".join(export.export_lines(thread))), agent=agent, external_id="copy")
    in_order = ("branch__created_at", "branch_id", "seq")
    copied = [storage.state_at(c) for c in Checkpoint.objects.filter(thread=copy).order_by(*in_order)]
    assert copied == [before[pk] for pk in Checkpoint.objects.filter(thread=thread).order_by(*in_order).values_list(
        "pk", flat=True)]  # fmt: skip

    # The store goes on from the compacted rows: appends on both branches, a new fork, fresh reads.
    head = storage.append_checkpoint(thread=thread, parent=main[-1], patch=[{"op": "replace", "path": "/step", "value":
                                                                            999}])  # fmt: skip
    alt_head = storage.append_checkpoint(thread=thread, parent=alt[-1], state={"restart": True})
    storage.start_branch(thread=thread, at=main[150], name="late")
    late = storage.append_checkpoint(thread=thread, parent=main[150], branch="late",
                                     patch=[{"op": "add", "path": "/late", "value": 1}])  # fmt: skip
    storage.clear_caches()
    assert storage.state_at(head) == {**before[main[-1].pk], "step": 999}
    assert storage.state_at(alt_head) == {"restart": True}
    assert storage.state_at(late) == {**before[main[150].pk], "late": 1}
    assert list(verify_thread(thread)) == []


def test_compacting_again_with_the_same_n_changes_nothing(agent: Agent) -> None:
    thread = storage.create_thread(agent=agent)[0]
    long_history(thread, 60)
    Thread.objects.filter(pk=thread.pk).update(status=ThreadStatus.COMPLETED)
    first = compaction.compact_thread(thread=thread, keep_every=7)
    rows = rows_of(thread)

    again = compaction.compact_thread(thread=thread, keep_every=7)

    assert first.removed > 0 and again.removed == 0
    assert rows_of(thread) == rows


def test_compaction_leaves_the_events_of_the_checkpoints_it_rewrites_and_removes_as_published(agent: Agent) -> None:
    thread = storage.create_thread(agent=agent)[0]
    long_history(thread, 40)
    Thread.objects.filter(pk=thread.pk).update(status=ThreadStatus.COMPLETED)
    before = storage.events_after(thread_id=thread.pk, seq=0, limit=100)

    result = compaction.compact_thread(thread=thread, keep_every=7)

    after = storage.events_after(thread_id=thread.pk, seq=0, limit=100)
    assert result.removed > 0 and len(after) == len(before) + 1  # and thread.compacted
    assert after[: len(before)] == before


def test_a_thread_with_a_tampered_row_is_not_compacted(agent: Agent) -> None:
    thread = storage.create_thread(agent=agent)[0]
    written = long_history(thread, 40)
    Thread.objects.filter(pk=thread.pk).update(status=ThreadStatus.COMPLETED)
    Checkpoint.objects.filter(pk=written[20].pk).update(label="edited behind Quicksave's back")
    rows = rows_of(thread)

    with pytest.raises(compaction.CompactionRefused, match="fails its integrity check"):
        compaction.compact_thread(thread=thread, keep_every=5)

    assert rows_of(thread) == rows  # a recomputed MAC would have hidden the edit


def test_running_and_waiting_threads_are_not_compacted_even_when_long_and_old(agent: Agent) -> None:
    retention.set_policy(agent=agent, completed_days=1, failed_days=1, compact_after=10, keep_every=3)
    busy = []
    for status in (ThreadStatus.RUNNING, ThreadStatus.WAITING_FOR_APPROVAL):
        thread = storage.create_thread(agent=agent)[0]
        long_history(thread, 30)
        Thread.objects.filter(pk=thread.pk).update(status=status, updated_at=timezone.now() - timedelta(days=90))
        busy.append((thread, rows_of(thread)))

    report = retention.prune()

    assert (report.threads_deleted, report.threads_compacted, report.checkpoints_removed) == (0, 0, 0)
    for thread, rows in busy:
        assert rows_of(thread) == rows
        with pytest.raises(compaction.CompactionRefused, match="left alone"):
            compaction.compact_thread(thread=thread, keep_every=3)


def test_prune_compacts_a_thread_only_once_it_has_been_idle_for_a_while(agent: Agent, settings: Any) -> None:
    settings.QUICKSAVE_COMPACT_IDLE_HOURS = 24
    retention.set_policy(agent=agent, compact_after=10, keep_every=3)
    thread = storage.create_thread(agent=agent)[0]
    long_history(thread, 30)
    Thread.objects.filter(pk=thread.pk).update(
        status=ThreadStatus.COMPLETED, updated_at=timezone.now() - timedelta(hours=23)
    )

    assert retention.prune().threads_compacted == 0

    Thread.objects.filter(pk=thread.pk).update(updated_at=timezone.now() - timedelta(hours=25))
    assert retention.prune().threads_compacted == 1
    assert Checkpoint.objects.filter(thread=thread).count() == 10 + 1  # seqs 1, 4, …, 28 and the head


def test_compaction_keeps_the_age_of_the_thread(agent: Agent) -> None:
    thread = storage.create_thread(agent=agent)[0]
    long_history(thread, 30)
    old = timezone.now() - timedelta(days=3)
    Thread.objects.filter(pk=thread.pk).update(status=ThreadStatus.COMPLETED, updated_at=old)

    compaction.compact_thread(thread=thread, keep_every=4)

    assert Thread.objects.get(pk=thread.pk).updated_at == old
    assert thread.events.filter(type="thread.compacted").exists()  # the live page refreshes


def test_compaction_drops_the_materialised_heads_it_made_stale(agent: Agent) -> None:
    thread = storage.create_thread(agent=agent)[0]
    written = long_history(thread, 32)  # a head far enough from its snapshot that a read saves it
    Thread.objects.filter(pk=thread.pk).update(status=ThreadStatus.PAUSED)
    a_fresh_process()
    head, state = storage.latest_state(thread=thread)  # saves the head's state, bound to its MAC
    assert head == written[-1].pk and MaterialisedHead.objects.filter(checkpoint_id=head).exists()

    compaction.compact_thread(thread=thread, keep_every=4)

    assert not MaterialisedHead.objects.filter(branch__thread=thread).exists()
    a_fresh_process()  # another server: it must learn the head's new MAC from PostgreSQL
    after = storage.append_checkpoint(thread=thread, parent=head, patch=[{"op": "add", "path": "/resumed", "value": 1}])
    a_fresh_process()
    assert storage.state_at(after) == {**state, "resumed": 1}
    assert list(verify_thread(thread)) == []


# --------------------------------------------------------------------------- commands and audit


def test_prune_command_shows_progress_and_a_summary(agent: Agent) -> None:
    retention.set_policy(agent=agent, completed_days=5, compact_after=20, keep_every=4)
    for _ in range(3):
        finished(agent, status=ThreadStatus.COMPLETED, days_old=6)
    thread = storage.create_thread(agent=agent)[0]
    long_history(thread, 41)
    Thread.objects.filter(pk=thread.pk).update(
        status=ThreadStatus.FAILED, updated_at=timezone.now() - timedelta(days=2)
    )
    out, err = io.StringIO(), io.StringIO()

    call_command("prune", stdout=out, stderr=err)

    progress = err.getvalue().splitlines()
    assert progress[0].startswith("prune [------------------------------]   0% 0/4 threads")
    assert progress[-1] == "prune [##############################] 100% 4/4 threads"
    assert len(progress) == 5  # one line per thread here: each is a quarter of the way
    summary = out.getvalue()
    assert "threads deleted:     3" in summary
    assert "threads compacted:   1" in summary
    assert "checkpoints removed: 39" in summary  # 9 in deleted threads, 41 - 11 compacted away
    assert "bytes freed:" in summary


def test_prune_records_one_audit_entry_with_its_counts(agent: Agent) -> None:
    retention.set_policy(agent=agent, failed_days=2)
    doomed = finished(agent, status=ThreadStatus.FAILED, days_old=3)

    call_command("prune", stdout=io.StringIO(), stderr=io.StringIO())
    call_command("prune", "--dry-run", stdout=io.StringIO(), stderr=io.StringIO())

    entry = AuditEntry.objects.get(action="retention.prune")
    assert entry.actor is None
    assert entry.actor_name.startswith("cli:")
    assert entry.after["threads_deleted"] == 1
    assert entry.after["checkpoints_removed"] == 3
    assert entry.after["bytes_freed"] > 0
    assert entry.after["deleted_threads"] == [str(doomed.pk)]


def test_retention_command_shows_and_sets_the_policy(agent: Agent) -> None:
    out = io.StringIO()
    call_command("retention", "travel", stdout=out)
    assert "Completed threads are kept forever." in out.getvalue()
    assert "Histories are never compacted." in out.getvalue()

    out = io.StringIO()
    call_command("retention", "travel", "--completed-days", "30", "--failed-days", "90", "--compact-after", "500",
                 "--keep-every", "10", stdout=out)  # fmt: skip

    agent.refresh_from_db()
    assert retention.Policy.of(agent) == retention.Policy(30, 90, 500, 10)
    assert "Completed threads are deleted 30 days after their last update." in out.getvalue()
    assert "more than 500 checkpoints keep every 10th checkpoint" in out.getvalue()
    entry = AuditEntry.objects.get(action="retention.policy")
    assert entry.before["completed_days"] is None and entry.after["keep_every"] == 10

    call_command("retention", "travel", "--failed-days", "forever", "--compact-after", "never", stdout=io.StringIO())
    agent.refresh_from_db()
    assert retention.Policy.of(agent) == retention.Policy(30, None, None, None)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--completed-days", "ten"], "--completed-days takes a whole number, or 'forever'; got 'ten'."),
        (["--failed-days", "0"], "Days to keep failed threads (--failed-days) must be a whole number of days from 1"),
        (["--completed-days", "99999"], "from 1 to 36500; got 99999."),
        (["--compact-after", "100", "--keep-every", "1"], "must be at least 2: keeping every checkpoint is no"),
        (["--keep-every", "5"], "(--compact-after) is needed before keeping every Nth checkpoint"),
        (["--compact-after", "100"], "(--keep-every) is needed with compaction after 100 checkpoints"),
        (["--compact-after", "never", "--keep-every", "3"], "cannot be set while compaction is being turned off"),
        (["--keep-every", "-3"], "--keep-every takes a whole number; got '-3'."),
        (["--completed-days", "\u00b2"], "--completed-days takes a whole number, or 'forever'; got '\u00b2'."),
        (["--failed-days", "\u0663"], "--failed-days takes a whole number, or 'forever'; got '\u0663'."),
        (["--compact-after", "9" * 5000], "--compact-after is out of range: got a number of 5000 digits."),
        (["--completed-days", "0" * 30 + "99999"], "from 1 to 36500; got 99999."),
    ],
)
def test_retention_command_refuses_bad_values_precisely(agent: Agent, args: list[str], message: str) -> None:
    with pytest.raises(CommandError) as refused:
        call_command("retention", "travel", *args, stdout=io.StringIO())

    assert message in str(refused.value)
    agent.refresh_from_db()
    assert retention.Policy.of(agent) == retention.Policy()
    assert not AuditEntry.objects.filter(action="retention.policy").exists()


def test_retention_command_names_the_agents_it_knows(agent: Agent) -> None:
    with pytest.raises(CommandError, match=r"No agent named 'nobody'\. Agents: travel\."):
        call_command("retention", "nobody", stdout=io.StringIO())


def test_bytes_freed_is_what_the_payload_column_lost(agent: Agent) -> None:
    """Bytes freed is the change in the payload column, as PostgreSQL measures it."""
    thread = storage.create_thread(agent=agent)[0]
    long_history(thread, 50)
    Thread.objects.filter(pk=thread.pk).update(status=ThreadStatus.CANCELLED)

    def stored() -> int:
        with connection.cursor() as cursor:
            cursor.execute("SELECT sum(octet_length(payload)) FROM checkpoints_checkpoint WHERE thread_id = %s",
                           [thread.pk])  # fmt: skip
            return int(cursor.fetchone()[0])

    before = stored()
    result = compaction.compact_thread(thread=thread, keep_every=5)

    assert result.bytes_before == before
    assert before - stored() == result.bytes_freed > 0


def test_compaction_keeps_large_values_and_prune_collects_those_left_behind(agent: Agent, settings: Any) -> None:
    settings.QUICKSAVE_OFFLOAD_BYTES = 2048
    settings.QUICKSAVE_BLOB_GRACE_SECONDS = 0  # the blobs were all used moments ago
    retention.set_policy(agent=agent, compact_after=10, keep_every=5)
    thread = storage.create_thread(agent=agent)[0]
    parent = storage.append_checkpoint(thread=thread, parent=None, state={"step": 0, "attachment": "v0 " * 1000})
    for i in range(1, 21):
        ops: list[dict[str, Any]] = [{"op": "replace", "path": "/step", "value": i}]
        if i % 4 == 0:
            ops.append({"op": "replace", "path": "/attachment", "value": f"v{i} " * 1000})
        parent = storage.append_checkpoint(thread=thread, parent=parent, patch=ops)
    Thread.objects.filter(pk=thread.pk).update(
        status=ThreadStatus.COMPLETED, updated_at=timezone.now() - timedelta(days=2)
    )
    assert Blob.objects.filter(thread=thread).count() == 6  # v0, v4, v8, v12, v16, v20
    before = every_state(thread)

    report = retention.prune()

    # Seqs 1, 6, 11, 16 and 21 hold v0, v4, v8, v12 and v20: nothing refers to v16 any more.
    assert report.checkpoints_removed == 16 and report.blobs_removed == 1
    assert Blob.objects.filter(thread=thread).count() == 5
    after = every_state(thread)
    assert after == {pk: before[pk] for pk in after}
    assert list(verify_thread(thread)) == []


def test_another_process_with_stale_cached_nodes_reads_and_appends_correctly_after_compaction(
    agent: Agent,
) -> None:
    thread = storage.create_thread(agent=agent)[0]
    written = long_history(thread, 60)
    head = written[-1]
    Thread.objects.filter(pk=thread.pk).update(status=ThreadStatus.COMPLETED)
    storage.clear_caches()
    expected = storage.state_at(head)
    # What another server process holds: the head and a middle checkpoint as they were before.
    stale = [storage.load_node(head.pk), storage.load_node(written[31].pk)]
    compaction.compact_thread(thread=thread, keep_every=7)
    assert Checkpoint.objects.get(pk=head.pk).integrity != stale[0].integrity  # the head's chain was rewritten

    for node in stale:
        nodes.states.put(node.id, node)  # the other process never heard of the compaction
    assert storage.state_at(head) == expected
    after = storage.append_checkpoint(
        thread=thread, parent=head, patch=[{"op": "replace", "path": "/step", "value": 99}]
    )
    storage.clear_caches()
    assert storage.state_at(after) == {**expected, "step": 99}
    assert list(verify_thread(Thread.objects.get(pk=thread.pk))) == []


@pytest.mark.django_db(transaction=True)
def test_an_append_racing_the_compaction_of_its_parent_chains_from_the_rewritten_parent(
    agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    thread = storage.create_thread(agent=agent)[0]
    head = long_history(thread, 30)[-1]
    Thread.objects.filter(pk=thread.pk).update(status=ThreadStatus.COMPLETED)
    applied, release = threading.Event(), threading.Event()
    check_result = compaction._check_result

    def held_open(kept: Any) -> None:  # the compaction has rewritten its rows but not committed
        applied.set()
        release.wait(10)
        check_result(kept)

    monkeypatch.setattr(compaction, "_check_result", held_open)
    appended: list[Any] = []

    def compact() -> None:
        try:
            compaction.compact_thread(thread=thread, keep_every=5)
        finally:
            connection.close()

    def append() -> None:
        try:
            appended.append(storage.append_checkpoint(thread=thread, parent=head.pk, patch=[
                {"op": "replace", "path": "/step", "value": 99}]))  # fmt: skip
        except Exception as exc:  # the assertion below shows it
            appended.append(exc)
        finally:
            connection.close()

    compacting = threading.Thread(target=compact)
    compacting.start()
    assert applied.wait(10)
    writer = threading.Thread(target=append)
    writer.start()
    writer.join(0.5)
    release.set()
    compacting.join(10)
    writer.join(10)

    (child,) = appended
    assert isinstance(child, Checkpoint), child
    assert child.parent_id == head.pk
    assert list(verify_thread(Thread.objects.get(pk=thread.pk))) == []
    storage.clear_caches()
    assert storage.state_at(child.pk)["step"] == 99
