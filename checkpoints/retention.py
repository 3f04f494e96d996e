"""Retention: each agent's policy for how long finished threads are kept and when long histories
are compacted, and `prune`, which applies every agent's policy (`manage.py prune`).

Deleting goes through `storage.delete_thread` (which destroys the thread's data key); compacting
one thread is `checkpoints.compaction.compact_thread`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db import DatabaseError, transaction
from django.db.models import Count, Exists, F, Func, OuterRef, Q, QuerySet, Subquery, Sum
from django.utils import timezone

from approvals.models import ApprovalRequest, ApprovalStatus
from audit import trail
from checkpoints import storage
from checkpoints.compaction import BUSY_STATUSES, CompactionRefused, compact_thread
from checkpoints.models import Checkpoint, Thread, ThreadStatus
from quicksave.errors import DomainError
from quicksave_agents.models import Agent, Run, RunStatus

log = logging.getLogger(__name__)

MAX_DAYS = 36500
MAX_COUNT = 2**31 - 1
COMPACTABLE_STATUSES = (ThreadStatus.COMPLETED, ThreadStatus.FAILED, ThreadStatus.CANCELLED, ThreadStatus.PAUSED)


class InvalidPolicy(DomainError):
    code = "invalid_retention_policy"
    status = 400


# --------------------------------------------------------------------------- policy


@dataclass(frozen=True, slots=True)
class Policy:
    """An agent's retention policy; None keeps forever / never compacts."""

    completed_days: int | None = None
    failed_days: int | None = None
    compact_after: int | None = None
    keep_every: int | None = None

    @classmethod
    def of(cls, agent: Agent) -> Policy:
        return cls(
            completed_days=agent.retain_completed_days,
            failed_days=agent.retain_failed_days,
            compact_after=agent.compact_after,
            keep_every=agent.compact_keep_every,
        )

    def as_json(self) -> dict[str, int | None]:
        return {
            "completed_days": self.completed_days,
            "failed_days": self.failed_days,
            "compact_after": self.compact_after,
            "keep_every": self.keep_every,
        }

    def describe(self) -> list[str]:
        """The policy in sentences, one per rule."""

        def kept(days: int | None, what: str) -> str:
            if days is None:
                return f"{what} threads are kept forever."
            return f"{what} threads are deleted {days} day{'s' if days != 1 else ''} after their last update."

        if self.compact_after is None or self.keep_every is None:
            compaction = "Histories are never compacted."
        else:
            compaction = (
                f"Threads with more than {self.compact_after} checkpoints keep every {_ordinal(self.keep_every)} "
                "checkpoint of each branch, plus branch heads, fork points and the checkpoints approvals and "
                "runs refer to."
            )
        return [kept(self.completed_days, "Completed"), kept(self.failed_days, "Failed"), compaction]


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


UNSET: Any = _Unset()
# How errors name each setting: in words, with the `manage.py retention` option that sets it.
LABELS = {
    "completed_days": "Days to keep completed threads (--completed-days)",
    "failed_days": "Days to keep failed threads (--failed-days)",
    "compact_after": "Checkpoints before compaction (--compact-after)",
    "keep_every": "Checkpoints kept when compacting (--keep-every)",
}


def set_policy(
    *,
    agent: Agent,
    completed_days: int | None = UNSET,
    failed_days: int | None = UNSET,
    compact_after: int | None = UNSET,
    keep_every: int | None = UNSET,
    actor_name: str | None = None,
) -> Policy:
    """Change the settings given (None: keep forever / never compact), check the result and
    audit the change. Raises InvalidPolicy naming the setting at fault; nothing changes then.

    Turning compaction off (`compact_after=None`) clears `keep_every` too.
    """

    def bad(name: str, message: str) -> InvalidPolicy:
        return InvalidPolicy(f"{LABELS[name]} {message}", detail={"field": name})

    def checked(name: str, value: Any, *, low: int, high: int, unit: str) -> int | None:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise bad(name, f"must be a whole number of {unit} from {low} to {high}; got {value!r}.")
        return value

    before = Policy.of(agent)
    changes: dict[str, int | None] = {}
    if completed_days is not UNSET:
        changes["completed_days"] = checked("completed_days", completed_days, low=1, high=MAX_DAYS, unit="days")
    if failed_days is not UNSET:
        changes["failed_days"] = checked("failed_days", failed_days, low=1, high=MAX_DAYS, unit="days")
    if compact_after is not UNSET:
        changes["compact_after"] = checked("compact_after", compact_after, low=1, high=MAX_COUNT, unit="checkpoints")
        if compact_after is None:
            if keep_every not in (UNSET, None):
                raise bad("keep_every", "cannot be set while compaction is being turned off.")
            changes["keep_every"] = None
    if keep_every is not UNSET and "keep_every" not in changes:
        if keep_every is not None and not isinstance(keep_every, bool) and keep_every == 1:
            raise bad("keep_every", "must be at least 2: keeping every checkpoint is no compaction.")
        changes["keep_every"] = checked("keep_every", keep_every, low=2, high=MAX_COUNT, unit="checkpoints")
    after = Policy(**{**before.as_json(), **changes})
    if after.compact_after is not None and after.keep_every is None:
        raise bad("keep_every", f"is needed with compaction after {after.compact_after} checkpoints: say which "
                                "checkpoints to keep, e.g. every 10th.")  # fmt: skip
    if after.keep_every is not None and after.compact_after is None:
        raise bad("compact_after", "is needed before keeping every Nth checkpoint: say how long a history may "
                                   "grow before it is compacted.")  # fmt: skip
    if after == before:
        return after
    with transaction.atomic():
        Agent.objects.filter(pk=agent.pk).update(
            retain_completed_days=after.completed_days, retain_failed_days=after.failed_days,
            compact_after=after.compact_after, compact_keep_every=after.keep_every,
        )  # fmt: skip
        trail.record(
            actor=None, actor_name=actor_name, action="retention.policy", target_type="agent", target_id=agent.name,
            before=before.as_json(), after=after.as_json(),
        )  # fmt: skip
    agent.refresh_from_db()
    return after


# --------------------------------------------------------------------------- prune


@dataclass(frozen=True, slots=True)
class Skipped:
    thread_id: UUID
    reason: str


@dataclass
class PruneReport:
    """What a prune run did (or, for a dry run, would do)."""

    dry_run: bool
    threads_deleted: int = 0
    threads_compacted: int = 0
    checkpoints_removed: int = 0
    checkpoints_rewritten: int = 0
    bytes_freed: int = 0
    blobs_removed: int = 0
    blob_bytes_freed: int = 0
    deleted: list[str] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    blob_error: str = ""

    def counts(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run,
            "threads_deleted": self.threads_deleted,
            "threads_compacted": self.threads_compacted,
            "checkpoints_removed": self.checkpoints_removed,
            "checkpoints_rewritten": self.checkpoints_rewritten,
            "bytes_freed": self.bytes_freed,
            "blobs_removed": self.blobs_removed,
            "blob_bytes_freed": self.blob_bytes_freed,
            "threads_skipped": len(self.skipped),
        }


Progress = Callable[[int, int], None]


def prune(
    *,
    dry_run: bool = False,
    now: datetime | None = None,
    progress: Progress | None = None,
    actor_name: str | None = None,
) -> PruneReport:
    """Apply every agent's retention policy: delete expired completed and failed threads, compact
    long histories, then collect blobs no checkpoint refers to any more.

    Never touches a thread that is running or waiting for approval, or has a queued or running
    run or a pending approval (each is checked again under the thread's row lock). A dry run
    changes nothing and reports the same counts a real run would. `progress(done, total)` is
    called after each thread. A real run is recorded in the audit trail (`retention.prune`).
    """
    now = now or timezone.now()
    report = PruneReport(dry_run=dry_run)
    deletions = list(_expired(now))
    doomed = {thread_id for thread_id, _ in deletions}
    compactions = [(thread_id, every) for thread_id, every in _compactable(now) if thread_id not in doomed]
    total, done = len(deletions) + len(compactions), 0
    if progress is not None:
        progress(0, total)
    for thread_id, expired in deletions:
        freed = _delete_expired(thread_id, expired=expired, dry_run=dry_run)
        if isinstance(freed, Skipped):
            report.skipped.append(freed)
        else:
            report.threads_deleted += 1
            report.checkpoints_removed += freed[0]
            report.bytes_freed += freed[1]
            report.deleted.append(str(thread_id))
        done += 1
        if progress is not None:
            progress(done, total)
    for thread_id, keep_every in compactions:
        try:
            result = compact_thread(thread=thread_id, keep_every=keep_every, dry_run=dry_run)
        except (CompactionRefused, storage.IntegrityFailure, DatabaseError) as exc:
            report.skipped.append(Skipped(thread_id, getattr(exc, "message", None) or str(exc)))
        else:
            if result.removed:
                report.threads_compacted += 1
                report.checkpoints_removed += result.removed
                report.checkpoints_rewritten += result.rewritten
                report.bytes_freed += result.bytes_freed
        done += 1
        if progress is not None:
            progress(done, total)
    _collect_blobs(report)
    if not dry_run:
        trail.record(
            actor=None, actor_name=actor_name, action="retention.prune", target_type="retention", target_id="prune",
            after={**report.counts(), "deleted_threads": report.deleted[:1000],
                   "skipped_threads": {str(s.thread_id): s.reason for s in report.skipped[:100]}},
        )  # fmt: skip
    return report


def _collect_blobs(report: PruneReport) -> None:
    try:
        collected = storage.collect_garbage(dry_run=report.dry_run, grace_seconds=settings.QUICKSAVE_BLOB_GRACE_SECONDS)
    except Exception as exc:  # a storage outage must not hide what prune already did
        log.exception("prune: collecting unreferenced blobs failed")
        report.blob_error = str(exc) or type(exc).__name__
        return
    report.blobs_removed = collected.rows + collected.files + collected.chunks
    report.blob_bytes_freed = collected.bytes


def _busy() -> Q:
    """Threads retention must not touch: working, waiting for a person, or with a run to do."""
    open_runs = Run.objects.filter(thread=OuterRef("pk"), status__in=[RunStatus.QUEUED, RunStatus.RUNNING])
    pending = ApprovalRequest.objects.filter(thread=OuterRef("pk"), status=ApprovalStatus.PENDING)
    return Q(status__in=BUSY_STATUSES) | Q(Exists(open_runs)) | Q(Exists(pending))


def _expired(now: datetime) -> Iterator[tuple[UUID, Q]]:
    """(thread id, the condition that makes it expired) for every thread past its agent's policy."""
    agents = Agent.objects.filter(Q(retain_completed_days__isnull=False) | Q(retain_failed_days__isnull=False))
    for agent in agents.order_by("name"):
        for status, days in ((ThreadStatus.COMPLETED, agent.retain_completed_days),
                             (ThreadStatus.FAILED, agent.retain_failed_days)):  # fmt: skip
            if days is None:
                continue
            expired = Q(agent=agent, status=status, updated_at__lt=now - timedelta(days=days))
            for thread_id in (
                Thread.objects.filter(expired)
                .exclude(_busy())
                .order_by("updated_at", "id")
                .values_list("id", flat=True)
            ):
                yield thread_id, expired


def _delete_expired(thread_id: UUID, *, expired: Q, dry_run: bool) -> tuple[int, int] | Skipped:
    """Delete one expired thread (checked again under its row lock); (checkpoints, payload bytes)."""
    with transaction.atomic():
        threads = Thread.objects.filter(expired, pk=thread_id).exclude(_busy())
        thread = threads.first() if dry_run else threads.select_for_update().first()
        if thread is None:
            return Skipped(thread_id, "it changed since prune looked at it (resumed, updated or deleted)")
        counts = Checkpoint.objects.filter(thread_id=thread_id).aggregate(
            checkpoints=Count("id"), bytes=Sum(Func(F("payload"), function="octet_length"))
        )
        if not dry_run:
            storage.delete_thread(thread)
    return counts["checkpoints"] or 0, counts["bytes"] or 0


def _compactable(now: datetime) -> Iterator[tuple[UUID, int]]:
    """(thread id, keep every) for threads whose history is longer than their agent's limit and that
    have been idle for QUICKSAVE_COMPACT_IDLE_HOURS: the longer a thread has been left alone, the less
    likely a server still holds its rows in memory (see compact_thread)."""
    idle_since = now - timedelta(hours=settings.QUICKSAVE_COMPACT_IDLE_HOURS)
    agents = Agent.objects.filter(compact_after__isnull=False, compact_keep_every__isnull=False)
    for agent in agents.order_by("name"):
        assert agent.compact_after is not None and agent.compact_keep_every is not None
        length = (
            Checkpoint.objects.filter(thread=OuterRef("pk")).order_by().values("thread").annotate(n=Count("*"))
        ).values("n")
        threads: QuerySet[Thread] = (
            Thread.objects.filter(agent=agent, status__in=COMPACTABLE_STATUSES, updated_at__lte=idle_since)
            .exclude(_busy())
            .annotate(length=Subquery(length))
            .filter(length__gt=agent.compact_after)
        )
        for thread_id in threads.order_by("updated_at", "id").values_list("id", flat=True):
            yield thread_id, agent.compact_keep_every
