"""The checkpoint store: the one way in for writing threads and checkpoints, and the
reader that materialises the state of any checkpoint.

A checkpoint stores the RFC 6902 patch from its parent's state (a delta), so a
write costs O(change). Every so often it stores the full state instead (a
snapshot): when `QUICKSAVE_SNAPSHOT_EVERY` deltas have piled up since the last
one, or when replaying the deltas since the last snapshot would cost more than
reading a snapshot (see REPLAY_COST_PER_BYTE). For a state that grows by
appending (a message log) that second rule doubles the distance between
snapshots, so their total size stays about twice the final state, storage stays
linear in the thread's length, and reading any state costs at most about one
and a half times its size.

States already materialised are kept in a per-process cache keyed by checkpoint
id. Checkpoints are immutable, so the cache never goes stale; it only saves the
replay of deltas. A writer still learns the branch head from the database.
"""

from __future__ import annotations

import contextlib
import functools
import hmac
import logging
import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple, ParamSpec, TypeVar
from uuid import UUID

import psycopg
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, DatabaseError, IntegrityError, connection, connections, transaction
from django.utils import timezone
from psycopg.types.json import Jsonb, JsonbBinaryLoader
from psycopg.types.numeric import Int8BinaryDumper, Int8Dumper

from agents import fencing
from agents.fencing import Fence
from agents.models import Agent
from checkpoints import blobs, codec, crypto, hotcache, live, wire
from checkpoints.errors import IntegrityFailure, InvalidPatch, InvalidState, NotFound, StaleParent, StateTooLarge
from checkpoints.fields import associated_data
from checkpoints.ids import new_id
from checkpoints.jsonpatch import PatchError, PatchTooLarge, apply_patch, make_patch, validate_ops
from checkpoints.models import (
    Branch,
    Checkpoint,
    CheckpointSource,
    CheckpointStatus,
    DeletedThread,
    Event,
    PayloadKind,
    Thread,
)

log = logging.getLogger(__name__)

MAIN_BRANCH = "main"
# Replaying a byte of delta costs about twice reading a byte of snapshot (each delta
# is a row to fetch, a MAC to check, a payload to decode and a patch to apply), so
# the store snapshots once the chain since the last snapshot holds half the state's bytes.
REPLAY_COST_PER_BYTE = 2
MODEL_FIELDS = {
    "name": "model_name",
    "version": "model_version",
    "temperature": "temperature",
    "top_p": "top_p",
    "seed": "seed",
}


@dataclass(frozen=True, slots=True)
class Node:
    """What the store knows about a materialised checkpoint. `state` is shared: never mutate it."""

    id: UUID
    thread_id: UUID
    branch_id: int
    seq: int
    state: dict[str, Any]
    state_bytes: int
    chain_length: int
    chain_bytes: int
    integrity: bytes


class _StateCache:
    """LRU of materialised checkpoints, bounded by the total size of their states."""

    def __init__(self) -> None:
        self._nodes: OrderedDict[UUID, Node] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, checkpoint_id: UUID) -> Node | None:
        with self._lock:
            node = self._nodes.get(checkpoint_id)
            if node is not None:
                self._nodes.move_to_end(checkpoint_id)
            return node

    def put(self, node: Node) -> None:
        budget: int = settings.QUICKSAVE_STATE_CACHE_BYTES
        if node.state_bytes > budget:
            return
        with self._lock:
            if node.id in self._nodes:
                return
            self._nodes[node.id] = node
            self._bytes += node.state_bytes
            while self._bytes > budget and self._nodes:
                _, evicted = self._nodes.popitem(last=False)
                self._bytes -= evicted.state_bytes

    def drop_thread(self, thread_id: UUID) -> None:
        with self._lock:
            for node in [node for node in self._nodes.values() if node.thread_id == thread_id]:
                del self._nodes[node.id]
                self._bytes -= node.state_bytes

    def drop(self, checkpoint_id: UUID) -> None:
        with self._lock:
            node = self._nodes.pop(checkpoint_id, None)
            if node is not None:
                self._bytes -= node.state_bytes

    def clear(self) -> None:
        with self._lock:
            self._nodes.clear()
            self._bytes = 0


_cache = _StateCache()
_branches: dict[tuple[UUID, str], tuple[int, UUID | None]] = {}
_branch_names: dict[int, str] = {}


def _forget_thread(thread_id: UUID) -> None:
    for key in [key for key in _branches if key[0] == thread_id]:
        branch_id, _ = _branches.pop(key)
        _branch_names.pop(branch_id, None)


def forget_branches(thread_id: UUID) -> None:
    """Forget a thread's cached branch ids. A caller whose transaction created a branch and then
    rolled back calls it, so the next write does not find the rolled-back branch's id here."""
    _forget_thread(thread_id)


def clear_caches() -> None:
    """Forget every cached state (tests use it to force a replay from the database)."""
    _cache.clear()
    blobs.forget()
    _branches.clear()
    _branch_names.clear()


# --------------------------------------------------------------------------- threads


def create_thread(
    *, agent: Agent, external_id: str | None = None, metadata: dict[str, Any] | None = None
) -> tuple[Thread, bool]:
    """Create a thread with its `main` branch, or return the agent's thread with `external_id`.

    Returns (thread, created).
    """
    metadata = _checked_object(metadata or {}, field="metadata")
    if external_id is not None:
        existing = Thread.objects.filter(agent=agent, external_id=external_id).first()
        if existing is not None:
            return existing, False
    try:
        with transaction.atomic():
            thread = Thread.objects.create(agent=agent, external_id=external_id, metadata=metadata)
            crypto.create_thread_key(thread.pk)
            branch = Branch.objects.create(thread=thread, name=MAIN_BRANCH)
            thread.active_branch = branch
            thread.save(update_fields=["active_branch"])
            record_event(thread=thread, type="thread.created", data={"agent": agent.name, "status": thread.status})
    except IntegrityError:
        # Another request created the same (agent, external_id) first: theirs wins.
        existing = Thread.objects.filter(agent=agent, external_id=external_id).first()
        if existing is None:
            raise
        return existing, False
    return thread, True


def record_event(*, thread: Thread | UUID, type: str, data: dict[str, Any]) -> Event:
    """Append an event to the thread's log; call it inside the transaction making the change."""
    thread_id = thread.pk if isinstance(thread, Thread) else thread
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE checkpoints_thread SET event_seq = event_seq + 1, updated_at = now() "
            "WHERE id = %s RETURNING event_seq",
            [thread_id],
        )
        row = cursor.fetchone()
    if row is None:
        raise NotFound(f"Thread {thread_id} does not exist.")
    event = Event.objects.create(thread_id=thread_id, seq=row[0], type=type, data=data)
    live.publish_on_commit(thread_id=thread_id, seq=event.seq, type=type, data=data, agent=data.get("agent"))
    return event


def set_thread_status(*, thread: Thread | UUID, status: str) -> None:
    """Set a thread's status without a checkpoint (a LangGraph graph that ran to its end),
    with a `thread.updated` event in the same transaction."""
    if status not in CheckpointStatus.values:
        raise InvalidState(f"`status` must be one of {', '.join(CheckpointStatus.values)}.", detail={"field": "status"})
    thread_id = thread.pk if isinstance(thread, Thread) else thread
    with transaction.atomic():
        # A cancellation stands: an agent finishing afterwards does not undo it.
        if Thread.objects.filter(pk=thread_id).exclude(status=CheckpointStatus.CANCELLED).update(status=status):
            record_event(thread=thread_id, type="thread.updated", data={"status": status})


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
            _cache.drop(stale.parent_id)
            hotcache.forget([stale.parent_id])
            return write(*args, **kwargs)

    return wrapper


@_retrying_stale_cache
def append_checkpoint(
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
) -> Checkpoint:
    """Append a checkpoint after `parent`, which must be the head of its branch.

    Give either the full new `state` or a `patch` against the parent's state.
    Raises StaleParent (naming the current head) when another write got there
    first, InvalidState / InvalidPatch / StateTooLarge for input the store
    refuses; a refused write leaves nothing behind. A run's write carries its `fence` and raises
    LeaseLost, writing nothing, once another attempt holds the run.
    """
    if (state is None) == (patch is None):
        raise InvalidState("Give exactly one of `state` (the full new state) or `patch` (RFC 6902 ops).")
    fields = _checked_fields(
        step=step, label=label, status=status, model=model, metadata=metadata,
        schema_version=schema_version, source=source,
    )  # fmt: skip
    parent_id = parent.pk if isinstance(parent, Checkpoint) else parent
    parent_node = _parent_node(parent_id, thread=thread) if parent_id is not None else None
    branch_name = branch or (get_branch_name(parent_node.branch_id) if parent_node else MAIN_BRANCH)
    branch_id, fork_point_id = _branch(thread.pk, branch_name)
    same_branch = parent_node is not None and parent_node.branch_id == branch_id
    if not same_branch and parent_id != fork_point_id:
        # Only the fork point may precede a branch's first checkpoint; if the branch
        # already has checkpoints the writer is behind its head.
        head = branch_head(thread_id=thread.pk, branch_id=branch_id)
        if head is not None or parent_id is not None:
            raise _stale_parent(parent_id, head, branch_name=branch_name)
    seq = parent_node.seq + 1 if parent_node is not None and same_branch else 1

    delta, new_state, state_bytes = _next_state(parent_node, state=state, patch=patch)
    chain_length = parent_node.chain_length + 1 if parent_node else 0
    chain_bytes = parent_node.chain_bytes + len(delta) if parent_node else 0
    if (
        parent_node is None
        or chain_length >= settings.QUICKSAVE_SNAPSHOT_EVERY
        or chain_bytes * REPLAY_COST_PER_BYTE > state_bytes
    ):
        kind, canonical, chain_length, chain_bytes = PayloadKind.SNAPSHOT, _canonical(new_state), 0, 0
    else:
        kind, canonical = PayloadKind.DELTA, delta

    if len(canonical) > blobs.limit():
        canonical = _offloaded(thread.pk, new_state if kind == PayloadKind.SNAPSHOT else codec.loads(delta), canonical)
    checkpoint_id = new_id()
    payload = _seal(thread.pk, checkpoint_id, canonical)
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
        "event": Jsonb(dumps=codec.dumps, obj={
            "checkpoint": str(checkpoint_id), "parent": str(parent_id) if parent_id else None,
            "branch": branch_name, "seq": seq, "step": step, "label": label, "status": fields["status"],
        }),
    }  # fmt: skip

    if tool_results:
        from checkpoints.tools import MAX_KEY_LENGTH, MAX_TOOL_LENGTH, put_tool_result, valid_key

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
        with transaction.atomic() if tool_results else contextlib.nullcontext(), _appending(params) as written:
            # In autocommit, done while the server executes and commits the append (see
            # checkpoints.wire). The new id is in no one else's hands yet, so caching its node
            # first is safe; it is dropped again if the append turns out to have written nothing.
            _cache.put(
                Node(id=checkpoint_id, thread_id=thread.pk, branch_id=branch_id, seq=seq, state=new_state,
                     state_bytes=state_bytes, chain_length=chain_length, chain_bytes=chain_bytes,
                     integrity=integrity)
            )  # fmt: skip
            params["metadata"] = fields["metadata"]
            checkpoint = Checkpoint.from_db("default", _ROW_FIELDS, [params[name] for name in _ROW_FIELDS])
            if not written():
                raise _refused(params, branch_name=branch_name, fence=fence)
            for item in tool_results or ():
                put_tool_result(thread=thread, key=item["key"], result=item["result"],
                                tool=item.get("tool", ""), checkpoint=checkpoint_id)  # fmt: skip
    except BaseException:
        _cache.drop(checkpoint_id)
        raise
    return checkpoint


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


# One statement inserts the checkpoint, bumps the thread and logs the event, so a
# write is atomic even in autocommit and costs one round trip. The unique
# (thread, branch, seq) index is the optimistic lock: seq is the parent's seq + 1,
# so of N writers with the same parent exactly one inserts and the rest conflict
# (a conflicting insert waits for the winner to commit, then does nothing).
_APPEND_SQL = """
WITH cp AS (
    INSERT INTO checkpoints_checkpoint (
        id, thread_id, branch_id, parent_id, seq, step, label, status, source, model_name, model_version,
        temperature, top_p, seed, metadata, schema_version, kind, payload, chain_length, chain_bytes,
        state_bytes, integrity, created_at)
    SELECT %(id)s::uuid, %(thread_id)s::uuid, %(branch_id)s::bigint, %(parent_id)s::uuid, %(seq)s::bigint,
        %(step)s::bigint, %(label)s::text, %(status)s::text, %(source)s::text, %(model_name)s::text,
        %(model_version)s::text, %(temperature)s::float8, %(top_p)s::float8, %(seed)s::bigint,
        %(metadata)s::jsonb, %(schema_version)s::bigint, %(kind)s::bigint, %(payload)s::bytea,
        %(chain_length)s::bigint, %(chain_bytes)s::bigint, %(state_bytes)s::bigint, %(integrity)s::bytea,
        %(created_at)s::timestamptz
    -- The MAC this row chains from must still be its parent's: a parent rewritten by compaction
    -- since this process cached it makes the write retry from the stored row.
    WHERE (%(parent_id)s::uuid IS NULL OR EXISTS (
        SELECT 1 FROM checkpoints_checkpoint p WHERE p.id = %(parent_id)s::uuid AND p.integrity = %(parent_mac)s::bytea
        -- Waits for a compaction rewriting the parent (it locks the row FOR UPDATE), then checks the
        -- new MAC. KEY SHARE is the lock the deferred parent_id foreign key takes at commit anyway.
        FOR KEY SHARE))
    -- A run's write only while its attempt still holds the run (agents.fencing).
    AND {fence}
    ON CONFLICT (thread_id, branch_id, seq) DO NOTHING
    RETURNING id
), bumped AS (
    UPDATE checkpoints_thread SET
        event_seq = event_seq + 1,
        -- At most once a second, so most of these updates touch no indexed column (HOT).
        updated_at = CASE WHEN updated_at < %(created_at)s::timestamptz - interval '1 second'
                          THEN %(created_at)s::timestamptz ELSE updated_at END,
        head_id = CASE WHEN active_branch_id = %(branch_id)s::bigint THEN %(id)s::uuid ELSE head_id END,
        step = CASE WHEN active_branch_id = %(branch_id)s::bigint THEN %(step)s::bigint ELSE step END,
        -- A cancellation stands: an agent still writing afterwards does not undo it (a person's fork may).
        status = CASE WHEN active_branch_id = %(branch_id)s::bigint
                           AND (status <> 'cancelled' OR %(source)s::text = 'human')
                      THEN %(status)s::text ELSE status END
    WHERE id = %(thread_id)s::uuid AND EXISTS (SELECT 1 FROM cp)
    RETURNING event_seq
)
INSERT INTO checkpoints_event (thread_id, seq, type, data, created_at)
SELECT %(thread_id)s::uuid, bumped.event_seq, 'checkpoint.created', %(event)s::jsonb, %(created_at)s::timestamptz
FROM bumped
RETURNING seq
""".replace("{fence}", fencing.SQL)

# Every column, in model order, as Model.from_db wants them.
_ROW_FIELDS = tuple(field.attname for field in Checkpoint._meta.concrete_fields)


_APPEND = wire.Statement.named("quicksave_append", _APPEND_SQL)


@contextlib.contextmanager
def _appending(params: dict[str, Any]) -> Iterator[Callable[[], bool]]:
    """Send the append and yield what reads its outcome: True once it wrote (its event is then
    published when committed), False when it wrote nothing (another write got there first,
    or the parent's MAC changed).

    In autocommit the statement goes out before the block runs and commits on its own; in
    a transaction (tool results, a caller's atomic block) psycopg's cursor runs it there.
    """
    db = connections[DEFAULT_DB_ALIAS]
    db.ensure_connection()
    conn = db.connection
    try:
        if conn.autocommit:
            with _APPEND.sent(conn, params) as reply:
                written = functools.cache(lambda: _published(params, reply.rows(), live.publish))
                try:
                    yield written
                except BaseException:
                    # The block failed after the append went out: it may have landed all the
                    # same, and then its event goes out too.
                    with contextlib.suppress(psycopg.Error):
                        written()
                    raise
        else:
            cursor = _append_cursor(conn)
            cursor.execute(_APPEND_SQL, params, prepare=True)
            yield lambda: _published(params, cursor.fetchall(), live.publish_on_commit)
    except psycopg.errors.ForeignKeyViolation:
        # The branch (and so the thread) was deleted after this process cached it.
        _forget_thread(params["thread_id"])
        raise NotFound(f"Thread {params['thread_id']} no longer exists.") from None


def _published(params: dict[str, Any], rows: Sequence[tuple[Any, ...]], publish: Callable[..., None]) -> bool:
    if not rows:
        return False
    publish(thread_id=params["thread_id"], seq=int(rows[0][0]), type="checkpoint.created", data=params["event"].obj)
    return True


# A cursor runs the append inside a transaction: psycopg keeps a cursor's adapters for the
# statement it last ran, so the next append finds the dumpers of its parameters instead of
# looking each up again. One per thread, for the connection the thread used last: a cursor
# holds its connection, so one cached per connection would keep every closed one alive; this
# way each thread keeps at most its last.
_append_cursors = threading.local()


def _append_cursor(conn: psycopg.Connection[Any]) -> psycopg.Cursor[Any]:
    cursor: psycopg.Cursor[Any] | None = getattr(_append_cursors, "cursor", None)
    if cursor is None or cursor.connection is not conn or cursor.closed:
        cursor = _append_cursors.cursor = psycopg.Cursor(conn)
        # psycopg sends a Python int as int2, int4 or int8 by its value, and each combination of
        # types is a statement of its own to prepare: as int8 always (the SQL casts each one), a
        # thread's growing sizes do not prepare the append again each time they cross a boundary.
        cursor.adapters.register_dumper(int, Int8Dumper)
        cursor.adapters.register_dumper(int, Int8BinaryDumper)
    return cursor


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


def branch_head(*, thread_id: UUID, branch_id: int) -> tuple[UUID, int] | None:
    """(id, seq) of the newest checkpoint on a branch, or None while it is empty."""
    row = (
        Checkpoint.objects.filter(thread_id=thread_id, branch_id=branch_id)
        .order_by("-seq")
        .values_list("id", "seq")
        .first()
    )
    return (row[0], row[1]) if row else None


def _next_state(
    parent: Node | None, *, state: dict[str, Any] | None, patch: list[dict[str, Any]] | None
) -> tuple[bytes, dict[str, Any], int]:
    """The delta from the parent's state as canonical JSON, the new state and its size, all checked."""
    base: dict[str, Any] = parent.state if parent else {}
    base_bytes = parent.state_bytes if parent else 2
    if patch is not None:
        try:
            ops = validate_ops(patch)
        except PatchError as exc:
            raise InvalidPatch(exc.message, detail=_patch_detail(exc)) from None
    else:
        if not isinstance(state, dict):
            raise InvalidState("`state` must be a JSON object.", detail={"field": "state"})
        ops = make_patch(base, state)
    # A round trip through canonical JSON rejects NaN/Infinity and bad Unicode, and
    # gives the store private copies of the inserted values, which a caller can no
    # longer mutate under the cache.
    try:
        delta = codec.to_canonical_bytes(ops)
    except codec.EncodingError as exc:
        field = "patch" if patch is not None else "state"
        raise InvalidState(f"The {field} {exc}.", detail={"field": field}) from None
    if blobs.MARKER_BYTES in delta:
        field = "patch" if patch is not None else "state"
        raise InvalidState(
            f"The {field} contains `{blobs.MARKER}`, which Quicksave keeps for its references to large values.",
            detail={"field": field},
        )
    ops = codec.loads(delta)
    max_bytes: int = settings.QUICKSAVE_MAX_STATE_BYTES
    try:
        applied = apply_patch(base, ops, limit=max_bytes - base_bytes)
    except PatchError as exc:
        raise InvalidPatch(exc.message, detail=_patch_detail(exc)) from None
    except PatchTooLarge as exc:
        raise StateTooLarge.stopped(exc, field="patch" if patch is not None else "state", limit=max_bytes) from None
    except RecursionError:
        raise InvalidState(f"The state is nested deeper than {settings.QUICKSAVE_MAX_DEPTH} levels.") from None
    if not isinstance(applied.doc, dict):
        raise InvalidState("The state must remain a JSON object.", detail={"field": "patch" if patch else "state"})
    limit: int = settings.QUICKSAVE_MAX_DEPTH
    if applied.depth > limit:
        raise InvalidState(
            f"The state is nested {applied.depth} levels deep; the limit is {limit}.",
            detail={"field": "patch" if patch is not None else "state", "limit": limit},
        )
    state_bytes = base_bytes + applied.size_delta
    if state_bytes > max_bytes:
        raise StateTooLarge(
            f"The state would be {state_bytes} bytes; the limit is {max_bytes} bytes (QUICKSAVE_MAX_STATE_BYTES).",
            detail={"field": "patch" if patch is not None else "state", "size": state_bytes, "limit": max_bytes},
        )
    return delta, applied.doc, state_bytes


def _patch_detail(exc: PatchError) -> dict[str, Any]:
    return {"field": "patch", "op": exc.index, "path": exc.path}


def _canonical(value: Any) -> bytes:
    return codec.to_canonical_bytes(value)


def _checked_object(value: Any, *, field: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidState(f"`{field}` must be a JSON object.", detail={"field": field})
    if not value:  # most writes carry no metadata
        return value
    try:
        size = len(codec.to_canonical_bytes(value))
        codec.check_depth(value)
    except codec.EncodingError as exc:
        raise InvalidState(f"`{field}` {exc}.", detail={"field": field}) from None
    limit: int = settings.QUICKSAVE_MAX_METADATA_BYTES
    if size > limit:
        raise InvalidState(
            f"`{field}` is {size} bytes of JSON; the limit is {limit} bytes (QUICKSAVE_MAX_METADATA_BYTES).",
            detail={"field": field, "size": size, "limit": limit},
        )
    return value


# Choices' .values builds a new list on every access; a write checks both.
# Each value to itself: looked up with any str or str enum member equal to it, they give the plain str.
_STATUSES = {value: value for value in CheckpointStatus.values}
_SOURCES = {value: value for value in CheckpointSource.values}


def _checked_fields(
    *,
    step: int | None,
    label: str,
    status: str,
    model: dict[str, Any] | None,
    metadata: dict[str, Any] | None,
    schema_version: int,
    source: str,
) -> dict[str, Any]:
    def bad(field: str, message: str) -> InvalidState:
        return InvalidState(f"`{field}` {message}", detail={"field": field})

    if step is not None and (isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < 2**31):
        raise bad("step", "must be an integer between 0 and 2147483647.")
    if not isinstance(label, str) or len(label) > 200:
        raise bad("label", "must be a string of at most 200 characters.")
    if status not in _STATUSES:
        raise bad("status", f"must be one of {', '.join(CheckpointStatus.values)}.")
    if source not in _SOURCES:
        raise bad("source", f"must be one of {', '.join(CheckpointSource.values)}.")
    if isinstance(schema_version, bool) or not isinstance(schema_version, int) or not 1 <= schema_version < 2**31:
        raise bad("schema_version", "must be a positive integer.")
    fields: dict[str, Any] = {
        # Plain strs, not the enum members the defaults are: the MAC's fields encode faster.
        "step": step, "label": label, "status": _STATUSES[status], "source": _SOURCES[source],
        "schema_version": schema_version,
        "metadata": _checked_object(metadata or {}, field="metadata"),
        "model_name": "", "model_version": "", "temperature": None, "top_p": None, "seed": None,
    }  # fmt: skip
    if model is not None:
        if not isinstance(model, dict):
            raise bad("model", "must be an object with name, version, temperature, top_p, seed.")
        unknown = set(model) - set(MODEL_FIELDS)
        if unknown:
            raise bad("model", f"has unknown keys {sorted(unknown)}; allowed: {sorted(MODEL_FIELDS)}.")
        for key in ("name", "version"):
            value = model.get(key)
            if value is not None and (not isinstance(value, str) or len(value) > (200 if key == "name" else 100)):
                raise bad(f"model.{key}", "must be a short string.")
            fields[MODEL_FIELDS[key]] = value or ""
        for key in ("temperature", "top_p"):
            fields[MODEL_FIELDS[key]] = _finite_float(model.get(key), field=f"model.{key}")
        seed = model.get("seed")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or abs(seed) >= 2**63):
            raise bad("model.seed", "must be a 64-bit integer.")
        fields["seed"] = seed
    return fields


def _finite_float(value: Any, *, field: str) -> float | None:
    """`value` as the double PostgreSQL stores (None stays None), refusing what is no number or
    none a double holds: NaN, an infinity, an integer of 309 digits or more."""
    if value is None:
        return None
    number = None
    if not isinstance(value, bool) and isinstance(value, (int, float)):
        with contextlib.suppress(OverflowError):
            number = float(value)
    if number is None or not math.isfinite(number):
        raise InvalidState(f"`{field}` must be a finite number.", detail={"field": field})
    return number


def mac_fields(checkpoint: Checkpoint | _Row) -> dict[str, Any]:
    """The recorded fields an integrity MAC covers, read back from a stored row."""
    return {
        "step": checkpoint.step, "label": checkpoint.label, "status": checkpoint.status,
        "source": checkpoint.source, "schema_version": checkpoint.schema_version, "metadata": checkpoint.metadata,
        "model_name": checkpoint.model_name, "model_version": checkpoint.model_version,
        "temperature": checkpoint.temperature, "top_p": checkpoint.top_p, "seed": checkpoint.seed,
        "state_bytes": checkpoint.state_bytes,
    }  # fmt: skip


def _branch(thread_id: UUID, name: str) -> tuple[int, UUID | None]:
    """(id, fork point) of a thread's branch by name; both never change, so they are cached."""
    key = (thread_id, name)
    known = _branches.get(key)
    if known is None:
        found = Branch.objects.filter(thread_id=thread_id, name=name).values_list("id", "fork_point_id").first()
        if found is None:
            raise NotFound(f"Thread {thread_id} has no branch named '{name}'.", detail={"field": "branch"})
        known = _remember_branch(thread_id, name, found[0], found[1])
    return known


def _remember_branch(thread_id: UUID, name: str, branch_id: int, fork_point: UUID | None) -> tuple[int, UUID | None]:
    _branches[thread_id, name] = (branch_id, fork_point)
    _branch_names[branch_id] = name
    return branch_id, fork_point


def get_branch_name(branch_id: int) -> str:
    name = _branch_names.get(branch_id)
    if name is None:
        found = Branch.objects.filter(pk=branch_id).values_list("name", flat=True).first()
        if found is None:
            raise NotFound(f"Branch {branch_id} no longer exists (its thread was deleted).")
        name = _branch_names[branch_id] = found
    return name


# --------------------------------------------------------------------------- reads


class _Row(NamedTuple):
    """The columns a replay reads: enough to verify a row's MAC and apply its payload."""

    id: UUID
    thread_id: UUID
    branch_id: int
    parent_id: UUID | None
    seq: int
    step: int | None
    label: str
    status: str
    source: str
    model_name: str
    model_version: str
    temperature: float | None
    top_p: float | None
    seed: int | None
    metadata: dict[str, Any]
    schema_version: int
    kind: int
    payload: bytes
    chain_length: int
    chain_bytes: int
    state_bytes: int
    integrity: bytes
    created_at: datetime
    parent_integrity: bytes | None


_ROW_COLUMNS = ", ".join(f"c.{name}" for name in _Row._fields[:-1])
_PARENT_MAC = (
    "CASE WHEN c.kind = %(snapshot)s AND c.parent_id IS NOT NULL THEN "
    "(SELECT p.integrity FROM checkpoints_checkpoint p WHERE p.id = c.parent_id) END"
)
# A chain that stays on the checkpoint's own branch is one range of the timeline index.
_RANGE_SQL = f"""
SELECT {_ROW_COLUMNS}, {_PARENT_MAC}
FROM checkpoints_checkpoint c
WHERE c.thread_id = %(thread)s AND c.branch_id = %(branch)s AND c.seq BETWEEN %(first)s AND %(last)s
ORDER BY c.seq
"""
# A chain that crosses a fork walks parent links back to the nearest snapshot.
_WALK_SQL = f"""
WITH RECURSIVE chain AS (
    SELECT c.*, 0 AS depth FROM checkpoints_checkpoint c WHERE c.id = %(id)s
    UNION ALL
    SELECT c.*, chain.depth + 1 FROM checkpoints_checkpoint c
    JOIN chain ON c.id = chain.parent_id
    WHERE chain.kind = %(delta)s
)
SELECT {_ROW_COLUMNS}, {_PARENT_MAC} FROM chain c ORDER BY c.depth DESC
"""


class _StoredJsonb(JsonbBinaryLoader):
    """jsonb in binary results, parsed as every stored JSON value is (codec.loads)."""

    _loads = staticmethod(codec.loads)


class _Head(NamedTuple):
    """A branch's materialised head that lies on the path a replay walks (see MaterialisedHead)."""

    checkpoint_id: UUID
    seq: int
    payload: bytes
    mac: bytes


# The checkpoint to materialise and, when its branch's materialised head lies on its path
# since the last snapshot, that head, in one round trip.
_TARGET_SQL = """
SELECT c.thread_id, c.branch_id, c.seq, c.chain_length, h.checkpoint_id, h.seq, h.payload, h.mac
FROM checkpoints_checkpoint c
LEFT JOIN checkpoints_materialisedhead h
    ON h.branch_id = c.branch_id AND h.seq <= c.seq AND h.seq > c.seq - c.chain_length
WHERE c.id = %(id)s
"""


def _chain(checkpoint_id: UUID, *, from_head: bool = True) -> tuple[list[_Row], _Head | None]:
    """The rows from the nearest snapshot up to the checkpoint, oldest first, or only those from
    its branch's materialised head on (returned with it) when that lies on the way."""
    connection.ensure_connection()
    with psycopg.Cursor(connection.connection) as cursor:
        # Binary results: a payload arrives as its bytes, not as hex text twice its size for
        # the server to write and this process to decode (a megabyte head: 0.8 ms, not 4.8).
        cursor.adapters.register_loader("jsonb", _StoredJsonb)
        cursor.execute(_TARGET_SQL, {"id": checkpoint_id}, prepare=True, binary=True)
        target = cursor.fetchone()
        if target is None:
            raise NotFound(f"Checkpoint {checkpoint_id} does not exist.")
        thread_id, branch_id, seq, chain_length, head_id = target[:5]
        head = _Head(head_id, *target[5:]) if from_head and head_id is not None else None
        # From a head on, the path is one range of this checkpoint's branch: its seqs run unbroken.
        first = head.seq if head is not None else seq - chain_length
        params = {"snapshot": PayloadKind.SNAPSHOT, "delta": PayloadKind.DELTA, "id": checkpoint_id,
                  "thread": thread_id, "branch": branch_id, "first": first, "last": seq}  # fmt: skip
        sql = _RANGE_SQL if head is not None or chain_length < seq else _WALK_SQL
        cursor.execute(sql, params, prepare=True, binary=True)
        rows = cursor.fetchall()
    return [_Row._make(row) for row in rows], head


def load_node(checkpoint_id: UUID | str, *, hot: bool = False) -> Node:
    """Materialise a checkpoint, checking the integrity of every row replayed.

    Looks in this process's cache, then in Redis (`hotcache`), then replays from the
    nearest snapshot; `hot` puts a replayed state into Redis for the other processes
    (callers pass it for branch heads).
    """
    checkpoint_id = checkpoint_id if isinstance(checkpoint_id, UUID) else UUID(str(checkpoint_id))
    cached = _cache.get(checkpoint_id)
    if cached is not None:
        return cached
    found = hotcache.get(checkpoint_id)
    if found is not None:
        thread_id, entry = found
        node = Node(
            id=checkpoint_id, thread_id=thread_id, branch_id=entry.branch_id, seq=entry.seq, state=entry.state,
            state_bytes=entry.state_bytes, chain_length=entry.chain_length, chain_bytes=entry.chain_bytes,
            integrity=entry.integrity,
        )  # fmt: skip
        _cache.put(node)
        return node
    node, replayed_bytes = _replay(checkpoint_id)
    if hot and replayed_bytes * REPLAY_COST_PER_BYTE * 2 > node.state_bytes:
        # The next cold read of this head (or of a checkpoint soon after it) would replay the
        # same deltas again, at more than half the cost of reading the state whole: save it.
        _materialise_head(node)
    if hot:
        hotcache.put(node.thread_id, node.id, hotcache.Entry(
            seq=node.seq, branch_id=node.branch_id, state_bytes=node.state_bytes, chain_length=node.chain_length,
            chain_bytes=node.chain_bytes, integrity=node.integrity, state=node.state,
        ))  # fmt: skip
    return node


def _replay(checkpoint_id: UUID) -> tuple[Node, int]:
    """Materialise a checkpoint from the database; also returns the delta bytes it replayed."""
    rows, head = _chain(checkpoint_id)
    if not rows or rows[-1].id != checkpoint_id:
        raise IntegrityFailure(f"Checkpoint {checkpoint_id}'s chain back to its snapshot is broken.")
    # Start from the newest ancestor already materialised, if any: its state is
    # shared with the cache, so the replay copies on write from there. From a
    # snapshot the replay owns every object and patches in place.
    start, node, owned = 0, None, True
    for index in range(len(rows) - 1, -1, -1):
        hit = _cache.get(rows[index].id)
        if hit is not None and hit.integrity != rows[index].integrity:
            _cache.drop(hit.id)  # its row was rewritten (compaction) since it was cached
        elif hit is not None:
            node, start, owned = hit, index + 1, False
            break
    if node is None and head is not None:
        node = _from_head(rows[0], head)
        if node is None:  # stale or forged: replay from the snapshot after all
            rows, head = _chain(checkpoint_id, from_head=False)
        else:
            start = 1
    if node is None:
        snapshot = rows[0]
        if snapshot.kind != PayloadKind.SNAPSHOT:
            raise IntegrityFailure(f"Checkpoint {checkpoint_id} has no snapshot on its path.")
        _verify(snapshot, parent_integrity=snapshot.parent_integrity)
        node = _node_from(snapshot, decode_payload(snapshot))
        start = 1
    state, integrity = node.state, node.integrity
    for row in rows[start:]:
        _verify(row, parent_integrity=integrity)
        try:
            state = apply_patch(state, decode_payload(row), measure=False, in_place=owned).doc
        except PatchError as exc:
            raise IntegrityFailure(f"Checkpoint {row.id}'s delta does not apply: {exc.message}") from None
        integrity = row.integrity
    replayed_bytes = rows[-1].chain_bytes - rows[start - 1].chain_bytes if start < len(rows) else 0
    if start < len(rows):
        node = _node_from(rows[-1], state)
    _cache.put(node)
    return node, replayed_bytes


# --------------------------------------------------------------------------- materialised heads


def head_ad(branch_id: int, checkpoint_id: UUID) -> bytes:
    """What a materialised head's sealed payload is bound to."""
    return associated_data("checkpoints_materialisedhead.payload", branch_id, checkpoint_id)


def _head_mac(row: _Row | Node, payload: bytes) -> bytes:
    return codec.head_mac(
        thread_id=row.thread_id, branch_id=row.branch_id, checkpoint_id=row.id, seq=row.seq,
        integrity=row.integrity, state_bytes=row.state_bytes, chain_length=row.chain_length,
        chain_bytes=row.chain_bytes, payload=payload,
    )  # fmt: skip


def _from_head(row: _Row, head: _Head) -> Node | None:
    """The node a materialised head holds for `row`, or None when it no longer matches the row
    (rewritten by compaction) or was altered: then the read replays from the snapshot.

    The head's MAC covers the row's MAC and recorded sizes as they were when its state was
    materialised from verified rows, so a match vouches for the row and the rows before it.
    """
    if row.id != head.checkpoint_id or not hmac.compare_digest(_head_mac(row, head.payload), head.mac):
        return None
    try:
        state = _open(row.thread_id, head.payload, lambda: head_ad(row.branch_id, row.id))
    except (ValueError, IntegrityFailure):
        return None
    return _node_from(row, state)


_HEAD_SQL = """
INSERT INTO checkpoints_materialisedhead (branch_id, checkpoint_id, seq, integrity, payload, mac, updated_at)
VALUES (%(branch_id)s, %(checkpoint_id)s, %(seq)s, %(integrity)s, %(payload)s, %(mac)s, now())
ON CONFLICT (branch_id) DO UPDATE SET
    checkpoint_id = EXCLUDED.checkpoint_id, seq = EXCLUDED.seq, integrity = EXCLUDED.integrity,
    payload = EXCLUDED.payload, mac = EXCLUDED.mac, updated_at = EXCLUDED.updated_at
-- A slower reader of an older head does not move it back.
WHERE checkpoints_materialisedhead.seq < EXCLUDED.seq
   OR (checkpoints_materialisedhead.seq = EXCLUDED.seq AND checkpoints_materialisedhead.integrity <> EXCLUDED.integrity)
"""


def _materialise_head(node: Node) -> None:
    """Save a replayed head's state as its branch's materialised head (best effort: a failure
    only leaves the next cold read to replay)."""
    try:
        encoded = codec.dumps(node.state)
        if len(encoded) > blobs.limit():
            encoded = _offloaded(node.thread_id, node.state, encoded)
        payload = crypto.seal(node.thread_id, head_ad(node.branch_id, node.id), codec.encode(encoded))
        params: dict[str, Any] = {
            "branch_id": node.branch_id, "checkpoint_id": node.id, "seq": node.seq, "integrity": node.integrity,
            "payload": payload, "mac": _head_mac(node, payload),
        }  # fmt: skip
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(_HEAD_SQL, params)
    except (DatabaseError, OSError) as exc:  # e.g. the thread was deleted meanwhile
        log.info("could not save the materialised head of branch %s: %s", node.branch_id, exc)


def payload_ad(checkpoint_id: UUID) -> bytes:
    """What a checkpoint's sealed payload is bound to: its table, column and row."""
    return associated_data("checkpoints_checkpoint.payload", checkpoint_id)


def encode_payload(*, thread_id: UUID, checkpoint_id: UUID, value: Any) -> bytes:
    """A payload as stored: `value` (a full state or RFC 6902 ops) as canonical JSON with its
    large values offloaded to blob storage, framed (zstd when it pays) and sealed under the
    thread's data key, bound to the checkpoint's row.

    The inverse of decode_payload; the store's writes and compaction both go through it.
    """
    canonical = _canonical(value)
    if len(canonical) > blobs.limit():
        canonical = _offloaded(thread_id, value, canonical)
    return _seal(thread_id, checkpoint_id, canonical)


def _offloaded(thread_id: UUID, value: Any, canonical: bytes) -> bytes:
    """`canonical` again with every value above QUICKSAVE_OFFLOAD_BYTES moved to blob storage."""
    stored, refs = blobs.offload(thread_id, value)
    return _canonical(stored) if refs else canonical


def _seal(thread_id: UUID, checkpoint_id: UUID, canonical: bytes) -> bytes:
    return crypto.seal(thread_id, lambda: payload_ad(checkpoint_id), codec.encode(canonical))


def decode_payload(row: Checkpoint | _Row, *, restore: bool = True) -> Any:
    """A stored row's payload as JSON: its full state (snapshot) or its RFC 6902 ops (delta).

    The one place a payload is opened (decrypted, decompressed, parsed, its offloaded values
    read back unless `restore` is False); callers check the row's MAC first (see verify.py),
    which covers the stored, sealed bytes and so the references to offloaded values.
    """
    return _open(row.thread_id, bytes(row.payload), lambda: payload_ad(row.id), restore=restore)


def _open(thread_id: UUID, stored: bytes, ad: Callable[[], bytes], *, restore: bool = True) -> Any:
    """The JSON value in a sealed (or, in a thread without a data key, plain) framed payload,
    with its offloaded values read back unless `restore` is False. `ad` gives what a sealed
    payload is bound to; it is only computed for one (a replay opens hundreds of plain ones)."""
    canonical = codec.unframe(crypto.unseal(thread_id, ad() if crypto.is_sealed(stored) else b"", stored))
    value = codec.loads(canonical)
    if restore and blobs.has_refs(canonical):
        value = blobs.restore(thread_id, value)
    return value


def _verify(row: _Row, *, parent_integrity: bytes | None) -> None:
    if not codec.integrity_matches(
        row.integrity, parent_integrity=parent_integrity, checkpoint_id=row.id, thread_id=row.thread_id,
        branch_id=row.branch_id, parent_id=row.parent_id, seq=row.seq, kind=row.kind,
        payload=row.payload, fields=mac_fields(row), created_at=row.created_at,
    ):  # fmt: skip
        raise IntegrityFailure(
            f"Checkpoint {row.id} (thread {row.thread_id}, seq {row.seq}) fails its integrity check: "
            "it was altered outside Quicksave.",
            detail={"checkpoint": str(row.id)},
        )


def _node_from(row: _Row, state: dict[str, Any]) -> Node:
    return Node(
        id=row.id, thread_id=row.thread_id, branch_id=row.branch_id, seq=row.seq, state=state,
        state_bytes=row.state_bytes, chain_length=row.chain_length, chain_bytes=row.chain_bytes,
        integrity=row.integrity,
    )  # fmt: skip


def state_at(checkpoint: Checkpoint | UUID, *, hot: bool = False) -> dict[str, Any]:
    """The full state at a checkpoint, integrity-checked; the caller owns the returned copy.

    `hot`: the checkpoint is a branch head others will read too; keep its state in Redis.
    """
    checkpoint_id = checkpoint.pk if isinstance(checkpoint, Checkpoint) else checkpoint
    return clone(load_node(checkpoint_id, hot=hot).state)


def latest_state(*, thread: Thread | UUID, branch: str = MAIN_BRANCH) -> tuple[UUID | None, dict[str, Any]]:
    """The head of a branch and its state ({} for a branch with no checkpoint yet)."""
    thread_id = thread.pk if isinstance(thread, Thread) else thread
    head_id = _branch_head_by_name(thread_id, branch)
    if head_id is None:
        return None, {}
    return head_id, clone(load_node(head_id, hot=True).state)


# The branch (cached like _branch) and its head in one round trip, for a reader in a new process.
_BRANCH_HEAD_SQL = """
SELECT b.id, b.fork_point_id, h.id
FROM checkpoints_branch b
LEFT JOIN LATERAL (
    SELECT c.id FROM checkpoints_checkpoint c WHERE c.thread_id = b.thread_id AND c.branch_id = b.id
    ORDER BY c.seq DESC LIMIT 1
) h ON TRUE
WHERE b.thread_id = %(thread)s AND b.name = %(name)s
"""


def _branch_head_by_name(thread_id: UUID, name: str) -> UUID | None:
    if (thread_id, name) in _branches:
        head = branch_head(thread_id=thread_id, branch_id=_branches[thread_id, name][0])
        return head[0] if head else None
    connection.ensure_connection()
    with psycopg.Cursor(connection.connection) as cursor:
        cursor.execute(_BRANCH_HEAD_SQL, {"thread": thread_id, "name": name}, prepare=True)
        found = cursor.fetchone()
    if found is None:
        raise NotFound(f"Thread {thread_id} has no branch named '{name}'.", detail={"field": "branch"})
    _remember_branch(thread_id, name, found[0], found[1])
    head_id: UUID | None = found[2]
    return head_id


def diff(*, base: Checkpoint | UUID, target: Checkpoint | UUID) -> list[dict[str, Any]]:
    """RFC 6902 ops that turn base's state into target's state."""
    base_id = base.pk if isinstance(base, Checkpoint) else base
    target_id = target.pk if isinstance(target, Checkpoint) else target
    return make_patch(load_node(base_id).state, load_node(target_id).state)


def clone(value: Any) -> Any:
    """A deep copy of a JSON value, several times faster than copy.deepcopy."""
    # Scalars are shared, not passed to a call each: a state is mostly strings.
    if isinstance(value, dict):
        return {key: clone(item) if isinstance(item, (dict, list)) else item for key, item in value.items()}
    if isinstance(value, list):
        return [clone(item) if isinstance(item, (dict, list)) else item for item in value]
    return value


def start_branch(*, thread: Thread, at: Checkpoint | UUID, name: str) -> Branch:
    """Open a new, empty branch whose first checkpoint will follow `at`."""
    at_id = at.pk if isinstance(at, Checkpoint) else at
    if not Checkpoint.objects.filter(pk=at_id, thread=thread).exists():
        raise NotFound(f"Checkpoint {at_id} is not in thread {thread.pk}.", detail={"field": "at"})
    if not name or len(name) > 100:
        raise InvalidState("A branch name must be 1 to 100 characters.", detail={"field": "name"})
    try:
        with transaction.atomic():
            branch = Branch.objects.create(thread=thread, name=name, fork_point_id=at_id)
            record_event(thread=thread, type="branch.created", data={"branch": name, "fork_point": str(at_id)})
    except IntegrityError:
        raise InvalidState(
            f"Thread {thread.pk} already has a branch named '{name}'.", detail={"field": "name"}
        ) from None
    return branch


def delete_thread(thread: Thread) -> None:
    """Delete a thread with everything in it, and destroy its data key (crypto-shredding):
    any copy of its rows left elsewhere, a backup included, can no longer be decrypted."""
    with transaction.atomic():
        # The checkpoint tree and the branches' fork points protect their rows one by one;
        # the whole thread goes, so unlink them first and let the cascade do the rest.
        Thread.objects.filter(pk=thread.pk).update(active_branch=None, head=None)
        Branch.objects.filter(thread=thread).update(fork_point=None)
        Checkpoint.objects.filter(thread=thread).update(parent=None)
        crypto.shred(thread.pk)
        Thread.objects.filter(pk=thread.pk).delete()
        DeletedThread.objects.get_or_create(thread_id=thread.pk)  # its blob files go at the next prune
    _forget_thread(thread.pk)
    _cache.drop_thread(thread.pk)
