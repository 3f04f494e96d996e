"""Admin-driven rewind, edit and branch: fork a thread from any checkpoint (its state edited or
not, the agent resumed or not), re-run from a checkpoint, resume a failed thread, cancel one.

Each action is one transaction that also writes its Event and its AuditEntry. A fork opens a
new branch whose first checkpoint (source `human`) follows the chosen checkpoint, and moves the
thread's head onto it. Older branches stay as they are: an agent still writing one lands there
(or gets StaleParent), never on the new branch, because a write follows its parent's branch.
A fork at a checkpoint a framework wrote is itself that framework's checkpoint: the framework's
integration registers a fork shaper (integrations.langgraph.forks for LangGraph).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from approvals.models import ApprovalRequest, ApprovalStatus
from approvals.services import InvalidApproval, cancel_pending
from audit import trail
from checkpoints import storage
from checkpoints.access import check_can_cancel, check_can_delete, check_can_fork
from checkpoints.models import Branch, Checkpoint, CheckpointSource, CheckpointStatus, Thread, ThreadStatus
from checkpoints.storage import codec
from checkpoints.storage.errors import InvalidPatch, InvalidState, NotFound, StateTooLarge
from checkpoints.storage.jsonpatch import PatchError, PatchTooLarge, apply_patch, validate_ops
from quicksave.errors import DomainError
from quicksave_agents.models import Run, RunReason, RunStatus
from quicksave_agents.runs import enqueue_run

REASON_MAX_CHARS = 2000
# The label names the checkpoint in headings, lists and the branch tree, so it carries only the
# start of the reason; the whole reason is in the checkpoint's metadata and the audit entry.
LABEL_CHARS = 60
# Branch names end up in URLs and on screen; keep them to what reads well in both.
BRANCH_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,99}")
GENERATED_PREFIX = "fork-"
# Decisions a person (or the expiry) made, which a fork may carry over to its resumed agent.
CARRYABLE = (ApprovalStatus.APPROVED, ApprovalStatus.REJECTED, ApprovalStatus.EXPIRED)
# A thread a person may resume from its head: it failed, or a fork left it paused at a human checkpoint.
RESUMABLE = (ThreadStatus.FAILED, ThreadStatus.PAUSED)
# The audit entry keeps the patch up to this size. A bigger one is not lost: the fork's new
# checkpoint stores exactly that patch, as its delta against the fork point.
AUDIT_PATCH_BYTES = 256 * 1024


@dataclass(frozen=True)
class ForkShape:
    """What makes a fork's checkpoint a framework's own, on top of the admin's edits."""

    ops: list[dict[str, Any]]  # applied after the admin's edits
    metadata: dict[str, Any]  # merged into the checkpoint's Quicksave metadata
    step: int | None


# Called with the fork point, its state and the edited state; returns None for a checkpoint
# the framework did not write.
ForkShaper = Callable[..., ForkShape | None]
_shapers: list[ForkShaper] = []


def register_fork_shaper(shaper: ForkShaper) -> None:
    """Make forks of a framework's checkpoints that framework's checkpoints too (an integration's
    AppConfig.ready calls this once; the core knows no framework)."""
    if shaper not in _shapers:
        _shapers.append(shaper)


def _shape(*, source: Checkpoint, before: dict[str, Any], after: dict[str, Any]) -> ForkShape | None:
    for shaper in _shapers:
        if shape := shaper(source=source, before=before, after=after):
            return shape
    return None


class InvalidFork(DomainError):
    """A field of a fork, cancel or resume request is missing or malformed."""

    code = "invalid"
    status = 400

    def __init__(self, message: str, *, field: str) -> None:
        super().__init__(message, detail={"field": field, "fields": {field: [message]}})


class BranchExists(DomainError):
    code = "branch_exists"
    status = 409


class InvalidThreadStatus(DomainError):
    """The thread's status does not allow this action (e.g. resuming a thread that has not failed)."""

    code = "invalid_thread_status"
    status = 409


class RunPending(DomainError):
    """The thread already has a run queued or in flight."""

    code = "run_pending"
    status = 409


@dataclass(frozen=True)
class ForkPlan:
    """What a fork would do, checked without writing anything (the confirmation page shows it)."""

    source: Checkpoint
    ops: list[dict[str, Any]]
    state: dict[str, Any]  # the new checkpoint's state; shared with the store's cache, never mutate it
    branch: str
    generated_name: bool
    resume: bool
    carry: ApprovalRequest | None
    pending_approvals: int
    queued_runs: int


def carryable_approvals(thread: Thread | UUID) -> QuerySet[ApprovalRequest]:
    """Decided approvals of a thread that a fork may carry over, newest first."""
    return (
        ApprovalRequest.objects.filter(thread=thread, status__in=CARRYABLE)
        .select_related("decided_by", "checkpoint__branch")
        .defer("checkpoint__payload")
        .order_by("-decided_at", "-created_at")
    )


def plan_fork(
    *,
    checkpoint: Checkpoint,
    reason: str,
    patch: list[dict[str, Any]] | None = None,
    branch: str | None = None,
    resume: bool = False,
    carry_approval: ApprovalRequest | UUID | str | None = None,
) -> ForkPlan:
    """Check a fork's input against the checkpoint and the thread as they are now; writes nothing.

    Raises what fork() would raise for the same input. The branch name it resolves can still be
    taken by someone else before the fork commits; fork() checks it again under the thread's lock.
    """
    _reason(reason)
    name = _branch_name(branch)
    ops, state = _edited_state(checkpoint, patch)
    carry = _carried(carry_approval, thread_id=checkpoint.thread_id, resume=resume)
    taken = set(Branch.objects.filter(thread_id=checkpoint.thread_id).values_list("name", flat=True))
    if name is not None and name in taken:
        raise _branch_exists(name, taken)
    return ForkPlan(
        source=checkpoint, ops=ops, state=state, branch=name or _free_name(taken), generated_name=name is None,
        resume=resume, carry=carry,
        pending_approvals=ApprovalRequest.objects.filter(
            thread_id=checkpoint.thread_id, status=ApprovalStatus.PENDING
        ).count(),
        queued_runs=Run.objects.filter(thread_id=checkpoint.thread_id, status=RunStatus.QUEUED).count(),
    )  # fmt: skip


def fork(
    *,
    checkpoint: Checkpoint,
    user: User,
    reason: str,
    patch: list[dict[str, Any]] | None = None,
    branch: str | None = None,
    resume: bool = False,
    carry_approval: ApprovalRequest | UUID | str | None = None,
    address: str | None = None,
) -> Checkpoint:
    """Start a new branch at `checkpoint`, headed by a human checkpoint with the state `patch` gives.

    The thread's head moves to the new branch. With `resume` a run continues the agent from the
    new checkpoint; `carry_approval` (a decided approval of this thread) hands that decision to
    the agent when it asks for the same action, instead of asking a person again. Approvals still
    pending and runs still queued belong to the branch being left, so they are cancelled. Returns
    the new checkpoint; everything is checked before anything is written, and written in one
    transaction.
    """
    return _fork(checkpoint=checkpoint, user=user, reason=reason, patch=patch, branch=branch, resume=resume,
                 carry_approval=carry_approval, address=address, action="thread.fork")  # fmt: skip


def rerun(*, checkpoint: Checkpoint, user: User, reason: str, address: str | None = None) -> Checkpoint:
    """Run the agent again from `checkpoint`, unedited: a fork with an empty patch that resumes."""
    return _fork(checkpoint=checkpoint, user=user, reason=reason, patch=[], branch=None, resume=True,
                 carry_approval=None, address=address, action="thread.rerun")  # fmt: skip


def _fork(
    *,
    checkpoint: Checkpoint,
    user: User,
    reason: str,
    patch: list[dict[str, Any]] | None,
    branch: str | None,
    resume: bool,
    carry_approval: ApprovalRequest | UUID | str | None,
    address: str | None,
    action: str,
) -> Checkpoint:
    check_can_fork(user)
    reason = _reason(reason)
    name = _branch_name(branch)
    ops, edited = _edited_state(checkpoint, patch)
    # A checkpoint a framework wrote forks into that framework's checkpoint, so its agent runs on from it.
    shape = _shape(source=checkpoint, before=storage.load_node(checkpoint.pk).state, after=edited)
    written_ops, step, framework_metadata = (
        (ops + shape.ops, shape.step, shape.metadata) if shape else (ops, checkpoint.step, {})
    )
    carry = _carried(carry_approval, thread_id=checkpoint.thread_id, resume=resume)
    source_branch = storage.get_branch_name(checkpoint.branch_id)
    status = CheckpointStatus.RUNNING if resume else CheckpointStatus.PAUSED
    with transaction.atomic():
        # The thread's row lock serialises forks of one thread (so a generated name is free
        # when it is used) and makes a concurrent agent write wait, then see the new active branch.
        thread = _locked(checkpoint.thread_id)
        taken = set(Branch.objects.filter(thread=thread).values_list("name", flat=True))
        if name is not None and name in taken:
            raise _branch_exists(name, taken)
        name = name or _free_name(taken)
        before = _thread_summary(thread)
        superseded = f"Superseded by the fork to branch {name}: {reason}"
        cancelled_approvals = _cancel_pending_approvals(thread, reason=superseded)
        cancelled_runs = _cancel_queued_runs(thread, reason=superseded)

        new_branch = storage.start_branch(thread=thread, at=checkpoint, name=name)
        # Activate the branch before appending to it: the store's one-statement write moves
        # thread.head, step and status only for a write on the active branch.
        thread.active_branch = new_branch
        thread.save(update_fields=["active_branch"])
        created = storage.append_checkpoint(
            thread=thread, parent=checkpoint, patch=written_ops, branch=name, step=step,
            label=_label("re-run" if action == "thread.rerun" else "fork", reason), status=status,
            metadata={"author": user.get_username(), "reason": reason, "forked_from": str(checkpoint.pk),
                      "edits": len(ops), **framework_metadata, **_environment(checkpoint)},
            schema_version=checkpoint.schema_version, source=CheckpointSource.HUMAN,
        )  # fmt: skip
        run = enqueue_run(thread=thread, checkpoint=created, reason=RunReason.FORK, approval=carry) if resume else None
        storage.record_event(thread=thread, type="branch.forked", data={
            "branch": name, "from_branch": source_branch, "fork_point": str(checkpoint.pk),
            "checkpoint": str(created.pk), "by": user.get_username(), "reason": reason,
            "run": str(run.pk) if run else None,
        })  # fmt: skip
        trail.record(
            actor=user, action=action, target_type="checkpoint", target_id=checkpoint.pk, thread=thread,
            reason=reason, before=before,
            after={
                "branch": name, "head": str(created.pk), "status": status, "fork_point": str(checkpoint.pk),
                "fork_point_branch": source_branch, "fork_point_seq": checkpoint.seq, **_audit_patch(ops),
                "resume": resume, "run": str(run.pk) if run else None,
                "carry_approval": str(carry.pk) if carry else None,
                "cancelled_approvals": cancelled_approvals, "cancelled_runs": cancelled_runs,
            },
            address=address, sealed=("patch",),
        )  # fmt: skip
    return created


def _environment(checkpoint: Checkpoint) -> dict[str, Any]:
    """The environment references the forked checkpoint recorded, carried to the fork's first
    checkpoint: a resume from it checks them (quicksave_agents.runtime, the SDK's `serve`)."""
    references = checkpoint.metadata.get("environment") if isinstance(checkpoint.metadata, dict) else None
    return {"environment": references} if references else {}


def resume_failed(*, thread: Thread, user: User, reason: str, address: str | None = None) -> Run:
    """Queue a run that continues a failed (or paused) thread from its head, as it is."""
    check_can_cancel(user)
    reason = _reason(reason)
    with transaction.atomic():
        locked = _locked(thread.pk, unless=resume_refusal)
        open_run = Run.objects.filter(thread=locked, status__in=[RunStatus.QUEUED, RunStatus.RUNNING]).first()
        if open_run is not None:
            raise RunPending(
                f"Run {open_run.pk} is already {open_run.status} for this thread; wait for it to finish.",
                detail={"run": str(open_run.pk), "status": open_run.status},
            )
        assert locked.head_id is not None  # resume_refusal says so otherwise
        head = Checkpoint.objects.defer("payload").get(pk=locked.head_id)
        before = _thread_summary(locked)
        Thread.objects.filter(pk=locked.pk).update(status=ThreadStatus.RUNNING, updated_at=timezone.now())
        run = enqueue_run(thread=locked, checkpoint=head, reason=RunReason.MANUAL)
        storage.record_event(thread=locked, type="thread.resumed", data={
            "status": ThreadStatus.RUNNING, "checkpoint": str(head.pk), "run": str(run.pk),
            "by": user.get_username(), "reason": reason,
        })  # fmt: skip
        trail.record(
            actor=user, action="thread.resume", target_type="thread", target_id=locked.pk, thread=locked,
            reason=reason, before=before,
            after={**before, "status": ThreadStatus.RUNNING, "run": str(run.pk), "checkpoint": str(head.pk)},
            address=address,
        )  # fmt: skip
    return run


def cancel(*, thread: Thread, user: User, reason: str, address: str | None = None) -> Thread:
    """Cancel a thread: its pending approvals and queued runs are cancelled with it.

    A run a worker already holds is not interrupted mid-step: the runtime sees the
    cancellation when the step returns and stops without committing it.
    """
    check_can_cancel(user)
    reason = _reason(reason)
    with transaction.atomic():
        locked = _locked(thread.pk, unless=cancel_refusal)
        before = _thread_summary(locked)
        cancelled_approvals = _cancel_pending_approvals(locked, reason=reason)
        cancelled_runs = _cancel_queued_runs(locked, reason=reason)
        Thread.objects.filter(pk=locked.pk).update(status=ThreadStatus.CANCELLED, updated_at=timezone.now())
        storage.record_event(thread=locked, type="thread.cancelled", data={
            "status": ThreadStatus.CANCELLED, "by": user.get_username(), "reason": reason,
            "approvals": cancelled_approvals, "runs": cancelled_runs,
        })  # fmt: skip
        trail.record(
            actor=user, action="thread.cancel", target_type="thread", target_id=locked.pk, thread=locked,
            reason=reason, before=before,
            after={**before, "status": ThreadStatus.CANCELLED, "cancelled_approvals": cancelled_approvals,
                   "cancelled_runs": cancelled_runs},
            address=address,
        )  # fmt: skip
        locked.status = ThreadStatus.CANCELLED
    return locked


def delete_refusal(thread: Thread) -> str | None:
    """Why `thread` cannot be deleted now, or None if it can."""
    if Run.objects.filter(thread=thread, status=RunStatus.RUNNING).exists():
        return "A worker is running this thread's agent right now; cancel the thread and wait for the step to end."
    return None


def delete(*, thread: Thread, user: User, reason: str, address: str | None = None) -> None:
    """Delete a thread with every checkpoint, approval and run, and shred its data key.

    The audit entry stays (it outlives the thread by design) and records what was deleted.
    """
    check_can_delete(user)
    reason = _reason(reason)
    with transaction.atomic():
        locked = _locked(thread.pk, unless=delete_refusal)
        before = {
            **_thread_summary(locked), "agent": locked.agent.name, "external_id": locked.external_id,
            "checkpoints": Checkpoint.objects.filter(thread=locked).count(),
            "branches": Branch.objects.filter(thread=locked).count(),
        }  # fmt: skip
        trail.record(
            actor=user, action="thread.delete", target_type="thread", target_id=locked.pk, reason=reason,
            before=before, after={"deleted": True, "data_key": "destroyed"}, address=address,
        )  # fmt: skip
        storage.delete_thread(locked)


def plan_branch_name(thread: Thread | UUID) -> str:
    """The name a fork of `thread` gets when none is given, as things stand now."""
    return _free_name(set(Branch.objects.filter(thread=thread).values_list("name", flat=True)))


def resume_refusal(thread: Thread) -> str | None:
    """Why `thread` cannot be resumed as it is now, or None if it can (pages use it to say so up front)."""
    if thread.status not in RESUMABLE:
        return f"Only a failed or paused thread can be resumed; this one is {thread.get_status_display().lower()}."
    if thread.head_id is None:
        return "This thread has no checkpoint to resume from."
    return None


def cancel_refusal(thread: Thread) -> str | None:
    """Why `thread` cannot be cancelled, or None if it can."""
    if thread.status in (ThreadStatus.COMPLETED, ThreadStatus.CANCELLED):
        return f"This thread is already {thread.get_status_display().lower()}; there is nothing to cancel."
    return None


# --------------------------------------------------------------------------- checks


def _reason(reason: Any) -> str:
    text = reason.strip() if isinstance(reason, str) else ""
    if not text:
        raise InvalidFork("Give a reason: the audit trail records why.", field="reason")
    if len(text) > REASON_MAX_CHARS:
        raise InvalidFork(f"Keep the reason to {REASON_MAX_CHARS} characters.", field="reason")
    if "\x00" in text:
        raise InvalidFork("The reason cannot hold a NUL character.", field="reason")
    return text


def _branch_name(branch: Any) -> str | None:
    """The requested branch name, or None when one is to be generated."""
    if branch is None or (isinstance(branch, str) and not branch.strip()):
        return None
    if not isinstance(branch, str) or not BRANCH_NAME.fullmatch(branch.strip()):
        raise InvalidFork(
            "A branch name is 1 to 100 letters, digits, '.', '_', '-' or '/', starting with a letter or digit.",
            field="branch",
        )
    return branch.strip()


def _edited_state(checkpoint: Checkpoint, patch: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The checked ops and the state they give at `checkpoint` (the checkpoint's own state for no patch)."""
    try:
        ops = validate_ops([] if patch is None else patch)
    except PatchError as exc:
        raise InvalidPatch(exc.message, detail={"field": "patch", "op": exc.index, "path": exc.path}) from None
    node = storage.load_node(checkpoint.pk)  # integrity-checked; shared, and apply_patch copies on write
    max_bytes: int = settings.QUICKSAVE_MAX_STATE_BYTES
    try:
        applied = apply_patch(node.state, ops, limit=max_bytes - node.state_bytes)
    except PatchError as exc:
        raise InvalidPatch(exc.message, detail={"field": "patch", "op": exc.index, "path": exc.path}) from None
    except PatchTooLarge as exc:
        raise StateTooLarge.stopped(exc, field="patch", limit=max_bytes) from None
    except RecursionError:
        raise InvalidState("The edited state is nested too deeply.", detail={"field": "patch"}) from None
    if not isinstance(applied.doc, dict):
        raise InvalidState("The state must remain a JSON object.", detail={"field": "patch"})
    try:
        codec.to_canonical_bytes(ops)
    except codec.EncodingError as exc:
        raise InvalidState(f"The patch {exc}.", detail={"field": "patch"}) from None
    return ops, applied.doc


def _carried(approval: ApprovalRequest | UUID | str | None, *, thread_id: UUID, resume: bool) -> ApprovalRequest | None:
    if approval is None or approval == "":
        return None
    if not resume:
        raise InvalidFork("A decision is only carried over to an agent that resumes; tick resume.",
                          field="carry_approval")  # fmt: skip
    approval_id = approval.pk if isinstance(approval, ApprovalRequest) else approval
    found = None
    try:
        approval_id = approval_id if isinstance(approval_id, UUID) else UUID(str(approval_id))
    except ValueError:
        pass  # not an id at all: reported below as not an approval of this thread
    else:
        found = ApprovalRequest.objects.filter(pk=approval_id, thread_id=thread_id).first()
    if found is None:
        raise InvalidApproval(f"Approval {approval_id} is not an approval of this thread.",
                              detail={"field": "carry_approval"})  # fmt: skip
    if found.status not in CARRYABLE:
        raise InvalidApproval(
            f"Approval {found.pk} is {found.status}; only a decided approval (approved, rejected or expired) "
            "can be carried over.",
            detail={"field": "carry_approval", "status": found.status},
        )
    return found


def _branch_exists(name: str, taken: set[str]) -> BranchExists:
    suggestion = _free_name(taken)
    return BranchExists(
        f"This thread already has a branch named '{name}'. Pick another name, or leave it empty for '{suggestion}'.",
        detail={"field": "branch", "branch": name, "suggestion": suggestion},
    )


def _free_name(taken: set[str]) -> str:
    number = len(taken)
    while f"{GENERATED_PREFIX}{number}" in taken:
        number += 1
    return f"{GENERATED_PREFIX}{number}"


def _label(prefix: str, reason: str) -> str:
    label = f"{prefix}: {' '.join(reason.split())}"
    return label if len(label) <= LABEL_CHARS else label[: LABEL_CHARS - 1].rstrip() + "…"


# --------------------------------------------------------------------------- writes


def _locked(thread_id: UUID, *, unless: Callable[[Thread], str | None] | None = None) -> Thread:
    """The thread with its row locked to the end of the transaction (agent and branch read along,
    unlocked); raises InvalidThreadStatus with the reason `unless` gives for the locked row, if any."""
    locked = (
        Thread.objects.select_for_update(of=("self",)).select_related("agent", "active_branch").filter(pk=thread_id)
    ).first()
    if locked is None:
        raise NotFound(f"Thread {thread_id} does not exist (it was deleted).")
    refusal = unless(locked) if unless is not None else None
    if refusal:
        raise InvalidThreadStatus(refusal, detail={"status": locked.status})
    return locked


def _cancel_pending_approvals(thread: Thread, *, reason: str) -> list[str]:
    ids = [str(pk) for pk in ApprovalRequest.objects.filter(thread=thread, status=ApprovalStatus.PENDING)
           .values_list("pk", flat=True)]  # fmt: skip
    if ids:
        cancel_pending(thread=thread, reason=reason)
    return ids


def _cancel_queued_runs(thread: Thread, *, reason: str) -> list[str]:
    """Cancel runs no worker has claimed yet; a claimed run is a worker's to finish."""
    now = timezone.now()
    cancelled = []
    # Locked, so a worker claiming one of them at this moment either wins (the run is no
    # longer queued when the lock frees) or skips it (SKIP LOCKED) and it is cancelled.
    for run in Run.objects.select_for_update().filter(thread=thread, status=RunStatus.QUEUED):
        run.status = RunStatus.CANCELLED
        run.error = reason[:10_000]
        run.finished_at = now
        run.save(update_fields=["status", "error", "finished_at"])
        storage.record_event(thread=thread, type="run.cancelled", data={"run": str(run.pk), "reason": reason[:500]})
        cancelled.append(str(run.pk))
    return cancelled


def _thread_summary(thread: Thread) -> dict[str, Any]:
    return {
        "status": thread.status,
        "branch": thread.active_branch.name if thread.active_branch else None,
        "head": str(thread.head_id) if thread.head_id else None,
        "step": thread.step,
    }


def _audit_patch(ops: list[dict[str, Any]]) -> dict[str, Any]:
    size = len(codec.to_canonical_bytes(ops))
    if size <= AUDIT_PATCH_BYTES:
        return {"patch": ops}
    return {"patch": None, "patch_ops": len(ops), "patch_bytes": size,
            "patch_note": "Too large to copy here; the new checkpoint stores it as its delta."}  # fmt: skip
