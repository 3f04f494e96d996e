"""What a notice says: the JSON body a webhook receives, and the Slack message and email made from it.

The body is built once, when the notice is fanned out to an endpoint, and kept sealed with its
delivery, so every attempt (and every "send again") sends the same message. Its `id` is the same
for all of them: receivers drop repeats by it.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django.conf import settings
from django.template.loader import render_to_string
from django.urls import reverse

from approvals import policies
from approvals.models import ApprovalKind, ApprovalRequest
from checkpoints.models import Thread
from notifications.models import Notice

# Slack refuses a section text over 3,000 characters; the args get what is left of that.
SLACK_ARGS_CHARS = 2_500
SLACK_TEXT_CHARS = 2_900


def absolute(path: str) -> str:
    """A dashboard path as a link someone can open from a message (QUICKSAVE_PUBLIC_URL)."""
    return settings.QUICKSAVE_PUBLIC_URL.rstrip("/") + path


def approval_url(approval_id: Any) -> str:
    return absolute(reverse("inbox:approval", args=[approval_id]))


def thread_url(thread_id: Any) -> str:
    return absolute(reverse("dashboard:thread", args=[thread_id]))


def thread_label(thread: Thread) -> str:
    return thread.external_id or str(thread.pk)[:8]


def _thread(thread: Thread) -> dict[str, Any]:
    return {
        "id": str(thread.pk),
        "external_id": thread.external_id,
        "label": thread_label(thread),
        "status": thread.status,
        "url": thread_url(thread.pk),
    }


def approval_body(
    *, id: str, notice: str, approval: ApprovalRequest, occurred_at: datetime, event: dict[str, Any] | None,
    decide: dict[str, str] | None,
) -> dict[str, Any]:  # fmt: skip
    """The message about an approval (requested, in doubt, expiring, escalated); `decide` holds the
    single-use links to approve and reject from the message, when the endpoint hands them out."""
    unreadable = approval.unreadable
    thread = approval.thread
    policy = approval.policy if approval.policy_id else None
    escalated = approval.escalated_at is not None
    return {
        "id": id,
        "type": notice,
        "occurred_at": occurred_at.isoformat(),
        "agent": thread.agent.name,
        "thread": _thread(thread),
        "approval": {
            "id": str(approval.pk),
            "kind": approval.kind,
            "action": approval.action,
            "args": None if unreadable else approval.args,
            "unreadable": unreadable or None,
            "message": approval.message,
            "risk": approval.risk,
            "status": approval.status,
            "created_at": approval.created_at.isoformat(),
            "expires_at": approval.expires_at.isoformat() if approval.expires_at else None,
            "escalated_at": approval.escalated_at.isoformat() if approval.escalated_at else None,
            # Its policy's say: who may decide (its escalation group too, once escalated) and how
            # many approvals it takes.
            "who_may_decide": policies.who_may_decide(policy, escalated=escalated) if policy else "reviewers",
            "approvals_needed": policy.approvals_needed if policy else 1,
            "url": approval_url(approval.pk),
            "decide": decide,
        },
        "event": event,
    }


def thread_body(
    *, id: str, notice: str, thread: Thread, occurred_at: datetime, event: dict[str, Any]
) -> dict[str, Any]:
    """The message about a thread (it failed)."""
    return {
        "id": id,
        "type": notice,
        "occurred_at": occurred_at.isoformat(),
        "agent": thread.agent.name,
        "thread": _thread(thread),
        "approval": None,
        "event": event,
    }


def webhook_bytes(body: dict[str, Any]) -> bytes:
    """The exact bytes a webhook receives (and its signature covers): compact, keys sorted."""
    return json.dumps(body, separators=(",", ":"), sort_keys=True, ensure_ascii=False).encode()


def headline(body: dict[str, Any]) -> str:
    """One line saying what happened, for a Slack message's text and an email's subject."""
    agent, approval, thread = body["agent"], body.get("approval") or {}, body["thread"]
    action = approval.get("action", "")
    notice = body["type"]
    if notice == Notice.IN_DOUBT:
        return f"{agent}: did {action} happen? A person must say (thread {thread['label']})"
    if notice == Notice.APPROVAL_EXPIRING:
        return f"{agent} still waits to {action}: the request expires at {approval.get('expires_at')}"
    if notice == Notice.APPROVAL_ESCALATED:
        return f"Escalated: {agent} asks to {action} (thread {thread['label']})"
    if notice == Notice.THREAD_FAILED:
        return f"{agent}: thread {thread['label']} failed"
    risk = f", {approval['risk']} risk" if approval else ""
    return f"{agent} asks to {action} (thread {thread['label']}{risk})"


def _args_text(approval: dict[str, Any]) -> str:
    if approval.get("unreadable"):
        return f"[the arguments do not open: {approval['unreadable']}]"
    text = json.dumps(approval.get("args"), indent=2, ensure_ascii=False, sort_keys=True)
    return text if len(text) <= SLACK_ARGS_CHARS else text[: SLACK_ARGS_CHARS - 1] + "…"


def _deciders(approval: dict[str, Any]) -> str:
    needed = approval.get("approvals_needed") or 1
    who = approval.get("who_may_decide") or "reviewers"
    return who if needed == 1 else f"{who} ({needed} approvals needed)"


def _mrkdwn(text: str) -> str:
    """Text as Slack shows it literally: &, < and > are its control characters."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _button(text: str, url: str, action_id: str, style: str | None = None) -> dict[str, Any]:
    button: dict[str, Any] = {"type": "button", "text": {"type": "plain_text", "text": text}, "url": url,
                              "action_id": action_id}  # fmt: skip
    if style:
        button["style"] = style
    return button


def slack_message(body: dict[str, Any]) -> dict[str, Any]:
    """A Slack incoming-webhook message: the request, its args, and buttons that open Quicksave."""
    approval, thread = body.get("approval"), body["thread"]
    title = headline(body)
    blocks: list[dict[str, Any]] = [{"type": "section", "text": {"type": "mrkdwn", "text": f"*{_mrkdwn(title)}*"}}]
    fields = [f"*Agent*\n{_mrkdwn(body['agent'])}", f"*Thread*\n<{thread['url']}|{_mrkdwn(thread['label'])}>"]
    buttons: list[dict[str, Any]] = []
    if approval:
        fields += [
            f"*Action*\n`{_mrkdwn(approval['action'])}`",
            f"*Risk*\n{approval['risk']}",
            f"*Who decides*\n{_mrkdwn(_deciders(approval))}",
        ]
        if approval.get("expires_at"):
            fields.append(f"*Expires*\n{approval['expires_at']}")
        blocks.append({"type": "section", "fields": [{"type": "mrkdwn", "text": text} for text in fields]})
        if approval.get("message"):
            message = _mrkdwn(approval["message"])[:SLACK_TEXT_CHARS]
            blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": message}})
        if approval["kind"] == ApprovalKind.APPROVAL:
            args = f"*Args*\n```{_mrkdwn(_args_text(approval))}```"
            blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": args}})
        buttons.append(_button("Open in Quicksave", approval["url"], "open", "primary"))
        decide = approval.get("decide")
        if decide:
            buttons.append(_button("Approve", decide["approve"], "approve", "primary"))
            buttons.append(_button("Reject", decide["reject"], "reject", "danger"))
            # Only one button may be primary: the approve link is the action, opening is the way round.
            buttons[0].pop("style")
    else:
        blocks.append({"type": "section", "fields": [{"type": "mrkdwn", "text": text} for text in fields]})
        buttons.append(_button("Open the thread", thread["url"], "open", "primary"))
    blocks.append({"type": "actions", "elements": buttons})
    return {"text": title, "blocks": blocks}


def slack_bytes(body: dict[str, Any]) -> bytes:
    return json.dumps(slack_message(body), separators=(",", ":"), ensure_ascii=False).encode()


def email_parts(body: dict[str, Any]) -> tuple[str, str, str]:
    """The subject, plain text and HTML of the email for a notice. The HTML comes from
    templates/notifications/email/notice.html, autoescaped; plain text is not markup, so it is
    written here rather than through a template with escaping turned off."""
    approval = body.get("approval")
    args_text = _args_text(approval) if approval and approval["kind"] == ApprovalKind.APPROVAL else ""
    title = headline(body)
    context = {"body": body, "headline": title, "approval": approval, "args_text": args_text}
    html = render_to_string("notifications/email/notice.html", context)
    return f"[Quicksave] {' '.join(title.split())}", _email_text(body, title, args_text), html


def _email_text(body: dict[str, Any], title: str, args_text: str) -> str:
    approval, thread = body.get("approval"), body["thread"]
    lines = [title, "", f"Agent:   {body['agent']}", f"Thread:  {thread['label']} ({thread['status']})"]
    if approval:
        lines += [f"Action:  {approval['action']}", f"Risk:    {approval['risk']}", f"Decides: {_deciders(approval)}"]
        if approval.get("expires_at"):
            lines.append(f"Expires: {approval['expires_at']}")
        if approval.get("message"):
            lines += ["", approval["message"]]
        if args_text:
            lines += ["", "Arguments:", args_text]
        lines += ["", f"Open it in Quicksave (sign in first if asked): {approval['url']}"]
        decide = approval.get("decide")
        if decide:
            lines += [
                "",
                f"Or decide from here (each link works once, until {decide['expires_at']}; "
                "you confirm after signing in):",
                f"  Approve: {decide['approve']}",
                f"  Reject:  {decide['reject']}",
            ]
    else:
        lines += ["", f"Open the thread in Quicksave: {thread['url']}"]
    lines += ["", "--", f"Quicksave sent this because a notification channel subscribes to {body['type']}."]
    return "\n".join(lines) + "\n"
