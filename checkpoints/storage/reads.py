"""Reading a state: materialise a checkpoint from this process's cache, a branch's materialised
head or a replay of deltas from the nearest snapshot, checking every row."""

from __future__ import annotations

import hmac
import logging
from collections.abc import Iterator
from typing import Any, NamedTuple
from uuid import UUID

from django.conf import settings
from django.db import DatabaseError, connection, transaction

from checkpoints.fields import associated_data
from checkpoints.models import (
    Checkpoint,
    PayloadKind,
    Thread,
)
from checkpoints.storage import blobs, branches, codec, crypto, cursors
from checkpoints.storage.branches import MAIN_BRANCH, head_by_name
from checkpoints.storage.errors import (
    IntegrityFailure,
    NotFound,
)
from checkpoints.storage.jsonpatch import PatchError, apply_patch, make_patch
from checkpoints.storage.nodes import Node, drop_thread, states
from checkpoints.storage.payloads import Row, decode_payload, offloaded, open_payload, verify_row

log = logging.getLogger(__name__)

# Replaying a byte of delta costs about twice reading a byte of snapshot (each delta
# is a row to fetch, a MAC to check, a payload to decode and a patch to apply), so
# the store snapshots once the chain since the last snapshot holds half the state's bytes.
REPLAY_COST_PER_BYTE = 2
# How many times the cost of reading a state whole its replay from the last snapshot may cost
# before the store writes a snapshot instead of a delta: snapshots twice apart in a growing log.
# 1.75 (eightfold apart, a quarter fewer bytes for a chat) made cold reads 26-38% slower on
# bench/checkpoint_store.py in a quiet same-run comparison (docs/storage-bytes.md).
REPLAY_BUDGET = 1.0


def needs_snapshot(*, chain_length: int, chain_bytes: int, state_bytes: int, every: int | None = None) -> bool:
    """Whether a checkpoint `chain_length` deltas of `chain_bytes` after the last snapshot, of a
    state of `state_bytes`, is stored as a snapshot (the store's rule, and compaction's with its
    own `every` in place of QUICKSAVE_SNAPSHOT_EVERY)."""
    return (
        chain_length >= (settings.QUICKSAVE_SNAPSHOT_EVERY if every is None else every)
        or chain_bytes * REPLAY_COST_PER_BYTE > REPLAY_BUDGET * state_bytes
    )


_ROW_COLUMNS = ", ".join(f"c.{name}" for name in Row._fields[:-1])
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


def _chain(checkpoint_id: UUID, *, from_head: bool = True) -> tuple[list[Row], _Head | None]:
    """The rows from the nearest snapshot up to the checkpoint, oldest first, or only those from
    its branch's materialised head on (returned with it) when that lies on the way."""
    with cursors.cursor(json=True) as cursor:
        cursor.execute(_TARGET_SQL, {"id": checkpoint_id})
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
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    return [Row._make(row) for row in rows], head


def load_node(checkpoint_id: UUID | str, *, hot: bool = False, cache: bool = True) -> Node:
    """Materialise a checkpoint, checking the integrity of every row replayed.

    Looks in this process's cache, then replays from the branch's materialised head or the
    nearest snapshot; `hot` (callers pass it for branch heads, which are read again) saves a
    long replay's state as the branch's materialised head. `cache=False` (a read of many states
    once each, such as an export) still uses what the cache holds but adds nothing to it, so it
    neither grows the process nor pushes out the states its other readers use.
    """
    checkpoint_id = checkpoint_id if isinstance(checkpoint_id, UUID) else UUID(str(checkpoint_id))
    cached = states.get(checkpoint_id)
    if cached is not None:
        return cached
    node, replayed_bytes = _replay(checkpoint_id, remember=cache)
    if hot and replayed_bytes * REPLAY_COST_PER_BYTE * 2 > node.state_bytes:
        # The next cold read of this head (or of a checkpoint soon after it) would replay the
        # same deltas again, at more than half the cost of reading the state whole: save it.
        _materialise_head(node)
    return node


def _replay(checkpoint_id: UUID, *, remember: bool = True) -> tuple[Node, int]:
    """Materialise a checkpoint from the database (kept in the cache when `remember`); also
    returns the delta bytes it replayed."""
    rows, head = _chain(checkpoint_id)
    if not rows or rows[-1].id != checkpoint_id:
        raise IntegrityFailure(f"Checkpoint {checkpoint_id}'s chain back to its snapshot is broken.")
    # Start from the newest ancestor already materialised, if any: its state is
    # shared with the cache, so the replay copies on write from there. From a
    # snapshot the replay owns every object and patches in place.
    start, node, owned = 0, None, True
    for index in range(len(rows) - 1, -1, -1):
        hit = states.get(rows[index].id)
        if hit is not None and hit.integrity != rows[index].integrity:
            states.drop(hit.id)  # its row was rewritten (compaction) since it was cached
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
        verify_row(snapshot, parent_integrity=snapshot.parent_integrity)
        node = _node_from(snapshot, decode_payload(snapshot))
        start = 1
    state, integrity = node.state, node.integrity
    for row in rows[start:]:
        verify_row(row, parent_integrity=integrity)
        try:
            state = apply_patch(state, decode_payload(row), measure=False, in_place=owned).doc
        except PatchError as exc:
            raise IntegrityFailure(f"Checkpoint {row.id}'s delta does not apply: {exc.message}") from None
        integrity = row.integrity
    replayed_bytes = rows[-1].chain_bytes - rows[start - 1].chain_bytes if start < len(rows) else 0
    if start < len(rows):
        node = _node_from(rows[-1], state)
    if remember:
        states.remember(node.id, node)
    return node, replayed_bytes


# The ids of the checkpoints from the thread's first to this one, oldest first (parent links
# cross forks); the rows are then read a batch at a time.
_PATH_SQL = """
WITH RECURSIVE path AS (
    SELECT c.id, c.parent_id, 0 AS depth FROM checkpoints_checkpoint c WHERE c.id = %(id)s
    UNION ALL
    SELECT c.id, c.parent_id, path.depth + 1 FROM checkpoints_checkpoint c JOIN path ON c.id = path.parent_id
)
SELECT id FROM path ORDER BY depth DESC
"""
_ROWS_SQL = f"SELECT {_ROW_COLUMNS}, NULL FROM checkpoints_checkpoint c WHERE c.id = ANY(%(ids)s)"
HISTORY_BATCH = 200


def states_along(checkpoint: Checkpoint | UUID) -> Iterator[tuple[Row, dict[str, Any]]]:
    """Every checkpoint from its thread's first to `checkpoint` (across the forks on the way),
    oldest first, each with its state: one replay of the whole path, every row checked against
    its parent's MAC, nothing added to the process's cache (a reader of a whole trajectory, such
    as an export, reads each state once).

    The state is the walk's own and is patched in place at the next step: copy what you keep.
    Raises NotFound for an unknown checkpoint and IntegrityFailure for a row that fails its check.
    """
    checkpoint_id = checkpoint.pk if isinstance(checkpoint, Checkpoint) else checkpoint
    with cursors.cursor() as cursor:
        cursor.execute(_PATH_SQL, {"id": checkpoint_id})
        ids = [row[0] for row in cursor.fetchall()]
    if not ids:
        raise NotFound(f"Checkpoint {checkpoint_id} does not exist.")
    state: dict[str, Any] = {}
    integrity: bytes | None = None
    for first in range(0, len(ids), HISTORY_BATCH):
        batch = ids[first : first + HISTORY_BATCH]
        with cursors.cursor(json=True) as cursor:
            cursor.execute(_ROWS_SQL, {"ids": batch})
            by_id = {row[0]: Row._make(row) for row in cursor.fetchall()}
        for row_id in batch:
            row = by_id.get(row_id)
            if row is None:  # deleted while we read (a thread deleted, compaction)
                raise IntegrityFailure(f"Checkpoint {checkpoint_id}'s history changed while it was read.")
            verify_row(row, parent_integrity=integrity)
            if row.kind == PayloadKind.SNAPSHOT:
                state = decode_payload(row)
            elif integrity is None:
                raise IntegrityFailure(f"Checkpoint {row.id} begins its thread without a snapshot.")
            else:
                try:
                    state = apply_patch(state, decode_payload(row), measure=False, in_place=True).doc
                except PatchError as exc:
                    raise IntegrityFailure(f"Checkpoint {row.id}'s delta does not apply: {exc.message}") from None
            integrity = row.integrity
            yield row, state


# --------------------------------------------------------------------------- materialised heads


def head_ad(branch_id: int, checkpoint_id: UUID) -> bytes:
    """What a materialised head's sealed payload is bound to."""
    return associated_data("checkpoints_materialisedhead.payload", branch_id, checkpoint_id)


def _head_mac(row: Row | Node, payload: bytes) -> bytes:
    return codec.head_mac(
        thread_id=row.thread_id, branch_id=row.branch_id, checkpoint_id=row.id, seq=row.seq,
        integrity=row.integrity, state_bytes=row.state_bytes, chain_length=row.chain_length,
        chain_bytes=row.chain_bytes, payload=payload,
    )  # fmt: skip


def _from_head(row: Row, head: _Head) -> Node | None:
    """The node a materialised head holds for `row`, or None when it no longer matches the row
    (rewritten by compaction) or was altered: then the read replays from the snapshot.

    The head's MAC covers the row's MAC and recorded sizes as they were when its state was
    materialised from verified rows, so a match vouches for the row and the rows before it.
    """
    if row.id != head.checkpoint_id or not hmac.compare_digest(_head_mac(row, head.payload), head.mac):
        return None
    try:
        state = open_payload(row.thread_id, head.payload, lambda: head_ad(row.branch_id, row.id))
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
            encoded = offloaded(node.thread_id, node.state, encoded)
        payload = crypto.seal(node.thread_id, head_ad(node.branch_id, node.id), codec.encode(encoded))
        params: dict[str, Any] = {
            "branch_id": node.branch_id, "checkpoint_id": node.id, "seq": node.seq, "integrity": node.integrity,
            "payload": payload, "mac": _head_mac(node, payload),
        }  # fmt: skip
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(_HEAD_SQL, params)
    except (DatabaseError, OSError) as exc:  # e.g. the thread was deleted meanwhile
        log.info("could not save the materialised head of branch %s: %s", node.branch_id, exc)


def _node_from(row: Row, state: dict[str, Any]) -> Node:
    return Node(
        id=row.id, thread_id=row.thread_id, branch_id=row.branch_id, seq=row.seq, state=state,
        state_bytes=row.state_bytes, chain_length=row.chain_length, chain_bytes=row.chain_bytes,
        integrity=row.integrity,
    )  # fmt: skip


def state_at(checkpoint: Checkpoint | UUID, *, hot: bool = False, cache: bool = True) -> dict[str, Any]:
    """The full state at a checkpoint, integrity-checked; the caller owns the returned copy.

    `hot`: the checkpoint is a branch head others will read too; `cache=False`: a read made once,
    kept out of the process's cache (see `load_node`).
    """
    checkpoint_id = checkpoint.pk if isinstance(checkpoint, Checkpoint) else checkpoint
    return clone(load_node(checkpoint_id, hot=hot, cache=cache).state)


def latest_state(*, thread: Thread | UUID, branch: str = MAIN_BRANCH) -> tuple[UUID | None, dict[str, Any]]:
    """The head of a branch and its state ({} for a branch with no checkpoint yet)."""
    thread_id = thread.pk if isinstance(thread, Thread) else thread
    head_id = head_by_name(thread_id, branch)
    if head_id is None:
        return None, {}
    return head_id, clone(load_node(head_id, hot=True).state)


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


def release_thread(thread_id: UUID) -> None:
    """Drop this process's cached states of a thread it is done with for now (a worker, once a run of
    the thread ends): a process that runs one agent after another then holds the states of the runs
    in hand, not the head of every thread it ever ran until the cache's budget is full. The next
    reader of the thread reads its branch's materialised head."""
    drop_thread(thread_id)


def clear_caches() -> None:
    """Forget every cached state, branch and blob (tests use it to force a replay from the database)."""
    states.clear()
    blobs.forget()
    branches.forget_all()
