"""A thread's trajectory as OpenTelemetry spans that follow the GenAI semantic conventions, for the
observability tools that read them (https://opentelemetry.io/docs/specs/semconv/gen-ai/).

One `invoke_agent {agent}` span per run (quicksave_agents Run: what a worker or an external agent
did between its claim and its end), and one for the work done before the thread's first run (or
for the whole thread when nothing ran it as a run); each is the root of a trace of its own, and
all of a thread's spans carry `gen_ai.conversation.id` = the thread's id. Under it:

- `chat {model}` (or `chat` when the checkpoint names no model) for each assistant message: a
  model call's output, from the checkpoint before it (its input) to the checkpoint that
  recorded it, with the checkpoint's model parameters (`gen_ai.request.model`, temperature,
  top_p, seed) and `gen_ai.response.finish_reasons`;
- `execute_tool {tool}` for each tool call, with `gen_ai.tool.name`, `gen_ai.tool.call.id` and
  `gen_ai.tool.type`, from the checkpoint that recorded the call to the one that recorded its
  result;
- `approval {action}` for each decided approval, from the request to the decision, with
  `quicksave.approval.decision`, `.reviewer` and `.comment` and a `quicksave.approval.decided`
  event at the decision.

The trajectory is read as checkpoints/trajectories.py reads it: the `messages` of the state at the
head of the thread's active branch, in OpenAI's chat shape (`trajectories.chat_messages`); a thread
whose state is not in that shape, or whose history fails its integrity check, is skipped and
counted. A message's time is the checkpoint at which the `messages` list first held it
(`storage.states_along` replays the active branch once, keeping nothing in the process's cache).

Message content (`gen_ai.input.messages`, `gen_ai.output.messages`, `gen_ai.tool.call.arguments`,
`gen_ai.tool.call.result`, an approval's arguments) is left out unless asked for (`content=True`;
QUICKSAVE_GENAI_CAPTURE_CONTENT for the live export), as the conventions require: it is likely to
hold people's data. `gen_ai.provider.name` is written only when a checkpoint's metadata names it
(`provider`): Quicksave does not guess a provider from a model's name.

Span and trace ids are derived from what they describe (a run, a message's checkpoint, a call, an
approval), so the live export (checkpoints.genai_live) and a batch export of the same thread name
the same spans, and a receiver that deduplicates sees an export repeated as one.
"""

from __future__ import annotations

import hashlib
import json
from bisect import bisect_right
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

from django.db.models import QuerySet
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from approvals.models import ApprovalRequest, ApprovalStatus
from checkpoints import storage, trajectories
from checkpoints.models import Checkpoint, Thread, ThreadStatus
from quicksave import telemetry
from quicksave_agents.models import Agent, Run, RunStatus

SCOPE = InstrumentationScope("quicksave.genai", "1")
# Spans go to the exporter this many at a time (an OTLP request each).
EXPORT_BATCH = 512
FAILED_THREAD = frozenset({ThreadStatus.FAILED, ThreadStatus.CANCELLED})
FINISHED_THREAD = frozenset({ThreadStatus.COMPLETED, ThreadStatus.FAILED, ThreadStatus.CANCELLED})
DECISIONS = {
    ApprovalStatus.APPROVED: "approve",
    ApprovalStatus.REJECTED: "reject",
    ApprovalStatus.EXPIRED: "expired",
    ApprovalStatus.CANCELLED: "cancelled",
    ApprovalStatus.RESOLVED: "resolved",
}

Attributes = dict[str, str | int | float | bool | Sequence[str]]


# --------------------------------------------------------------------------- ids and times


def _digest(*parts: object, size: int) -> int:
    value = int.from_bytes(hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=size).digest(), "big")
    return value or 1  # an id of zero means "no id"


def _ns(when: datetime) -> int:
    return int(when.timestamp() * 1_000_000) * 1000


@dataclass(frozen=True)
class Segment:
    """What one `invoke_agent` span covers: a run, or the thread's work before (or without) runs."""

    key: str  # "run:<id>" or "thread:<id>"
    start: datetime
    run: Run | None = None

    @property
    def trace_id(self) -> int:
        return _digest("quicksave-genai-trace", self.key, size=16)

    @property
    def span_id(self) -> int:
        return _digest("quicksave-genai-agent", self.key, size=8)

    def context(self) -> SpanContext:
        return _context(self.trace_id, self.span_id)


def _context(trace_id: int, span_id: int) -> SpanContext:
    return SpanContext(trace_id, span_id, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))


def segments(thread: Thread, runs: Sequence[Run]) -> list[Segment]:
    """The thread's segment, then one per run that started, in the order they started."""
    started = sorted(
        (Segment(f"run:{run.pk}", run.started_at, run) for run in runs if run.started_at is not None),
        key=lambda segment: segment.start,
    )
    return [Segment(f"thread:{thread.pk}", thread.created_at), *started]


def segment_at(found: Sequence[Segment], when: datetime) -> Segment:
    """The segment a moment belongs to: the last one to start at or before it."""
    index = bisect_right([segment.start for segment in found], when) - 1
    return found[max(index, 0)]


def thread_runs(thread: UUID | list[UUID]) -> list[Run]:
    """The runs of a thread (or of several)."""
    chosen = (
        Run.objects.filter(thread_id__in=thread) if isinstance(thread, list) else Run.objects.filter(thread_id=thread)
    )
    return list(chosen.only("id", "thread", "reason", "status", "error", "created_at", "started_at", "finished_at"))


# --------------------------------------------------------------------------- what a span says


@dataclass(frozen=True, slots=True)
class Stamp:
    """A checkpoint as the spans need it: when, its model parameters, and how many messages its state held."""

    checkpoint_id: UUID
    seq: int
    at: datetime
    model: str
    temperature: float | None
    top_p: float | None
    seed: int | None
    provider: str
    messages: int

    @classmethod
    def of(cls, row: storage.Row | Checkpoint, messages: int) -> Stamp:
        provider = row.metadata.get("provider") if isinstance(row.metadata, dict) else None
        return cls(row.id, row.seq, row.created_at, row.model_name, row.temperature, row.top_p, row.seed,
                   provider if isinstance(provider, str) else "", messages)  # fmt: skip


@dataclass
class Conversation:
    """One thread's facts every span repeats, and how it is exported."""

    thread_id: UUID
    agent: Agent
    content: bool
    resource: Resource
    tools: dict[str, str] = field(default_factory=dict)  # tool name -> description, from the state's `tools`

    def attributes(self, operation: str) -> Attributes:
        return {
            "gen_ai.operation.name": operation,
            "gen_ai.conversation.id": str(self.thread_id),
            "gen_ai.agent.name": self.agent.name,
            "quicksave.thread.id": str(self.thread_id),
        }

    def span(
        self,
        name: str,
        *,
        trace_id: int,
        span_id: int,
        parent: SpanContext | None,
        start: datetime,
        end: datetime,
        attributes: Attributes,
        kind: SpanKind = SpanKind.INTERNAL,
        status: Status | None = None,
        events: Sequence[Event] = (),
    ) -> ReadableSpan:
        return ReadableSpan(
            name, context=_context(trace_id, span_id), parent=parent, resource=self.resource, attributes=attributes,
            events=events, kind=kind, status=status or Status(StatusCode.UNSET), start_time=_ns(start),
            end_time=max(_ns(end), _ns(start)), instrumentation_scope=SCOPE,
        )  # fmt: skip


def conversation(thread: Thread, *, content: bool, resource: Resource | None = None) -> Conversation:
    return Conversation(thread.pk, thread.agent, content, resource or telemetry.resource())


def agent_span(conv: Conversation, segment: Segment, *, end: datetime, messages: Sequence[dict[str, Any]] = (),
               first: int = 0, last: int = 0, failed: str = "") -> ReadableSpan:  # fmt: skip
    """`invoke_agent {agent}` for a segment; with content, the messages its first model call saw and
    its last answer (`messages[first:last]` are those the segment added)."""
    attributes = conv.attributes("invoke_agent")
    attributes["gen_ai.agent.version"] = conv.agent.version
    if conv.agent.description:
        attributes["gen_ai.agent.description"] = conv.agent.description
    if segment.run is not None:
        attributes["quicksave.run.id"] = str(segment.run.pk)
        attributes["quicksave.run.reason"] = segment.run.reason
        attributes["quicksave.run.status"] = segment.run.status
    if failed:
        attributes["error.type"] = failed
    if conv.content:
        replies = [i for i in range(first, last) if messages[i]["role"] == "assistant"]
        if replies:
            attributes["gen_ai.input.messages"] = _json([input_message(m) for m in messages[: replies[0]]])
            attributes["gen_ai.output.messages"] = _json([output_message(messages[replies[-1]])])
    status = Status(StatusCode.ERROR, failed) if failed else None
    return conv.span(f"invoke_agent {conv.agent.name}", trace_id=segment.trace_id, span_id=segment.span_id,
                     parent=None, start=segment.start, end=end, attributes=attributes, status=status)  # fmt: skip


def message_spans(
    conv: Conversation,
    *,
    messages: Sequence[dict[str, Any]],
    new: range,
    stamp: Stamp,
    previous: Stamp | None,
    segment: Segment,
    introduced: Callable[[int], datetime | None],
) -> Iterator[ReadableSpan]:
    """The spans of the messages `new` (indexes into `messages`), which checkpoint `stamp` recorded:
    a chat span per assistant message, an execute_tool span per tool result. `introduced(i)` is when
    message i first appeared, when known (a call's start)."""
    parent = segment.context()
    began = previous.at if previous is not None else stamp.at
    for index in new:
        message = messages[index]
        if message["role"] == "assistant":
            yield _chat_span(conv, messages, index, stamp=stamp, start=began, segment=segment, parent=parent)
        elif message["role"] == "tool":
            call = _call(messages, index)
            if call is not None:
                call_index, function = call
                start = introduced(call_index) or began
                yield _tool_span(conv, message["tool_call_id"], function, stamp=stamp, start=start, end=stamp.at,
                                 segment=segment, parent=parent, result=message.get("content"))  # fmt: skip


def _chat_span(conv: Conversation, messages: Sequence[dict[str, Any]], index: int, *, stamp: Stamp, start: datetime,
               segment: Segment, parent: SpanContext) -> ReadableSpan:  # fmt: skip
    message = messages[index]
    attributes = conv.attributes("chat")
    attributes["quicksave.checkpoint.id"] = str(stamp.checkpoint_id)
    attributes["quicksave.checkpoint.seq"] = stamp.seq
    if stamp.model:
        attributes["gen_ai.request.model"] = stamp.model
    if stamp.provider:
        attributes["gen_ai.provider.name"] = stamp.provider
    if stamp.temperature is not None:
        attributes["gen_ai.request.temperature"] = stamp.temperature
    if stamp.top_p is not None:
        attributes["gen_ai.request.top_p"] = stamp.top_p
    if stamp.seed is not None:
        attributes["gen_ai.request.seed"] = stamp.seed
    attributes["gen_ai.response.finish_reasons"] = [_finish_reason(message)]
    if conv.content:
        attributes["gen_ai.input.messages"] = _json([input_message(m) for m in messages[:index]])
        attributes["gen_ai.output.messages"] = _json([output_message(message)])
    name = f"chat {stamp.model}" if stamp.model else "chat"
    span_id = _digest("quicksave-genai-chat", conv.thread_id, stamp.checkpoint_id, index, size=8)
    return conv.span(name, trace_id=segment.trace_id, span_id=span_id, parent=parent, start=start, end=stamp.at,
                     attributes=attributes, kind=SpanKind.CLIENT)  # fmt: skip


def _tool_span(conv: Conversation, call_id: str, function: dict[str, Any], *, stamp: Stamp, start: datetime,
               end: datetime, segment: Segment, parent: SpanContext, result: Any = None) -> ReadableSpan:  # fmt: skip
    name = function["name"]
    attributes = conv.attributes("execute_tool")
    attributes["gen_ai.tool.name"] = name
    attributes["gen_ai.tool.call.id"] = call_id
    attributes["gen_ai.tool.type"] = "function"
    attributes["quicksave.checkpoint.id"] = str(stamp.checkpoint_id)
    if conv.tools.get(name):
        attributes["gen_ai.tool.description"] = conv.tools[name]
    if conv.content:
        attributes["gen_ai.tool.call.arguments"] = function["arguments"]
        if result is not None:
            attributes["gen_ai.tool.call.result"] = result if isinstance(result, str) else _json(result)
    span_id = _digest("quicksave-genai-tool", conv.thread_id, stamp.checkpoint_id, call_id, size=8)
    return conv.span(f"execute_tool {name}", trace_id=segment.trace_id, span_id=span_id, parent=parent,
                     start=start, end=end, attributes=attributes)  # fmt: skip


def _call(messages: Sequence[dict[str, Any]], result_index: int) -> tuple[int, dict[str, Any]] | None:
    """The assistant message (its index) and function of the call a tool result answers."""
    call_id = messages[result_index]["tool_call_id"]
    for index in range(result_index - 1, -1, -1):
        for call in messages[index].get("tool_calls") or ():
            if call["id"] == call_id:
                return index, call["function"]
    return None


def approval_span(conv: Conversation, approval: ApprovalRequest, *, segment: Segment) -> ReadableSpan | None:
    """`approval {action}` from the request to its decision, with who decided what and why; None
    while it waits."""
    if approval.decided_at is None:
        return None
    decision = DECISIONS.get(ApprovalStatus(approval.status), approval.status)
    if approval.status == ApprovalStatus.APPROVED and approval.args_edited:
        decision = "approve_edited"
    reviewer = approval.decided_by.get_username() if approval.decided_by is not None else ""
    about: Attributes = {
        "quicksave.approval.decision": decision,
        "quicksave.approval.reviewer": reviewer or ("rule" if approval.rule_id else ""),
        "quicksave.approval.comment": approval.comment,
    }
    attributes = conv.attributes("quicksave.approval")
    attributes.update(about)
    attributes["quicksave.approval.id"] = str(approval.pk)
    attributes["quicksave.approval.action"] = approval.action
    attributes["quicksave.approval.risk"] = approval.risk
    attributes["gen_ai.tool.name"] = approval.action
    if conv.content and not approval.unreadable:
        attributes["quicksave.approval.args"] = _json(approval.args)
        if approval.args_edited:
            attributes["quicksave.approval.decided_args"] = _json(approval.decided_args)
    event = Event("quicksave.approval.decided", attributes=about, timestamp=_ns(approval.decided_at))
    status = Status(StatusCode.UNSET)
    span_id = _digest("quicksave-genai-approval", approval.pk, size=8)
    return conv.span(f"approval {approval.action}", trace_id=segment.trace_id, span_id=span_id,
                     parent=segment.context(), start=approval.created_at, end=approval.decided_at,
                     attributes=attributes, status=status, events=[event])  # fmt: skip


def decided_approvals(thread: UUID | list[UUID]) -> list[ApprovalRequest]:
    """The decided approvals of a thread (or of several), oldest first."""
    chosen = (
        ApprovalRequest.objects.filter(thread_id__in=thread)
        if isinstance(thread, list)
        else ApprovalRequest.objects.filter(thread_id=thread)
    )
    return list(chosen.filter(decided_at__isnull=False).select_related("decided_by").order_by("created_at", "pk"))


# --------------------------------------------------------------------------- message shapes


def input_message(message: dict[str, Any]) -> dict[str, Any]:
    """A chat message in the conventions' input-message shape (`role`, `parts`)."""
    parts: list[dict[str, Any]] = []
    if message["role"] == "tool":
        parts.append({"type": "tool_call_response", "id": message["tool_call_id"], "response": message["content"]})
    else:
        parts.extend(_content_parts(message.get("content")))
        for call in message.get("tool_calls") or ():
            parts.append({"type": "tool_call", "id": call["id"], "name": call["function"]["name"],
                          "arguments": _arguments(call["function"]["arguments"])})  # fmt: skip
    shaped: dict[str, Any] = {"role": message["role"], "parts": parts}
    if message.get("name"):
        shaped["name"] = message["name"]
    return shaped


def output_message(message: dict[str, Any]) -> dict[str, Any]:
    """An assistant message in the conventions' output-message shape (with its `finish_reason`)."""
    return {**input_message(message), "finish_reason": _finish_reason(message)}


def _content_parts(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "content": content}]
    parts = []
    for part in content or ():
        if isinstance(part, dict) and isinstance(part.get("text"), str):
            parts.append({"type": "text", "content": part["text"]})
        elif isinstance(part, dict):
            parts.append({"type": str(part.get("type", "unknown"))})  # an image or file: its kind, not its bytes
    return parts


def _arguments(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


def _finish_reason(message: dict[str, Any]) -> str:
    return "tool_call" if message.get("tool_calls") else "stop"


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


# --------------------------------------------------------------------------- batch


def thread_spans(
    thread: Thread,
    *,
    content: bool = False,
    resource: Resource | None = None,
    runs: Sequence[Run] | None = None,
    approvals: Sequence[ApprovalRequest] | None = None,
) -> list[ReadableSpan] | None:
    """Every span of a thread's trajectory (its active branch), or None when its state is not
    chat-shaped or its history fails its integrity check."""
    if thread.head_id is None:
        return None
    stamps: list[Stamp] = []
    state: dict[str, Any] = {}
    try:
        for row, state in storage.states_along(thread.head_id):
            raw = state.get("messages")
            stamps.append(Stamp.of(row, len(raw) if isinstance(raw, list) else 0))
    except (storage.IntegrityFailure, storage.NotFound):
        return None
    messages = trajectories.chat_messages(state.get("messages"))
    tools = trajectories.chat_tools(state.get("tools", []))
    if messages is None or tools is None:
        return None
    conv = conversation(thread, content=content, resource=resource)
    conv.tools = {tool["function"]["name"]: tool["function"].get("description", "") for tool in tools}
    found = segments(thread, thread_runs(thread.pk) if runs is None else runs)
    activity: dict[str, Activity] = {}
    arrived: list[datetime] = []  # when each message first appeared

    def introduced(index: int) -> datetime | None:
        return arrived[index] if index < len(arrived) else None

    spans: list[ReadableSpan] = []
    for position, stamp in enumerate(stamps):
        # Message i arrived with the first checkpoint whose state held more than i messages.
        new = range(len(arrived), max(len(arrived), min(stamp.messages, len(messages))))
        arrived.extend(stamp.at for _ in new)
        segment = segment_at(found, stamp.at)
        activity.setdefault(segment.key, Activity(segment.start)).saw(stamp.at, new)
        previous = stamps[position - 1] if position else None
        spans.extend(message_spans(conv, messages=messages, new=new, stamp=stamp, previous=previous,
                                   segment=segment, introduced=introduced))  # fmt: skip
    for approval in decided_approvals(thread.pk) if approvals is None else approvals:
        segment = segment_at(found, approval.created_at)
        span = approval_span(conv, approval, segment=segment)
        if span is not None and approval.decided_at is not None:
            spans.append(span)
            activity.setdefault(segment.key, Activity(segment.start)).saw(approval.decided_at, range(0))
    for segment in found:
        if segment.run is None and segment.key not in activity and len(found) > 1:
            continue  # nothing happened before the first run
        done = activity.get(segment.key, Activity(segment.start))
        end = segment.run.finished_at if segment.run is not None and segment.run.finished_at else done.last
        spans.append(agent_span(conv, segment, end=end, messages=messages, first=done.first, last=done.stop,
                                failed=failure(thread, segment)))  # fmt: skip
    return spans


@dataclass
class Activity:
    """What one segment did: its last moment and the messages it added (`first` to `stop`)."""

    last: datetime
    first: int = 0
    stop: int = 0
    _any: bool = False

    def saw(self, when: datetime, new: range) -> None:
        self.last = max(self.last, when)
        if new:
            if not self._any:
                self.first, self._any = new.start, True
            self.stop = new.stop


def failure(thread: Thread, segment: Segment) -> str:
    """The `error.type` of a segment's `invoke_agent` span: its run failed, or (outside runs) its thread did."""
    if segment.run is not None:
        return "run_failed" if segment.run.status == RunStatus.FAILED else ""
    return "thread_failed" if thread.status in FAILED_THREAD else ""


@dataclass
class Sent:
    threads: int = 0
    spans: int = 0
    skipped: int = 0
    skipped_ids: list[str] = field(default_factory=list)


class ExportFailed(Exception):
    """The receiver did not take the spans (unreachable, or it answered with an error)."""


def export(
    pages: Iterator[list[Thread]],
    exporter: Any,
    *,
    content: bool = False,
    progress: Callable[[Sent], None] | None = None,
) -> Sent:
    """Build each thread's spans and send them through `exporter` (an OpenTelemetry SpanExporter),
    EXPORT_BATCH at a time; raises ExportFailed when the receiver does not take a batch. The runs
    and decided approvals of a page of threads are read in one query each."""
    from opentelemetry.sdk.trace.export import SpanExportResult

    sent = Sent()
    resource = telemetry.resource()
    pending: list[ReadableSpan] = []

    def flush() -> None:
        if pending:
            if exporter.export(list(pending)) != SpanExportResult.SUCCESS:
                raise ExportFailed(f"did not take {len(pending)} span(s)")
            sent.spans += len(pending)
            pending.clear()

    for page in pages:
        ids = [thread.pk for thread in page]
        runs: dict[UUID, list[Run]] = {}
        for run in thread_runs(ids):
            runs.setdefault(run.thread_id, []).append(run)
        approvals: dict[UUID, list[ApprovalRequest]] = {}
        for approval in decided_approvals(ids):
            approvals.setdefault(approval.thread_id, []).append(approval)
        for thread in page:
            spans = thread_spans(thread, content=content, resource=resource, runs=runs.get(thread.pk, []),
                                 approvals=approvals.get(thread.pk, []))  # fmt: skip
            if spans is None:
                sent.skipped += 1
                if len(sent.skipped_ids) < 20:
                    sent.skipped_ids.append(str(thread.pk))
            else:
                sent.threads += 1
                pending.extend(spans)
                if len(pending) >= EXPORT_BATCH:
                    flush()
            if progress is not None:
                progress(sent)
    flush()
    return sent


def thread_pages(threads: QuerySet[Thread], *, batch_size: int = 200) -> Iterator[list[Thread]]:
    """`threads` with a head, in id order, a keyset page at a time (constant memory)."""
    rows = threads.filter(head__isnull=False).select_related("agent").order_by("pk")
    after: UUID | None = None
    while True:
        page = list((rows if after is None else rows.filter(pk__gt=after))[:batch_size])
        if page:
            yield page
        if len(page) < batch_size:
            return
        after = page[-1].pk
