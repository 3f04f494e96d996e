"""Every write to memory: put an item, delete it, refresh or sweep expiry. Each is one function,
and each write of an item is a new version of it.

A put or delete is one statement: it moves the item's head (compare-and-set on the version this
process knows, so a stale cache or a concurrent writer costs a retry, never a lost or forked
version), appends the version with its MAC chained from the one before, and replaces the item's
index entries. A value of DELTA_FROM bytes or more is stored as RFC 6902 ops against the version
before when that is less than half its size, with a full snapshot at least every SNAPSHOT_EVERY
versions, so a long history of a large item costs its changes and any version reads in bounded
work.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, cast
from uuid import UUID

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from checkpoints.ids import new_id
from checkpoints.storage import codec, kept_cursor
from checkpoints.storage.jsonpatch import make_patch
from memory import access, boards, changes, filters, heads, sealing, spaces
from memory.access import Scope
from memory.errors import InvalidValue, ItemNotFound, NotABoard, ValueTooLarge, VersionConflict
from memory.heads import Head
from memory.models import VersionKind, Writer
from memory.paths import Path, item_key, namespace_path
from memory.texts import IndexText

DELTA_FROM = 2048
SNAPSHOT_EVERY = 32
_ATTEMPTS = 8
_MICROSECOND = timedelta(microseconds=1)


@dataclass(frozen=True, slots=True)
class Author:
    """Who writes: an agent (and the key it used), a person, an auto-approve or other rule, or
    Quicksave itself (`rule` names what, e.g. "ttl")."""

    kind: Writer
    agent_id: int | None = None
    agent_key_id: int | None = None
    user_id: int | None = None
    rule: str = ""

    @classmethod
    def agent(cls, agent_id: int, *, key_id: int | None = None) -> Author:
        return cls(Writer.AGENT, agent_id=agent_id, agent_key_id=key_id)

    @classmethod
    def person(cls, user_id: int) -> Author:
        return cls(Writer.PERSON, user_id=user_id)

    @classmethod
    def by_rule(cls, name: str) -> Author:
        return cls(Writer.RULE, rule=name)

    @classmethod
    def system(cls, what: str) -> Author:
        return cls(Writer.SYSTEM, rule=what)


@dataclass(frozen=True, slots=True)
class Origin:
    """The thread, and the checkpoint in it, a write was made from (either may be unknown)."""

    thread_id: UUID | None = None
    checkpoint_id: UUID | None = None


NOWHERE = Origin()


@dataclass(frozen=True, slots=True)
class Written:
    item_id: UUID
    namespace: Path
    key: str
    version: int
    created_at: datetime
    updated_at: datetime
    expires_at: datetime | None
    created: bool  # the item did not exist (or was deleted) before this write
    deleted: bool = False  # this write is a deletion


def _fields(author: Author, origin: Origin, value_bytes: int) -> dict[str, Any]:
    """What a version's MAC covers besides its payload (memory.sealing)."""
    return {
        "writer": str(author.kind), "agent": author.agent_id, "agent_key": author.agent_key_id,
        "user": author.user_id, "rule": author.rule,
        "thread": str(origin.thread_id) if origin.thread_id else None,
        "checkpoint": str(origin.checkpoint_id) if origin.checkpoint_id else None,
        "value_bytes": value_bytes,
    }  # fmt: skip


def _writer(author: Author) -> dict[str, Any]:
    """Who wrote, as the live feeds name them (memory.boards, memory.changes)."""
    return {"writer": str(author.kind), "agent": author.agent_id, "user": author.user_id}


def version_fields(row: Any) -> dict[str, Any]:
    """`_fields` of a stored version row (ItemVersion, or its values by name)."""
    get = row.get if isinstance(row, dict) else lambda name: getattr(row, name)
    thread, checkpoint = get("thread_id"), get("checkpoint_id")
    return {
        "writer": str(get("writer")), "agent": get("agent_id"), "agent_key": get("agent_key_id"),
        "user": get("user_id"), "rule": get("rule"), "thread": str(thread) if thread else None,
        "checkpoint": str(checkpoint) if checkpoint else None, "value_bytes": get("value_bytes"),
    }  # fmt: skip


def _canonical(value: Any) -> bytes:
    try:
        canonical = codec.to_canonical_bytes(value)
        codec.check_depth(value)
    except codec.EncodingError as exc:
        raise InvalidValue(f"The value {exc}.", detail={"field": "value"}) from None
    limit: int = settings.QUICKSAVE_MEMORY_MAX_VALUE_BYTES
    if len(canonical) > limit:
        raise ValueTooLarge(
            f"The value is {len(canonical)} bytes of JSON; the limit is {limit} (QUICKSAVE_MEMORY_MAX_VALUE_BYTES).",
            detail={"field": "value", "limit": limit},
        )
    return canonical


def check_value(value: Any) -> None:
    """Refuse a value put_item would refuse for its shape or size (InvalidValue, ValueTooLarge)."""
    _canonical(value)


def _check_index(index: list[IndexText] | None) -> list[IndexText]:
    for entry in index or ():
        if entry.embedding is not None and (
            not entry.embedding or not all(math.isfinite(component) for component in entry.embedding)
        ):
            raise InvalidValue(f"The embedding of {entry.field!r} is empty or not finite.", detail={"field": "index"})
    return list(index or ())


_HEAD_SQL = (
    "SELECT id, version, integrity, deleted, created_at, updated_at, since_snapshot, indexed "
    "FROM memory_item WHERE namespace_id = %s AND key = %s"
)


def _load_head(space: spaces.Space, key: str, *, lock: bool = False) -> Head | None:
    with connection.cursor() as cursor:
        cursor.execute(_HEAD_SQL + (" FOR UPDATE" if lock else ""), [space.id, key])
        row = cursor.fetchone()
    if row is None:
        return None
    head = Head(
        item_id=row[0], version=row[1], integrity=bytes(row[2]), deleted=row[3], created_at=row[4],
        updated_at=row[5], since_snapshot=row[6], indexed=row[7],
    )  # fmt: skip
    heads.keep(space.id, key, head)
    return head


def _head(space: spaces.Space, key: str) -> Head | None:
    return heads.get(space.id, key) or _load_head(space, key)


def _previous_value(space: spaces.Space, head: Head) -> Any:
    """The value of the head version (for a delta): kept by this process, or read."""
    kept = heads.value(head.item_id, head.version)
    if kept is not None:
        return kept
    with connection.cursor() as cursor:
        cursor.execute("SELECT value FROM memory_item WHERE id = %s AND version = %s", [head.item_id, head.version])
        row = cursor.fetchone()
    if row is None or row[0] is None:
        return None
    return sealing.open_value(space, head.item_id, head.version, row[0])


class _NamespaceGone(Exception):
    """The namespace this process remembered at a path was deleted since (memory.spaces)."""


def _space_for_write(path: Path, scope: Scope, *, fresh: bool = False) -> spaces.Space:
    """The namespace to write at `path`, made if need be; with `fresh`, read again first."""
    if fresh:
        spaces.find(path, fresh=True)
    space, created = spaces.ensure(path, agent_id=scope.agent_id)
    if not created and not access.may_use(scope, space):
        if not fresh:  # a refusal is decided on the namespace as it is now, not as remembered
            return _space_for_write(path, scope, fresh=True)
        # As if it did not exist, and it cannot be made: another agent's namespace.
        raise ItemNotFound(
            f"The memory namespace {'.'.join(path)} belongs to another agent; a person may share it with yours.",
            detail={"namespace": list(path)},
        )
    return space


def _space_for_delete(path: Path, scope: Scope, *, fresh: bool = False) -> spaces.Space | None:
    """The namespace to delete in at `path`, None when there is none the scope may use."""
    space = spaces.find(path, fresh=fresh)
    if space is not None and not access.may_use(scope, space):
        return None if fresh else _space_for_delete(path, scope, fresh=True)
    return space


def _check_expected(head: Head | None, expected_version: int | None) -> None:
    if expected_version is None:
        return
    current = head.version if head is not None and not head.deleted else 0
    if current != expected_version:
        raise VersionConflict(
            f"The item is at version {current}, not {expected_version}: someone wrote it since.",
            detail={"current_version": current, "expected_version": expected_version},
        )


def _now(head: Head | None) -> datetime:
    """Now, or just after the head's time if this process's clock is behind it: versions' times
    never go backwards (an as-of read picks the version by time)."""
    now = timezone.now()
    if head is not None and now <= head.updated_at:
        now = head.updated_at + _MICROSECOND
    return now


def put_item(
    *,
    namespace: Path | list[str],
    key: str,
    value: Any,
    author: Author,
    scope: Scope,
    origin: Origin = NOWHERE,
    ttl_minutes: float | None = None,
    index: list[IndexText] | None = None,
    expected_version: int | None = None,
    fencing_token: int | None = None,
) -> Written:
    """Write a new version of the item at (`namespace`, `key`), creating the namespace and the item
    as needed. `index` replaces the item's indexed texts (None: it has none). `ttl_minutes`: the
    item expires this long after its last write or read (memory.selectors refreshes it). With
    `expected_version` (0: the item must not exist) the write is refused with VersionConflict
    unless the item is at that version. On a blackboard the write is also refused unless
    `fencing_token` is the key's live lease (without one: unless nobody holds the key), and it is
    an event on the board's feed (memory.boards)."""
    path = namespace_path(namespace)
    key = item_key(key)
    canonical = _canonical(value)
    entries = _check_index(index)
    if ttl_minutes is not None and not (math.isfinite(ttl_minutes) and ttl_minutes > 0):
        raise InvalidValue("ttl_minutes must be a positive number of minutes.", detail={"field": "ttl_minutes"})

    def write_in(space: spaces.Space) -> Written:
        tokens = filters.value_tokens(value, space.id)

        def attempt(head: Head | None) -> Written | None:
            _check_expected(head, expected_version)
            return _write(
                space=space, key=key, head=head, canonical=canonical, value=value, tokens=tokens, author=author,
                origin=origin, ttl_minutes=ttl_minutes, entries=entries,
            )  # fmt: skip

        if space.board:
            if ttl_minutes is not None:
                # A board's changes are events under its lock; an expiry would change it behind both.
                raise InvalidValue(
                    "Items of a blackboard do not expire: leave ttl_minutes out (a lease expires instead).",
                    detail={"field": "ttl_minutes"},
                )
            return cast(Written, _on_board(space, key, author, scope, fencing_token, attempt, guess_new=True))
        _check_token(fencing_token)
        return cast(Written, _retrying(space, key, attempt, guess_new=True))

    try:
        return write_in(_space_for_write(path, scope))
    except _NamespaceGone:
        return write_in(_space_for_write(path, scope, fresh=True))


def _check_token(fencing_token: int | None) -> None:
    if fencing_token is not None:
        raise NotABoard(
            "fencing_token is for the keys of a blackboard, and this namespace is not one.",
            detail={"field": "fencing_token"},
        )


def _on_board(
    space: spaces.Space, key: str, author: Author, scope: Scope, fencing_token: int | None,
    attempt: Callable[[Head | None], Written | None], *, guess_new: bool = False,
) -> Any:  # fmt: skip
    """A write to a blackboard: under the board's lock, after its lease check, with its event."""
    with transaction.atomic():
        boards.guard_write(space, key, fencing_token, scope)
        written = _retrying(space, key, attempt, guess_new=guess_new)
        if written is not _GONE:
            boards.record_write(
                space, key=key, version=written.version, deleted=written.deleted, writer=_writer(author)
            )
    return written


def _retrying(
    space: spaces.Space, key: str, attempt: Callable[[Head | None], Written | None], *, guess_new: bool = False
) -> Any:
    """`attempt` over the head this process knows (no read); if another writer moved the item
    meanwhile, again over the head read under a row lock, which no other writer can then move.
    A conflict with the expected version found on a remembered head is checked again on the
    stored one: this process may not know the newest version.

    With `guess_new` (a put), an item this process knows nothing of is first taken to be new:
    its insert does nothing if the item exists, so a new key costs one statement, not a read
    and a write, and an existing one costs the read it would have cost anyway, after it."""
    cached = heads.get(space.id, key)
    if cached is None and guess_new:
        try:
            written = attempt(None)
        except VersionConflict:  # an expected version other than 0: the item must exist
            written = None
        if written is not None:
            return written
    try:
        written = attempt(cached or _load_head(space, key))
    except VersionConflict:
        if cached is None:
            raise
        written = None
    if written is not None:
        return written
    for _ in range(_ATTEMPTS):
        heads.drop(space.id, key)
        with transaction.atomic():
            written = attempt(_load_head(space, key, lock=True))
        if written is not None:
            return written
    raise VersionConflict(f"Item {key!r} kept changing under this write; try again.", detail={"field": "key"})


def _write(
    *,
    space: spaces.Space,
    key: str,
    head: Head | None,
    canonical: bytes,
    value: Any,
    tokens: list[int] | None,
    author: Author,
    origin: Origin,
    ttl_minutes: float | None,
    entries: list[IndexText],
) -> Written | None:
    """One attempt at a put over `head`; None when the item moved on (or appeared) meanwhile."""
    fresh = head is None or head.deleted
    item_id = head.item_id if head is not None else new_id()
    version = head.version + 1 if head is not None else 1
    now = _now(head)
    created_at = now if fresh else head.created_at  # type: ignore[union-attr]
    kind, payload_canonical, since_snapshot = VersionKind.SNAPSHOT, canonical, 0
    if not fresh and len(canonical) >= DELTA_FROM and head.since_snapshot + 1 < SNAPSHOT_EVERY:  # type: ignore[union-attr]
        previous = _previous_value(space, head)  # type: ignore[arg-type]
        if previous is not None:
            ops = codec.to_canonical_bytes(make_patch(previous, value))
            if 2 * len(ops) < len(canonical):
                kind, payload_canonical, since_snapshot = VersionKind.DELTA, ops, head.since_snapshot + 1  # type: ignore[union-attr]
    sealed_value = sealing.seal(space, item_id, version, canonical)
    payload = sealed_value if kind == VersionKind.SNAPSHOT else sealing.seal(space, item_id, version, payload_canonical)
    fields = _fields(author, origin, len(canonical))
    integrity = sealing.version_mac(
        previous=head.integrity if head is not None else None, item_id=item_id, namespace_id=space.id, key=key,
        version=version, kind=kind, created_at=now, fields=fields, payload=payload,
    )  # fmt: skip
    head_mac = sealing.head_mac(
        item_id=item_id, namespace_id=space.id, key=key, version=version, value=sealed_value, integrity=integrity
    )
    expires_at = now + timedelta(minutes=ttl_minutes) if ttl_minutes is not None else None
    item = {
        "item": item_id, "namespace": space.id, "key": key, "version": version, "previous": version - 1,
        "deleted": False, "value": sealed_value, "value_bytes": len(canonical), "integrity": integrity,
        "head_mac": head_mac, "tokens": _bigint_array(tokens), "indexed": bool(entries),
        "since_snapshot": since_snapshot,
        "created_at": created_at, "updated_at": now, "expires_at": expires_at, "ttl": ttl_minutes,
    }  # fmt: skip
    # A snapshot's payload is the item's value: the statement copies it (None), not sent twice.
    row = {
        "kind": int(kind), "payload": None if kind == VersionKind.SNAPSHOT else payload, "writer": str(author.kind),
        "agent": author.agent_id, "agent_key": author.agent_key_id, "user": author.user_id, "rule": author.rule,
        "thread": origin.thread_id, "checkpoint": origin.checkpoint_id,
    }  # fmt: skip
    drop_entries = head is not None and head.indexed
    if not _execute(head is None, item, row, entries, drop_entries):
        return None
    changes.announce_on_commit(path=space.path, key=key, version=version, deleted=False, writer=_writer(author))
    heads.keep(space.id, key, Head(
        item_id=item_id, version=version, integrity=integrity, deleted=False, created_at=created_at,
        updated_at=now, since_snapshot=since_snapshot, indexed=bool(entries),
    ))  # fmt: skip
    if len(canonical) >= DELTA_FROM:
        heads.keep_value(item_id, version, codec.loads(canonical), len(canonical))  # a copy no caller holds
    return Written(
        item_id=item_id, namespace=space.path, key=key, version=version, created_at=created_at, updated_at=now,
        expires_at=expires_at, created=fresh,
    )  # fmt: skip


def _bigint_array(numbers: list[int] | None) -> str | None:
    """A bigint[] as its text literal: psycopg adapts a list of ints element by element, which
    cost a put more than anything else it sends."""
    return None if numbers is None else "{" + ",".join(map(str, numbers)) + "}"


_INSERT_ITEM = """
    INSERT INTO memory_item (id, namespace_id, key, version, deleted, value, value_bytes, integrity, head_mac,
        tokens, indexed, since_snapshot, created_at, updated_at, expires_at, ttl_minutes)
    SELECT %(item)s::uuid, ns.id, %(key)s::text, %(version)s::int, %(deleted)s::bool,
        %(value)s::bytea, %(value_bytes)s::int, %(integrity)s::bytea, %(head_mac)s::bytea, %(tokens)s::bigint[],
        %(indexed)s::bool, %(since_snapshot)s::int, %(created_at)s::timestamptz, %(updated_at)s::timestamptz,
        %(expires_at)s::timestamptz, %(ttl)s::float8
    FROM ns
    ON CONFLICT (namespace_id, key) DO NOTHING RETURNING id, value
"""
_UPDATE_ITEM = """
    UPDATE memory_item SET version = %(version)s, deleted = %(deleted)s, value = %(value)s,
        value_bytes = %(value_bytes)s, integrity = %(integrity)s, head_mac = %(head_mac)s,
        tokens = %(tokens)s::bigint[], indexed = %(indexed)s, since_snapshot = %(since_snapshot)s,
        created_at = %(created_at)s, updated_at = %(updated_at)s, expires_at = %(expires_at)s,
        ttl_minutes = %(ttl)s::float8
    WHERE id = %(item)s AND version = %(previous)s RETURNING id, value
"""
_INSERT_VERSION = """
    INSERT INTO memory_itemversion (item_id, version, kind, payload, integrity, created_at, value_bytes, writer,
        agent_id, agent_key_id, user_id, rule, thread_id, checkpoint_id)
    SELECT id, %(version)s::int, %(kind)s::smallint, coalesce(%(payload)s::bytea, value), %(integrity)s::bytea,
        %(updated_at)s::timestamptz, %(value_bytes)s::int, %(writer)s::varchar, %(agent)s::bigint,
        %(agent_key)s::bigint, %(user)s::int, %(rule)s::varchar, %(thread)s::uuid, %(checkpoint)s::uuid
    FROM item RETURNING 1
"""
_DROP_ENTRIES = "DELETE FROM memory_indexentry x USING item WHERE x.item_id = item.id"
# The namespace, read once: a new item is inserted FROM it (nothing, rather than a foreign-key
# error at commit, when it was deleted since this process remembered it), and the statement's
# last column says whether it was there.
_NAMESPACE = "ns AS (SELECT id FROM memory_namespace WHERE id = %(namespace)s::bigint)"
_WRITTEN_NEW = " SELECT (SELECT count(*) FROM version), EXISTS (SELECT 1 FROM ns)"
# An update that wrote its row found the item, so its namespace is there: the namespace is looked
# up only when nothing was written (OR stops at its first true operand, and the uncorrelated
# EXISTS is an init plan run when first needed).
_WRITTEN_UPDATE = (
    " SELECT written.n, written.n > 0 OR EXISTS (SELECT 1 FROM memory_namespace WHERE id = %(namespace)s::bigint)"
    " FROM (SELECT count(*) AS n FROM version) AS written"
)
_INSERT_ENTRIES = """
    INSERT INTO memory_indexentry (item_id, namespace_id, field, lexemes, embedding, dims)
    SELECT item.id, %(namespace)s, e.field, to_tsvector('simple', e.text), e.embedding::real[], e.dims
    FROM item, unnest(%(fields)s::text[], %(texts)s::text[], %(embeddings)s::text[], %(dims)s::int[])
        AS e(field, text, embedding, dims)
"""


@functools.cache
def _statement(new: bool, drop_entries: bool, entries: bool) -> tuple[str, str]:
    """The put's statement of each shape, made once (the same str object each time: see
    _execute), and the role of the kept cursor it runs on."""
    item = f"{_NAMESPACE}, item AS ({_INSERT_ITEM})" if new else f"item AS ({_UPDATE_ITEM})"
    sql = "".join((
        f"WITH {item}, version AS ({_INSERT_VERSION})",
        f", dropped AS ({_DROP_ENTRIES})" if drop_entries else "",
        f", entries AS ({_INSERT_ENTRIES})" if entries else "",
        _WRITTEN_NEW if new else _WRITTEN_UPDATE,
    ))  # fmt: skip
    return f"memory-put-{'new' if new else 'next'}-{int(drop_entries)}{int(entries)}", sql


def _execute(
    new: bool, item: dict[str, Any], row: dict[str, Any], entries: list[IndexText], drop_entries: bool
) -> bool:
    params = {**item, **row}
    if entries:
        params["fields"] = [entry.field for entry in entries]
        params["texts"] = [entry.text for entry in entries]
        params["embeddings"] = [
            "{" + ",".join(repr(float(c)) for c in entry.embedding) + "}" if entry.embedding else None
            for entry in entries
        ]
        params["dims"] = [len(entry.embedding) if entry.embedding else None for entry in entries]
    # Each shape of the statement runs on a kept cursor of its own (storage.kept_cursor), and is
    # the same str object each time: psycopg keeps a cursor's adaptation of the parameters (the
    # dumper of each of some thirty) only while it is given the very query object it ran last, and
    # otherwise finds them all again; a new cursor would look up the prepared statement again too.
    role, sql = _statement(new, drop_entries, bool(entries))
    cursor = kept_cursor(role)
    cursor.execute(sql, params)
    written, namespace_exists = cursor.fetchone()
    if not namespace_exists:
        raise _NamespaceGone
    return bool(written)


def delete_item(
    *,
    namespace: Path | list[str],
    key: str,
    author: Author,
    scope: Scope,
    origin: Origin = NOWHERE,
    expected_version: int | None = None,
    fencing_token: int | None = None,
) -> Written | None:
    """Write a deletion as the item's next version (its history stays); None when there was no
    item to delete (or the namespace is one the scope may not use). On a blackboard, as put_item:
    the lease check, then an event."""
    path = namespace_path(namespace)
    key = item_key(key)

    def delete_in(space: spaces.Space | None) -> Written | None:
        if space is None:
            if expected_version:
                _check_expected(None, expected_version)
            return None

        def attempt(head: Head | None) -> Written | None:
            _check_expected(head, expected_version)
            if head is None or head.deleted:
                return _GONE
            return _tombstone(space, key, head, author=author, origin=origin)

        if space.board:
            written = _on_board(space, key, author, scope, fencing_token, attempt)
        else:
            _check_token(fencing_token)
            written = _retrying(space, key, attempt)
        return None if written is _GONE else cast(Written, written)

    try:
        return delete_in(_space_for_delete(path, scope))
    except _NamespaceGone:
        return delete_in(_space_for_delete(path, scope, fresh=True))


# What a delete's attempt answers when there is nothing to delete (a Written, so no retry follows).
_GONE: Any = object()


def _tombstone(space: spaces.Space, key: str, head: Head, *, author: Author, origin: Origin) -> Written | None:
    version = head.version + 1
    now = _now(head)
    fields = _fields(author, origin, 0)
    integrity = sealing.version_mac(
        previous=head.integrity, item_id=head.item_id, namespace_id=space.id, key=key, version=version,
        kind=VersionKind.DELETED, created_at=now, fields=fields, payload=b"",
    )  # fmt: skip
    head_mac = sealing.head_mac(
        item_id=head.item_id, namespace_id=space.id, key=key, version=version, value=None, integrity=integrity
    )
    item = {
        "item": head.item_id, "namespace": space.id, "key": key, "version": version, "previous": head.version,
        "deleted": True, "value": None, "value_bytes": 0, "integrity": integrity, "head_mac": head_mac,
        "tokens": None, "indexed": False, "since_snapshot": 0, "created_at": head.created_at, "updated_at": now,
        "expires_at": None, "ttl": None,
    }  # fmt: skip
    row = {
        "kind": int(VersionKind.DELETED), "payload": b"", "writer": str(author.kind), "agent": author.agent_id,
        "agent_key": author.agent_key_id, "user": author.user_id, "rule": author.rule,
        "thread": origin.thread_id, "checkpoint": origin.checkpoint_id,
    }  # fmt: skip
    if not _execute(False, item, row, [], head.indexed):
        return None
    changes.announce_on_commit(path=space.path, key=key, version=version, deleted=True, writer=_writer(author))
    heads.keep(space.id, key, Head(
        item_id=head.item_id, version=version, integrity=integrity, deleted=True, created_at=head.created_at,
        updated_at=now, since_snapshot=0, indexed=False,
    ))  # fmt: skip
    return Written(
        item_id=head.item_id, namespace=space.path, key=key, version=version, created_at=head.created_at,
        updated_at=now, expires_at=None, created=False, deleted=True,
    )  # fmt: skip


def refresh_expiry(item_ids: list[UUID], *, live_only: bool = False) -> None:
    """Move the expiry of items with a TTL to that long from now (a read of them); `live_only`
    leaves items already past it alone (they are treated as gone)."""
    if not item_ids:
        return
    condition = " AND expires_at > now()" if live_only else ""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE memory_item SET expires_at = now() + ttl_minutes * interval '1 minute' "
            f"WHERE id = ANY(%s::uuid[]) AND ttl_minutes IS NOT NULL AND NOT deleted{condition}",
            [item_ids],
        )


def sweep_expired(*, batch: int = 500) -> int:
    """Delete (as a new version written by Quicksave, rule "ttl") every item past its expiry; returns
    how many. Safe to run in several processes at once: each takes rows the others have not locked."""
    swept = 0
    author = Author.system("ttl")
    while True:
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT i.id, i.namespace_id, i.key, i.version, i.integrity, i.created_at, i.updated_at, i.indexed "
                    "FROM memory_item i WHERE i.expires_at <= now() AND NOT i.deleted "
                    "ORDER BY i.expires_at LIMIT %s FOR UPDATE SKIP LOCKED",
                    [batch],
                )
                rows = cursor.fetchall()
            for item_id, namespace_id, key, version, integrity, created_at, updated_at, indexed in rows:
                head = Head(
                    item_id=item_id, version=version, integrity=bytes(integrity), deleted=False,
                    created_at=created_at, updated_at=updated_at, since_snapshot=0, indexed=indexed,
                )  # fmt: skip
                if _tombstone(spaces.by_id(namespace_id), key, head, author=author, origin=NOWHERE) is not None:
                    swept += 1
        if len(rows) < batch:
            return swept
