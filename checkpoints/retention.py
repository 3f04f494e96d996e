"""Retention: each agent's policy for how long finished threads are kept and when long histories
are compacted, and `prune`, which applies every agent's policy (`manage.py prune`).

Deleting goes through `storage.delete_thread` (which destroys the thread's data key). Compaction
keeps every Nth checkpoint of each branch, counted from its first, plus every checkpoint something
points at (branch heads, fork points, approvals, runs), and rewrites the rows after each gap so
that every remaining state still materialises and verifies:

- A kept checkpoint whose parent is removed is relinked to the previous kept checkpoint of its
  branch and stored as a delta against that checkpoint's state, or as a snapshot where the store
  itself would snapshot (the chain too long, or replaying it dearer than reading a snapshot).
- `chain_length` becomes the seq distance back to the chain's snapshot (plus the fork point's own
  for a chain that crosses a fork), so the store's range read, `seq - chain_length .. seq` on the
  branch, still finds exactly the chain's rows across the gaps, and a chain crossing a fork still
  has `chain_length >= seq`, so the store walks parent links for it. Appends keep both true.
- Integrity MACs chain over the parent's MAC, so every row after the first change on its path
  gets a new MAC, computed parent before child. Rows whose path lost nothing keep theirs.

Rows are only ever verified before they are rewritten: a thread with a row that fails its MAC
is refused, so compaction never launders a tampered row. This module decides what is kept and
how; the storage engine (`storage.rewrite_chain`) computes the MACs, writes the rows and drops
the cached states, as the one writer of the integrity chain. Other processes' in-memory caches
cannot be reached from here; see `compact_thread`.
"""

from __future__ import annotations

import hashlib
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
from checkpoints.models import Branch, Checkpoint, PayloadKind, Thread, ThreadStatus
from checkpoints.storage import codec, crypto
from checkpoints.storage.jsonpatch import PatchError, apply_patch, json_equal, make_patch
from quicksave.errors import DomainError
from quicksave_agents.models import Agent, Run, RunStatus

log = logging.getLogger(__name__)

MAX_DAYS = 36500
MAX_COUNT = 2**31 - 1
# A thread in these states is being worked on or waits for a person: retention never touches it.
BUSY_STATUSES = (ThreadStatus.RUNNING, ThreadStatus.WAITING_FOR_APPROVAL)
COMPACTABLE_STATUSES = (ThreadStatus.COMPLETED, ThreadStatus.FAILED, ThreadStatus.CANCELLED, ThreadStatus.PAUSED)


class InvalidPolicy(DomainError):
    code = "invalid_retention_policy"
    status = 400


class CompactionRefused(DomainError):
    """The thread cannot be compacted now (busy, or a row fails its integrity check)."""

    code = "compaction_refused"
    status = 409


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
    report.blobs_removed = collected.rows + collected.files
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


# --------------------------------------------------------------------------- compaction


@dataclass(frozen=True, slots=True)
class Compaction:
    """What compacting one thread did (or would do)."""

    thread_id: UUID
    removed: int = 0
    rewritten: int = 0  # kept rows stored anew: relinked, or turned into a snapshot
    remacked: int = 0  # kept rows whose MAC or chain changed (the rewritten ones included)
    bytes_before: int = 0
    bytes_after: int = 0

    @property
    def bytes_freed(self) -> int:
        return self.bytes_before - self.bytes_after


@dataclass(slots=True)
class _Kept:
    """A kept checkpoint as it will be stored."""

    id: UUID
    branch_id: int
    seq: int
    parent_id: UUID | None
    kind: int
    payload: bytes
    chain_length: int
    chain_bytes: int
    digest: bytes  # SHA-256 of the state's canonical JSON, to check the result
    rewritten: bool
    row: Checkpoint

    def relinked(self) -> storage.Relinked:
        return storage.Relinked(
            row=self.row, parent_id=self.parent_id, kind=self.kind, payload=self.payload,
            chain_length=self.chain_length, chain_bytes=self.chain_bytes,
        )  # fmt: skip


def compact_thread(*, thread: Thread | UUID, keep_every: int, dry_run: bool = False) -> Compaction:
    """Keep every `keep_every`-th checkpoint of each branch (seq 1, 1 + N, 1 + 2N…) plus branch
    heads, fork points and the checkpoints approvals and runs refer to; remove the rest.

    One transaction under the thread's row lock, so the thread's status cannot change under it
    and writers that touch the thread row (appends, events) wait for it. Raises CompactionRefused
    for a thread that is busy (see BUSY_STATUSES) or has a row that fails its integrity check;
    nothing changes then. Compacting again with the same N removes nothing.

    Caches: the engine drops this process's states of the thread and the thread's materialised
    heads. Another process may still hold one of those rows in its in-memory state cache:
    reading a state from there stays right (states never change), and an append after it fails
    its parent-MAC check and retries from the stored row.
    """
    thread_id = thread.pk if isinstance(thread, Thread) else thread
    if isinstance(keep_every, bool) or not isinstance(keep_every, int) or keep_every < 2:
        raise InvalidPolicy(f"{LABELS['keep_every']} must be a whole number of checkpoints from 2; got {keep_every!r}.")
    with transaction.atomic():
        locked = Thread.objects.filter(pk=thread_id)
        row = (locked if dry_run else locked.select_for_update()).first()
        if row is None:
            raise CompactionRefused(f"Thread {thread_id} does not exist.")
        _check_idle(row)
        removed, kept_ids = _plan(row, keep_every)
        if not removed:
            return Compaction(thread_id)
        kept, bytes_before = _rewrite(row, removed=removed, kept_ids=kept_ids, seal=not dry_run)
        changed = storage.rewrite_chain(thread=row, kept=[k.relinked() for k in kept], removed=removed, dry_run=dry_run)
        result = Compaction(
            thread_id, removed=len(removed), rewritten=sum(k.rewritten for k in kept),
            remacked=len(changed) - len(removed), bytes_before=bytes_before,
            bytes_after=sum(len(k.payload) for k in kept),
        )  # fmt: skip
        if dry_run:
            return result
        _check_result(kept)
        storage.record_event(thread=row, type="thread.compacted", data={
            "removed": result.removed, "kept": len(kept), "keep_every": keep_every,
        })  # fmt: skip
        # Compaction is not activity: the thread keeps its age for the deletion rules.
        Thread.objects.filter(pk=thread_id).update(updated_at=row.updated_at)
    return result


def _check_idle(thread: Thread) -> None:
    if thread.status in BUSY_STATUSES:
        raise CompactionRefused(f"Thread {thread.pk} is {thread.get_status_display().lower()}; it is left alone.",
                                detail={"status": thread.status})  # fmt: skip
    if Run.objects.filter(thread=thread, status__in=[RunStatus.QUEUED, RunStatus.RUNNING]).exists():
        raise CompactionRefused(f"Thread {thread.pk} has a queued or running run; it is left alone.")
    if ApprovalRequest.objects.filter(thread=thread, status=ApprovalStatus.PENDING).exists():
        raise CompactionRefused(f"Thread {thread.pk} has a pending approval; it is left alone.")


def _plan(thread: Thread, keep_every: int) -> tuple[set[UUID], set[UUID]]:
    """(removed, kept) checkpoint ids, from the rows' positions and what refers to them."""
    rows = list(Checkpoint.objects.filter(thread=thread).order_by().values_list("id", "branch_id", "seq"))
    heads: dict[int, tuple[int, UUID]] = {}
    for checkpoint_id, branch_id, seq in rows:
        if branch_id not in heads or seq > heads[branch_id][0]:
            heads[branch_id] = (seq, checkpoint_id)
    referenced = {checkpoint_id for _, checkpoint_id in heads.values()}
    referenced.update(
        Branch.objects.filter(thread=thread, fork_point__isnull=False).values_list("fork_point_id", flat=True)
    )
    referenced.update(ApprovalRequest.objects.filter(checkpoint__thread=thread).values_list("checkpoint_id", flat=True))
    referenced.update(Run.objects.filter(checkpoint__thread=thread).values_list("checkpoint_id", flat=True))
    if thread.head_id is not None:
        referenced.add(thread.head_id)
    kept = {checkpoint_id for checkpoint_id, _, seq in rows if (seq - 1) % keep_every == 0} | referenced
    return {checkpoint_id for checkpoint_id, _, _ in rows} - kept, kept


def _branch_order(thread: Thread) -> list[tuple[int, UUID | None]]:
    """(branch id, fork point) with every branch after the branch its fork point is on."""
    branches = list(Branch.objects.filter(thread=thread).order_by("created_at", "id").values_list("id", "fork_point"))
    fork_branch = dict(
        Checkpoint.objects.filter(pk__in=[fp for _, fp in branches if fp is not None]).values_list("id", "branch_id")
    )
    ordered: list[tuple[int, UUID | None]] = []
    placed: set[int] = set()
    pending = branches
    while pending:
        ready = [(b, fp) for b, fp in pending if fp is None or fork_branch.get(fp) in placed]
        if not ready:
            raise CompactionRefused(f"Thread {thread.pk}'s branches do not form a tree; it is left alone.")
        ordered.extend(ready)
        placed.update(b for b, _ in ready)
        pending = [(b, fp) for b, fp in pending if b not in placed]
    return ordered


def _rewrite(thread: Thread, *, removed: set[UUID], kept_ids: set[UUID], seal: bool) -> tuple[list[_Kept], int]:
    """Every kept row as it will be stored, computed from the rows as they are (nothing is written),
    and the thread's payload bytes now. Each row's MAC is checked before anything is derived from it."""
    snapshot_every: int = settings.QUICKSAVE_SNAPSHOT_EVERY
    old_macs: dict[UUID, bytes] = {}
    old_chain_bytes: dict[UUID, int] = {}
    kept: dict[UUID, _Kept] = {}
    fork_points: dict[UUID, Any] = {}  # states of kept checkpoints a branch starts from
    branches = _branch_order(thread)
    starts = {fp for _, fp in branches if fp is not None}
    bytes_before = 0
    for branch_id, fork_point in branches:
        state: Any = fork_points.get(fork_point) if fork_point is not None else None
        previous: UUID | None = fork_point  # the line's last row, removed or not
        last_kept: tuple[UUID, Any] | None = (fork_point, state) if fork_point is not None else None
        rows = Checkpoint.objects.filter(thread=thread, branch_id=branch_id).order_by("seq")
        for row in rows.iterator(chunk_size=200):
            payload = bytes(row.payload)
            bytes_before += len(payload)
            parent_mac = old_macs.get(row.parent_id) if row.parent_id is not None else None
            if row.parent_id is not None and (parent_mac is None or row.parent_id != previous):
                raise CompactionRefused(
                    f"Checkpoint {row.pk} (seq {row.seq}) does not follow the row before it on its branch; "
                    "the thread is left alone."
                )
            if not storage.mac_matches(row, parent_integrity=parent_mac):
                raise CompactionRefused(
                    f"Checkpoint {row.pk} (seq {row.seq}) fails its integrity check; the thread is left alone "
                    "(run verify_integrity).",
                    detail={"checkpoint": str(row.pk)},
                )
            old_macs[row.pk] = bytes(row.integrity)
            old_chain_bytes[row.pk] = row.chain_bytes
            value = storage.decode_payload(row)
            if row.kind == PayloadKind.SNAPSHOT:
                state = value
            elif state is None:
                raise CompactionRefused(f"Checkpoint {row.pk} is a delta with nothing before it; the thread is left "
                                        "alone.")  # fmt: skip
            else:
                try:
                    state = apply_patch(state, value, measure=False).doc
                except PatchError as exc:
                    raise CompactionRefused(f"Checkpoint {row.pk}'s delta does not apply: {exc.message}") from None
            previous = row.pk
            if row.pk in removed:
                continue
            new = _kept_row(
                row, payload=payload, state=state, kept=kept, last_kept=last_kept, seal=seal,
                snapshot_every=snapshot_every, removed=removed,
                parent_chain_bytes=old_chain_bytes.get(row.parent_id, 0) if row.parent_id is not None else 0,
            )  # fmt: skip
            kept[row.pk] = new
            last_kept = (row.pk, state)
            if row.pk in starts:
                fork_points[row.pk] = state
    missing = kept_ids - kept.keys()
    if missing:
        raise CompactionRefused(f"{len(missing)} checkpoint(s) of thread {thread.pk} are on no branch line.")
    return list(kept.values()), bytes_before


def _kept_row(
    row: Checkpoint,
    *,
    payload: bytes,
    state: Any,
    kept: dict[UUID, _Kept],
    last_kept: tuple[UUID, Any] | None,
    seal: bool,
    snapshot_every: int,
    removed: set[UUID],
    parent_chain_bytes: int,
) -> _Kept:
    """How one kept row will be stored (its MAC is filled in by the caller)."""
    digest = hashlib.sha256(codec.to_canonical_bytes(state)).digest()
    relinked = row.parent_id is not None and row.parent_id in removed
    parent_id = (last_kept[0] if last_kept else None) if relinked else row.parent_id

    def keep(parent: UUID | None, kind: int, stored: bytes, length: int, chain_bytes: int, *, rewritten: bool) -> _Kept:
        return _Kept(row.pk, row.branch_id, row.seq, parent, kind, stored, length, chain_bytes, digest, rewritten, row)

    def chain_after(parent: _Kept, own_bytes: int) -> tuple[int, int]:
        # The seq distance back to the chain's snapshot; across a fork, the fork point's plus this seq,
        # so that chain_length >= seq sends the store's reader along parent links.
        step = row.seq - parent.seq if parent.branch_id == row.branch_id else row.seq
        return parent.chain_length + step, parent.chain_bytes + own_bytes

    def too_long(length: int, chain_bytes: int) -> bool:
        return length >= snapshot_every or chain_bytes * storage.REPLAY_COST_PER_BYTE > row.state_bytes

    def snapshot() -> _Kept:
        return keep(parent_id, PayloadKind.SNAPSHOT, _encode(row, state, seal), 0, 0, rewritten=True)

    if parent_id is None:
        if row.kind == PayloadKind.SNAPSHOT and not relinked:
            return keep(None, row.kind, payload, 0, 0, rewritten=False)
        return snapshot()
    parent = kept[parent_id]
    if not relinked:
        if row.kind == PayloadKind.SNAPSHOT:
            return keep(parent_id, row.kind, payload, 0, 0, rewritten=False)
        # The delta still applies (its parent's state is unchanged); only its chain may have grown.
        length, chain_bytes = chain_after(parent, row.chain_bytes - parent_chain_bytes)
        grew = (length, chain_bytes) != (row.chain_length, row.chain_bytes)
        if grew and too_long(length, chain_bytes):
            return snapshot()
        return keep(parent_id, row.kind, payload, length, chain_bytes, rewritten=False)
    assert last_kept is not None
    ops = make_patch(last_kept[1], state)
    try:
        exact = json_equal(apply_patch(last_kept[1], ops, measure=False).doc, state)
    except PatchError:
        exact = False
    length, chain_bytes = chain_after(parent, len(codec.to_canonical_bytes(ops)))
    if not exact or too_long(length, chain_bytes):
        return snapshot()
    return keep(parent_id, PayloadKind.DELTA, _encode(row, ops, seal), length, chain_bytes, rewritten=True)


def _encode(row: Checkpoint, value: Any, seal: bool) -> bytes:
    """The payload for `value`. A dry run writes nothing, not even an offloaded large value, so it
    seals without offloading: the size is exact unless a value above QUICKSAVE_OFFLOAD_BYTES is in it."""
    if seal:
        return storage.encode_payload(thread_id=row.thread_id, checkpoint_id=row.pk, value=value)
    return crypto.seal(row.thread_id, storage.payload_ad(row.pk), codec.encode(codec.to_canonical_bytes(value)))


def _check_result(kept: list[_Kept]) -> None:
    """Materialise, through the store, every kept row that ends a chain (the head of its line, or the
    row before a snapshot) and compare it with the state it had: each such replay checks every row
    of its chain, so together they check every kept row's MAC, link and delta."""
    continues = {k.parent_id for k in kept if k.kind == PayloadKind.DELTA}
    for k in kept:
        if k.id in continues:
            continue
        state = storage.load_node(k.id).state
        if hashlib.sha256(codec.to_canonical_bytes(state)).digest() != k.digest:
            raise storage.IntegrityFailure(f"Compaction would change checkpoint {k.id}'s state; nothing was changed.")
