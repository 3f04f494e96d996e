"""Compaction of one thread's history (`compact_thread`, which retention's `prune` runs under
each agent's policy). It keeps every Nth checkpoint of each branch, counted from its first, plus
every checkpoint something points at (branch heads, fork points, approvals, runs), and rewrites
the rows after each gap so that every remaining state still materialises and verifies:

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
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db import transaction

from approvals.models import ApprovalRequest, ApprovalStatus
from checkpoints import storage
from checkpoints.models import Branch, Checkpoint, PayloadKind, Thread, ThreadStatus
from checkpoints.storage import codec, crypto
from checkpoints.storage.jsonpatch import PatchError, apply_patch, json_equal, make_patch
from quicksave.errors import DomainError
from quicksave_agents.models import Run, RunStatus

# A thread in these states is being worked on or waits for a person: compaction (and retention's
# deletions) never touch it.
BUSY_STATUSES = (ThreadStatus.RUNNING, ThreadStatus.WAITING_FOR_APPROVAL)


class CompactionRefused(DomainError):
    """The thread cannot be compacted now (busy, or a row fails its integrity check)."""

    code = "compaction_refused"
    status = 409


class InvalidCompaction(DomainError):
    code = "invalid_compaction"
    status = 400


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
        raise InvalidCompaction(f"keep_every must be a whole number of checkpoints from 2; got {keep_every!r}.")
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
        return storage.needs_snapshot(chain_length=length, chain_bytes=chain_bytes, state_bytes=row.state_bytes,
                                      every=snapshot_every)  # fmt: skip

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
