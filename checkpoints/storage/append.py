"""The checkpoint store: the one way in for writing threads and checkpoints, and the
reader that materialises the state of any checkpoint.

A checkpoint stores the RFC 6902 patch from its parent's state (a delta), so a
write costs O(change). Every so often it stores the full state instead (a
snapshot): when `QUICKSAVE_SNAPSHOT_EVERY` deltas have piled up since the last
one, or when replaying the deltas since the last snapshot would cost more than
REPLAY_BUDGET times reading the state whole (see REPLAY_COST_PER_BYTE). For a
state that grows by appending (a message log) that second rule doubles the distance
between snapshots, so their total size stays about twice the final state, storage
stays linear in the thread's length, and reading any state costs at most about one
and a half times its size. The count rule bounds the rows a cold read replays. A large snapshot is
stored in chunks its thread's other snapshots share (chunks.py): of a growing log, each stores
about what was added since the last, so the count rule's snapshots of a long thread no longer
add a whole state each.

States already materialised are kept in a per-process cache keyed by checkpoint
id. Checkpoints are immutable, so the cache never goes stale; it only saves the
replay of deltas. A writer still learns the branch head from the database. An append
puts its new state there in place of its parent's (same branch): the next append needs
only the head, and an older state is replayed, and kept, when someone reads it.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar
from uuid import UUID

import psycopg
from django.db import DEFAULT_DB_ALIAS, IntegrityError, transaction
from django.utils import timezone
from psycopg.types.json import Jsonb

from checkpoints import live
from checkpoints.ids import new_id
from checkpoints.models import (
    Checkpoint,
    CheckpointSource,
    CheckpointStatus,
    PayloadKind,
    Thread,
)
from checkpoints.storage import blobs, codec, cursors
from checkpoints.storage.branches import MAIN_BRANCH, branch_by_name, branch_head, forget_thread, get_branch_name
from checkpoints.storage.errors import (
    InvalidState,
    NotFound,
    StaleParent,
)
from checkpoints.storage.nodes import Node, keep_head, states
from checkpoints.storage.payloads import offloaded, seal_payload
from checkpoints.storage.reads import load_node, needs_snapshot
from checkpoints.storage.threads import checkpoint_event
from checkpoints.storage.tool_results import MAX_KEY_LENGTH, MAX_TOOL_LENGTH, put_tool_result, valid_key
from checkpoints.storage.validation import checked_fields, next_state
from quicksave import telemetry
from quicksave_agents import fencing
from quicksave_agents.fencing import Fence

log = logging.getLogger(__name__)

# --------------------------------------------------------------------------- writes


class _StaleCache(Exception):
    """The cached parent's MAC is not the stored one any more (its row was compacted)."""

    def __init__(self, parent_id: UUID) -> None:
        super().__init__(parent_id)
        self.parent_id = parent_id


P = ParamSpec("P")
R = TypeVar("R")


def _retrying_stale_cache(write: Callable[P, R]) -> Callable[P, R]:
    """Run a write again, from the stored parent, when the cached parent turns out stale."""

    @functools.wraps(write)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return write(*args, **kwargs)
        except _StaleCache as stale:
            states.drop(stale.parent_id)
            return write(*args, **kwargs)

    return wrapper


@_retrying_stale_cache
def _append_row(
    *,
    thread: Thread,
    parent: Checkpoint | UUID | None,
    state: dict[str, Any] | None = None,
    patch: list[dict[str, Any]] | None = None,
    branch: str | None = None,
    step: int | None = None,
    label: str = "",
    status: str = CheckpointStatus.RUNNING,
    model: dict[str, Any] | None = None,
    metadata: dict[str, Any] | None = None,
    schema_version: int = 1,
    source: str = CheckpointSource.AGENT,
    tool_results: list[dict[str, Any]] | None = None,
    fence: Fence | None = None,
) -> dict[str, Any]:
    """Append a checkpoint after `parent`, which must be the head of its branch.

    Give either the full new `state` or a `patch` against the parent's state.
    Raises StaleParent (naming the current head) when another write got there
    first, InvalidState / InvalidPatch / StateTooLarge for input the store
    refuses; a refused write leaves nothing behind. A run's write carries its `fence` and raises
    LeaseLost, writing nothing, once another attempt holds the run.
    """
    if (state is None) == (patch is None):
        raise InvalidState("Give exactly one of `state` (the full new state) or `patch` (RFC 6902 ops).")
    fields = checked_fields(
        step=step, label=label, status=status, model=model, metadata=metadata,
        schema_version=schema_version, source=source,
    )  # fmt: skip
    parent_id = parent.pk if isinstance(parent, Checkpoint) else parent
    parent_node = _parent_node(parent_id, thread=thread) if parent_id is not None else None
    branch_name = branch or (get_branch_name(parent_node.branch_id) if parent_node else MAIN_BRANCH)
    branch_id, fork_point_id = branch_by_name(thread.pk, branch_name)
    same_branch = parent_node is not None and parent_node.branch_id == branch_id
    if not same_branch and parent_id != fork_point_id:
        # Only the fork point may precede a branch's first checkpoint; if the branch
        # already has checkpoints the writer is behind its head.
        head = branch_head(thread_id=thread.pk, branch_id=branch_id)
        if head is not None or parent_id is not None:
            raise _stale_parent(parent_id, head, branch_name=branch_name)
    seq = parent_node.seq + 1 if parent_node is not None and same_branch else 1

    delta, new_state, state_bytes = next_state(parent_node, state=state, patch=patch)
    chain_length = parent_node.chain_length + 1 if parent_node else 0
    chain_bytes = parent_node.chain_bytes + len(delta) if parent_node else 0
    if parent_node is None or needs_snapshot(chain_length=chain_length, chain_bytes=chain_bytes,
                                             state_bytes=state_bytes):  # fmt: skip
        kind, canonical, chain_length, chain_bytes = PayloadKind.SNAPSHOT, codec.to_canonical_bytes(new_state), 0, 0
    else:
        kind, canonical = PayloadKind.DELTA, delta

    if len(canonical) > blobs.limit():
        canonical = offloaded(thread.pk, new_state if kind == PayloadKind.SNAPSHOT else codec.loads(delta), canonical)
    checkpoint_id = new_id()
    payload = seal_payload(thread.pk, checkpoint_id, canonical, snapshot=kind == PayloadKind.SNAPSHOT)
    fields["state_bytes"] = state_bytes
    created_at = timezone.now()
    integrity = codec.integrity_mac(
        parent_integrity=parent_node.integrity if parent_node else None,
        checkpoint_id=checkpoint_id, thread_id=thread.pk, branch_id=branch_id, parent_id=parent_id,
        seq=seq, kind=kind, payload=payload, fields=fields, created_at=created_at,
    )  # fmt: skip
    params = {
        **fields, "id": checkpoint_id, "thread_id": thread.pk, "branch_id": branch_id, "parent_id": parent_id,
        "parent_mac": parent_node.integrity if parent_node else None,
        "seq": seq, "kind": kind, "payload": payload, "chain_length": chain_length, "chain_bytes": chain_bytes,
        "integrity": integrity, "created_at": created_at, "metadata": Jsonb(fields["metadata"], dumps=codec.dumps),
        **fencing.params(fence),
        # Published once committed; stored as this row itself (threads.events_after).
        "event": checkpoint_event(
            checkpoint_id=checkpoint_id, parent_id=parent_id, branch=branch_name, seq=seq, step=step, label=label,
            status=fields["status"],
        ),
    }  # fmt: skip

    if tool_results:
        for index, item in enumerate(tool_results):
            if (
                not isinstance(item, dict)
                or not isinstance(item.get("key"), str)
                or not valid_key(item["key"])
                or not isinstance(item.get("tool", ""), str)
                or len(item.get("tool", "")) > MAX_TOOL_LENGTH
                or "result" not in item
            ):
                raise InvalidState(
                    f"`tool_results[{index}]` must be an object with a `key` of 1 to {MAX_KEY_LENGTH} "
                    f"characters, a `result` and optionally a `tool` of at most {MAX_TOOL_LENGTH}.",
                    detail={"field": "tool_results", "index": index},
                )

    try:
        with transaction.atomic() if tool_results else contextlib.nullcontext():
            if not _append(params):
                raise _refused(params, branch_name=branch_name, fence=fence)
            node = Node(id=checkpoint_id, thread_id=thread.pk, branch_id=branch_id, seq=seq, state=new_state,
                        state_bytes=state_bytes, chain_length=chain_length, chain_bytes=chain_bytes,
                        integrity=integrity)  # fmt: skip
            # One callback for both (each asking Django whether a transaction is open cost some
            # 16,000 instructions); in autocommit it runs at once. The writer's trace context is
            # taken now: the commit may run its callbacks under another span.
            transaction.on_commit(functools.partial(
                _committed, node, parent_id=parent_id if same_branch else None, params=params,
                trace=telemetry.current_carrier(),
            ))  # fmt: skip
            for item in tool_results or ():
                put_tool_result(thread=thread, key=item["key"], result=item["result"],
                                tool=item.get("tool", ""), checkpoint=checkpoint_id)  # fmt: skip
    except BaseException:
        states.drop(checkpoint_id)
        raise
    params["metadata"] = fields["metadata"]
    return params


def _returning(made: Callable[[dict[str, Any]], R]) -> Callable[[Callable[P, dict[str, Any]]], Callable[P, R]]:
    def decorate(write: Callable[P, dict[str, Any]]) -> Callable[P, R]:
        @functools.wraps(write)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            return made(write(*args, **kwargs))

        return wrapper

    return decorate


def _row(params: dict[str, Any]) -> Checkpoint:
    return Checkpoint.from_db(DEFAULT_DB_ALIAS, _ROW_FIELDS, [params[name] for name in _ROW_FIELDS])


def _row_id(params: dict[str, Any]) -> UUID:
    checkpoint_id: UUID = params["id"]
    return checkpoint_id


# The written row as a model instance (what most callers want), or only its id: LangGraph's
# saver keeps nothing of a row but its id, and building the instance of its 25 columns cost
# 64,000 instructions of each of its three puts a step.
append_checkpoint = _returning(_row)(_append_row)
append_checkpoint_id = _returning(_row_id)(_append_row)


def _parent_node(parent_id: UUID, *, thread: Thread) -> Node:
    """The node of an append's parent. A checkpoint of another thread is refused in the very words
    an unknown one is, so a caller cannot tell another agent's checkpoint ids from made-up ones."""
    try:
        node = load_node(parent_id)
    except NotFound:
        node = None
    if node is None or node.thread_id != thread.pk:
        raise NotFound(f"Checkpoint {parent_id} is not in thread {thread.pk}.", detail={"field": "parent"})
    return node


# One statement inserts the checkpoint, which is its own `checkpoint.created` event, and bumps
# the thread, so a write is atomic even in autocommit and costs one round trip. The unique
# (thread, branch, seq) index is the optimistic lock: seq is the parent's seq + 1,
# so of N writers with the same parent exactly one inserts and the rest conflict
# (a conflicting insert waits for the winner to commit, then does nothing). The event's seq is
# the thread's counter + 1, read under the thread row's lock (the lock the bump takes anyway,
# held to commit), so a thread's events commit in seq order and a loser bumps nothing: no gap.
_APPEND_SQL = """
WITH cp AS (
    INSERT INTO checkpoints_checkpoint (
        id, thread_id, branch_id, parent_id, seq, step, label, status, source, model_name, model_version,
        temperature, top_p, seed, metadata, schema_version, kind, payload, chain_length, chain_bytes,
        state_bytes, integrity, created_at, event_seq)
    SELECT %(id)s::uuid, %(thread_id)s::uuid, %(branch_id)s::bigint, %(parent_id)s::uuid, %(seq)s::bigint,
        %(step)s::bigint, %(label)s::text, %(status)s::text, %(source)s::text, %(model_name)s::text,
        %(model_version)s::text, %(temperature)s::float8, %(top_p)s::float8, %(seed)s::bigint,
        %(metadata)s::jsonb, %(schema_version)s::bigint, %(kind)s::bigint, %(payload)s::bytea,
        %(chain_length)s::bigint, %(chain_bytes)s::bigint, %(state_bytes)s::bigint, %(integrity)s::bytea,
        %(created_at)s::timestamptz,
        (SELECT t.event_seq + 1 FROM checkpoints_thread t WHERE t.id = %(thread_id)s::uuid FOR NO KEY UPDATE)
    -- The MAC this row chains from must still be its parent's: a parent rewritten by compaction
    -- since this process cached it makes the write retry from the stored row.
    WHERE (%(parent_id)s::uuid IS NULL OR EXISTS (
        SELECT 1 FROM checkpoints_checkpoint p WHERE p.id = %(parent_id)s::uuid AND p.integrity = %(parent_mac)s::bytea
        -- Waits for a compaction rewriting the parent (it locks the row FOR UPDATE), then checks the
        -- new MAC. KEY SHARE is the lock the deferred parent_id foreign key takes at commit anyway.
        FOR KEY SHARE))
    -- A run's write only while its attempt still holds the run (quicksave_agents.fencing).
    AND {fence}
    ON CONFLICT (thread_id, branch_id, seq) DO NOTHING
    RETURNING event_seq
)
UPDATE checkpoints_thread SET
    event_seq = cp.event_seq,
    -- At most once a second, so most of these updates touch no indexed column (HOT).
    updated_at = CASE WHEN updated_at < %(created_at)s::timestamptz - interval '1 second'
                      THEN %(created_at)s::timestamptz ELSE updated_at END,
    head_id = CASE WHEN active_branch_id = %(branch_id)s::bigint THEN %(id)s::uuid ELSE head_id END,
    step = CASE WHEN active_branch_id = %(branch_id)s::bigint THEN %(step)s::bigint ELSE step END,
    -- A cancellation stands: an agent still writing afterwards does not undo it (a person's fork may).
    status = CASE WHEN active_branch_id = %(branch_id)s::bigint
                       AND (status <> 'cancelled' OR %(source)s::text = 'human')
                  THEN %(status)s::text ELSE status END
FROM cp
WHERE id = %(thread_id)s::uuid
RETURNING cp.event_seq
""".replace("{fence}", fencing.SQL)

# Every column, in model order, as Model.from_db wants them.
_ROW_FIELDS = tuple(field.attname for field in Checkpoint._meta.concrete_fields)


def _append(params: dict[str, Any]) -> bool:
    """Run the append on Django's connection: True when it wrote (its event goes out once
    committed: `_committed`), False when it wrote nothing (another write got there first, the
    parent's MAC changed, or the run's lease is lost)."""
    try:
        cursor = cursors.kept_cursor()
        cursor.execute(_APPEND_SQL, params)
        rows = cursor.fetchall()
    except IntegrityError as exc:
        if not isinstance(exc.__cause__, psycopg.errors.ForeignKeyViolation):
            raise
        # The branch (and so the thread) was deleted after this process cached it.
        forget_thread(params["thread_id"])
        raise NotFound(f"Thread {params['thread_id']} no longer exists.") from None
    if not rows:
        return False
    params["event_seq"] = int(rows[0][0])
    return True


def _committed(node: Node, *, parent_id: UUID | None, params: dict[str, Any], trace: dict[str, str]) -> None:
    """What follows an append's commit: its node takes the place of its branch's old head in this
    process's cache (appends need only a branch's head), and its event goes out."""
    keep_head(node, parent_id=parent_id)
    live.publish(thread_id=node.thread_id, seq=params["event_seq"], type=live.CHECKPOINT_CREATED,
                 data=params["event"], trace=trace)  # fmt: skip


def _refused(params: dict[str, Any], *, branch_name: str, fence: Fence | None = None) -> Exception:
    """Why an append wrote nothing: a lost lease, a stale parent (naming the head), or a stale cached parent."""
    if fence is not None and not fencing.holds(fence, thread_id=params["thread_id"]):
        return fence.lost(thread_id=params["thread_id"])
    head = branch_head(thread_id=params["thread_id"], branch_id=params["branch_id"])
    if (head is None and params["seq"] == 1) or head == (params["parent_id"], params["seq"] - 1):
        # Nobody wrote first: the parent's MAC changed under this process's cache.
        return _StaleCache(params["parent_id"])
    return _stale_parent(params["parent_id"], head, branch_name=branch_name)


def _stale_parent(parent_id: UUID | None, head: tuple[UUID, int] | None, *, branch_name: str) -> StaleParent:
    """The error for a write whose parent is not its branch's head, naming the head."""
    written_after = f"Checkpoint {parent_id} is not" if parent_id else "No parent is"
    return StaleParent(
        f"{written_after} the head of branch '{branch_name}'; "
        f"the head is {head[0] if head else 'empty'}. Re-read the head and write again.",
        detail={"head": str(head[0]) if head else None, "head_seq": head[1] if head else 0, "branch": branch_name},
    )
