"""ADK tool confirmations as Quicksave approvals.

A tool declared with `require_confirmation` or calling `tool_context.request_confirmation(hint,
payload)` makes ADK end the invocation with an `adk_request_confirmation` function call. When
QuicksaveSessionService stores that event it files a pending approval at the event's checkpoint,
in the same transaction:

- action: the tool's name; message: the confirmation's hint;
- args: the confirmation's `payload` when the tool gave one (a person may edit it, and the tool
  reads the edited one from `tool_context.tool_confirmation.payload`), else the arguments the
  model called the tool with (shown, not editable: ADK runs the call as the model made it).

The decision goes back as the confirmation's function response, `{"confirmed": bool,
"payload": <approved payload>}`, sent by the worker (integrations.adk.runner). It binds to the
checkpoint the approval was filed at, the confirmation call there whose tool and canonical
payload digest are the approval's, and nothing else: a head that moved on, no such call, or an
edit the tool cannot receive fails closed (ApprovalMismatch). One approval per event: a second
confirmation asked in the same event waits in the session (logged).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from google.adk.events.event import Event
from google.adk.flows.llm_flows.functions import REQUEST_CONFIRMATION_FUNCTION_CALL_NAME
from google.genai import types

from approvals.models import ApprovalRequest
from approvals.services import ApprovalPending, InvalidApproval, ThreadCancelled, request_approval
from checkpoints.models import Checkpoint, Thread
from checkpoints.storage import tool_key
from quicksave_agents.fencing import Fence
from quicksave_agents.runtime import ApprovalMismatch, decision_for

log = logging.getLogger(__name__)
ACTION_CHARS = 200


@dataclass(frozen=True)
class ConfirmationRequest:
    """One `adk_request_confirmation` call: which tool call it asks about and what a person sees."""

    call_id: str
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
            call_id=call.id, action=name if len(name) <= ACTION_CHARS else name[: ACTION_CHARS - 1] + "…",
            args=confirmation["payload"] if editable else original.get("args", {}),
            message=str(confirmation.get("hint") or ""), editable=editable,
        ))  # fmt: skip
    return found


def file(
    *, thread: Thread, checkpoint: Checkpoint, requests: list[ConfirmationRequest], fence: Fence | None
) -> ApprovalRequest | None:
    """File the first request as a pending approval at `checkpoint`; None when it cannot be filed."""
    if not requests:
        return None
    if len(requests) > 1:
        log.warning("thread %s: %d confirmations asked at once; %s is filed, the others wait", thread.pk,
                    len(requests), requests[0].call_id)  # fmt: skip
    ask = requests[0]
    try:
        return request_approval(thread=thread, checkpoint=checkpoint, action=ask.action, args=ask.args,
                                message=ask.message, fence=fence)  # fmt: skip
    except (ApprovalPending, ThreadCancelled, InvalidApproval) as exc:
        log.warning("thread %s: confirmation %s is not filed: %s", thread.pk, ask.call_id, exc)
        return None


def response_for(approval: ApprovalRequest, asked: list[ConfirmationRequest]) -> types.Content:
    """The user message that answers the confirmation `approval` was filed for (see the module docstring).

    `asked` are the confirmations in the event of the approval's checkpoint, which must still be
    the session's head (the caller checks)."""
    matching = [ask for ask in asked if ask.digest == tool_key(approval.action, approval.args)]
    if len(matching) != 1:
        raise ApprovalMismatch(
            f"Checkpoint {approval.checkpoint_id} asks no confirmation of {approval.action} with the approved "
            f"request's payload ({len(matching)} match); not acting on the decision."
        )
    ask = matching[0]
    decision = decision_for(approval)
    if decision.approved and decision.edited and not ask.editable:
        raise ApprovalMismatch(
            f"{ask.action} asked for confirmation without a payload, so ADK runs it with the model's arguments: "
            "an edited approval cannot reach it. Have the tool call tool_context.request_confirmation(payload=...) "
            "to let a person edit."
        )
    response: dict[str, Any] = {"confirmed": decision.approved}
    if decision.approved and ask.editable:
        response["payload"] = decision.args
    part = types.Part(function_response=types.FunctionResponse(
        id=ask.call_id, name=REQUEST_CONFIRMATION_FUNCTION_CALL_NAME, response=response,
    ))  # fmt: skip
    return types.Content(role="user", parts=[part])
