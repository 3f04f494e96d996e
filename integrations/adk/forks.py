"""A dashboard fork of an ADK session's checkpoint, made a point the session goes on from.

The fork's checkpoint heads a new branch whose events are the fork point's path (reads follow
fork points) and whose state is the admin's edit of the session state. It appends no event, so
its metadata names the last event before it (`adk_after_event`) and that event's time: the
session's next append, by its application or by the worker, takes it as its head.

No ADK import: the dashboard forks without ADK installed (integrations.adk.apps registers this
shaper whether or not ADK is).
"""

from __future__ import annotations

from typing import Any

from checkpoints.forks import ForkShape
from checkpoints.models import Checkpoint, Thread

FRAMEWORK = "adk"


def last_event(metadata: dict[str, Any]) -> str | None:
    """The id of the newest event on the path to a checkpoint with this metadata (None: no event yet)."""
    found = metadata.get("adk_event") or metadata.get("adk_after_event")
    return found if isinstance(found, str) else None


def adk_fork(*, source: Checkpoint, before: dict[str, Any], after: dict[str, Any]) -> ForkShape | None:
    """The ADK side of a fork at `source`, or None when `source` is not in an ADK session."""
    if not Thread.objects.filter(pk=source.thread_id, metadata__framework=FRAMEWORK,
                                 metadata__adk__has_key="session_id").exists():  # fmt: skip
        return None
    metadata: dict[str, Any] = {"ts": source.metadata.get("ts")}
    if (event := last_event(source.metadata)) is not None:
        metadata["adk_after_event"] = event
    return ForkShape(ops=[], metadata=metadata, step=source.step)
