"""A dashboard fork of a checkpoint that LangGraph wrote, made a LangGraph checkpoint the way
LangGraph's own `update_state` makes one, so the graph lists it in `get_state_history` and
runs on from it.

The fork's state is the fork point's LangGraph checkpoint with the admin's edits, a new
time-ordered checkpoint id and timestamp, and a new version for every channel the edits
changed; its metadata names the fork point as its LangGraph parent, with `source: "update"` and
the next step. Invoked from the fork, the graph runs the tasks that were due at the fork point,
on the edited state: what `update_state(config, values)` followed by `invoke(None, config)` does,
with two differences that come from editing state rather than running a node's writers: an
edit sets a channel's value as written (no reducer runs), and the route already taken at the
fork point stays (no conditional edge is evaluated again).

No LangGraph import: the dashboard forks without it installed (integrations.langgraph.apps
registers this shaper whether or not LangGraph is).
"""

from __future__ import annotations

import secrets
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from checkpoints.forks import ForkShape
from checkpoints.models import Checkpoint

MISSING = object()
# 100-nanosecond intervals between the Gregorian calendar's start and the Unix epoch (RFC 9562).
GREGORIAN_OFFSET = 0x01B21DD213814000


def langgraph_fork(*, source: Checkpoint, before: dict[str, Any], after: dict[str, Any]) -> ForkShape | None:
    """The LangGraph side of a fork at `source` whose state goes from `before` to `after`,
    or None when LangGraph did not write `source`."""
    lg_id = source.metadata.get("lg_id")
    if not isinstance(lg_id, str):
        return None
    parent_metadata = source.metadata.get("lg_metadata") or {}
    parent_step = parent_metadata.get("step")
    step = parent_step + 1 if type(parent_step) is int else 0
    new_id = _uuid6(timestamp=max(time.time_ns() // 100 + GREGORIAN_OFFSET, _timestamp(lg_id) + 1), clock_seq=step)
    ops: list[dict[str, Any]] = [
        {"op": "add", "path": "/id", "value": new_id},
        {"op": "add", "path": "/ts", "value": datetime.now(UTC).isoformat()},
        # As update_state leaves it: no narrowing of the nodes the next step looks at.
        {"op": "add", "path": "/updated_channels", "value": None},
    ]
    versions = after.get("channel_versions")
    if isinstance(versions, dict):
        changed = _changed_channels(before.get("channel_values") or {}, after.get("channel_values") or {})
        if changed:
            version = _next_version(list(versions.values()))
            ops += [{"op": "add", "path": f"/channel_versions/{_pointer(name)}", "value": version} for name in changed]
    lg_metadata = {
        **{key: value for key, value in parent_metadata.items() if key not in ("source", "step", "run_id")},
        "source": "update",
        "step": step,
        "parents": parent_metadata.get("parents", {}),
    }
    return ForkShape(
        ops=ops,
        metadata={"lg_id": new_id, "lg_parent": lg_id, "lg_metadata": lg_metadata},
        step=step if step >= 0 else None,
    )


def _changed_channels(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    return sorted(name for name in set(before) | set(after) if before.get(name, MISSING) != after.get(name, MISSING))


def _next_version(versions: list[Any]) -> Any:
    """One past the newest version, in the form the thread's versions have (LangGraph's
    `get_next_version`: integers for QuicksaveSaver, "<32 digits>.<fraction>" strings for others)."""
    if all(type(version) is int for version in versions):
        return max(versions, default=0) + 1
    newest = max(int(str(version).split(".")[0]) for version in versions)
    return f"{newest + 1:032}.{secrets.randbelow(10**16):016}"


def _pointer(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")


def _timestamp(lg_id: str) -> int:
    """The 60-bit timestamp of a version 6 UUID (LangGraph's checkpoint ids), 0 for any other id."""
    try:
        value = uuid.UUID(lg_id)
    except ValueError:
        return 0
    if value.version != 6:
        return 0
    return (value.int >> 80) << 12 | (value.int >> 64) & 0x0FFF


def _uuid6(*, timestamp: int, clock_seq: int) -> str:
    """A version 6 UUID (RFC 9562), as LangGraph makes its checkpoint ids: ids sort by time."""
    value = ((timestamp >> 12) & 0xFFFFFFFFFFFF) << 80
    value |= (0x6000 | timestamp & 0x0FFF) << 64
    value |= (0x8000 | clock_seq & 0x3FFF) << 48
    value |= secrets.randbits(48)
    return str(uuid.UUID(int=value))
