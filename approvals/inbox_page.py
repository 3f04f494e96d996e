"""What the inbox page shows of each approval and each blocked agent, as plain data
(templates/approvals/inbox.html draws it): one pass with one clock, so the template makes no
reverse() call, filter or lookup through a model per row."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.utils import timezone
from django.utils.timesince import timesince, timeuntil

from approvals.models import ApprovalKind, ApprovalRequest, ApprovalStatus, Quorum, Risk
from approvals.selectors import Blocked, quorum_of
from checkpoints.presentation.timeline import url_maker
from quicksave.templatetags.quicksave import compact_json, framework

ARGS_CHARS = 80
MESSAGE_CHARS = 90
THREAD_CHARS = 28
NEXT_LABEL_CHARS = 40
# What get_risk_display() and get_status_display() say, without their per-call work.
_RISKS, _STATUSES = dict(Risk.choices), dict(ApprovalStatus.choices)


def inbox_rows(approvals: list[ApprovalRequest], *, now: datetime) -> list[dict[str, Any]]:
    """The rows of `approvals`, read with their thread and agent, policy with its escalation group,
    decider and rule, and their voters (`selectors.with_voters`); decided ones annotated with their
    next checkpoint (`selectors.with_next_checkpoint`). Dicts rather than dataclasses: the template
    engine tries a key before an attribute, and that failed lookup on every cell would cost much."""
    approval_url, thread_url = url_maker("inbox:approval"), url_maker("dashboard:thread")
    checkpoint_url = url_maker("dashboard:checkpoint")
    zone = timezone.get_current_timezone()
    rows = []
    for approval in approvals:
        pending = approval.status == ApprovalStatus.PENDING
        thread, policy, unreadable = approval.thread, approval.policy, approval.unreadable
        quorum = quorum_of(approval)
        row = {
            "id": str(approval.pk),
            "url": approval_url(approval.pk),
            "action": approval.action,
            "in_doubt": approval.kind == ApprovalKind.IN_DOUBT,
            # What may be approved together after one confirmation (views.bulk_approve).
            "bulk": approval.risk == Risk.LOW and approval.kind == ApprovalKind.APPROVAL,
            # Decided from the row: a high-risk one only from its page, after a look at it.
            "decidable": approval.kind == ApprovalKind.APPROVAL and not unreadable,
            "approve_here": approval.risk != Risk.HIGH,
            "message": _cut(approval.message, MESSAGE_CHARS),
            "quorum": _quorum(quorum) if pending and quorum.counts else None,
            "escalated": pending and approval.escalated_at is not None,
            "escalated_to": policy.escalate_to.name if policy and policy.escalate_to else "",
            "agent": thread.agent.name,
            # The thread only for the badge's template, and only when an integration wrote it.
            "framework_thread": thread if framework(thread) else None,
            "thread_url": thread_url(approval.thread_id),
            "thread_label": _cut(thread.external_id or str(approval.thread_id), THREAD_CHARS),
            "unreadable": unreadable,
            "args": "" if unreadable else compact_json(approval.args, ARGS_CHARS),
            "risk": approval.risk,
            "risk_label": _RISKS.get(approval.risk, approval.risk),
            "created_iso": approval.created_at.astimezone(zone).isoformat(),
            "waited": timesince(approval.created_at, now),
            **_deadline(approval.expires_at, now=now, zone=zone),
            "status": approval.status,
            "status_label": _STATUSES.get(approval.status, approval.status),
            "decided_by": approval.decided_by.get_username() if approval.decided_by else "",
            "rule": approval.rule.name if approval.rule else "",
            "next_url": "",
            "next_label": "",
        }
        next_id = getattr(approval, "next_checkpoint_id", None)
        if next_id is not None:
            label = _cut(getattr(approval, "next_checkpoint_label", "") or "checkpoint", NEXT_LABEL_CHARS)
            row["next_url"] = checkpoint_url(next_id)
            row["next_label"] = f"#{getattr(approval, 'next_checkpoint_seq', '')} {label}"
        rows.append(row)
    return rows


def blocked_chips(blocked: list[Blocked], *, now: datetime) -> list[dict[str, str]]:
    """The agents blocked on a person (`selectors.waiting_by_agent`), as their chips say it."""
    zone = timezone.get_current_timezone()
    return [
        {
            "agent": item.agent,
            "threads": f"{item.threads} thread{'' if item.threads == 1 else 's'}",
            "since_iso": item.since.astimezone(zone).isoformat(),
            "waited": timesince(item.since, now),
        }
        for item in blocked
    ]


def _quorum(quorum: Quorum) -> dict[str, Any]:
    return {
        "approved": len(quorum.approved_by),
        "needed": quorum.approvals_needed,
        "approved_by": ", ".join(quorum.approved_by),
        "rejected_by": ", ".join(quorum.rejected_by),
    }


def _deadline(expires_at: datetime | None, *, now: datetime, zone: Any) -> dict[str, Any]:
    if expires_at is None:
        return {"deadline_iso": "", "overdue": False, "deadline": ""}
    overdue = expires_at < now
    return {
        "deadline_iso": expires_at.astimezone(zone).isoformat(),
        "overdue": overdue,
        "deadline": "overdue" if overdue else f"in {timeuntil(expires_at, now)}",
    }


def _cut(text: str, width: int) -> str:
    """`text` cut to `width` characters, the last an ellipsis (as `truncatechars` does)."""
    return text if len(text) <= width else text[: width - 1] + "…"
