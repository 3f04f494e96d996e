"""The tool-result cache: a resumed agent looks a call up here instead of repeating it."""

from __future__ import annotations

import hashlib
import json
from typing import Any
from uuid import UUID

from django.db import connection
from django.utils import timezone

from checkpoints import codec, crypto
from checkpoints.errors import InvalidState
from checkpoints.fields import associated_data
from checkpoints.models import Checkpoint, Thread, ToolResult

MAX_KEY_LENGTH = 128


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
    if not key or len(key) > MAX_KEY_LENGTH:
        raise InvalidState(f"`key` must be 1 to {MAX_KEY_LENGTH} characters.", detail={"field": "key"})
    try:
        canonical = codec.to_canonical_bytes(result)
        codec.check_depth(result)
    except codec.EncodingError as exc:
        raise InvalidState(f"`result` {exc}.", detail={"field": "result"}) from None
    checkpoint_id = checkpoint.pk if isinstance(checkpoint, Checkpoint) else checkpoint
    # The clock now, not now(): that is when the transaction began, which would date a
    # result before checkpoints written earlier in it.
    created_at = timezone.now()
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO checkpoints_toolresult (thread_id, key, tool, result, checkpoint_id, created_at) "
            "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (thread_id, key) DO NOTHING RETURNING id",
            [thread.pk, key, tool[:200], crypto.seal(thread.pk, result_ad(thread.pk, key), codec.encode(canonical)),
             checkpoint_id, created_at],
        )  # fmt: skip
        row = cursor.fetchone()
    if row is None:  # the key was there: the first result stands
        return ToolResult.objects.get(thread=thread, key=key), False
    stored = ToolResult(id=row[0], thread_id=thread.pk, key=key, tool=tool[:200], result=json.loads(canonical),
                        checkpoint_id=checkpoint_id, created_at=created_at)  # fmt: skip
    return stored, True


def get_tool_result(*, thread: Thread, key: str) -> ToolResult | None:
    return ToolResult.objects.filter(thread=thread, key=key).first()
