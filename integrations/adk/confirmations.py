"""ADK tool confirmations as Quicksave approvals.

A tool declared with `require_confirmation` or calling `tool_context.request_confirmation(hint,
payload)` makes ADK end the invocation with an event of `adk_request_confirmation` function calls,
one per call that asks (a model turn with several confirming calls asks them all in one event).
Each confirmation is one approval at that event's checkpoint:

- action: the tool's name; message: the confirmation's hint;
- args: the confirmation's `payload` when the tool gave one (a person may edit it, and the tool
  reads the edited one from `tool_context.tool_confirmation.payload`), else the arguments the
  model called the tool with (shown, not editable: ADK runs the call as the model made it).

A thread waits on one decision at a time, so the approvals are filed in order: the first when
QuicksaveSessionService stores the event (in the same transaction), each next one by the run its
predecessor's decision queues (`file_next`). Each is decided on its own (approve, edit, reject);
once all are, the worker resumes the invocation with one user message holding each decision as
its own confirmation response, `{"confirmed": bool, "payload": <approved payload>}`
(integrations.adk.runner).

A decision binds to the checkpoint it was filed at and to one confirmation call there: a marker
row (a tool result keyed by the checkpoint and the confirmation's call id, written with the
approval) names the approval and the digest of what the person saw. A decision whose marker, call
or payload no longer match, or an edit the tool cannot receive, fails closed (ApprovalMismatch).
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from google.adk.events.event import Event
from google.adk.flows.llm_flows.functions import REQUEST_CONFIRMATION_FUNCTION_CALL_NAME
from google.genai import types

from approvals.models import ApprovalRequest, ApprovalStatus
from approvals.services import ApprovalPending, InvalidApproval, ThreadCancelled, request_approval
from checkpoints.models import Checkpoint, Thread
from checkpoints.storage import get_tool_result, put_tool_result, tool_key
from quicksave_agents.fencing import Fence
from quicksave_agents.runtime import ApprovalMismatch, decision_for

log = logging.getLogger(__name__)
ACTION_CHARS = 200
# The marker rows' tool name; the approval's id follows it.
MARKER_TOOL = "adk:confirmation"
DECIDED = (ApprovalStatus.APPROVED, ApprovalStatus.REJECTED, ApprovalStatus.EXPIRED)


@dataclass(frozen=True)
class ConfirmationRequest:
    """One `adk_request_confirmation` call: which tool call it asks about and what a person sees."""

    call_id: str  # the confirmation call's, which its response answers
    original_id: str | None  # the tool call's it asks about
    action: str
    args: Any
    message: str
    editable: bool

    @property
    def digest(self) -> str:
        return tool_key(self.action, self.args)


def requests_in(event: Event | dict[str, Any]) -> list[ConfirmationRequest]:
    """The confirmations an event (or its stored JSON) asks for, in order."""
    if isinstance(event, dict):
        event = Event.model_validate(event)
    found = []
    for call in event.get_function_calls():
        if call.name != REQUEST_CONFIRMATION_FUNCTION_CALL_NAME or not call.id:
            continue
        args = call.args or {}
        original = args.get("originalFunctionCall") or {}
        confirmation = args.get("toolConfirmation") or {}
        editable = confirmation.get("payload") is not None
        name = str(original.get("name") or "tool")
        found.append(ConfirmationRequest(
            call_id=call.id, original_id=original.get("id"),
            action=name if len(name) <= ACTION_CHARS else name[: ACTION_CHARS - 1] + "…",
            args=confirmation["payload"] if editable else original.get("args", {}),
            message=str(confirmation.get("hint") or ""), editable=editable,
        ))  # fmt: skip
    return found


def _marker_key(checkpoint: Checkpoint, ask: ConfirmationRequest) -> str:
    return hashlib.sha256(f"{MARKER_TOOL}\x00{checkpoint.pk}\x00{ask.call_id}".encode()).hexdigest()


def file_next(
    *, thread: Thread, checkpoint: Checkpoint, requests: list[ConfirmationRequest], fence: Fence | None
) -> ApprovalRequest | None:
    """File the first confirmation at `checkpoint` not filed yet as a pending approval; None when
    every one is filed, or when this one cannot be filed now (logged)."""
    for ask in requests:
        key = _marker_key(checkpoint, ask)
        try:
            with transaction.atomic():
                if get_tool_result(thread=thread, key=key) is not None:
                    continue
                approval = request_approval(thread=thread, checkpoint=checkpoint, action=ask.action, args=ask.args,
                                            message=ask.message, fence=fence)  # fmt: skip
                marker = {"approval": str(approval.pk), "call_id": ask.call_id, "digest": ask.digest}
                put_tool_result(thread=thread, key=key, tool=f"{MARKER_TOOL}:{approval.pk}", checkpoint=checkpoint,
                                result=marker)  # fmt: skip
        except (ApprovalPending, ThreadCancelled, InvalidApproval) as exc:
            log.warning("thread %s: confirmation %s is not filed: %s", thread.pk, ask.call_id, exc)
            return None
        return approval
    return None


def decisions(
    *, thread: Thread, checkpoint: Checkpoint, requests: list[ConfirmationRequest]
) -> dict[str, ApprovalRequest] | None:
    """The decided approval of each confirmation at `checkpoint` by its call id, or None while one
    is not filed or not decided. Raises ApprovalMismatch when a decision does not fit its call."""
    found: dict[str, ApprovalRequest] = {}
    for ask in requests:
        marker = get_tool_result(thread=thread, key=_marker_key(checkpoint, ask))
        if marker is None:
            return None
        approval = ApprovalRequest.objects.select_related("decided_by").get(pk=marker.result["approval"])
        if approval.status not in DECIDED:
            return None
        bound = (
            approval.checkpoint_id == checkpoint.pk
            and marker.tool == f"{MARKER_TOOL}:{approval.pk}"
            and marker.result.get("call_id") == ask.call_id
            and approval.action == ask.action
            and marker.result.get("digest") == ask.digest == tool_key(approval.action, approval.args)
        )
        if not bound:
            raise ApprovalMismatch(
                f"Checkpoint {checkpoint.pk} asks no confirmation of {approval.action} with the approved request's "
                f"payload under call {ask.call_id}; not acting on the decision {approval.pk}."
            )
        found[ask.call_id] = approval
    return found


def response(requests: list[ConfirmationRequest], decided: dict[str, ApprovalRequest]) -> types.Content:
    """The user message that answers every confirmation of `requests`, each decision its own
    confirmation response (see the module docstring)."""
    parts = []
    for ask in requests:
        decision = decision_for(decided[ask.call_id])
        if decision.approved and decision.edited and not ask.editable:
            raise ApprovalMismatch(
                f"{ask.action} asked for confirmation without a payload, so ADK runs it with the model's arguments: "
                "an edited approval cannot reach it. Have the tool call tool_context.request_confirmation(payload=...) "
                "to let a person edit."
            )
        answer: dict[str, Any] = {"confirmed": decision.approved}
        if decision.approved and ask.editable:
            answer["payload"] = decision.args
        parts.append(types.Part(function_response=types.FunctionResponse(
            id=ask.call_id, name=REQUEST_CONFIRMATION_FUNCTION_CALL_NAME, response=answer,
        )))  # fmt: skip
    return types.Content(role="user", parts=parts)
