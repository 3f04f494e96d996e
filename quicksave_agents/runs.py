"""The run queue: resume jobs claimed under a lease by workers and external agents.

Claims use `SELECT ... FOR UPDATE SKIP LOCKED`, so any number of workers share the
queue without blocking each other. A claim holds a lease; the holder renews it with
heartbeats, and a run whose lease ran out (its worker died) is claimed again.
Enqueuing sends a PostgreSQL NOTIFY on `quicksave_runs`, delivered at commit, so
idle workers wake at once instead of polling.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db import connection, transaction
from django.db.models import CharField, Count, Max, Min, QuerySet
from django.db.models.functions import Cast
from django.utils import timezone

from checkpoints.models import Checkpoint, Thread
from checkpoints.storage import record_event
from quicksave import metrics, telemetry
from quicksave.errors import DomainError
from quicksave.listen import Listener
from quicksave_agents.fencing import Fence, LeaseLost
from quicksave_agents.models import Agent, Run, RunReason, RunStatus

CHANNEL = "quicksave_runs"


class RunFinished(DomainError):
    code = "run_finished"
    status = 409


def enqueue_run(*, thread: Thread, checkpoint: Checkpoint, reason: str, approval: Any = None) -> Run:
    """Queue a resume of `thread` from `checkpoint`; call inside the transaction that causes it."""
    # The run carries the trace of the request that queued it (a decision, a fork), so the resume
    # that claims it continues that trace in another process.
    run = Run.objects.create(
        agent_id=thread.agent_id, thread=thread, checkpoint=checkpoint, reason=reason, approval=approval,
        trace_context=telemetry.current_carrier(),
    )  # fmt: skip
    transaction.on_commit(metrics.runs_queued_total.labels(reason=reason).inc)
    record_event(thread=thread, type="run.queued", data={"run": str(run.pk), "reason": reason,
                                                         "checkpoint": str(checkpoint.pk)})  # fmt: skip
    agent_name = Agent.objects.values_list("name", flat=True).get(pk=thread.agent_id)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, %s)", [CHANNEL, agent_name])
    return run


def claim_run(*, agents: Iterable[Agent], worker: str, lease_seconds: int | None = None) -> Run | None:
    """Claim the oldest open run of any of `agents`, or None: a queued run, or one whose lease expired."""
    agent_ids = [agent.pk for agent in agents]
    if not agent_ids:
        return None
    lease = timedelta(seconds=lease_seconds or settings.QUICKSAVE_RUN_LEASE_SECONDS)
    with transaction.atomic():
        now = timezone.now()
        run = (
            Run.objects.select_for_update(skip_locked=True)
            .filter(agent_id__in=agent_ids, status__in=[RunStatus.QUEUED, RunStatus.RUNNING])
            .exclude(status=RunStatus.RUNNING, lease_expires_at__gt=now)
            .order_by("created_at")
            .first()
        )
        if run is None:
            return None
        recovered = run.status == RunStatus.RUNNING
        run.status = RunStatus.RUNNING
        run.attempts += 1
        run.claimed_by = worker
        run.lease_expires_at = now + lease
        run.started_at = run.started_at or now
        run.save(update_fields=["status", "attempts", "claimed_by", "lease_expires_at", "started_at"])
        record_event(
            thread=run.thread_id,
            type="run.claimed",
            data={"run": str(run.pk), "worker": worker, "attempt": run.attempts, "recovered": recovered},
        )
    _count_claim(run, recovered=recovered, claimed_at=now)
    return run


def _count_claim(run: Run, *, recovered: bool, claimed_at: datetime) -> None:
    """Metrics of a committed claim: a first claim measures the queue's wait (and, for a decided
    approval, decision to resume: the run is queued in the decision's transaction)."""
    metrics.runs_claimed_total.labels(reason=run.reason).inc()
    if recovered:
        metrics.runs_lost_total.inc()
    elif run.attempts == 1:
        waited = max(0.0, (claimed_at - run.created_at).total_seconds())
        metrics.run_queue_wait_seconds.labels(reason=run.reason).observe(waited)
        if run.reason == RunReason.APPROVAL:
            metrics.decision_to_resume_seconds.observe(waited)


def fence_of(run: Run) -> Fence:
    """The fence of the claim that gave `run` its current attempt."""
    return Fence(run.pk, run.attempts)


def heartbeat(*, run: Run, worker: str, lease_seconds: int | None = None, fence: Fence | None = None) -> Run:
    """Extend the lease of a run this worker holds; LeaseLost if it is no longer ours.

    With a `fence`, only that attempt's lease is extended: two holders of one agent key look
    the same by name, not by attempt.
    """
    lease = timedelta(seconds=lease_seconds or settings.QUICKSAVE_RUN_LEASE_SECONDS)
    mine = Run.objects.filter(pk=run.pk, status=RunStatus.RUNNING, claimed_by=worker)
    if fence is not None:
        mine = mine.filter(attempts=fence.attempt)
    updated = mine.update(lease_expires_at=timezone.now() + lease)
    if not updated:
        raise LeaseLost(f"Run {run.pk} is no longer held by {worker}.", detail={"run": str(run.pk)})
    run.refresh_from_db()
    return run


def finish_run(*, run: Run, worker: str, status: str, error: str = "", fence: Fence | None = None) -> Run:
    """Close a run this worker holds as completed, failed or cancelled (its thread was cancelled).

    With a `fence`, only that attempt may close it: LeaseLost once another attempt claimed it.
    """
    if status not in (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED):
        raise ValueError(f"a run finishes as completed, failed or cancelled, not {status!r}")
    with transaction.atomic():
        locked = Run.objects.select_for_update().get(pk=run.pk)
        if locked.status != RunStatus.RUNNING:
            raise RunFinished(f"Run {run.pk} is already {locked.status}.", detail={"status": locked.status})
        if locked.claimed_by != worker or (fence is not None and fence.attempt != locked.attempts):
            raise LeaseLost(f"Run {run.pk} is held by another worker now.", detail={"run": str(run.pk)})
        locked.status = status
        locked.error = error[:10_000]
        locked.finished_at = timezone.now()
        locked.lease_expires_at = None
        locked.save(update_fields=["status", "error", "finished_at", "lease_expires_at"])
        record_event(thread=locked.thread_id, type=f"run.{status}",
                     data={"run": str(locked.pk), "error": locked.error[:500]})  # fmt: skip
    return locked


def release_run(*, run: Run, worker: str, fence: Fence | None = None) -> Run:
    """Hand a run this worker holds back to the queue, at once and not when its lease runs out: the
    worker is stopping (SIGTERM) between two steps. The next claim, woken by NOTIFY, goes on from
    the last checkpoint the run committed. LeaseLost when another attempt holds it now."""
    with transaction.atomic():
        locked = Run.objects.select_for_update().get(pk=run.pk)
        if (
            locked.status != RunStatus.RUNNING
            or locked.claimed_by != worker
            or (fence is not None and fence.attempt != locked.attempts)
        ):
            raise LeaseLost(f"Run {run.pk} is not held by {worker} any more.", detail={"run": str(run.pk)})
        locked.status = RunStatus.QUEUED
        locked.claimed_by = ""
        locked.lease_expires_at = None
        locked.save(update_fields=["status", "claimed_by", "lease_expires_at"])
        record_event(thread=locked.thread_id, type="run.released", data={"run": str(locked.pk), "worker": worker})
        agent_name = Agent.objects.values_list("name", flat=True).get(pk=locked.agent_id)
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, %s)", [CHANNEL, agent_name])
    return locked


@dataclass(frozen=True)
class Unclaimed:
    """An agent whose queued runs no worker has claimed for longer than the threshold."""

    agent: str
    runs: int
    threads: int
    since: datetime  # when the oldest of them was queued
    thread_id: UUID | None  # the thread, when only one thread waits (the warning links to it)


def unclaimed_runs(*, threads: QuerySet[Thread] | None = None, thread: Thread | None = None,
                   now: datetime | None = None) -> list[Unclaimed]:  # fmt: skip
    """Per agent, the runs still queued `QUICKSAVE_UNCLAIMED_RUN_SECONDS` after they were queued
    (no worker serves the agent, or every one is busy or down), longest wait first: one query on the
    open-runs index. Scoped to `thread`, or to the runs of `threads` (what the reader may see)."""
    cutoff = (now or timezone.now()) - timedelta(seconds=settings.QUICKSAVE_UNCLAIMED_RUN_SECONDS)
    queued = Run.objects.filter(status=RunStatus.QUEUED, created_at__lte=cutoff)
    if thread is not None:
        queued = queued.filter(thread_id=thread.pk)
    if threads is not None:
        queued = queued.filter(thread__in=threads)
    rows = (
        queued.order_by()
        .values("agent__name")
        .annotate(runs=Count("id"), threads=Count("thread_id", distinct=True), since=Min("created_at"),
                  some_thread=Max(Cast("thread_id", CharField())))
        .order_by("since", "agent__name")
    )  # fmt: skip
    return [
        Unclaimed(agent=row["agent__name"], runs=row["runs"], threads=row["threads"], since=row["since"],
                  thread_id=UUID(row["some_thread"]) if row["threads"] == 1 else None)
        for row in rows
    ]  # fmt: skip


def run_notifications() -> Listener:
    """A LISTEN for queued runs (see quicksave.listen): open it before looking for work."""
    return Listener(CHANNEL)


__all__ = [
    "LeaseLost", "RunFinished", "RunReason", "claim_run", "enqueue_run", "fence_of", "finish_run",
    "heartbeat", "release_run", "run_notifications", "unclaimed_runs",
]  # fmt: skip
