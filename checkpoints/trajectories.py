"""Trajectories out for training: fine-tuning JSONL (OpenAI chat format) and preference pairs
(DPO JSONL) from people's edits and rejections. The one way out; the command, the API and any
page call `fine_tuning_records` / `preference_records` (or `lines`) and re-implement nothing.

Both read states through the storage engine's public surface (`storage.state_at`, integrity
checked) and approvals through their model. Threads are read one at a time, in keyset batches of
ids, so memory stays flat however many threads match.

Fine-tuning, one line per thread: `{"messages": [...], "tools": [...]}` from the state at the
head of the thread's active branch (the branch that finished, not an abandoned fork). The state
must hold `messages` already in OpenAI's chat shape (roles system/user/assistant/tool, an
assistant's `tool_calls`, each tool result after the call it answers) and, optionally, `tools`
as OpenAI function definitions. A thread whose state does not have that shape is skipped and
counted (`Tally.skipped`), never guessed at; so is one with a row that fails its integrity check.
Only the message keys the format defines are written.

Preference pairs, one line per approval that was approved with edited arguments or rejected:
`{"input": {"messages": [...]}, "preferred_output": [...], "non_preferred_output": [...]}`. The
input is the conversation in the state at the approval's checkpoint, without a trailing assistant
turn that makes tool calls (that turn is the proposal); the non-preferred output is the agent's
proposed call, the preferred one the person's edited call, or for a rejection with a comment the
comment as an assistant turn when asked for (`rejections="comment"`); other rejections are skipped
and counted.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal
from uuid import UUID

from django.db.models import Q, QuerySet

from approvals.models import ApprovalRequest, ApprovalStatus
from checkpoints import storage
from checkpoints.models import Thread

CONTENT_TYPE = "application/x-ndjson"
BATCH_SIZE = 200
CHUNK_BYTES = 64 * 1024
ROLES = frozenset({"system", "user", "assistant", "tool"})

Rejections = Literal["skip", "comment"]


@dataclass(frozen=True)
class Filter:
    """Which threads: an agent (by name), a time range on when the thread started, an outcome (status)."""

    agent: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    outcome: str | None = None

    def apply(self, threads: QuerySet[Thread]) -> QuerySet[Thread]:
        if self.agent:
            threads = threads.filter(agent__name=self.agent)
        if self.since is not None:
            threads = threads.filter(created_at__gte=self.since)
        if self.until is not None:
            threads = threads.filter(created_at__lt=self.until)
        if self.outcome:
            threads = threads.filter(status=self.outcome)
        return threads


@dataclass
class Tally:
    """What an export wrote and what it left out, filled in as the records are read."""

    written: int = 0
    skipped: int = 0
    seen: int = 0
    skipped_ids: list[str] = field(default_factory=list)
    progress: Callable[[int], None] | None = None  # called with `seen` after each thread or approval

    def see(self) -> None:
        self.seen += 1
        if self.progress is not None:
            self.progress(self.seen)

    def skip(self, item: UUID) -> None:
        self.skipped += 1
        if len(self.skipped_ids) < 20:  # a sample to look at, not a list that grows with the export
            self.skipped_ids.append(str(item))


# --------------------------------------------------------------------------- fine-tuning


def fine_tuning_records(threads: QuerySet[Thread], *, tally: Tally | None = None) -> Iterator[dict[str, Any]]:
    """One `{"messages", "tools"}` record per thread with a chat-shaped state at its active head."""
    tally = tally if tally is not None else Tally()
    for thread_id, head_id in _keyset(fine_tuning_candidates(threads).values_list("pk", "head_id")):
        tally.see()
        state = _state(head_id)
        messages = chat_messages(state.get("messages"))
        tools = chat_tools(state.get("tools", []))
        if messages is None or tools is None or not any(m["role"] == "assistant" for m in messages):
            tally.skip(thread_id)
            continue
        tally.written += 1
        yield {"messages": messages, "tools": tools}


def chat_messages(value: Any) -> list[dict[str, Any]] | None:
    """`value` as OpenAI chat messages, or None when it is not already in that shape."""
    if not isinstance(value, list) or not value:
        return None
    out: list[dict[str, Any]] = []
    calls: set[str] = set()
    for raw in value:
        message = _message(raw, calls)
        if message is None:
            return None
        out.append(message)
    return out


def _message(raw: Any, calls: set[str]) -> dict[str, Any] | None:
    if not isinstance(raw, dict) or raw.get("role") not in ROLES:
        return None
    role, content = raw["role"], raw.get("content")
    if content is not None and not isinstance(content, str | list):
        return None
    message: dict[str, Any] = {"role": role, "content": content}
    if isinstance(raw.get("name"), str) and role in {"system", "user", "assistant"}:
        message["name"] = raw["name"]
    if role == "assistant":
        if raw.get("tool_calls"):
            tool_calls = (
                [_tool_call(call) for call in raw["tool_calls"]] if isinstance(raw["tool_calls"], list) else [None]
            )
            if any(call is None for call in tool_calls):
                return None
            message["tool_calls"] = tool_calls
            calls.update(call["id"] for call in tool_calls if call is not None)
        elif content is None:
            return None
    elif role == "tool":
        # A result must answer a call made before it: results out of order are not guessed at.
        if raw.get("tool_call_id") not in calls or content is None:
            return None
        message["tool_call_id"] = raw["tool_call_id"]
    elif content is None:
        return None
    return message


def _tool_call(raw: Any) -> dict[str, Any] | None:
    if not isinstance(raw, dict) or not isinstance(raw.get("id"), str) or raw.get("type", "function") != "function":
        return None
    function = raw.get("function")
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        return None
    arguments = function.get("arguments", "{}")
    if isinstance(arguments, dict):  # the chat format carries arguments as a JSON string
        arguments = json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))
    if not isinstance(arguments, str):
        return None
    return {"id": raw["id"], "type": "function", "function": {"name": function["name"], "arguments": arguments}}


def chat_tools(value: Any) -> list[dict[str, Any]] | None:
    """`value` as OpenAI function definitions, or None when it is not in that shape."""
    if not isinstance(value, list):
        return None
    tools = []
    for raw in value:
        function = raw.get("function") if isinstance(raw, dict) and raw.get("type") == "function" else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            return None
        kept = {key: function[key] for key in ("name", "description", "parameters", "strict") if key in function}
        tools.append({"type": "function", "function": kept})
    return tools


# --------------------------------------------------------------------------- preference pairs


def preference_records(
    threads: QuerySet[Thread], *, rejections: Rejections = "skip", tally: Tally | None = None
) -> Iterator[dict[str, Any]]:
    """One pair per edited or rejected approval on `threads`, in id order."""
    tally = tally if tally is not None else Tally()
    approvals = pair_candidates(threads).only(
        "id", "checkpoint_id", "action", "args", "decided_args", "status", "comment"
    )
    for approval in _keyset_objects(approvals):
        tally.see()
        record = preference_pair(approval, rejections=rejections)
        if record is None:
            tally.skip(approval.pk)
            continue
        tally.written += 1
        yield record


def pair_candidates(threads: QuerySet[Thread]) -> QuerySet[ApprovalRequest]:
    """The approvals on `threads` that may make a pair: approved with edited arguments, or rejected."""
    return ApprovalRequest.objects.filter(thread__in=threads).filter(
        Q(status=ApprovalStatus.APPROVED, args_edited=True) | Q(status=ApprovalStatus.REJECTED)
    )


def fine_tuning_candidates(threads: QuerySet[Thread]) -> QuerySet[Thread]:
    """The threads on `threads` that have a head to read (the count a progress bar runs to)."""
    return threads.filter(head__isnull=False)


def preference_pair(approval: ApprovalRequest, *, rejections: Rejections = "skip") -> dict[str, Any] | None:
    """The approval as a pair, or None when its state is not chat-shaped or it carries no preference."""
    if approval.status == ApprovalStatus.REJECTED:
        if rejections != "comment" or not approval.comment.strip():
            return None
        preferred: dict[str, Any] = {"role": "assistant", "content": approval.comment}
    else:
        preferred = _call_turn(approval, approval.decided_args)
    if approval.unreadable:  # its sealed arguments no longer open: nothing to pair
        return None
    messages = chat_messages(_state(approval.checkpoint_id).get("messages"))
    if messages is None:
        return None
    if messages[-1]["role"] == "assistant" and messages[-1].get("tool_calls"):
        messages = messages[:-1]  # the agent's proposal: it is the non-preferred output, not input
    if not messages:
        return None
    return {
        "input": {"messages": messages},
        "preferred_output": [preferred],
        "non_preferred_output": [_call_turn(approval, approval.args)],
    }


def _call_turn(approval: ApprovalRequest, args: Any) -> dict[str, Any]:
    arguments = json.dumps(args if args is not None else {}, ensure_ascii=False, separators=(",", ":"))
    call = {
        "id": f"call_{approval.pk.hex}",
        "type": "function",
        "function": {"name": approval.action, "arguments": arguments},
    }
    return {"role": "assistant", "content": None, "tool_calls": [call]}


def _state(checkpoint_id: UUID) -> dict[str, Any]:
    """The state at a checkpoint, or {} (skipped as not chat-shaped) when a row fails its integrity
    check: by then the stream has started, and one altered thread must not end everyone's file.

    Read once, so kept out of the process's state cache: an export of every thread would otherwise
    fill it (the process grows by the cache's budget) and push out the states live readers use."""
    try:
        return storage.state_at(checkpoint_id, cache=False)
    except storage.IntegrityFailure:
        return {}


# --------------------------------------------------------------------------- lines


def lines(records: Iterator[dict[str, Any]]) -> Iterator[bytes]:
    """Records as JSON Lines, in chunks of whole lines (for a streaming response or a file)."""
    chunk = bytearray()
    for record in records:
        chunk += json.dumps(record, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"
        if len(chunk) >= CHUNK_BYTES:
            yield bytes(chunk)
            chunk.clear()
    if chunk:
        yield bytes(chunk)


def _keyset(rows: QuerySet[Any, tuple[Any, ...]]) -> Iterator[tuple[Any, ...]]:
    """Rows (the pk first) in pk order, `BATCH_SIZE` at a time: no server-side cursor, so it works
    behind PgBouncer's transaction mode, and no more than one batch in memory."""
    after: UUID | None = None
    while True:
        page = rows.order_by("pk")
        if after is not None:
            page = page.filter(pk__gt=after)
        batch = list(page[:BATCH_SIZE])
        yield from batch
        if len(batch) < BATCH_SIZE:
            return
        after = batch[-1][0]


def _keyset_objects(rows: QuerySet[ApprovalRequest]) -> Iterator[ApprovalRequest]:
    after: UUID | None = None
    while True:
        page = rows.order_by("pk")
        if after is not None:
            page = page.filter(pk__gt=after)
        batch = list(page[:BATCH_SIZE])
        yield from batch
        if len(batch) < BATCH_SIZE:
            return
        after = batch[-1].pk
