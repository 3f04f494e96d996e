"""A paused Pydantic AI run in the inbox, and the decisions that resume it.

A run that ends with `DeferredToolRequests` leaves a checkpoint waiting for approval whose state
lists the deferred calls (`deferred.items`). Each becomes one item in the inbox, filed in order
(a thread waits on one decision at a time):

- a call in `approvals` asks to run `tool(args)`: approve, approve with edited args, or reject
  with a comment; it resumes as `True`, `ToolApproved(override_args=...)` or `ToolDenied(message=...)`;
- a call in `calls` runs outside the agent: the item's args are `{"args": <the call's args>,
  "result": null}`, a person fills in `result` and approves (the call returns it), or rejects
  (the call fails with the comment, `ToolFailed`).

When every item is decided the worker resumes the run with all of them as `DeferredToolResults`.
A decision is bound to its checkpoint, its tool call id and the digest of the arguments a person
saw: a marker row (a tool result keyed by checkpoint and tool call id, written in the approval's
transaction) records them, and a decision that no longer matches the waiting call fails closed.
A decision a dashboard fork carries over binds to the call on the new branch that asks for the
same tool with the same args (`carry`), which is then not asked again.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from pydantic_ai import DeferredToolRequests, DeferredToolResults, ToolApproved, ToolDenied, ToolFailed

from approvals.models import ApprovalRequest, ApprovalStatus, Risk
from approvals.services import ApprovalPending, request_approval
from checkpoints.models import Checkpoint, Thread, ToolResult
from checkpoints.storage import get_tool_result, put_tool_result, tool_key
from quicksave_agents.fencing import Fence
from quicksave_agents.runtime import ApprovalMismatch, decision_for

APPROVAL, EXTERNAL = "approval", "external"
# The marker rows' tool name; the approval's id follows it.
MARKER_TOOL = "pydantic-ai:deferred"
DECIDED = (ApprovalStatus.APPROVED, ApprovalStatus.REJECTED, ApprovalStatus.EXPIRED)


@dataclass(frozen=True)
class Item:
    """One deferred call, as the waiting checkpoint keeps it."""

    id: str
    tool: str
    args: dict[str, Any]
    kind: str
    metadata: dict[str, Any]

    @property
    def asked(self) -> Any:
        """The args a person sees and edits."""
        return self.args if self.kind == APPROVAL else {"args": self.args, "result": None}


def describe(requests: DeferredToolRequests) -> dict[str, Any]:
    """The `deferred` entry of a waiting checkpoint's state: the calls in order, approvals first."""
    entries = [(call, APPROVAL) for call in requests.approvals] + [(call, EXTERNAL) for call in requests.calls]
    return {
        "items": [
            {"id": call.tool_call_id, "tool": call.tool_name, "args": call.args_as_dict(), "kind": kind,
             "metadata": requests.metadata.get(call.tool_call_id, {})}
            for call, kind in entries
        ]
    }  # fmt: skip


def items_of(deferred: dict[str, Any]) -> list[Item]:
    return [Item(**item) for item in deferred.get("items", [])]


def _marker_key(checkpoint: Checkpoint, item: Item) -> str:
    return hashlib.sha256(f"{MARKER_TOOL}\x00{checkpoint.pk}\x00{item.id}".encode()).hexdigest()


def _message(item: Item) -> str:
    given = item.metadata.get("message", item.metadata.get("reason"))
    if isinstance(given, str) and given.strip():
        return given
    if item.kind == EXTERNAL:
        return (f"{item.tool} runs outside the agent (call {item.id}): fill in `result` and approve to hand it "
                "back, or reject to tell the agent it failed.")  # fmt: skip
    return f"The agent asks to call {item.tool} (call {item.id})."


def file_next(*, thread: Thread, checkpoint: Checkpoint, items: list[Item], fence: Fence | None) -> bool:
    """File the first item at `checkpoint` not filed yet; False when every item is filed already."""
    for item in items:
        key = _marker_key(checkpoint, item)
        with transaction.atomic():
            if get_tool_result(thread=thread, key=key) is not None:
                continue
            risk = item.metadata.get("risk")
            try:
                approval = request_approval(thread=thread, checkpoint=checkpoint, action=item.tool, args=item.asked,
                                            message=_message(item), risk=risk if risk in Risk.values else Risk.HIGH,
                                            fence=fence)  # fmt: skip
            except ApprovalPending:
                return True  # the thread waits on a decision already; this item is filed when it comes back
            put_tool_result(thread=thread, key=key, tool=f"{MARKER_TOOL}:{approval.pk}", checkpoint=checkpoint,
                            result={"approval": str(approval.pk), "tool_call_id": item.id, "kind": item.kind,
                                    "digest": tool_key(item.tool, item.asked)})  # fmt: skip
        return True
    return False


def carry(*, thread: Thread, checkpoint: Checkpoint, items: list[Item], approval: ApprovalRequest) -> bool:
    """Bind a decision a dashboard fork carried over to the item at `checkpoint` that asks for the
    very call it was made on (the same tool, and the args the person saw), so that item is not asked
    again; False when no item does."""
    for item in items:
        if approval.action == item.tool and tool_key(item.tool, item.asked) == tool_key(approval.action, approval.args):
            put_tool_result(thread=thread, key=_marker_key(checkpoint, item), tool=f"{MARKER_TOOL}:{approval.pk}",
                            checkpoint=checkpoint, result={"approval": str(approval.pk), "tool_call_id": item.id,
                                                           "kind": item.kind, "digest": tool_key(item.tool, item.asked),
                                                           "carried": True})  # fmt: skip
            return True
    return False


def decisions(*, thread: Thread, checkpoint: Checkpoint, items: list[Item]) -> dict[str, ApprovalRequest] | None:
    """The decided approval of each item by tool call id, or None while one is not decided.

    Raises ApprovalMismatch when a decision does not fit the call waiting at `checkpoint`: another
    checkpoint, tool or tool call, or other arguments than the person saw.
    """
    found: dict[str, ApprovalRequest] = {}
    for item in items:
        marker = get_tool_result(thread=thread, key=_marker_key(checkpoint, item))
        if marker is None:
            return None
        approval = ApprovalRequest.objects.select_related("decided_by").get(pk=marker.result["approval"])
        if approval.status not in DECIDED:
            return None
        _check_binding(approval, marker, checkpoint, item)
        found[item.id] = approval
    return found


def _check_binding(approval: ApprovalRequest, marker: ToolResult, checkpoint: Checkpoint, item: Item) -> None:
    bound = (
        (approval.checkpoint_id == checkpoint.pk or marker.result.get("carried") is True)
        and marker.tool == f"{MARKER_TOOL}:{approval.pk}"
        and marker.result.get("tool_call_id") == item.id
        and approval.action == item.tool
        and marker.result.get("digest") == tool_key(item.tool, item.asked) == tool_key(approval.action, approval.args)
    )
    if not bound:
        raise ApprovalMismatch(
            f"The decision {approval.pk} on {approval.action} does not fit call {item.id} ({item.tool}) waiting at "
            f"checkpoint {checkpoint.pk}; not acting on it."
        )


def results(items: list[Item], decided: dict[str, ApprovalRequest]) -> DeferredToolResults:
    """The decisions as Pydantic AI takes them back (see the module docstring)."""
    found = DeferredToolResults()
    for item in items:
        approval = decided[item.id]
        decision = decision_for(approval)
        comment = decision.comment or ("Rejected." if not decision.expired else "Expired without a decision.")
        if item.kind == APPROVAL:
            if not decision.approved:
                found.approvals[item.id] = ToolDenied(message=comment)
            elif decision.edited:
                if not isinstance(decision.args, dict):
                    raise ApprovalMismatch(f"The edited args of call {item.id} are not an object; not acting on them.")
                found.approvals[item.id] = ToolApproved(override_args=decision.args)
            else:
                found.approvals[item.id] = True
        elif decision.approved:
            given = decision.args.get("result") if isinstance(decision.args, dict) else None
            found.calls[item.id] = given
        else:
            found.calls[item.id] = ToolFailed(comment)
        found.metadata[item.id] = {"quicksave_approval": str(approval.pk), "comment": decision.comment}
        found.answered_by[item.id] = decision.decided_by or "quicksave:expiry"
    return found
