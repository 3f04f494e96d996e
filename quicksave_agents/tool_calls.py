"""The tool-call log: an intent written before a side-effecting call runs, its result after.

This is what lets a replayed step avoid repeating a call. Every call an agent makes through
Quicksave is, in order:

1. `begin`: the intent (tool, args digest, idempotency key, run attempt, time) is committed.
2. The tool runs, handed the idempotency key.
3. `finish`: the result is committed.
4. The step's checkpoint is committed.

A replay of the step (after a crash, a lost lease, a decision) reaches the same calls with the
same keys (`call_key`: thread, the checkpoint the step started from, the call's position in the
step) and finds, for each, the state a crash left:

- no intent: the call never started; it runs.
- a result: it returns the result; the tool is not called.
- an intent and no result, written by another attempt: the call is *in doubt*, since the attempt
  may have died before the effect or after it. An idempotent tool runs again with the same key;
  any other is not run, and a person decides (approvals.services.file_in_doubt).

Each write of a run's attempt is fenced (quicksave_agents.fencing): an attempt that lost its lease cannot
record an intent, so it never starts a call after another attempt took over.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from enum import Enum
from typing import Any
from uuid import UUID

from django.db import connection
from django.utils import timezone

from checkpoints.fields import associated_data
from checkpoints.storage import codec, crypto
from checkpoints.storage.errors import InvalidState
from checkpoints.storage.tool_results import MAX_KEY_LENGTH, MAX_TOOL_LENGTH, tool_key, valid_key
from quicksave.errors import DomainError
from quicksave_agents import fencing
from quicksave_agents.fencing import Fence
from quicksave_agents.models import ToolCall, ToolCallState


class ToolCallMismatch(DomainError):
    """A replay called something else at a place where another call was recorded: the agent is
    not deterministic from its checkpoint, and handing it the recorded result would be wrong."""

    code = "tool_call_mismatch"
    status = 409


class Outcome(Enum):
    RUN = "run"  # call the tool now, then `finish`
    DONE = "done"  # the result is recorded: do not call the tool
    IN_DOUBT = "in_doubt"  # do not call the tool: a person decides whether it happened


@dataclass(frozen=True)
class Begun:
    outcome: Outcome
    call: ToolCall
    recorded: bool = False  # this call wrote the intent (not a retry of one already written)


def call_key(*, thread_id: UUID, checkpoint_id: UUID | None, position: int) -> str:
    """The idempotency key of the `position`th call of a step started at `checkpoint_id`: the same
    on every replay of that step, different for every other call in the thread."""
    return hashlib.sha256(f"quicksave-call/{thread_id}/{checkpoint_id or 'root'}/{position}".encode()).hexdigest()


def args_digest(tool: str, args: Any) -> str:
    """SHA-256 of the canonical JSON of `[tool, args]` (the tool-result cache's key)."""
    return tool_key(tool, args)


def _ad(column: str, thread_id: UUID, key: str) -> bytes:
    # What ToolCall's SealedJSONFields bind to: the same row's ciphertext opens there only.
    return associated_data(f"agents_toolcall.{column}", thread_id, key)


def _seal(thread_id: UUID, key: str, column: str, canonical: bytes) -> bytes:
    return crypto.seal(thread_id, _ad(column, thread_id, key), codec.encode(canonical))


def _canonical(value: Any, *, field: str) -> bytes:
    try:
        canonical = codec.to_canonical_bytes(value)
        codec.check_depth(value)
    except codec.EncodingError as exc:
        raise InvalidState(f"`{field}` {exc}.", detail={"field": field}) from None
    return canonical


_INTENT_SQL = f"""
INSERT INTO agents_toolcall (thread_id, key, tool, args_digest, args, idempotent, state, run_id, attempt, starts,
                             started_at)
SELECT %(thread_id)s::uuid, %(key)s, %(tool)s, %(digest)s, %(args)s, %(idempotent)s, 'pending',
       %(fence_run)s::uuid, %(fence_attempt)s::bigint, 1, %(now)s
WHERE {fencing.SQL}
ON CONFLICT (thread_id, key) DO NOTHING
RETURNING id
"""

# Start a call again: an idempotent one found pending, or one a person said did not happen.
_RESTART_SQL = f"""
UPDATE agents_toolcall SET state = 'pending', run_id = %(fence_run)s::uuid, attempt = %(fence_attempt)s::bigint,
                           starts = starts + 1, started_at = %(now)s
WHERE id = %(id)s AND state = %(from_state)s AND {fencing.SQL}
RETURNING id
"""


def begin(
    *, thread_id: UUID, key: str, tool: str, args: Any, idempotent: bool = False, fence: Fence | None = None
) -> Begun:
    """Record the intent to call `tool(args)` under `key`, or say why not to call it.

    RUN: the intent is committed (in autocommit, before this returns); call the tool, then
    `finish`. DONE: the call's result is recorded. IN_DOUBT: another attempt started the call and
    recorded no result, and the tool is not idempotent; file it with approvals.services.file_in_doubt.
    Raises LeaseLost when `fence` no longer holds its run, ToolCallMismatch when the key was used
    for another tool or other args.
    """
    if not valid_key(key):
        raise InvalidState(f"`key` must be 1 to {MAX_KEY_LENGTH} characters, none of them NUL.",
                           detail={"field": "key", "limit": MAX_KEY_LENGTH})  # fmt: skip
    if not tool or len(tool) > MAX_TOOL_LENGTH or "\x00" in tool:
        raise InvalidState(f"`tool` must be 1 to {MAX_TOOL_LENGTH} characters, none of them NUL.",
                           detail={"field": "tool", "limit": MAX_TOOL_LENGTH})  # fmt: skip
    canonical = _canonical(args, field="args")
    digest = args_digest(tool, codec.loads(canonical))
    now = timezone.now()
    params = {
        "thread_id": thread_id, "key": key, "tool": tool, "digest": digest,
        "args": _seal(thread_id, key, "args", canonical), "idempotent": idempotent, "now": now,
        **fencing.params(fence),
    }  # fmt: skip
    with connection.cursor() as cursor:
        cursor.execute(_INTENT_SQL, params)
        inserted = cursor.fetchone()
    if inserted is not None:
        call = ToolCall(id=inserted[0], thread_id=thread_id, key=key, tool=tool, args_digest=digest,
                        idempotent=idempotent, state=ToolCallState.PENDING, attempt=fence.attempt if fence else None,
                        run_id=fence.run_id if fence else None, started_at=now)  # fmt: skip
        return Begun(Outcome.RUN, call, recorded=True)
    found = ToolCall.objects.filter(thread_id=thread_id, key=key).first()
    if found is None:
        # Nothing under the key and nothing written: the fence refused the intent.
        raise fence.lost(thread_id=thread_id) if fence else InvalidState(f"Thread {thread_id} refused the call.")
    call = found
    if call.tool != tool or call.args_digest != digest:
        raise ToolCallMismatch(
            f"This step's call #{key[:12]} was recorded as {call.tool} with other arguments (digest "
            f"{call.args_digest[:12]}); the replay asked for {tool} (digest {digest[:12]}). The agent does not "
            "make the same calls when it replays a step from the same checkpoint.",
            detail={"key": key, "recorded_tool": call.tool, "tool": tool},
        )
    if call.state == ToolCallState.DONE:
        return Begun(Outcome.DONE, call)
    if call.state == ToolCallState.IN_DOUBT:
        return Begun(Outcome.IN_DOUBT, call)
    same_attempt = fence is not None and (call.run_id, call.attempt) == (fence.run_id, fence.attempt)
    if call.state == ToolCallState.PENDING and same_attempt:
        # This attempt recorded the intent and asks again (an HTTP retry whose first answer was
        # lost): it has not called the tool, or it would not be asking.
        return Begun(Outcome.RUN, call)
    if call.state == ToolCallState.PENDING and not idempotent:
        return Begun(Outcome.IN_DOUBT, call)
    with connection.cursor() as cursor:
        cursor.execute(_RESTART_SQL, {**params, "id": call.pk, "from_state": call.state})
        restarted = cursor.fetchone()
    if restarted is None:
        if fence is not None and not fencing.holds(fence, thread_id=thread_id):
            raise fence.lost(thread_id=thread_id)
        # Another attempt restarted it first.
        return begin(thread_id=thread_id, key=key, tool=tool, args=args, idempotent=idempotent, fence=fence)
    call.refresh_from_db()
    return Begun(Outcome.RUN, call, recorded=True)


_RESULT_SQL = f"""
UPDATE agents_toolcall SET state = 'done', result = %(result)s, finished_at = %(now)s
WHERE thread_id = %(thread_id)s::uuid AND key = %(key)s AND state = 'pending'
  AND run_id IS NOT DISTINCT FROM %(fence_run)s::uuid AND attempt IS NOT DISTINCT FROM %(fence_attempt)s::bigint
  AND {fencing.SQL}
RETURNING id
"""


def finish(*, thread_id: UUID, key: str, result: Any, fence: Fence | None = None) -> Any:
    """Record the result of a call this attempt began; returns it as stored (as a replay will see it).

    Raises LeaseLost when another attempt holds the run now: the call then stays without a result,
    and the attempt that finds it decides as for any call in doubt.
    """
    canonical = _canonical(result, field="result")
    params = {
        "thread_id": thread_id, "key": key, "result": _seal(thread_id, key, "result", canonical),
        "now": timezone.now(), **fencing.params(fence),
    }  # fmt: skip
    with connection.cursor() as cursor:
        cursor.execute(_RESULT_SQL, params)
        written = cursor.fetchone()
    if written is None:
        if fence is not None and not fencing.holds(fence, thread_id=thread_id):
            raise fence.lost(thread_id=thread_id)
        call = ToolCall.objects.filter(thread_id=thread_id, key=key).first()
        same_attempt = call is not None and (call.run_id, call.attempt) == (
            (fence.run_id, fence.attempt) if fence else (None, None)
        )
        if call is not None and call.state == ToolCallState.DONE and (same_attempt or fence is None):
            return call.result  # recorded already (a retried request): the first result stands
        raise InvalidState(f"No call under '{key}' waits for a result from this attempt in thread {thread_id}.",
                           detail={"field": "key"})  # fmt: skip
    return codec.loads(canonical)


def mark_in_doubt(*, call: ToolCall, fence: Fence | None = None) -> bool:
    """Mark a pending call in doubt (inside the transaction that files it for a person); False if
    it was no longer pending. Raises LeaseLost when `fence` no longer holds its run."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE agents_toolcall SET state = 'in_doubt' WHERE id = %(id)s AND state = 'pending' AND {fencing.SQL}"
            " RETURNING id",
            {"id": call.pk, "thread_id": call.thread_id, **fencing.params(fence)},
        )
        marked = cursor.fetchone() is not None
    if not marked and fence is not None and not fencing.holds(fence, thread_id=call.thread_id):
        raise fence.lost(thread_id=call.thread_id)
    return marked


def resolve(*, call: ToolCall, happened: bool, result: Any = None) -> None:
    """A person's answer on a call in doubt (inside the decision's transaction): it happened, with
    this result (the next attempt is handed it), or it did not (the next attempt runs it)."""
    if call.state != ToolCallState.IN_DOUBT:
        raise InvalidState(f"The call is {call.state}, not in doubt.", detail={"field": "state"})
    if happened:
        call.result = result
        call.state = ToolCallState.DONE
        call.finished_at = timezone.now()
        call.save(update_fields=["result", "state", "finished_at"])
    else:
        call.state = ToolCallState.RETRY
        call.save(update_fields=["state"])
