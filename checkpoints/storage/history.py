"""A value's history: the checkpoints, across all of a thread's branches, where one JSON path
(an RFC 6901 pointer) changed, with the value before and after each, read from the stored
patches, never by materialising every state.

An index (`ChangedPath`) names, for each checkpoint, the pointers its stored change touched:
the paths of its delta's ops (a snapshot's: of its diff from its parent), and, for an insertion
into or a removal from an array, the array itself, whose later elements shift. The first history
read of a thread fills it; each later read first indexes only what was appended since, per branch
(`ChangedPathMark`). A read then decodes just the checkpoints whose change touched the path, an
ancestor of it (a `replace` of /config is a change of /config/batch_size when the value differs)
or something under it, checking each row's integrity MAC as a state read does, and follows the
value from one change to the next along the tree: the value after a change is the value before
the next change below it, so each change costs one patch applied to the value, not a state.
"""

from __future__ import annotations

import base64
import binascii
from bisect import bisect_right
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final
from uuid import UUID

from django.db import connection, transaction

from checkpoints.models import PayloadKind, Thread
from checkpoints.storage import cursors
from checkpoints.storage.errors import IntegrityFailure, InvalidPath
from checkpoints.storage.jsonpatch import PatchError, apply_patch, json_equal, make_patch, parse_pointer
from checkpoints.storage.payloads import Row, decode_payload, verify_row
from checkpoints.storage.reads import load_node

# A pointer longer than this is indexed as its longest ancestor that fits (a B-tree entry has a
# size limit); reads then decode that checkpoint for any path under the ancestor, and discard it
# when the value did not change.
MAX_INDEXED_POINTER = 400
# A change touching more paths than this is indexed by shallower ancestors of them, down to the
# whole state: a bulk rewrite of a state costs a few index rows, not thousands.
MAX_PATHS_PER_CHECKPOINT = 64
# Rows of a range being indexed read from the database at a time.
_BATCH = 500


class _Absent:
    """The value of a path that does not exist in a state (ABSENT, its one instance)."""

    def __repr__(self) -> str:
        return "ABSENT"

    def __bool__(self) -> bool:
        return False


ABSENT: Final = _Absent()
# An object or array a first pass over a history did not keep (see value_history); never returned.
_DROPPED: Final = _Absent()


@dataclass(frozen=True, slots=True)
class ValueChange:
    """One checkpoint where the value at the path changed: `old` in its parent's state, `new` in
    its own, either of them ABSENT where the path does not exist. Values are shared: never mutate."""

    checkpoint_id: UUID
    parent_id: UUID | None
    branch: str
    seq: int
    step: int | None
    label: str
    status: str
    created_at: datetime
    change: str  # "added" (the path appeared), "removed" (it went) or "changed"
    old: Any
    new: Any

    @property
    def position(self) -> tuple[datetime, UUID]:
        """Where the change sits in a history, newest first (see `encode_cursor`)."""
        return (self.created_at, self.checkpoint_id)


def value_history(
    thread: Thread | UUID, path: str, *, after: tuple[datetime, UUID] | None = None, limit: int | None = None
) -> list[ValueChange]:
    """The changes of the value at `path` in `thread`, on every branch, newest first: at most
    `limit`, those after the position `after` (the last one of a previous page).

    Raises InvalidPath for a pointer that is not RFC 6901, IntegrityFailure when a row read
    fails its integrity check.
    """
    thread_id = thread.pk if isinstance(thread, Thread) else thread
    tokens = pointer_tokens(path)
    branches = _index(thread_id)
    follow = _Follower(_touching(thread_id, path), path, tokens, branches)
    if limit is None and after is None:
        return _newest_first(follow.changes(keep=None))
    # Which changes make the page needs no object or array kept: a value's history of a growing list
    # would otherwise hold a copy of the list for every change. Then those of the page, if any.
    page = _newest_first(follow.changes(keep=frozenset()))
    if after is not None:
        page = [change for change in page if change.position < after]
    if limit is not None:
        page = page[:limit]
    if all(change.old is not _DROPPED and change.new is not _DROPPED for change in page):
        return page
    shown = frozenset(change.checkpoint_id for change in page)
    return _newest_first([change for change in follow.changes(keep=shown) if change.checkpoint_id in shown])


def _newest_first(changes: list[ValueChange]) -> list[ValueChange]:
    return sorted(changes, key=lambda change: change.position, reverse=True)


def pointer_tokens(path: Any) -> list[str]:
    """The reference tokens of an RFC 6901 pointer, or InvalidPath naming the `path` field."""
    if not isinstance(path, str):
        raise InvalidPath("`path` must be a JSON pointer string, like /config/batch_size.", detail={"field": "path"})
    try:
        if "\x00" in path:  # no stored key holds one, and PostgreSQL's text cannot
            raise PatchError("NUL")
        return parse_pointer(path)
    except PatchError:
        raise InvalidPath(
            f"`path` must be a JSON pointer (RFC 6901): empty for the whole state, or '/' followed by keys "
            f"separated by '/', with '~' written '~0' and '/' in a key '~1'; {path[:200]!r} is not one.",
            detail={"field": "path"},
        ) from None


def encode_cursor(position: tuple[datetime, UUID]) -> str:
    """An opaque page cursor for the position of the last change shown."""
    created_at, checkpoint_id = position
    return base64.urlsafe_b64encode(f"{created_at.isoformat()}|{checkpoint_id}".encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, UUID]:
    """The position a cursor from `encode_cursor` holds, or InvalidPath naming the `cursor` field."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        at, checkpoint_id = raw.split("|")
        created_at = datetime.fromisoformat(at)
        if created_at.tzinfo is None:
            raise ValueError("no time zone")
        return created_at, UUID(checkpoint_id)
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise InvalidPath(
            "`cursor` is not a cursor this history handed out: follow `next` or leave it out.",
            detail={"field": "cursor"},
        ) from None


# --------------------------------------------------------------------------- the index


@dataclass(frozen=True, slots=True)
class _Branch:
    id: int
    name: str
    fork_branch: int | None  # the branch and seq of its fork point (None for a root branch)
    fork_seq: int | None
    head_seq: int | None
    marked_seq: int | None
    mark_valid: bool


# Every branch of the thread with its fork point, its newest seq and its mark, in one round trip.
# The mark is valid while its checkpoint still has the MAC it had when the mark was set.
_BRANCHES_SQL = """
SELECT b.id, b.name, fp.branch_id, fp.seq, h.seq, m.seq,
       m.branch_id IS NULL OR (mc.integrity IS NOT NULL AND mc.integrity = m.integrity)
FROM checkpoints_branch b
LEFT JOIN checkpoints_checkpoint fp ON fp.id = b.fork_point_id
LEFT JOIN checkpoints_changedpathmark m ON m.branch_id = b.id
LEFT JOIN checkpoints_checkpoint mc ON mc.id = m.checkpoint_id AND mc.thread_id = b.thread_id
CROSS JOIN LATERAL (
    SELECT max(c.seq) AS seq FROM checkpoints_checkpoint c WHERE c.thread_id = b.thread_id AND c.branch_id = b.id
) h
WHERE b.thread_id = %s
"""

_ROW_COLUMNS = ", ".join(f"c.{name}" for name in Row._fields[:-1])
_RANGE_SQL = f"""
SELECT {_ROW_COLUMNS}, p.integrity
FROM checkpoints_checkpoint c
LEFT JOIN checkpoints_checkpoint p ON p.id = c.parent_id
WHERE c.thread_id = %s AND c.branch_id = %s AND c.seq > %s AND c.seq <= %s
ORDER BY c.seq
"""

_INSERT_SQL = """
INSERT INTO checkpoints_changedpath (thread_id, path, checkpoint_id)
SELECT %s, path, checkpoint_id FROM unnest(%s::text[], %s::uuid[]) AS t(path, checkpoint_id)
ON CONFLICT DO NOTHING
"""

_MARK_SQL = """
INSERT INTO checkpoints_changedpathmark (branch_id, thread_id, checkpoint_id, seq, integrity)
VALUES (%s, %s, %s, %s, %s)
ON CONFLICT (branch_id) DO UPDATE SET
    checkpoint_id = EXCLUDED.checkpoint_id, seq = EXCLUDED.seq, integrity = EXCLUDED.integrity
"""


def _branches(thread_id: UUID) -> list[_Branch]:
    with cursors.cursor() as cursor:
        cursor.execute(_BRANCHES_SQL, [thread_id])
        return [_Branch(*row) for row in cursor.fetchall()]


def _behind(branches: list[_Branch]) -> bool:
    return any(
        not branch.mark_valid or (branch.head_seq is not None and (branch.marked_seq or 0) < branch.head_seq)
        for branch in branches
    )


def _index(thread_id: UUID) -> dict[int, _Branch]:
    """Index whatever the thread's branches gained since the last read; returns its branches."""
    branches = _branches(thread_id)
    if _behind(branches):
        with transaction.atomic(), connection.cursor() as cursor:
            # KEY SHARE waits for a compaction in progress (it holds the row FOR UPDATE) and keeps
            # the next from starting, yet lets appends (NO KEY UPDATE) through; the advisory lock
            # lets one reader index a thread at a time, the others then find it indexed.
            cursor.execute("SELECT 1 FROM checkpoints_thread WHERE id = %s FOR KEY SHARE", [thread_id])
            cursor.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", [f"changed-paths:{thread_id}"])
            branches = _branches(thread_id)
            if not all(branch.mark_valid for branch in branches):
                # Rows were rewritten (compaction) since they were indexed: start again.
                cursor.execute("DELETE FROM checkpoints_changedpath WHERE thread_id = %s", [thread_id])
                cursor.execute("DELETE FROM checkpoints_changedpathmark WHERE thread_id = %s", [thread_id])
                branches = _branches(thread_id)
            for branch in branches:
                if branch.head_seq is not None and (branch.marked_seq or 0) < branch.head_seq:
                    _index_range(thread_id, branch.id, branch.marked_seq or 0, branch.head_seq)
            branches = _branches(thread_id)
    return {branch.id: branch for branch in branches}


def _index_range(thread_id: UUID, branch_id: int, after_seq: int, last_seq: int) -> None:
    """Index the checkpoints of a branch with seqs in (after_seq, last_seq] and move its mark."""
    paths: list[str] = []
    ids: list[UUID] = []
    last: Row | None = None
    with cursors.cursor(json=True) as cursor:
        cursor.execute(_RANGE_SQL, [thread_id, branch_id, after_seq, last_seq])
        while batch := cursor.fetchmany(_BATCH):
            for values in batch:
                row = Row._make(values)
                verify_row(row, parent_integrity=row.parent_integrity)
                for pointer in touched(_stored_change(row)):
                    paths.append(pointer)
                    ids.append(row.id)
                last = row
    if last is None:
        return
    with connection.cursor() as cursor:
        for start in range(0, len(paths), 10_000):
            cursor.execute(_INSERT_SQL, [thread_id, paths[start : start + 10_000], ids[start : start + 10_000]])
        cursor.execute(_MARK_SQL, [branch_id, thread_id, last.id, last.seq, last.integrity])


def _stored_change(row: Row) -> list[dict[str, Any]] | None:
    """A checkpoint's change from its parent as RFC 6902 ops, or None for a first checkpoint
    (it sets the whole state)."""
    if row.parent_id is None:
        return None
    if row.kind == PayloadKind.DELTA:
        ops: list[dict[str, Any]] = decode_payload(row, restore=False)
        return ops
    # A snapshot after a parent: what changed is its diff from the parent's state.
    return make_patch(load_node(row.parent_id).state, decode_payload(row))


def touched(ops: list[dict[str, Any]] | None) -> list[str]:
    """The pointers a change is indexed under (see the module's docstring); [""] for a first checkpoint."""
    if ops is None:
        return [""]
    found: dict[str, None] = {}
    for op in ops:
        name = op.get("op")
        if name == "test":
            continue
        # (pointer, whether an array's later elements may shift: an insertion or a removal)
        ends = [(op.get("path", ""), name != "replace")]
        if name == "move":
            ends.append((op.get("from", ""), True))
        for pointer, shifts in ends:
            if not isinstance(pointer, str):
                continue
            found[_fitted(pointer)] = None
            cut = pointer.rfind("/")
            last = pointer[cut + 1 :]
            if shifts and cut >= 0 and (last.isdigit() or last == "-"):
                found[_fitted(pointer[:cut])] = None
    return _coarsened(list(found))


def _fitted(pointer: str) -> str:
    """The pointer, or its longest ancestor no longer than MAX_INDEXED_POINTER."""
    while len(pointer) > MAX_INDEXED_POINTER:
        pointer = pointer[: pointer.rfind("/", 0, MAX_INDEXED_POINTER + 1)] if "/" in pointer[1:] else ""
    return pointer


def _coarsened(pointers: list[str]) -> list[str]:
    """At most MAX_PATHS_PER_CHECKPOINT pointers covering `pointers`: their ancestors at the
    deepest level that leaves few enough."""
    if len(pointers) <= MAX_PATHS_PER_CHECKPOINT:
        return pointers
    depth = max(pointer.count("/") for pointer in pointers)
    while depth > 0:
        depth -= 1
        cut = {_ancestor(pointer, depth) for pointer in pointers}
        if len(cut) <= MAX_PATHS_PER_CHECKPOINT:
            return sorted(cut)
    return [""]


def _ancestor(pointer: str, depth: int) -> str:
    """The pointer cut to its first `depth` tokens."""
    at = 0
    for _ in range(depth):
        at = pointer.find("/", at + 1)
        if at < 0:
            return pointer
    return pointer[:at] if depth else ""


# --------------------------------------------------------------------------- reading a history


@dataclass(frozen=True, slots=True)
class _Touching:
    row: Row
    branch: str


# The checkpoints indexed under the path, an ancestor of it or a pointer below it, with what
# their MAC check needs (the parent's MAC) and their branch's name, in one round trip.
_TOUCHING_SQL = f"""
SELECT {_ROW_COLUMNS}, p.integrity, b.name
FROM checkpoints_checkpoint c
JOIN checkpoints_branch b ON b.id = c.branch_id
LEFT JOIN checkpoints_checkpoint p ON p.id = c.parent_id
WHERE c.thread_id = %(thread)s AND c.id IN (
    SELECT checkpoint_id FROM checkpoints_changedpath
    WHERE thread_id = %(thread)s AND (path = ANY(%(ancestors)s) OR (path >= %(low)s AND path < %(high)s))
)
"""


def _touching(thread_id: UUID, path: str) -> list[_Touching]:
    ancestors = [""] + [path[:at] for at in _separators(path)][1:] + ([path] if path else [])
    params: dict[str, Any] = {"thread": thread_id, "ancestors": ancestors, "low": path + "/", "high": path + "0"}
    with cursors.cursor(json=True) as cursor:
        cursor.execute(_TOUCHING_SQL, params)
        found = [_Touching(Row._make(values[:-1]), values[-1]) for values in cursor.fetchall()]
    for item in found:
        verify_row(item.row, parent_integrity=item.row.parent_integrity)
    return found


def _separators(path: str) -> Iterator[int]:
    at = path.find("/")
    while at >= 0:
        yield at
        at = path.find("/", at + 1)


class _Unknown(Exception):
    """The patch moves values the history does not follow (array shifts, move, copy): read the state."""


class _Follower:
    """Follows the value along the tree through the checkpoints that touched the path: the value
    before each is the value after its nearest touching ancestor, and the value after it is that
    value with its change applied. Decoded changes are kept for a second pass, states are not."""

    def __init__(self, found: list[_Touching], path: str, tokens: list[str], branches: dict[int, _Branch]) -> None:
        self.path = path
        self.tokens = tokens
        self.branches = branches
        self.depth: dict[int, int] = {}
        # Ancestors first: a branch after the branch it forked from, each branch in seq order.
        self.found = sorted(found, key=lambda item: (self._depth(item.row.branch_id), item.row.branch_id, item.row.seq))
        self.seqs: dict[int, list[int]] = {}
        for item in self.found:
            self.seqs.setdefault(item.row.branch_id, []).append(item.row.seq)
        # The value after a touching checkpoint is needed later only while it is its branch's latest,
        # or when another branch forks after it (before the next touching checkpoint of its branch).
        self.needed: set[tuple[int, int]] = set()
        for branch in branches.values():
            if branch.fork_branch is None or branch.fork_seq is None:
                continue
            known = self.seqs.get(branch.fork_branch, [])
            at = bisect_right(known, branch.fork_seq)
            if at:
                self.needed.add((branch.fork_branch, known[at - 1]))
        self.decoded: dict[UUID, Any] = {}

    def _depth(self, branch_id: int) -> int:
        if branch_id not in self.depth:
            branch = self.branches.get(branch_id)
            parent = branch.fork_branch if branch is not None else None
            self.depth[branch_id] = 0 if parent is None or parent == branch_id else self._depth(parent) + 1
        return self.depth[branch_id]

    def changes(self, *, keep: frozenset[UUID] | None) -> list[ValueChange]:
        """The checkpoints where the value changed, with their values if `keep` is None or names
        them; else only their scalars (an object or array is _DROPPED)."""
        values: dict[tuple[int, int], Any] = {}
        latest: dict[int, tuple[int, Any]] = {}
        found: list[ValueChange] = []
        for item in self.found:
            row = item.row
            old = ABSENT if row.parent_id is None else self._before(row, values, latest)
            new = self._after(row, old)
            previous = latest.get(row.branch_id)
            if previous is not None and (row.branch_id, previous[0]) not in self.needed:
                values.pop((row.branch_id, previous[0]), None)
            latest[row.branch_id] = (row.seq, new)
            values[(row.branch_id, row.seq)] = new
            if old is ABSENT and new is ABSENT:
                continue
            if old is not ABSENT and new is not ABSENT and json_equal(old, new):
                continue
            change = "added" if old is ABSENT else "removed" if new is ABSENT else "changed"
            if keep is not None and row.id not in keep:
                old = _DROPPED if isinstance(old, (dict, list)) else old
                new = _DROPPED if isinstance(new, (dict, list)) else new
            found.append(ValueChange(
                checkpoint_id=row.id, parent_id=row.parent_id, branch=item.branch, seq=row.seq, step=row.step,
                label=row.label, status=row.status, created_at=row.created_at, change=change, old=old, new=new,
            ))  # fmt: skip
        return found

    def _before(self, row: Row, values: dict[tuple[int, int], Any], latest: dict[int, tuple[int, Any]]) -> Any:
        """The value at the path in the row's parent's state: after the nearest touching ancestor."""
        branch_id: int | None = row.branch_id
        below, strict = row.seq, True  # on the row's branch, seqs before it; on a fork's, up to its fork point
        while branch_id is not None:
            known = self.seqs.get(branch_id, [])
            at = bisect_right(known, below - 1 if strict else below)
            if at:
                seq = known[at - 1]
                if (branch_id, seq) in values:
                    return values[(branch_id, seq)]
                break  # not kept (cannot happen: see `needed`): read the state instead
            branch = self.branches.get(branch_id)
            if branch is None or branch.fork_branch is None:
                break
            branch_id, below, strict = branch.fork_branch, branch.fork_seq or 0, False
        # No touching ancestor was found (the index is behind the rows): read the parent's state.
        assert row.parent_id is not None
        return lookup(load_node(row.parent_id).state, self.tokens)

    def _after(self, row: Row, old: Any) -> Any:
        try:
            if row.parent_id is None or row.kind == PayloadKind.SNAPSHOT:
                # A whole state: its decoded copy is not kept, nor needed past this lookup.
                return lookup(decode_payload(row), self.tokens)
            ops = self.decoded.get(row.id)
            if ops is None:
                ops = self.decoded[row.id] = decode_payload(row)
            return _apply(old, ops, self.path, self.tokens)
        except _Unknown:
            return lookup(load_node(row.id).state, self.tokens)
        except (ValueError, OSError) as exc:
            raise IntegrityFailure(f"Checkpoint {row.id}'s payload does not open: {exc}") from None


def _apply(value: Any, ops: list[dict[str, Any]], path: str, tokens: list[str]) -> Any:
    """The value at the path after `ops`, given its value before them."""
    depth = len(tokens)
    for op in ops:
        name = op.get("op")
        if name == "test" or not (_near(op["path"], path) or (name == "move" and _near(op["from"], path))):
            continue
        target = parse_pointer(op["path"])
        if name in ("move", "copy"):
            moved = [target] if name == "copy" else [target, parse_pointer(op["from"])]
            if any(_related(end, tokens) for end in moved):
                raise _Unknown
            continue
        relation = _related(target, tokens)
        if relation is None:
            continue
        if relation == "shift":
            if name == "replace":
                continue  # a replace moves no element
            raise _Unknown
        if relation == "append":
            if value is ABSENT:
                raise _Unknown  # the appended element may be the path's
            continue  # the path's element exists: an append is after it
        if relation == "above":  # the op is at the path or an ancestor of it
            if target and target[-1] == "-":
                raise _Unknown  # an append, to an array's end (or to an object's member "-")
            if name == "remove":
                if target and target[-1].isdigit():
                    raise _Unknown  # an array's later elements move up into the path
                value = ABSENT
            else:
                value = lookup(op["value"], tokens[len(target) :])
            continue
        # Below the path: apply it to the value itself.
        if value is ABSENT:
            raise _Unknown
        relative = {**op, "path": "/v" + op["path"][_prefix_length(op["path"], depth) :]}
        try:
            value = apply_patch({"v": value}, [relative], measure=False).doc["v"]
        except (PatchError, KeyError):
            raise _Unknown from None
    return value


def _near(pointer: str, path: str) -> bool:
    """Whether an op's pointer may bear on the path (see `_related`), by comparing the pointers' text
    alone: most ops of a step touch other paths, and this spares parsing them."""
    if pointer == path or not pointer or not path:
        return True
    if path.startswith(pointer) and path[len(pointer)] == "/":
        return True  # an ancestor
    if pointer.startswith(path) and pointer[len(path)] == "/":
        return True  # a descendant
    cut = pointer.rfind("/")
    # A sibling of an ancestor, in an array: an insertion, removal or append there may move the path.
    last = pointer[cut + 1 :]
    return (last.isdigit() or last == "-") and path.startswith(pointer[: cut + 1])


def _prefix_length(pointer: str, depth: int) -> int:
    """Characters of `pointer` that hold its first `depth` tokens."""
    at = 0
    for _ in range(depth):
        at = pointer.find("/", at + 1)
    return at


def _related(target: list[str], tokens: list[str]) -> str | None:
    """How an op's pointer bears on the path: "above" (the path or an ancestor of it), "below"
    (inside the path's value), "shift" (an insertion or removal in an array that holds the path at
    a later index: the path's element moves), "append" (an element added at the end of an array
    that holds the path: it may be the path's element), or None (it leaves the path alone)."""
    common = min(len(target), len(tokens))
    for at in range(common):
        if target[at] != tokens[at]:
            if at == len(target) - 1 and tokens[at].isdigit():
                if target[at].isdigit():
                    return "shift" if int(target[at]) <= int(tokens[at]) else None
                if target[at] == "-":
                    return "append"
            return None
    return "above" if len(target) <= len(tokens) else "below"


def lookup(document: Any, tokens: Iterable[str]) -> Any:
    """The value at the tokens' pointer in a document, or ABSENT."""
    node = document
    for token in tokens:
        if isinstance(node, dict):
            node = node.get(token, ABSENT)
            if node is ABSENT:
                return ABSENT
        elif isinstance(node, list):
            if not (token.isdigit() and token.isascii()) or (token[0] == "0" and len(token) > 1):
                return ABSENT
            index = int(token)
            if index >= len(node):
                return ABSENT
            node = node[index]
        else:
            return ABSENT
    return node


__all__ = [
    "ABSENT",
    "ValueChange",
    "decode_cursor",
    "encode_cursor",
    "lookup",
    "pointer_tokens",
    "touched",
    "value_history",
]
