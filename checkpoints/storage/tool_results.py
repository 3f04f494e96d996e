"""The tool-result cache: a resumed agent looks a call up here instead of repeating it."""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from datetime import datetime
from typing import Any, NamedTuple
from uuid import UUID

import psycopg
from django.db import IntegrityError
from django.utils import timezone

from checkpoints.fields import associated_data
from checkpoints.models import Checkpoint, Thread, ToolResult
from checkpoints.storage import codec, crypto, cursors
from checkpoints.storage.errors import InvalidState, NotFound
from quicksave_agents import fencing
from quicksave_agents.fencing import Fence

MAX_KEY_LENGTH = 128
MAX_TOOL_LENGTH = 200  # ToolResult.tool's max_length


def tool_key(tool: str, args: Any) -> str:
    """The cache key of a call: SHA-256 of the tool name and its canonical arguments."""
    return hashlib.sha256(codec.to_canonical_bytes([tool, args])).hexdigest()


def result_ad(thread_id: UUID, key: str) -> bytes:
    """What a sealed tool result is bound to (the same as `ToolResult.result`'s field computes)."""
    return associated_data("checkpoints_toolresult.result", thread_id, key)


def put_tool_result(
    *, thread: Thread, key: str, result: Any, tool: str = "", checkpoint: Checkpoint | UUID | None = None
) -> tuple[ToolResult, bool]:
    """Store a result under `key` unless one is there; returns (the stored row, created).

    Idempotent: a second put of the same key leaves the first result unchanged and
    returns it, so two copies of an agent racing on the same call agree on one answer.
    """
    ((stored, created),) = put_tool_results(thread=thread, results=[(key, result)], tool=tool, checkpoint=checkpoint)
    return stored, created


# One statement for any number of results, so it is prepared once per connection. Both arrays go
# in binary: as text, psycopg would escape every byte of the sealed results into an array literal,
# and search each key with a regular expression for characters to quote (a third of the insert's
# client instructions for a few 64-character keys).
_PUT_SQL = """
INSERT INTO checkpoints_toolresult (thread_id, key, tool, result, checkpoint_id, created_at)
SELECT %(thread)s::uuid, key, %(tool)s::text, result, %(checkpoint)s::uuid, %(created_at)s::timestamptz
FROM unnest(%(keys)b::text[], %(results)b::bytea[]) AS given(key, result)
WHERE {fence}
ON CONFLICT (thread_id, key) DO NOTHING
RETURNING id, key
""".replace("{fence}", fencing.SQL)


class _Sealed(NamedTuple):
    key: str
    sealed: bytes
    canonical: bytes


def put_tool_results(
    *, thread: Thread, results: Sequence[tuple[str, Any]], tool: str = "", checkpoint: Checkpoint | UUID | None = None
) -> list[tuple[ToolResult, bool]]:
    """`put_tool_result` for several (key, result) pairs of one tool in one statement: all are
    checked before any is written, and each key keeps its first result."""
    tool = _checked_tool(tool)
    rows = _sealed(thread, results)
    checkpoint_id = checkpoint.pk if isinstance(checkpoint, Checkpoint) else checkpoint
    # The clock now, not now(): that is when the transaction began, which would date a
    # result before checkpoints written earlier in it.
    created_at = timezone.now()
    inserted = _write(thread, rows, tool=tool, checkpoint_id=checkpoint_id, created_at=created_at)
    missing = [row.key for row in rows if row.key not in inserted]
    existing = (
        {found.key: found for found in ToolResult.objects.filter(thread=thread, key__in=missing)} if missing else {}
    )
    stored: list[tuple[ToolResult, bool]] = []
    for row in rows:
        if row.key not in inserted:  # the key was there: the first result stands
            stored.append((existing[row.key], False))
            continue
        fresh = ToolResult(
            id=inserted[row.key], thread_id=thread.pk, key=row.key, tool=tool,
            result=codec.loads(row.canonical), checkpoint_id=checkpoint_id, created_at=created_at,
        )  # fmt: skip
        stored.append((fresh, True))
    return stored


def add_tool_results(
    *,
    thread: Thread,
    results: Sequence[tuple[str, Any]],
    tool: str = "",
    checkpoint: Checkpoint | UUID | None = None,
    fence: Fence | None = None,
) -> int:
    """`put_tool_results` for a caller that does not read the stored rows back (LangGraph's
    pending writes, two puts a step): how many keys were new. A run's writes carry its `fence`:
    LeaseLost, and nothing written, once another attempt holds the run."""
    checkpoint_id = checkpoint.pk if isinstance(checkpoint, Checkpoint) else checkpoint
    tool = _checked_tool(tool)
    rows = _sealed(thread, results)
    written = len(_write(thread, rows, tool=tool, checkpoint_id=checkpoint_id, created_at=timezone.now(), fence=fence))
    if fence is not None and written < len(rows) and not fencing.holds(fence, thread_id=thread.pk):
        raise fence.lost(thread_id=thread.pk)
    return written


def valid_key(key: str) -> bool:
    """Whether `key` can name a cached result: 1 to MAX_KEY_LENGTH characters, no NUL (which
    PostgreSQL's text cannot hold)."""
    return 0 < len(key) <= MAX_KEY_LENGTH and "\x00" not in key


def _checked_tool(tool: str) -> str:
    if len(tool) > MAX_TOOL_LENGTH or "\x00" in tool:
        raise InvalidState(
            f"`tool` must be at most {MAX_TOOL_LENGTH} characters, none of them NUL.",
            detail={"field": "tool", "limit": MAX_TOOL_LENGTH},
        )
    return tool


def _sealed(thread: Thread, results: Sequence[tuple[str, Any]]) -> list[_Sealed]:
    """Each result checked, as canonical JSON and as stored (framed and sealed, bound to its key)."""
    rows: list[_Sealed] = []
    for key, result in results:
        if not valid_key(key):
            raise InvalidState(
                f"`key` must be 1 to {MAX_KEY_LENGTH} characters, none of them NUL.",
                detail={"field": "key", "limit": MAX_KEY_LENGTH},
            )
        try:
            canonical = codec.to_canonical_bytes(result)
            codec.check_depth(result, canonical=canonical)
        except codec.EncodingError as exc:
            raise InvalidState(f"`result` {exc}.", detail={"field": "result"}) from None
        sealed = crypto.seal(thread.pk, functools.partial(result_ad, thread.pk, key), codec.encode(canonical))
        rows.append(_Sealed(key, sealed, canonical))
    return rows


def _write(
    thread: Thread,
    rows: list[_Sealed],
    *,
    tool: str,
    checkpoint_id: UUID | None,
    created_at: datetime,
    fence: Fence | None = None,
) -> dict[str, int]:
    """Insert the rows whose keys are new; the id of each one inserted, by key."""
    if not rows:
        return {}
    params = {
        "thread": thread.pk, "keys": [row.key for row in rows], "tool": tool,
        "results": [row.sealed for row in rows], "checkpoint": checkpoint_id, "created_at": created_at,
        **fencing.params(fence),
    }  # fmt: skip
    try:
        # The insert of LangGraph's pending writes, twice a step: on a kept cursor of its own
        # (binary results), not the appends', which it would set up for its results each time.
        cursor = cursors.kept_cursor("tool-results")
        cursor.execute(_PUT_SQL, params)
        return {key: row_id for row_id, key in cursor.fetchall()}
    except IntegrityError as exc:
        if not isinstance(exc.__cause__, psycopg.errors.ForeignKeyViolation):
            raise
        # In autocommit the foreign keys are checked here, not at a commit of Django's: the
        # thread, or the checkpoint the results belong to, was deleted after the caller read it.
        raise NotFound(f"Thread {thread.pk} or the checkpoint the results belong to no longer exists.") from None


def get_tool_result(*, thread: Thread, key: str) -> ToolResult | None:
    if not valid_key(key):
        return None  # nothing can be stored under it
    return ToolResult.objects.filter(thread=thread, key=key).first()
