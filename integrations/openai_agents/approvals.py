"""Tool approvals of the OpenAI Agents SDK as Quicksave approvals.

A run that stops with `result.interruptions` (a tool with `needs_approval`) is paused here: one
checkpoint, status `waiting_for_approval`, keeps `RunState.to_json()` in the thread's state
(`run_state`, encrypted at rest like every state) and files one approval for the first
`ToolApprovalItem`: the tool's name as the action, its parsed arguments as the args, and the call
id in the checkpoint's metadata with the digest of the canonical (tool, arguments) pair. A run
that paused on several calls files them one at a time: each decision is recorded in the RunState
and the next call is filed, and the run resumes once every call has its decision.

A decision binds to that checkpoint, that call id and that digest. The worker resumes only when
the thread's head is still the checkpoint, the RunState still holds the call and the call's
arguments hash to the digest the person saw; anything else raises `ApprovalMismatch` and the
thread fails instead of acting on a decision nobody made. Approve is `state.approve(item)`,
reject is `state.reject(item, rejection_message=comment)`; an edit approves the call and hands
the tool the edited arguments (integrations.openai_agents.tools): the SDK binds a call id to its
arguments, so the call runs under its id with the arguments the person approved.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from agents import RunState, ToolApprovalItem
from django.db import transaction

from approvals.models import ApprovalRequest
from approvals.services import request_approval
from checkpoints.models import Checkpoint, CheckpointStatus
from checkpoints.storage import tool_key
from integrations.openai_agents.session import META, RUN_STATE, QuicksaveSession
from quicksave_agents.runtime import ApprovalMismatch, Decision

ACTION_CHARS = 200


def arguments_of(item: ToolApprovalItem) -> Any:
    """A call's arguments as JSON (the model sends a JSON string; anything unparsable stays a string)."""
    raw = item.arguments
    if raw is None:
        return {}
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def pause(
    session: QuicksaveSession, state: RunState[Any, Any], *, paused: PausedRun | None = None
) -> ApprovalRequest | None:
    """Checkpoint `state` as waiting for a decision on its first undecided call and file that
    approval, in one transaction; None when every interrupted call already has its decision.
    `paused` carries the decisions already made on this pause (by call id) and their edits."""
    paused = paused or PausedRun(state={}, edits={}, decided=[])
    pending = undecided(state, paused.decided)
    if not pending:
        return None
    item = pending[0]
    args = arguments_of(item)
    action = (item.tool_name or "tool")[:ACTION_CHARS]
    meta = {"paused": True, "call_id": item.call_id, "tool": action, "args_digest": tool_key(action, args)}
    stored = {"state": state.to_json(), "edits": paused.edits, "decided": paused.decided}
    with transaction.atomic():
        checkpoint = session.write([{"op": "add", "path": f"/{RUN_STATE}", "value": stored}], turns=0,
                                   label=f"approval: {action}"[:60], status=CheckpointStatus.WAITING_FOR_APPROVAL,
                                   meta=meta)  # fmt: skip
        return request_approval(thread=session.thread, checkpoint=checkpoint, action=action, args=args,
                                message=f"The agent asks to call {action}.", fence=session.fence)  # fmt: skip


def undecided(state: RunState[Any, Any], decided: list[str]) -> list[ToolApprovalItem]:
    """The interrupted calls of `state` whose call id has no decision yet."""
    return [item for item in state.get_interruptions() if item.call_id not in decided]


@dataclasses.dataclass
class PausedRun:
    """A paused run as a waiting checkpoint keeps it: the RunState JSON, the reviewers' edited
    arguments and the calls decided so far (by call id), and the call this checkpoint waits on."""

    state: dict[str, Any]
    edits: dict[str, Any]
    decided: list[str]
    waits_on: dict[str, Any] = dataclasses.field(default_factory=dict)


def paused_run(checkpoint: Checkpoint, state: dict[str, Any]) -> PausedRun | None:
    """The paused run a checkpoint's state keeps, or None."""
    stored = state.get(RUN_STATE)
    if not isinstance(stored, dict):
        return None
    meta = checkpoint.metadata.get(META) or {}
    return PausedRun(state=stored["state"], edits=dict(stored.get("edits") or {}),
                     decided=list(stored.get("decided") or []), waits_on=meta)  # fmt: skip


def apply_decision(
    state: RunState[Any, Any], *, approval: ApprovalRequest, decision: Decision, paused: PausedRun
) -> None:
    """Record `decision` in `state` and `paused` on the call the checkpoint waits on (an edit's
    arguments in `paused.edits`). Fails closed (ApprovalMismatch) unless the approval is for that
    call as the person saw it."""
    call_id, digest = paused.waits_on.get("call_id"), paused.waits_on.get("args_digest")
    matches = [item for item in state.get_interruptions() if item.call_id == call_id]
    if len(matches) != 1:
        raise ApprovalMismatch(f"The paused run holds no single call {call_id!r}; not acting on the decision.")
    item = matches[0]
    action = (item.tool_name or "tool")[:ACTION_CHARS]
    bound = (
        call_id not in paused.decided
        and action == approval.action == paused.waits_on.get("tool")
        and tool_key(action, arguments_of(item)) == digest == tool_key(approval.action, approval.args)
    )
    if not bound:
        raise ApprovalMismatch(
            f"The decision on {approval.action} (digest {tool_key(approval.action, approval.args)[:12]}) is not for "
            f"call {call_id} of {action} (digest {str(digest)[:12]}); not acting on it."
        )
    paused.decided.append(str(call_id))
    if not decision.approved:
        state.reject(item, rejection_message=decision.comment or "A reviewer rejected this call.")
        return
    state.approve(item)
    if decision.args != approval.args:
        paused.edits[str(call_id)] = decision.args
