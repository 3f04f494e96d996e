"""Copy LangGraph threads from another checkpointer (LangGraph's PostgresSaver, for a team moving
over) into Quicksave, through QuicksaveSaver's own `put` and `put_writes`.

The source is read only through LangGraph's checkpointer API (`list`, `get_tuple`), never its
tables, so any saver works as a source. Every namespace (subgraphs) of a thread is copied, each
namespace's checkpoints parents first, in the order LangGraph wrote them, so Quicksave's branches
open where LangGraph forked; metadata and pending writes go with them. Checkpoints Quicksave
already holds (by LangGraph id) are left alone, so a second run copies nothing twice and an
interrupted run picks up where it stopped.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db.models import Count
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver, ChannelVersions, CheckpointTuple
from langgraph.checkpoint.serde.types import INTERRUPT

from checkpoints.models import Checkpoint, ToolResult
from integrations.langgraph.saver import QuicksaveSaver
from integrations.langgraph.tables import external_id_for, write_tool

# Checkpoints read from the source per `list` call while scanning it.
PAGE = 500

Progress = Callable[[int, int], None]


class SourceUnreadable(Exception):
    """The source checkpointer failed to list or read its checkpoints; its own error is the cause."""


class MissingThreads(Exception):
    """Thread ids asked for that the source does not hold; raised before anything is written."""

    def __init__(self, thread_ids: list[str]) -> None:
        super().__init__(f"not in the source: {', '.join(thread_ids)}")
        self.thread_ids = thread_ids


@dataclass(slots=True, frozen=True)
class SourceCheckpoint:
    """What the scan keeps of one source checkpoint: enough to select, order and count it."""

    thread_id: str
    checkpoint_ns: str
    checkpoint_id: str
    parent_id: str | None
    ts: datetime | None
    writes: int
    interrupted: bool  # it has a pending `__interrupt__` write


@dataclass(slots=True)
class ImportReport:
    """What an import copied (or, on a dry run, would copy) and what Quicksave already held."""

    threads: int = 0
    namespaces: int = 0
    checkpoints: int = 0
    writes: int = 0
    checkpoints_present: int = 0
    writes_present: int = 0
    # Threads whose newest root checkpoint waits at an interrupt, filed as approvals.
    waiting: int = 0
    missing: list[str] = field(default_factory=list)  # asked-for thread ids the source does not hold


def import_threads(
    *,
    source: BaseCheckpointSaver[Any],
    agent: str = "langgraph",
    thread_ids: Sequence[str] | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    approvals: bool = True,
    dry_run: bool = False,
    progress: Progress | None = None,
) -> ImportReport:
    """Copy the source's threads into Quicksave under `agent`, as QuicksaveSaver(agent=agent) stores them.

    `thread_ids` limits the copy to those threads; `since` (inclusive) and `until` (exclusive)
    to the threads with a checkpoint written in that window. A selected thread is copied whole,
    every namespace and branch, so its tree stays whole. `approvals` files the interrupt a
    thread is waiting at, if any, as a pending approval, as QuicksaveSaver does when a graph
    interrupts; interrupts that were answered before the move are history, not questions.
    `dry_run` reads both sides and writes nothing.

    Raises MissingThreads, having written nothing, when a thread id in `thread_ids` is not in
    the source (a dry run lists them in the report's `missing` instead).
    """
    report = ImportReport()
    threads = _scan(source, thread_ids, report)
    if report.missing and not dry_run:
        raise MissingThreads(report.missing)
    if since is not None or until is not None:
        threads = {
            thread_id: found
            for thread_id, found in threads.items()
            if any(_within(checkpoint.ts, since, until) for checkpoint in found)
        }
    plan = [(thread_id, _namespaces(found)) for thread_id, found in threads.items()]
    total = sum(len(found) for found in threads.values())
    report.threads = len(plan)
    done = 0
    if progress is not None:
        progress(done, total)
    saver = QuicksaveSaver(agent=agent, approvals=False)
    inbox = QuicksaveSaver(agent=agent) if approvals else None
    for thread_id, namespaces in plan:
        for checkpoint_ns, found in namespaces:
            report.namespaces += 1
            held, held_writes = _held(agent, thread_id, checkpoint_ns)
            head = max(checkpoint.checkpoint_id for checkpoint in found)
            # LangGraph resumes a thread from its newest root checkpoint only.
            waiting = not checkpoint_ns and any(c.interrupted and c.checkpoint_id == head for c in found)
            report.waiting += waiting
            versions: dict[str, ChannelVersions] = {}
            for checkpoint in _parents_first(found):
                present = checkpoint.checkpoint_id in held
                writes_present = min(held_writes.get(checkpoint.checkpoint_id, 0), checkpoint.writes)
                report.checkpoints += not present
                report.checkpoints_present += present
                report.writes += checkpoint.writes - writes_present
                report.writes_present += writes_present
                if not dry_run and (not present or writes_present < checkpoint.writes):
                    # The head's writes go through the saver that files approvals, once its put is in.
                    writer = inbox if inbox is not None and waiting and checkpoint.checkpoint_id == head else saver
                    _copy(source, saver, writer, checkpoint, versions, put=not present)
                done += 1
                if progress is not None:
                    progress(done, total)
    return report


def _scan(
    source: BaseCheckpointSaver[Any], thread_ids: Sequence[str] | None, report: ImportReport
) -> dict[str, list[SourceCheckpoint]]:
    """Every checkpoint of the selected threads (all of them without `thread_ids`), by thread,
    threads in the order the source lists them (newest activity first)."""
    threads: dict[str, list[SourceCheckpoint]] = {}
    if thread_ids is None:
        for checkpoint in _pages(source, None):
            threads.setdefault(checkpoint.thread_id, []).append(checkpoint)
        return threads
    for thread_id in dict.fromkeys(thread_ids):
        found = list(_pages(source, {"configurable": {"thread_id": thread_id}}))
        if found:
            threads[thread_id] = found
        else:
            report.missing.append(thread_id)
    return threads


def _pages(source: BaseCheckpointSaver[Any], config: RunnableConfig | None) -> Iterator[SourceCheckpoint]:
    """The source's checkpoints under `config` (every thread and namespace when None), newest
    first, read a page at a time so that only one page of states is in memory.

    Pages are cut by checkpoint id (`before`), which LangGraph makes unique (uuid6) and
    time-ordered, the order `list` returns them in.
    """
    before: RunnableConfig | None = None
    while True:
        try:
            page = list(source.list(config, before=before, limit=PAGE))
        except Exception as exc:
            raise SourceUnreadable(str(exc)) from exc
        for found in page:
            yield _summary(found)
        if len(page) < PAGE:
            return
        before = {"configurable": {"checkpoint_id": page[-1].config["configurable"]["checkpoint_id"]}}


def _summary(found: CheckpointTuple) -> SourceCheckpoint:
    configurable = found.config["configurable"]
    parent = found.parent_config["configurable"].get("checkpoint_id") if found.parent_config else None
    writes = found.pending_writes or []
    return SourceCheckpoint(
        thread_id=str(configurable["thread_id"]),
        checkpoint_ns=configurable.get("checkpoint_ns", ""),
        checkpoint_id=configurable["checkpoint_id"],
        parent_id=parent,
        ts=_timestamp(found.checkpoint.get("ts")),
        writes=len(writes),
        interrupted=any(channel == INTERRUPT for _, channel, _ in writes),
    )


def _timestamp(value: Any) -> datetime | None:
    try:
        return datetime.fromisoformat(value) if isinstance(value, str) else None
    except ValueError:
        return None


def _within(ts: datetime | None, since: datetime | None, until: datetime | None) -> bool:
    if ts is None or ts.tzinfo is None:
        return False  # LangGraph writes aware UTC times; anything else cannot be placed
    return (since is None or ts >= since) and (until is None or ts < until)


def _namespaces(found: Iterable[SourceCheckpoint]) -> list[tuple[str, list[SourceCheckpoint]]]:
    """A thread's checkpoints by namespace, the root namespace first."""
    by_ns: dict[str, list[SourceCheckpoint]] = {}
    for checkpoint in found:
        by_ns.setdefault(checkpoint.checkpoint_ns, []).append(checkpoint)
    return sorted(by_ns.items(), key=lambda item: (item[0] != "", item[0]))


def _parents_first(found: list[SourceCheckpoint]) -> list[SourceCheckpoint]:
    """One namespace's checkpoints with every parent before its children, and otherwise in id
    order, which is the order LangGraph wrote them in: each fork then comes after the checkpoints
    that followed its fork point, so it opens a branch there, as it did in LangGraph.

    A checkpoint whose parent the source no longer holds (pruned) starts a root of its own.
    """
    by_id = {checkpoint.checkpoint_id: checkpoint for checkpoint in found}
    children: dict[str, list[str]] = {}
    ready: list[str] = []
    for checkpoint in found:
        if checkpoint.parent_id in by_id and checkpoint.parent_id != checkpoint.checkpoint_id:
            children.setdefault(checkpoint.parent_id, []).append(checkpoint.checkpoint_id)
        else:
            ready.append(checkpoint.checkpoint_id)
    heapq.heapify(ready)
    ordered: list[SourceCheckpoint] = []
    while ready:
        checkpoint_id = heapq.heappop(ready)
        ordered.append(by_id[checkpoint_id])
        for child in children.get(checkpoint_id, []):
            heapq.heappush(ready, child)
    return ordered


def _held(agent: str, thread_id: str, checkpoint_ns: str) -> tuple[set[str], dict[str, int]]:
    """The LangGraph ids Quicksave holds in this (thread, namespace), and how many pending-write
    rows it holds per id. Read without creating anything, for the dry run's sake."""
    scope = {"thread__agent__name": agent, "thread__external_id": external_id_for(thread_id, checkpoint_ns)}
    held = set(Checkpoint.objects.filter(**scope, metadata__has_key="lg_id").values_list("metadata__lg_id", flat=True))
    prefix = write_tool("")
    rows = (
        ToolResult.objects.filter(**scope, tool__startswith=prefix)
        .values("tool")
        .annotate(rows=Count("id"))
        .values_list("tool", "rows")
    )
    return held, {tool.removeprefix(prefix): count for tool, count in rows}


def _copy(
    source: BaseCheckpointSaver[Any],
    saver: QuicksaveSaver,
    writer: QuicksaveSaver,
    checkpoint: SourceCheckpoint,
    versions: dict[str, ChannelVersions],
    *,
    put: bool,
) -> None:
    """Write one source checkpoint (unless Quicksave holds it: `put=False`) and its pending writes."""
    names = {"thread_id": checkpoint.thread_id, "checkpoint_ns": checkpoint.checkpoint_ns}
    try:
        found = source.get_tuple({"configurable": {**names, "checkpoint_id": checkpoint.checkpoint_id}})
    except Exception as exc:
        raise SourceUnreadable(str(exc)) from exc
    if found is None:
        return  # deleted from the source since the scan
    channel_versions = found.checkpoint["channel_versions"]
    versions[checkpoint.checkpoint_id] = dict(channel_versions)
    if put:
        config: RunnableConfig = {"configurable": dict(names)}
        if checkpoint.parent_id is not None:
            config["configurable"]["checkpoint_id"] = checkpoint.parent_id
        # The channels this checkpoint changed: all of them when the parent was not read in this run.
        before = versions.get(checkpoint.parent_id or "", {})
        changed = {name: version for name, version in channel_versions.items() if before.get(name) != version}
        saver.put(config, found.checkpoint, found.metadata, changed)
    # One put_writes per task, in the source's order, as LangGraph saves a task's writes; the
    # saver keys each by (checkpoint, task, position), so a repeat stores nothing new.
    by_task: dict[str, list[tuple[str, Any]]] = {}
    for task_id, channel, value in found.pending_writes or []:
        by_task.setdefault(task_id, []).append((channel, value))
    config = {"configurable": {**names, "checkpoint_id": checkpoint.checkpoint_id}}
    for task_id, writes in by_task.items():
        writer.put_writes(config, writes, task_id)
