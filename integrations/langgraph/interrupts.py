"""LangGraph interrupts as Quicksave approvals: an `interrupt(value)` in a graph checkpointed by
`QuicksaveSaver` files a pending approval in the inbox, and the reviewer's decision becomes the
value the graph resumes with (`Command(resume={interrupt_id: value})`, sent by the worker).

What the inbox shows, by the shape of the interrupt value:

- a plain request `{"action": "book_flight", "args": {...}, "message": "...", "risk": "high"}`
  (`description` also names the message): that action, args and message;
- LangChain's HumanInTheLoopMiddleware request `{"action_requests": [{"name", "args",
  "description"}], "review_configs": [...]}`: the tool name, its args and the description;
- the older agent-inbox list `[{"action_request": {"action", "args"}, "config": {...},
  "description": ...}]`: the action, its args and the description;
- anything else: the action `interrupt` with args `{"value": <value>}` (a string value is also
  the message).

A request with several actions is one approval: its action joins the names and its args are
`{"actions": [{"name", "args"}, ...]}`; a reviewer edits any of them and decides them all at once.

What the graph resumes with, by shape:

- plain and anything else: `{"decision": "approve" | "reject", "args": <approved args or None>,
  "edited": bool, "comment": str, "decided_by": <username or None>, "expired": bool}`;
- HumanInTheLoopMiddleware: `{"decisions": [...]}`, one per action: `{"type": "approve"}`,
  `{"type": "edit", "edited_action": {"name", "args"}}` when the reviewer changed the args, or
  `{"type": "reject", "message": <comment>}`;
- agent inbox: a list with one response per action: `{"type": "accept", "args": None}`,
  `{"type": "edit", "args": {"action", "args"}}`, or for a rejection `{"type": "response",
  "args": <comment>}` (`{"type": "ignore", "args": None}` where the config does not allow a response).

Each interrupt is filed once: a tool-result row keyed by (LangGraph checkpoint, task, how many
resume values the task already had, interrupt id, value) marks it, written in the approval's
transaction. Only the root namespace files approvals: an interrupt in a subgraph reaches the
root graph too, and the root is what a resume addresses. No LangGraph import here.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from django.db import transaction

from approvals.models import ApprovalRequest, Risk
from approvals.services import ApprovalPending, InvalidApproval, ThreadCancelled, request_approval
from checkpoints.models import Checkpoint, Thread, ToolResult
from checkpoints.storage import codec
from checkpoints.storage.tool_results import get_tool_result, put_tool_result
from quicksave_agents.fencing import Fence
from quicksave_agents.runtime import Decision, decision_for

log = logging.getLogger(__name__)

PLAIN, HITL, AGENT_INBOX, OTHER = "plain", "hitl", "agent_inbox", "other"
# The tool name of the marker rows; the approval's id follows it, so the worker finds the
# marker of an approval by a clear column (tool results are sealed at rest).
MARKER_TOOL = "langgraph:interrupt"
ACTION_CHARS = 200

Codec = Callable[[Any], Any]


@dataclass(frozen=True)
class InterruptRequest:
    """What an interrupt asks a person, read from its value."""

    shape: str
    action: str
    args: Any
    message: str
    risk: str = Risk.HIGH
    # Agent inbox only, one per action: how a rejection answers ("response" or "ignore").
    reject_as: tuple[str, ...] = ()


def read_request(value: Any, *, encode: Codec) -> InterruptRequest:
    """The action, args and message an interrupt value asks about; `encode` makes args JSON-safe."""
    if isinstance(value, dict) and _named(value, "action"):
        message = value.get("message", value.get("description"))
        return InterruptRequest(
            shape=PLAIN,
            action=_short(value["action"]),
            args=encode(value.get("args", {})),
            message=message if isinstance(message, str) else "",
            risk=value["risk"] if value.get("risk") in Risk.values else Risk.HIGH,
        )
    requests = value.get("action_requests") if isinstance(value, dict) else None
    if isinstance(requests, list) and requests and all(_named(item, "name") for item in requests):
        actions = [(item["name"], item.get("args", {}), item.get("description")) for item in requests]
        return _actions(HITL, actions, encode=encode)
    if isinstance(value, list) and value and all(_named(_get(item, "action_request"), "action") for item in value):
        actions = [(item["action_request"]["action"], item["action_request"].get("args", {}), item.get("description"))
                   for item in value]  # fmt: skip
        reject_as = tuple("response" if (item.get("config") or {}).get("allow_respond", True) else "ignore"
                          for item in value)  # fmt: skip
        return _actions(AGENT_INBOX, actions, encode=encode, reject_as=reject_as)
    return InterruptRequest(
        shape=OTHER, action="interrupt", args={"value": encode(value)}, message=value if isinstance(value, str) else ""
    )


def _get(item: Any, key: str) -> Any:
    return item.get(key) if isinstance(item, dict) else None


def _named(item: Any, key: str) -> bool:
    return isinstance(item, dict) and isinstance(item.get(key), str) and bool(item[key].strip())


def _short(action: str) -> str:
    return action if len(action) <= ACTION_CHARS else action[: ACTION_CHARS - 1] + "…"


def _actions(
    shape: str, actions: list[tuple[str, Any, Any]], *, encode: Codec, reject_as: tuple[str, ...] = ()
) -> InterruptRequest:
    """One approval for the actions of a request: the action itself when it is alone."""
    if len(actions) == 1:
        name, args, description = actions[0]
        message = description if isinstance(description, str) else ""
        return InterruptRequest(shape, _short(name), encode(args), message, reject_as=reject_as)
    return InterruptRequest(
        shape=shape,
        action=_short(", ".join(name for name, _, _ in actions)),
        args={"actions": [{"name": name, "args": encode(args)} for name, args, _ in actions]},
        message="\n\n".join(f"{name}: {text}" for name, _, text in actions if isinstance(text, str)),
        reject_as=reject_as,
    )


# --------------------------------------------------------------------------- filing


@dataclass(frozen=True)
class PendingInterrupt:
    """An interrupt as LangGraph wrote it: its value and id (None for a bare value)."""

    value: Any
    id: str | None


def pending_interrupts(written: Any) -> list[PendingInterrupt]:
    """The interrupts in the value of an `__interrupt__` write (a tuple of `Interrupt`s, as a rule)."""
    items = written if isinstance(written, (list, tuple)) else [written]
    found = []
    for item in items:
        interrupt_id = getattr(item, "id", None)
        value = getattr(item, "value", item)
        found.append(PendingInterrupt(value=value, id=interrupt_id if isinstance(interrupt_id, str) else None))
    return found


def file_interrupts(
    *,
    thread: Thread,
    checkpoint_id: UUID,
    lg_id: str,
    task_id: str,
    interrupts: Sequence[PendingInterrupt],
    resumed: int,
    encode: Codec,
    fence: Fence | None = None,
) -> list[ApprovalRequest]:
    """File a pending approval for each interrupt not filed before; returns the new approvals.

    `resumed` is how many resume values the task had consumed when it interrupted, which tells a
    second `interrupt()` in one node from the first. An interrupt that finds the thread already
    waiting on another decision is left alone: the graph raises it again when that decision
    resumes it, and it is filed then.
    """
    filed = []
    checkpoint = Checkpoint.objects.only("id", "thread_id").get(pk=checkpoint_id)
    for interrupt in interrupts:
        request = read_request(interrupt.value, encode=encode)
        key = _marker_key(lg_id, task_id, resumed, interrupt, encode)
        try:
            with transaction.atomic():
                if get_tool_result(thread=thread, key=key) is not None:
                    continue
                approval = request_approval(thread=thread, checkpoint=checkpoint, action=request.action,
                                            args=request.args, message=request.message, risk=request.risk,
                                            fence=fence)  # fmt: skip
                put_tool_result(thread=thread, key=key, tool=f"{MARKER_TOOL}:{approval.pk}", checkpoint=checkpoint,
                                result={"approval": str(approval.pk), "interrupt_id": interrupt.id,
                                        "shape": request.shape, "reject_as": list(request.reject_as),
                                        "lg_id": lg_id, "task_id": task_id})  # fmt: skip
        except ApprovalPending:
            log.info("thread %s already waits on a decision; interrupt %s is filed when it comes back", thread.pk,
                     interrupt.id)  # fmt: skip
            continue
        except InvalidApproval as exc:
            log.warning("interrupt %s of thread %s cannot be filed as an approval: %s", interrupt.id, thread.pk, exc)
            continue
        except ThreadCancelled:
            log.info("thread %s was cancelled; interrupt %s is not filed", thread.pk, interrupt.id)
            continue
        filed.append(approval)
    return filed


def _marker_key(lg_id: str, task_id: str, resumed: int, interrupt: PendingInterrupt, encode: Codec) -> str:
    value = codec.to_canonical_bytes(encode(interrupt.value)).hex()
    parts = [MARKER_TOOL, lg_id, task_id, str(resumed), interrupt.id or "", value]
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()


# --------------------------------------------------------------------------- resuming


def resume_for(approval: ApprovalRequest, *, decode: Codec) -> Any:
    """What a decided approval resumes its graph with, `Command(resume=<this>)`: the decision's
    value keyed by its interrupt's id, which LangGraph needs when several interrupts are pending.

    An approval filed some other way (through the API on a LangGraph thread) resumes with the
    plain decision value, which LangGraph accepts while one interrupt is pending.
    """
    marker = ToolResult.objects.filter(thread_id=approval.thread_id, tool=f"{MARKER_TOOL}:{approval.pk}").first()
    info = marker.result if marker is not None else {}
    value = resume_value(
        shape=info.get("shape", PLAIN), action=approval.action, asked=approval.args, decision=decision_for(approval),
        reject_as=tuple(info.get("reject_as", ())), decode=decode,
    )  # fmt: skip
    interrupt_id = info.get("interrupt_id")
    return {interrupt_id: value} if interrupt_id else value


def resume_value(
    *, shape: str, action: str, asked: Any, decision: Decision, reject_as: tuple[str, ...], decode: Codec
) -> Any:
    """What the graph's `interrupt()` call returns for this decision (see the module docstring)."""
    if shape == HITL:
        decided = _decided(action, asked, decision, decode)
        return {"decisions": [_hitl(name, args, changed, decision) for name, args, changed in decided]}
    if shape == AGENT_INBOX:
        decided = _decided(action, asked, decision, decode)
        how = reject_as + ("response",) * (len(decided) - len(reject_as))
        return [_inbox(name, args, changed, decision, how[i]) for i, (name, args, changed) in enumerate(decided)]
    return {
        "decision": "approve" if decision.approved else "reject",
        "args": decode(decision.args) if decision.approved else None,
        "edited": decision.edited, "comment": decision.comment, "decided_by": decision.decided_by,
        "expired": decision.expired,
    }  # fmt: skip


def _decided(action: str, asked: Any, decision: Decision, decode: Codec) -> list[tuple[str, Any, bool]]:
    """(name, approved args, changed by the reviewer) for each action of a HITL or agent-inbox request."""
    approved = decision.args if decision.approved else asked
    if not (isinstance(asked, dict) and list(asked) == ["actions"]):
        return [(action, decode(approved), approved != asked)]
    before = asked["actions"]
    after = approved.get("actions") if isinstance(approved, dict) else None
    if not (isinstance(after, list) and len(after) == len(before) and all(_named(item, "name") for item in after)):
        raise ValueError(f'The approved args must keep the shape {{"actions": [...]}} with {len(before)} actions, '
                         'each a {"name", "args"} object.')  # fmt: skip
    return [(new["name"], decode(new.get("args", {})), new != old) for old, new in zip(before, after, strict=True)]


def _hitl(name: str, args: Any, changed: bool, decision: Decision) -> dict[str, Any]:
    if not decision.approved:
        return {"type": "reject", "message": decision.comment}
    if not changed:
        return {"type": "approve"}
    return {"type": "edit", "edited_action": {"name": name, "args": args}}


def _inbox(name: str, args: Any, changed: bool, decision: Decision, reject_as: str) -> dict[str, Any]:
    if not decision.approved:
        return (
            {"type": "response", "args": decision.comment}
            if reject_as == "response"
            else {"type": "ignore", "args": None}
        )
    if not changed:
        return {"type": "accept", "args": None}
    return {"type": "edit", "args": {"action": name, "args": args}}
