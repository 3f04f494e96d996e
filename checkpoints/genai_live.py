"""The live GenAI export: the spans of checkpoints/genai.py sent as a thread's events commit, for the
agents an operator lists in QUICKSAVE_GENAI_LIVE_AGENTS.

It hangs off the publisher (checkpoints.live): each committed event is handed to `committed`, which
only puts it on this process's queue, so a writer never waits on it. One daemon thread takes the
events in order, reads what the spans need (the checkpoint and its parent's states, the thread's
runs, an approval) and hands the spans to the SDK's BatchSpanProcessor, whose own thread sends them
over OTLP/HTTP to QUICKSAVE_GENAI_OTLP_ENDPOINT (or where the OTEL_EXPORTER_OTLP_* variables say).

- `checkpoint.created`: a `chat` span per assistant message and an `execute_tool` span per tool
  result the checkpoint added, children of their run's `invoke_agent` span (sent later: ids are
  derived, so a child may arrive before its parent);
- `run.completed`, `run.failed`: the run's `invoke_agent` span;
- a thread that finishes (`thread.updated`, or a checkpoint, with status completed, failed or
  cancelled): the `invoke_agent` span of its work outside runs;
- `approval.decided`: the approval's span.

Message content is sent only with QUICKSAVE_GENAI_CAPTURE_CONTENT on. Live spans are best effort:
an event a process had not sent when it died is not sent (`manage.py export_genai` sends a
thread's spans again, with the same ids). A tool call's start is the checkpoint that recorded it
when this process saw that checkpoint, otherwise the result's parent checkpoint.
"""

from __future__ import annotations

import atexit
import logging
import queue
import threading
from datetime import datetime
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db import close_old_connections, connection
from django.db.models import Max
from opentelemetry.sdk.trace import ReadableSpan

from approvals.models import ApprovalRequest
from checkpoints import genai, storage, trajectories
from checkpoints.models import Checkpoint, Thread
from checkpoints.storage.lru import LRU
from quicksave import telemetry
from quicksave_agents.models import Run, RunStatus

log = logging.getLogger(__name__)

RUN_ENDS = frozenset({f"run.{RunStatus.COMPLETED}", f"run.{RunStatus.FAILED}"})
_CHECKPOINT_FIELDS = ("id", "thread", "parent", "seq", "created_at", "model_name", "temperature", "top_p", "seed",
                      "metadata")  # fmt: skip


def agents() -> frozenset[str]:
    listed: frozenset[str] = settings.QUICKSAVE_GENAI_LIVE_AGENTS
    return listed


def committed(payload: dict[str, Any]) -> None:
    """A committed event (as websocket clients receive it): queued for the export thread when some
    agent is listed, else ignored. Never raises, never blocks."""
    if agents():
        _exporter.put(payload)


def flush(timeout: float = 10.0) -> bool:
    """Wait until every event queued so far is turned into spans and they are sent (tests, shutdown)."""
    return _exporter.flush(timeout)


class _Exporter:
    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[dict[str, Any] | threading.Event] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._processor: Any = None
        self._configured: tuple[str, ...] | None = None
        # Which agent a thread belongs to never changes; when each message arrived, as seen here.
        self._agent_of: LRU[UUID, str] = LRU(10_000)
        self._arrived: LRU[tuple[UUID, int], datetime] = LRU(100_000)
        self._resource: Any = None

    def put(self, item: dict[str, Any] | threading.Event) -> None:
        if self._thread is None or not self._thread.is_alive():
            with self._lock:
                if self._thread is None or not self._thread.is_alive():
                    self._thread = threading.Thread(target=self._run, name="genai-export", daemon=True)
                    self._thread.start()
        self._queue.put(item)

    def flush(self, timeout: float) -> bool:
        done = threading.Event()
        self.put(done)
        if not done.wait(timeout):
            return False
        processor = self._processor
        return bool(processor.force_flush(int(timeout * 1000))) if processor is not None else True

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if not isinstance(item, threading.Event):
                self._export(item)
            if self._queue.empty() or isinstance(item, threading.Event):
                connection.close()  # idle until the next write: hold no connection meanwhile
            if isinstance(item, threading.Event):
                item.set()

    def _export(self, event: dict[str, Any]) -> None:
        try:
            close_old_connections()
            for span in self._spans(event):
                self._sink().on_end(span)
        except Exception:  # one event's failure must not stop the export of the next
            log.warning("could not export the GenAI spans of event %s of thread %s", event.get("seq"),
                        event.get("thread"), exc_info=True)  # fmt: skip

    def _sink(self) -> Any:
        """The span processor for the current settings (made again when a test changes them)."""
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        wanted = (settings.QUICKSAVE_GENAI_OTLP_ENDPOINT,)
        if self._processor is None or self._configured != wanted:
            if self._processor is not None:
                self._processor.shutdown()
            self._processor = BatchSpanProcessor(telemetry.span_exporter(settings.QUICKSAVE_GENAI_OTLP_ENDPOINT))
            atexit.register(self._processor.shutdown)  # what is still queued goes out as the process ends
            self._configured = wanted
            self._resource = telemetry.resource()
        return self._processor

    def _spans(self, event: dict[str, Any]) -> list[ReadableSpan]:
        thread_id = UUID(event["thread"])
        name = self._agent_name(thread_id)
        if name is None or name not in agents():
            return []
        kind, data = event["type"], event.get("data") or {}
        thread = Thread.objects.select_related("agent").get(pk=thread_id)
        conv = genai.conversation(thread, content=settings.QUICKSAVE_GENAI_CAPTURE_CONTENT,
                                  resource=self._resource or telemetry.resource())  # fmt: skip
        spans: list[ReadableSpan] = []
        if kind == "checkpoint.created":
            spans.extend(self._checkpoint_spans(conv, thread, UUID(data["checkpoint"])))
        elif kind == "approval.decided":
            approval = ApprovalRequest.objects.select_related("decided_by").filter(pk=UUID(data["approval"])).first()
            if approval is not None:
                found = genai.segments(thread, genai.thread_runs(thread.pk))
                span = genai.approval_span(conv, approval, segment=genai.segment_at(found, approval.created_at))
                spans.extend([span] if span is not None else [])
        elif kind in RUN_ENDS:
            run = Run.objects.filter(pk=UUID(data["run"]), thread_id=thread.pk).first()
            if run is not None and run.started_at is not None:
                spans.append(self._agent_span(conv, thread, run=run))
        if (kind in ("thread.updated", "checkpoint.created")) and data.get("status") in genai.FINISHED_THREAD:
            span = self._thread_span(conv, thread)
            spans.extend([span] if span is not None else [])
        return spans

    def _agent_name(self, thread_id: UUID) -> str | None:
        found, name = self._agent_of.find(thread_id)
        if not found:
            name = Thread.objects.filter(pk=thread_id).values_list("agent__name", flat=True).first()
            if name is not None:
                self._agent_of.put(thread_id, name)
        return name

    def _checkpoint_spans(self, conv: genai.Conversation, thread: Thread, checkpoint_id: UUID) -> list[ReadableSpan]:
        checkpoint = Checkpoint.objects.only(*_CHECKPOINT_FIELDS).get(pk=checkpoint_id)
        state = storage.state_at(checkpoint.pk)
        raw = state.get("messages")
        messages = trajectories.chat_messages(raw)
        tools = trajectories.chat_tools(state.get("tools", []))
        if messages is None or tools is None:
            return []
        conv.tools = {tool["function"]["name"]: tool["function"].get("description", "") for tool in tools}
        previous = None
        before = 0
        if checkpoint.parent_id is not None:
            parent = Checkpoint.objects.only(*_CHECKPOINT_FIELDS).get(pk=checkpoint.parent_id)
            parent_raw = storage.state_at(parent.pk).get("messages")
            before = len(parent_raw) if isinstance(parent_raw, list) else 0
            previous = genai.Stamp.of(parent, before)
        stamp = genai.Stamp.of(checkpoint, len(messages))
        new = range(min(before, len(messages)), len(messages))
        for index in new:
            self._arrived.put((thread.pk, index), checkpoint.created_at)
        found = genai.segments(thread, genai.thread_runs(thread.pk))
        segment = genai.segment_at(found, checkpoint.created_at)
        return list(genai.message_spans(conv, messages=messages, new=new, stamp=stamp, previous=previous,
                                        segment=segment,
                                        introduced=lambda index: self._arrived.get((thread.pk, index))))  # fmt: skip

    def _agent_span(self, conv: genai.Conversation, thread: Thread, *, run: Run | None) -> ReadableSpan:
        """The `invoke_agent` span of a run, or (run=None) of the thread's work outside runs."""
        found = genai.segments(thread, genai.thread_runs(thread.pk))
        key = f"run:{run.pk}" if run is not None else f"thread:{thread.pk}"
        position = next(i for i, segment in enumerate(found) if segment.key == key)
        segment = found[position]
        during = Checkpoint.objects.filter(thread_id=thread.pk, created_at__gte=segment.start)
        if position + 1 < len(found):
            during = during.filter(created_at__lt=found[position + 1].start)
        latest = during.aggregate(last=Max("created_at"))["last"]
        end = run.finished_at if run is not None and run.finished_at else (latest or segment.start)
        messages: list[dict[str, Any]] = []
        first = last = 0
        if conv.content and latest is not None:
            edge = during.order_by("-created_at").values_list("pk", flat=True).first()
            start = during.order_by("created_at").values_list("parent_id", flat=True).first()
            messages = (trajectories.chat_messages(storage.state_at(edge).get("messages")) or []) if edge else []
            before = storage.state_at(start).get("messages") if start is not None else []
            first, last = min(len(before) if isinstance(before, list) else 0, len(messages)), len(messages)
        return genai.agent_span(conv, segment, end=end, messages=messages, first=first, last=last,
                                failed=genai.failure(thread, segment))  # fmt: skip

    def _thread_span(self, conv: genai.Conversation, thread: Thread) -> ReadableSpan | None:
        found = genai.segments(thread, genai.thread_runs(thread.pk))
        if (
            len(found) > 1
            and not Checkpoint.objects.filter(thread_id=thread.pk, created_at__lt=found[1].start).exists()
        ):
            return None  # nothing happened before the first run
        return self._agent_span(conv, thread, run=None)


_exporter = _Exporter()
