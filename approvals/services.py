"""The one way in for approval writes: request one, decide (vote on) one, apply the deadlines.

A request is filed under the approval policy in force for its agent and action
(approvals.policies), and an auto-approve rule that matches it (approvals.rules) decides it
at once. A vote locks the approval row (`SELECT ... FOR UPDATE`), so of any number of
reviewers voting at once each waits for the one before, counts the votes with its own, and
exactly one of them records the outcome; those after it get AlreadyDecided. The decision,
the resume run and their events commit together.
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta
from typing import Any

import jsonschema
from django.conf import settings
from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.utils import timezone

from approvals import policies, rules
from approvals.models import (
    ApprovalKind,
    ApprovalRequest,
    ApprovalStatus,
    ApprovalVote,
    AtDeadline,
    AutoApproveRule,
    Resolution,
    Risk,
)
from audit import trail
from checkpoints.models import Checkpoint, Thread, ThreadStatus
from checkpoints.storage import codec, record_event, set_thread_status
from quicksave.errors import DomainError
from quicksave_agents import fencing, tool_calls
from quicksave_agents.fencing import Fence
from quicksave_agents.models import Agent, RunReason, ToolCall
from quicksave_agents.runs import enqueue_run

APPROVE = "approve"
REJECT = "reject"
# The answers on an in-doubt call.
HAPPENED = Resolution.HAPPENED.value
NOT_HAPPENED = Resolution.NOT_HAPPENED.value
FAIL = Resolution.FAIL.value


class InvalidApproval(DomainError):
    code = "invalid_approval"
    status = 422


class ApprovalPending(DomainError):
    """The thread already waits on another decision."""

    code = "approval_pending"
    status = 409


class ThreadCancelled(DomainError):
    """A cancelled thread takes no new approval requests: nobody is to decide for it any more."""

    code = "thread_cancelled"
    status = 409


class AlreadyDecided(DomainError):
    code = "already_decided"
    status = 409


class ApprovalExpired(DomainError):
    code = "expired"
    status = 409


class AlreadyVoted(DomainError):
    """The person voted on this request already; it waits for other people's votes."""

    code = "already_voted"
    status = 409


def request_approval(
    *,
    thread: Thread,
    checkpoint: Checkpoint,
    action: str,
    args: Any,
    message: str = "",
    risk: str = Risk.HIGH,
    expires_at: datetime | None = None,
    fence: Fence | None = None,
) -> ApprovalRequest:
    """Suspend `thread` at `checkpoint` until a person decides whether `action(args)` may run.

    A run's request carries its `fence`: LeaseLost, and nothing filed, once another attempt holds the run.
    The request binds the approval policy in force (whose deadline may come sooner than
    `expires_at`); a live auto-approve rule that matches it approves it before this returns.
    """
    if checkpoint.thread_id != thread.pk:
        raise InvalidApproval(f"Checkpoint {checkpoint.pk} is not in thread {thread.pk}.",
                              detail={"field": "checkpoint"})  # fmt: skip
    if not isinstance(action, str) or not action.strip() or len(action) > 200:
        raise InvalidApproval("`action` must be a non-empty string of at most 200 characters.",
                              detail={"field": "action"})  # fmt: skip
    if risk not in Risk.values:
        raise InvalidApproval(f"`risk` must be one of {', '.join(Risk.values)}.", detail={"field": "risk"})
    if expires_at is not None and expires_at <= timezone.now():
        raise InvalidApproval("`expires_at` must be in the future.", detail={"field": "expires_at"})
    _check_json(args, "args")
    with transaction.atomic():
        fencing.hold(fence, thread_id=thread.pk)
        now = timezone.now()
        policy = policies.policy_in_force(agent_id=thread.agent_id, action=action)
        deadline = policies.deadline_for(policy, asked=expires_at, now=now)
        approval = _file(ApprovalRequest(thread=thread, checkpoint=checkpoint, action=action, args=args,
                                         message=message, risk=risk, policy=policy, expires_at=deadline))  # fmt: skip
        rule = rules.matching_rule(approval, now=now)
        if rule is not None:
            _approve_by_rule(approval, rule, now)
        return approval


def _file(approval: ApprovalRequest) -> ApprovalRequest:
    """Save a new request and set its thread waiting, with the event, in one transaction."""
    thread = approval.thread
    try:
        with transaction.atomic():
            approval.save(force_insert=True)
            # The row lock this takes orders the request with a cancellation of the thread.
            waiting = Thread.objects.filter(pk=thread.pk).exclude(status=ThreadStatus.CANCELLED)
            if not waiting.update(status=ThreadStatus.WAITING_FOR_APPROVAL):
                raise ThreadCancelled(f"Thread {thread.pk} was cancelled; it takes no approval requests.")
            record_event(thread=thread, type="approval.requested", data=_summary(approval))
    except IntegrityError:
        raise ApprovalPending(f"Thread {thread.pk} already waits on a decision.") from None
    return approval


def decide(
    *,
    approval: ApprovalRequest,
    user: User,
    decision: str,
    comment: str = "",
    args: Any = None,
    address: str | None = None,
) -> ApprovalRequest:
    """Record a reviewer's vote and, when it settles the request, the decision and the agent's
    resume; or raise why not.

    Without a policy, or under one where one approval decides, the first vote decides. Under a
    policy that needs N approvals the request stays pending, showing who approved so far, until N
    distinct people approve or enough reject (one, unless the policy says more). The policy also
    says who may vote (NotEligible otherwise). `args` approves with edited arguments (checked
    against the agent's schema for the action), only where one approval decides. Rejecting needs
    a comment.
    """
    if decision not in (APPROVE, REJECT):
        raise InvalidApproval("`decision` must be approve or reject.", detail={"field": "decision"})
    comment = _checked_comment(comment)
    if decision == REJECT and not comment:
        raise InvalidApproval("A rejection needs a `comment` saying why.", detail={"field": "comment"})
    if decision == REJECT and args is not None:
        raise InvalidApproval("Edited `args` only go with approve.", detail={"field": "args"})
    expired = False
    with transaction.atomic():
        locked = ApprovalRequest.objects.select_for_update().select_related("thread").get(pk=approval.pk)
        if locked.kind == ApprovalKind.IN_DOUBT:
            raise InvalidApproval(f"An in-doubt call is answered {', '.join(Resolution.values)}, not {decision}.",
                                  detail={"field": "decision"})  # fmt: skip
        _check_pending(locked)
        _check_readable(locked)
        now = timezone.now()
        if locked.expires_at is not None and locked.expires_at <= now:
            expired = not _reach_deadline(locked, now)
        if not expired:
            _vote(locked, user=user, decision=decision, comment=comment, args=args, address=address, now=now)
    if expired:
        raise ApprovalExpired(
            f"This approval reached its deadline at {locked.decided_at:%Y-%m-%d %H:%M:%S %Z} and was "
            f"{'approved' if locked.decided_args is not None else 'rejected'} automatically.",
            detail={
                "status": locked.status,
                "expired_at": locked.decided_at.isoformat() if locked.decided_at else None,
            },
        )
    return locked


def _vote(
    locked: ApprovalRequest, *, user: User, decision: str, comment: str, args: Any, address: str | None, now: datetime
) -> None:
    """Cast `user`'s vote on the locked, pending request and record the outcome if it settles it."""
    policies.check_may_decide(approval=locked, user=user, decision=decision)
    # Read apart from `locked`, whose caches would then miss the vote cast below.
    quorum = ApprovalRequest.objects.select_related("policy").prefetch_related("votes__user").get(pk=locked.pk).quorum
    if args is not None:
        if quorum.approvals_needed > 1:
            raise InvalidApproval("Edited `args` need a policy where one approval decides: the other approvers "
                                  "approve the arguments as asked.", detail={"field": "args"})  # fmt: skip
        _check_args(locked, args)
    if user.get_username() in (*quorum.approved_by, *quorum.rejected_by):
        mine = locked.votes.get(user=user)
        raise AlreadyVoted(
            f"You voted {mine.decision} on this request at {mine.created_at:%Y-%m-%d %H:%M:%S %Z}; it waits for "
            f"{quorum.approvals_needed - len(quorum.approved_by)} more approval(s).",
            detail={"vote": mine.decision, "voted_at": mine.created_at.isoformat()},
        )
    ApprovalVote.objects.create(approval=locked, user=user, decision=decision, comment=comment, created_at=now)
    approved_by = [*quorum.approved_by, user.get_username()] if decision == APPROVE else quorum.approved_by
    rejected_by = [*quorum.rejected_by, user.get_username()] if decision == REJECT else quorum.rejected_by
    if decision == APPROVE:
        settled = len(approved_by) >= quorum.approvals_needed
    else:
        settled = len(rejected_by) >= quorum.rejections_needed
    tally = {"approved_by": approved_by, "rejected_by": rejected_by, "approvals_needed": quorum.approvals_needed,
             "rejections_needed": quorum.rejections_needed}  # fmt: skip
    if not settled:
        trail.record(
            actor=user, action="approval.vote", target_type="approval", target_id=locked.pk, thread=locked.thread,
            reason=comment, before={"status": ApprovalStatus.PENDING}, after={"vote": decision, **tally},
            address=address,
        )  # fmt: skip
        record_event(thread=locked.thread, type="approval.voted", data={**_summary(locked), **tally})
        return
    locked.status = ApprovalStatus.APPROVED if decision == APPROVE else ApprovalStatus.REJECTED
    locked.decided_args = (args if args is not None else locked.args) if decision == APPROVE else None
    locked.args_edited = args is not None
    locked.comment = comment
    locked.decided_by = user
    locked.decided_at = now
    locked.save(update_fields=["status", "decided_args", "args_edited", "comment", "decided_by", "decided_at"])
    after = {"status": locked.status, "args": locked.decided_args, "args_edited": locked.args_edited}
    if quorum.approvals_needed > 1 or quorum.rejections_needed > 1:
        after.update(tally)
    trail.record(
        actor=user, action=f"approval.{decision}", target_type="approval", target_id=locked.pk,
        thread=locked.thread, reason=comment, before={"status": ApprovalStatus.PENDING, "args": locked.args},
        after=after, address=address, sealed=("args",),
    )  # fmt: skip
    _resume(locked)


def _approve_by_rule(approval: ApprovalRequest, rule: AutoApproveRule, now: datetime) -> None:
    """Approve a request just filed, as `rule` says: the audit trail names the rule as the actor."""
    approval.status = ApprovalStatus.APPROVED
    approval.decided_args = approval.args
    approval.rule = rule
    approval.comment = f"Approved by rule “{rule.name}”."
    approval.decided_at = now
    approval.save(update_fields=["status", "decided_args", "rule", "comment", "decided_at"])
    trail.record(
        actor=None, actor_name=f"rule:{rule.pk}", action="approval.approve", target_type="approval",
        target_id=approval.pk, thread=approval.thread, reason=approval.comment,
        before={"status": ApprovalStatus.PENDING, "args": approval.args},
        after={"status": approval.status, "args": approval.decided_args, "args_edited": False, "rule": rule.pk,
               "rule_name": rule.name},
        sealed=("args",),
    )  # fmt: skip
    _resume(approval)


def file_in_doubt(*, call: ToolCall, checkpoint: Checkpoint, fence: Fence | None = None) -> ApprovalRequest | None:
    """Put a call in doubt before a person: the attempt that started it died before recording its
    result, so nobody knows whether it happened. Marks the call in doubt, files an `in_doubt`
    request at `checkpoint` (the checkpoint the replayed step started from) and sets the thread
    waiting, in one transaction. None when another attempt filed it first."""
    thread = Thread.objects.select_related("agent").get(pk=call.thread_id)
    started = f"{call.started_at:%Y-%m-%d %H:%M:%S %Z}"
    attempt = f"attempt {call.attempt}" if call.attempt else "a write outside any run"
    message = (
        f"{call.tool} was started at {started} by {attempt}, which stopped before recording a result. Did it happen?"
    )
    with transaction.atomic():
        if not tool_calls.mark_in_doubt(call=call, fence=fence):
            return None
        # The person still has to answer a call whose arguments no longer open; the item says why.
        args = {"unreadable": call.unreadable} if call.unreadable else call.args
        return _file(ApprovalRequest(thread=thread, checkpoint=checkpoint, kind=ApprovalKind.IN_DOUBT, tool_call=call,
                                     action=call.tool, args=args, message=message, risk=Risk.HIGH))  # fmt: skip


_UNSET: Any = object()


def resolve_in_doubt(
    *,
    approval: ApprovalRequest,
    user: User,
    resolution: str,
    comment: str = "",
    result: Any = _UNSET,
    address: str | None = None,
) -> ApprovalRequest:
    """A person's answer on an in-doubt call: `happened` (with the call's `result`, which the agent
    goes on with), `not_happened` (the agent runs the call, under the same idempotency key) or
    `fail` (the thread fails; a comment says why). Exactly one answer wins, as with decisions."""
    if resolution not in Resolution.values:
        raise InvalidApproval(f"`decision` must be one of {', '.join(Resolution.values)} for an in-doubt call.",
                              detail={"field": "decision"})  # fmt: skip
    comment = _checked_comment(comment)
    if resolution == HAPPENED and result is _UNSET:
        raise InvalidApproval("`happened` needs the call's `result`.", detail={"field": "result"})
    if resolution != HAPPENED and result is not _UNSET:
        raise InvalidApproval("A `result` only goes with `happened`.", detail={"field": "result"})
    if resolution == FAIL and not comment:
        raise InvalidApproval("Failing the thread needs a `comment` saying why.", detail={"field": "comment"})
    if result is not _UNSET:
        _check_json(result, "result")
    with transaction.atomic():
        locked = ApprovalRequest.objects.select_for_update().select_related("thread__agent").get(pk=approval.pk)
        if locked.kind != ApprovalKind.IN_DOUBT or locked.tool_call_id is None:
            raise InvalidApproval("This is an approval, not an in-doubt call: approve or reject it.",
                                  detail={"field": "decision"})  # fmt: skip
        _check_pending(locked)
        _check_readable(locked)
        call = ToolCall.objects.select_for_update().get(pk=locked.tool_call_id)
        if resolution != FAIL:
            tool_calls.resolve(call=call, happened=resolution == HAPPENED, result=None if result is _UNSET else result)
        now = timezone.now()
        locked.status = ApprovalStatus.RESOLVED
        locked.resolution = resolution
        locked.decided_args = result if resolution == HAPPENED else None
        locked.comment = comment
        locked.decided_by = user
        locked.decided_at = now
        locked.save(update_fields=["status", "resolution", "decided_args", "comment", "decided_by", "decided_at"])
        trail.record(
            actor=user, action=f"in_doubt.{resolution}", target_type="approval", target_id=locked.pk,
            thread=locked.thread, reason=comment, before={"status": ApprovalStatus.PENDING, "tool": call.tool},
            after={"status": locked.status, "resolution": resolution,
                   "result_digest": _digest(result) if resolution == HAPPENED else None},
            address=address,
        )  # fmt: skip
        if resolution == FAIL:
            record_event(thread=locked.thread, type="approval.decided", data=_summary(locked))
            set_thread_status(thread=locked.thread, status=ThreadStatus.FAILED)
        else:
            _resume(locked)
    return locked


def expire_due(*, now: datetime | None = None, limit: int = 100) -> int:
    """Apply the deadline of pending approvals past it: escalate them, or close them with the outcome
    their policy (or, without one, QUICKSAVE_APPROVAL_EXPIRY_OUTCOME) gives; returns how many."""
    now = now or timezone.now()
    reached = 0
    for approval_id in ApprovalRequest.objects.filter(status=ApprovalStatus.PENDING, expires_at__lte=now).values_list(
        "pk", flat=True
    )[:limit]:
        with transaction.atomic():
            locked = (
                ApprovalRequest.objects.select_for_update(skip_locked=True)
                .select_related("thread")
                .filter(pk=approval_id, status=ApprovalStatus.PENDING, expires_at__lte=now)
                .first()
            )
            if locked is not None:
                _reach_deadline(locked, now)
                reached += 1
    return reached


def cancel_pending(*, thread: Thread, reason: str) -> int:
    """Cancel a thread's pending approvals (the thread is being cancelled); returns how many."""
    cancelled = 0
    for approval in ApprovalRequest.objects.select_for_update().filter(thread=thread, status=ApprovalStatus.PENDING):
        approval.status = ApprovalStatus.CANCELLED
        approval.comment = reason
        approval.decided_at = timezone.now()
        approval.save(update_fields=["status", "comment", "decided_at"])
        record_event(thread=thread, type="approval.decided", data=_summary(approval))
        cancelled += 1
    return cancelled


def _check_pending(approval: ApprovalRequest) -> None:
    if approval.status == ApprovalStatus.PENDING:
        return
    if approval.status == ApprovalStatus.EXPIRED:
        raise ApprovalExpired(
            f"This approval expired at {approval.decided_at:%Y-%m-%d %H:%M:%S %Z}.",
            detail={
                "status": approval.status,
                "expired_at": approval.decided_at.isoformat() if approval.decided_at else None,
            },
        )
    who = approval.decided_by.get_username() if approval.decided_by else "Quicksave"
    when = approval.decided_at.isoformat() if approval.decided_at else None
    raise AlreadyDecided(
        f"{who} already decided this approval ({approval.status}) at {approval.decided_at:%Y-%m-%d %H:%M:%S %Z}.",
        detail={"status": approval.status, "decided_by": who, "decided_at": when},
    )


def _checked_comment(comment: str | None) -> str:
    comment = (comment or "").strip()
    if "\x00" in comment:
        raise InvalidApproval("The comment cannot hold a NUL character.", detail={"field": "comment"})
    return comment


def _check_readable(approval: ApprovalRequest) -> None:
    if approval.unreadable:
        raise InvalidApproval(
            f"This request's arguments do not open ({approval.unreadable}); it cannot be decided. "
            "An admin can cancel the thread.",
            detail={"field": "args", "unreadable": approval.unreadable},
        )


def _reach_deadline(approval: ApprovalRequest, now: datetime) -> bool:
    """Do what the locked, pending request's policy says at its deadline. True when it is still
    pending (escalated to another group, with a new deadline); False when it was closed."""
    version = approval.policy
    if version is None:
        outcome = settings.QUICKSAVE_APPROVAL_EXPIRY_OUTCOME
        _expire(approval, now, outcome=outcome, comment=f"Expired without a decision; treated as {outcome}.")
        return False
    if version.at_deadline == AtDeadline.ESCALATE and approval.escalated_at is None:
        _escalate(approval, now)
        return True
    name = f"{version.policy} v{version.version}"
    if version.at_deadline == AtDeadline.APPROVE_LOW_RISK and approval.risk == Risk.LOW:
        _expire(approval, now, outcome=APPROVE, comment=f"No decision by the deadline; policy {name} approves "
                                                        "low-risk requests then.")  # fmt: skip
    elif version.at_deadline == AtDeadline.APPROVE_LOW_RISK:
        why = f"No decision by the deadline; policy {name} approves only low-risk requests then, not {approval.risk}."
        _expire(approval, now, outcome=REJECT, comment=why)
    elif approval.escalated_at is not None:
        _expire(approval, now, outcome=REJECT, comment=f"No decision after the escalation to {version.escalate_to}; "
                                                       f"policy {name} rejects it.")  # fmt: skip
    else:
        _expire(approval, now, outcome=REJECT, comment=f"No decision by the deadline; policy {name} rejects it.")
    return False


def _escalate(approval: ApprovalRequest, now: datetime) -> None:
    """Hand the request to its policy's escalation group, whose members may decide it from now on,
    with the policy's escalation deadline (or none); audited, and an `approval.escalated` event."""
    version = approval.policy
    assert version is not None and version.escalate_to is not None
    approval.escalated_at = now
    approval.expires_at = now + timedelta(minutes=version.escalation_minutes) if version.escalation_minutes else None
    approval.save(update_fields=["escalated_at", "expires_at"])
    group = version.escalate_to.name
    after = {"escalated_to": group, "expires_at": approval.expires_at.isoformat() if approval.expires_at else None}
    trail.record(actor=None, action="approval.escalate", target_type="approval", target_id=approval.pk,
                 thread=approval.thread, reason=f"No decision by the deadline; escalated to {group}.",
                 before={"status": ApprovalStatus.PENDING}, after=after)  # fmt: skip
    record_event(thread=approval.thread, type="approval.escalated", data={**_summary(approval), **after})


def _expire(approval: ApprovalRequest, now: datetime, *, outcome: str, comment: str) -> None:
    """Close an overdue approval with `outcome` and let the agent resume with it."""
    approval.status = ApprovalStatus.EXPIRED
    approval.decided_args = approval.args if outcome == APPROVE else None
    approval.comment = comment
    approval.decided_at = now
    approval.save(update_fields=["status", "decided_args", "comment", "decided_at"])
    _resume(approval)


def _resume(approval: ApprovalRequest) -> None:
    thread = approval.thread
    Thread.objects.filter(pk=thread.pk).update(status=ThreadStatus.RUNNING, updated_at=timezone.now())
    record_event(thread=thread, type="approval.decided", data=_summary(approval))
    enqueue_run(thread=thread, checkpoint=approval.checkpoint, reason=RunReason.APPROVAL, approval=approval)


def _check_args(approval: ApprovalRequest, args: Any) -> None:
    _check_json(args, "args")
    schemas = Agent.objects.values_list("action_schemas", flat=True).get(pk=approval.thread.agent_id) or {}
    schema = schemas.get(approval.action)
    if schema is None:
        return
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(args), key=lambda error: list(error.path))
    if errors:
        problems = [
            {"path": "/" + "/".join(str(part) for part in error.path), "message": error.message} for error in errors
        ]
        first = problems[0]
        raise InvalidApproval(
            f"The edited args do not fit {approval.action}'s schema: {first['path']}: {first['message']}",
            detail={"field": "args", "errors": problems},
        )


def _check_json(value: Any, field: str) -> None:
    try:
        codec.to_canonical_bytes(value)
        codec.check_depth(value)
    except codec.EncodingError as exc:
        raise InvalidApproval(f"`{field}` {exc}.", detail={"field": field}) from None


def _digest(value: Any) -> str:
    """SHA-256 of a value's canonical JSON: what the audit trail keeps of a recorded result."""
    return hashlib.sha256(codec.to_canonical_bytes(value)).hexdigest()


def _summary(approval: ApprovalRequest) -> dict[str, Any]:
    return {
        "approval": str(approval.pk),
        "agent": approval.thread.agent.name,
        "action": approval.action,
        "kind": approval.kind,
        "status": approval.status,
        "checkpoint": str(approval.checkpoint_id),
        "decided_by": approval.decided_by.get_username() if approval.decided_by else None,
        "rule": approval.rule.name if approval.rule_id and approval.rule else None,
    }
