"""Reads of memory the API, the pages and the LangGraph store share: an item now or as of any
time, search (filters, full text, or pgvector), namespaces, an item's history, and the check of
an item's whole integrity chain.

Every value read is opened under its namespace's key and checked: the head against its MAC
(`sealing.check_head`), versions against theirs, each chained from the one before.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from django.db import connection
from django.utils import timezone

from checkpoints.storage.errors import IntegrityFailure
from checkpoints.storage.jsonpatch import apply_patch
from memory import access, filters, heads, reads, sealing, spaces, store
from memory.access import Scope
from memory.errors import NoVectorSearch
from memory.heads import Head
from memory.models import VersionKind
from memory.paths import Path, item_key, namespace_path, pattern
from memory.vectors import VectorSearch, distance_sql, score_sql
from memory.vectors import available as vectors_available


@dataclass(frozen=True, slots=True)
class Found:
    """An item as read: its newest version's value (or the one in force at an as-of time)."""

    item_id: UUID
    namespace: Path
    key: str
    value: Any
    version: int
    created_at: datetime
    updated_at: datetime
    expires_at: datetime | None = None
    score: float | None = None


_ITEM_COLUMNS = (
    "i.id, i.namespace_id, i.key, i.version, i.value, i.integrity, i.head_mac, i.created_at, i.updated_at, "
    "i.expires_at, i.ttl_minutes, i.since_snapshot, i.indexed"
)


def _open_row(row: tuple[Any, ...], path: Path, score: float | None = None) -> tuple[Found, bool]:
    """The item in a row of _ITEM_COLUMNS, checked; and whether it has a TTL."""
    item_id, namespace_id, key, version, value, integrity, head_mac, created_at, updated_at, expires_at, ttl = row[:11]
    space = spaces.by_id(namespace_id)
    sealed = bytes(value)
    sealing.check_head(
        head_mac, item_id=item_id, namespace_id=namespace_id, key=key, version=version, value=sealed,
        integrity=bytes(integrity),
    )  # fmt: skip
    found = Found(
        item_id=item_id, namespace=path, key=key, value=sealing.open_value(space, item_id, version, sealed),
        version=version, created_at=created_at, updated_at=updated_at, expires_at=expires_at, score=score,
    )  # fmt: skip
    return found, ttl is not None


def _space_for_read(path: Path, scope: Scope, *, fresh: bool = False) -> spaces.Space | None:
    """The namespace at `path` if the scope may read it; a refusal is decided on the namespace as
    it is now, not as this process remembers it (memory.spaces)."""
    space = spaces.find(path, fresh=fresh)
    if space is not None and not access.may_use(scope, space):
        return None if fresh else _space_for_read(path, scope, fresh=True)
    return space


# A LangGraph reader's thread and its head checkpoint now, found by the same statement as the items read.
_READER_SQL = (
    "(SELECT ARRAY[t.id, t.head_id] FROM checkpoints_thread t "
    "WHERE t.agent_id = %(reader_agent)s AND t.external_id = %(reader_thread)s)"
)
# No row: the namespace was deleted since this process remembered it; a row of NULLs: no such item.
_GET_SQL = (
    f"SELECT {_ITEM_COLUMNS}, i.deleted, {{reader}} FROM memory_namespace n "
    "LEFT JOIN memory_item i ON i.namespace_id = n.id AND i.key = %(key)s WHERE n.id = %(namespace)s"
)
_GET_PLAIN_SQL = _GET_SQL.format(reader="NULL")
_GET_READER_SQL = _GET_SQL.format(reader=_READER_SQL)


def get_item(
    *,
    namespace: Path | list[str],
    key: str,
    scope: Scope,
    refresh_ttl: bool = False,
    omit_expired: bool = False,
    reader: reads.Reader | None = None,
) -> Found | None:
    """The item's current value, or None (no such item, deleted, or not the scope's to read). A
    read from a thread (`reader`) is recorded (memory.reads)."""
    path, key = namespace_path(namespace), item_key(key)
    space = _space_for_read(path, scope)
    row = _get_row(space, key, reader)
    if row is _NO_NAMESPACE:
        space = _space_for_read(path, scope, fresh=True)
        row = _get_row(space, key, reader)
    if space is None or row is None or row is _NO_NAMESPACE:
        return None
    # A write that follows this read need not read the head again.
    heads.keep(space.id, key, Head(
        item_id=row[0], version=row[3], integrity=bytes(row[5]), deleted=row[13], created_at=row[7],
        updated_at=row[8], since_snapshot=row[11], indexed=row[12],
    ))  # fmt: skip
    if row[13]:
        return None
    expired = row[9] is not None and row[9] <= _now()
    if omit_expired and expired:
        return None
    found, has_ttl = _open_row(row, path)
    if has_ttl and refresh_ttl:
        store.refresh_expiry([found.item_id], live_only=omit_expired)
    if reader is not None:
        _record_read(found, reader, resolved=row[14] if reader.by_external_id else None)
    return found


def _reader_params(reader: reads.Reader) -> dict[str, int | str | None]:
    return {"reader_agent": reader.agent_id, "reader_thread": reader.external_id}


def _record_read(found: Found, reader: reads.Reader, *, resolved: list[UUID | None] | None) -> None:
    thread_id, checkpoint_id = reader.thread_id, reader.checkpoint_id
    if resolved:
        thread_id, checkpoint_id = resolved[0], resolved[1]
    if thread_id is not None:
        reads.record(reads.Read(item_id=found.item_id, version=found.version, thread_id=thread_id,
                                checkpoint_id=checkpoint_id, read_at=_now()))  # fmt: skip


_NO_NAMESPACE: Any = object()


def _get_row(space: spaces.Space | None, key: str, reader: reads.Reader | None) -> tuple[Any, ...] | None:
    """The item's row in `space` (None: no such item), or _NO_NAMESPACE when the space is gone; with a
    LangGraph reader, its thread and head checkpoint as a last column."""
    if space is None:
        return None
    sql = _GET_PLAIN_SQL
    params: dict[str, Any] = {"key": key, "namespace": space.id}
    if reader is not None and reader.by_external_id:
        sql = _GET_READER_SQL
        params.update(_reader_params(reader))
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    if row is None:
        return _NO_NAMESPACE
    return None if row[0] is None else row


def _now() -> datetime:
    return timezone.now()


def _namespace_conditions(prefix: Path, scope: Scope) -> tuple[str, list[Any]]:
    visible, params = access.visible_sql(scope, "n")
    if prefix:
        return f"n.path[1:{len(prefix)}] = %s::text[] AND {visible}", [list(prefix), *params]
    return visible, params


def search_items(
    *,
    scope: Scope,
    prefix: Path | list[str] = (),
    filter: dict[str, Any] | None = None,
    query: str | None = None,
    vector: VectorSearch | None = None,
    vectors_per_item: int = 1,
    limit: int = 10,
    offset: int = 0,
    refresh_ttl: bool = False,
    omit_expired: bool = False,
    reader: reads.Reader | None = None,
) -> list[Found]:
    """Items under `prefix` that match `filter`, newest first; with `vector`, nearest first (pgvector);
    with a text `query` alone, those whose indexed fields have its words first, best first
    (full-text search), then the rest, newest first. The items found by a search from a thread
    (`reader`) are recorded as read by it (memory.reads)."""
    path = namespace_path(prefix, field="prefix", allow_empty=True)
    wanted = filters.check(filter)
    tokens, exact = filters.filter_tokens(wanted)
    if vector is not None and not vectors_available():
        raise NoVectorSearch("This database has no pgvector extension; search with a text query instead.")
    ns_sql, ns_params = _namespace_conditions(path, scope)
    conditions = ["NOT i.deleted"]
    params: dict[str, Any] = {}
    wanted_sql = "NULL::bigint[]"
    if tokens:
        # The filter's tokens as each namespace's items carry them (memory.filters), a column of
        # `ns`, so the index scan of each namespace finds its matches alone.
        mask = filters.MASK_SQL.format("n.id")
        wanted_sql = f"ARRAY(SELECT t # {mask} FROM unnest(%(tokens)s::bigint[]) t)"
        conditions.append("i.tokens @> ns.wanted")
        params["tokens"] = tokens
    if omit_expired:
        conditions.append("(i.expires_at IS NULL OR i.expires_at > now())")
    where = " AND ".join(conditions)
    # The namespace conditions use positional parameters: inline them as named ones.
    named_ns = ns_sql
    for position, value in enumerate(ns_params):
        named_ns = named_ns.replace("%s", f"%(ns{position})s", 1)
        params[f"ns{position}"] = value
    namespaces = (
        f"ns AS MATERIALIZED (SELECT n.id, n.path, {wanted_sql} AS wanted FROM memory_namespace n WHERE {named_ns})"
    )
    reader_sql = "NULL"
    if reader is not None and reader.by_external_id:
        reader_sql = _READER_SQL
        params.update(_reader_params(reader))
    if vector is not None:
        dims = vector.dims
        params["query_vector"] = "[" + ",".join(repr(float(c)) for c in vector.embedding) + "]"
        distance = distance_sql(vector)
        sql = (
            f"WITH {namespaces}, {_near_sql(distance, dims)}, best AS MATERIALIZED (SELECT item_id, namespace_id, "
            "min(distance) AS distance FROM near GROUP BY item_id, namespace_id) "
            f"SELECT {_ITEM_COLUMNS}, ns.path, {score_sql(vector, 'best.distance')} AS score, {reader_sql} FROM best "
            f"JOIN ns ON ns.id = best.namespace_id JOIN memory_item i ON i.id = best.item_id WHERE {where} "
            "ORDER BY best.distance, i.updated_at DESC, i.id DESC"
        )
        params["expanded"] = (offset + limit) * max(vectors_per_item, 1) * (2 if exact else 8) + 1
        params["candidates"] = max(params["expanded"], HNSW_CANDIDATES)
    elif query and query.strip():
        params["query"] = " or ".join(word.strip('"').lstrip("-") for word in query.split())
        sql = (
            f"WITH {namespaces}, hits AS (SELECT x.item_id, max(ts_rank_cd(x.lexemes, q)) AS rank "
            "FROM memory_indexentry x, websearch_to_tsquery('simple', %(query)s) q "
            "WHERE x.namespace_id IN (SELECT id FROM ns) AND x.lexemes @@ q GROUP BY x.item_id) "
            f"SELECT {_ITEM_COLUMNS}, ns.path, coalesce(hits.rank, 0) AS score, {reader_sql} FROM memory_item i "
            f"JOIN ns ON ns.id = i.namespace_id LEFT JOIN hits ON hits.item_id = i.id WHERE {where} "
            "ORDER BY score DESC, i.updated_at DESC, i.id DESC"
        )
    else:
        sql = (
            f"WITH {namespaces} SELECT {_ITEM_COLUMNS}, ns.path, NULL AS score, {reader_sql} FROM memory_item i "
            f"JOIN ns ON ns.id = i.namespace_id WHERE {where} ORDER BY i.updated_at DESC, i.id DESC"
        )
    found, resolved = _page(sql, params, limit=limit, offset=offset, keep=None if exact else wanted)
    if refresh_ttl:
        store.refresh_expiry([item.item_id for item, has_ttl in found if has_ttl], live_only=omit_expired)
    if reader is not None:
        for item, _ in found:
            _record_read(item, reader, resolved=resolved)
    return [item for item, _ in found]


# What an HNSW index scan returns at most: pgvector's default `hnsw.ef_search` (before pgvector 0.8,
# which the embedded server predates, a scan stops there, whatever the LIMIT).
HNSW_CANDIDATES = 40


def _near_sql(distance: str, dims: int) -> str:
    """The `near` CTE of a vector search: the `%(expanded)s` index entries under `ns` nearest the
    query, found by the HNSW index where it can, else exactly.

    The index serves an ORDER BY distance LIMIT over all entries of the dimensions, not one
    filtered by namespace: the planner, which takes `ns` for a row or two, would read the entries
    of `ns`'s namespaces by their btree and sort them all instead, however many there are. So
    the index's nearest `%(candidates)s` entries come first (`approximate`), and when enough of
    them are under `ns` they are the answer; when not (a narrow prefix: the index's nearest are
    mostly elsewhere) the entries under `ns` are read and sorted, ordered by an expression the
    index cannot serve, so that part is exact and never cut short by the index scan's own limit."""
    dims = int(dims)
    return (
        "candidates AS MATERIALIZED (SELECT x.item_id, x.namespace_id, "
        f"{distance} AS distance FROM memory_indexentry x WHERE x.dims = {dims} ORDER BY {distance} "
        "LIMIT %(candidates)s), "
        "approximate AS MATERIALIZED (SELECT c.item_id, c.namespace_id, c.distance FROM candidates c "
        "WHERE c.namespace_id IN (SELECT id FROM ns) ORDER BY c.distance LIMIT %(expanded)s), "
        "near AS (SELECT item_id, namespace_id, distance FROM approximate "
        "WHERE (SELECT count(*) FROM approximate) = %(expanded)s "
        f"UNION ALL (SELECT x.item_id, x.namespace_id, {distance} FROM memory_indexentry x "
        "WHERE (SELECT count(*) FROM approximate) < %(expanded)s "
        f"AND x.dims = {dims} AND x.namespace_id IN (SELECT id FROM ns) ORDER BY ({distance}) + 0 "
        "LIMIT %(expanded)s))"
    )


def _page(
    sql: str, params: dict[str, Any], *, limit: int, offset: int, keep: dict[str, Any] | None
) -> tuple[list[tuple[Found, bool]], Any]:
    """Rows `offset` to `offset + limit` of `sql`'s results that match `keep` (a filter only the
    opened values can decide; None: every row matches), and the last column of a row (the
    reader's thread, the same in every row). Such a filter reads in growing chunks."""
    rows: list[tuple[Found, bool]] = []
    if limit <= 0:
        return rows, None
    if keep is None:
        with connection.cursor() as cursor:
            cursor.execute(f"{sql} LIMIT %(limit)s OFFSET %(offset)s", {**params, "limit": limit, "offset": offset})
            found = cursor.fetchall()
        rows = [_open_row(row, tuple(row[13]), _score(row[14])) for row in found]
        return rows, found[0][15] if found else None
    skipped, read, chunk, last = 0, 0, max(2 * (offset + limit), 64), None
    while True:
        with connection.cursor() as cursor:
            cursor.execute(f"{sql} LIMIT %(limit)s OFFSET %(offset)s", {**params, "limit": chunk, "offset": read})
            batch = cursor.fetchall()
        read += len(batch)
        for row in batch:
            last = row[15]
            item, has_ttl = _open_row(row, tuple(row[13]), _score(row[14]))
            if not filters.matches(item.value, keep):
                continue
            if skipped < offset:
                skipped += 1
                continue
            rows.append((item, has_ttl))
            if len(rows) == limit:
                return rows, last
        if len(batch) < chunk:
            return rows, last
        chunk *= 2


def _score(value: Any) -> float | None:
    return None if value is None else float(value)


def list_namespaces(
    *,
    scope: Scope,
    prefix: Path | list[str] = (),
    suffix: Path | list[str] = (),
    max_depth: int | None = None,
    limit: int = 100,
    offset: int = 0,
    omit_expired: bool = False,
    after: Path | None = None,
) -> list[Path]:
    """Namespaces holding at least one item, matching `prefix` and `suffix` (`*` matches any one
    label), cut to `max_depth` labels (and then listed once), in order; with `after`, those
    after it (a page's last, for the next page)."""
    starts = pattern(prefix, field="prefix")
    ends = pattern(suffix, field="suffix")
    visible, params = access.visible_sql(scope, "n")
    conditions = [visible]
    if len(starts) or len(ends):
        conditions.append("cardinality(n.path) >= %s")
        params.append(max(len(starts), len(ends)))
    for position, label in enumerate(starts, start=1):
        if label != "*":
            conditions.append(f"n.path[{position}] = %s")
            params.append(label)
    for position, label in enumerate(reversed(ends)):
        if label != "*":
            conditions.append(f"n.path[cardinality(n.path) - {position}] = %s")
            params.append(label)
    live = "NOT i.deleted" + (" AND (i.expires_at IS NULL OR i.expires_at > now())" if omit_expired else "")
    conditions.append(f"EXISTS (SELECT 1 FROM memory_item i WHERE i.namespace_id = n.id AND {live})")
    shown = f"n.path[1:{int(max_depth)}]" if max_depth is not None else "n.path"
    sql = f"SELECT DISTINCT {shown} AS shown FROM memory_namespace n WHERE {' AND '.join(conditions)}"
    if after is not None:
        sql = f"SELECT shown FROM ({sql}) listed WHERE shown > %s::text[]"
        params.append(list(after))
    sql += " ORDER BY shown LIMIT %s OFFSET %s"
    with connection.cursor() as cursor:
        cursor.execute(sql, [*params, limit, offset])
        return [tuple(row[0]) for row in cursor.fetchall()]


@dataclass(frozen=True, slots=True)
class Version:
    """One version of an item: its value (None for a deletion), who wrote it, from where, when."""

    version: int
    kind: VersionKind
    value: Any
    created_at: datetime
    writer: str
    agent_id: int | None
    agent_key_id: int | None
    user_id: int | None
    rule: str
    thread_id: UUID | None
    checkpoint_id: UUID | None
    value_bytes: int

    @property
    def deleted(self) -> bool:
        return self.kind == VersionKind.DELETED


_VERSION_COLUMNS = (
    "version, kind, payload, integrity, created_at, writer, agent_id, agent_key_id, user_id, rule, thread_id, "
    "checkpoint_id, value_bytes"
)
_NAMES = [name.strip() for name in _VERSION_COLUMNS.split(",")]


@dataclass(frozen=True, slots=True)
class _Item:
    id: UUID
    space: spaces.Space
    key: str
    version: int
    integrity: bytes


def _item(path: Path, key: str, scope: Scope, *, fresh: bool = False) -> _Item | None:
    space = _space_for_read(path, scope, fresh=fresh)
    if space is None:
        return None
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id, version, integrity, head_mac, value FROM memory_item WHERE namespace_id = %s AND key = %s",
            [space.id, key],
        )
        row = cursor.fetchone()
    if row is None:
        # The namespace this process remembers may have been deleted and made again since.
        return None if fresh else _item(path, key, scope, fresh=True)
    sealing.check_head(
        row[3], item_id=row[0], namespace_id=space.id, key=key, version=row[1],
        value=bytes(row[4]) if row[4] is not None else None, integrity=bytes(row[2]),
    )  # fmt: skip
    return _Item(id=row[0], space=space, key=key, version=row[1], integrity=bytes(row[2]))


def _versions(item: _Item, first: int, last: int) -> list[dict[str, Any]]:
    """Stored versions first..last of the item (and the one before `first`, for its MAC), checked."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {_VERSION_COLUMNS} FROM memory_itemversion WHERE item_id = %s AND version BETWEEN %s AND %s "
            "ORDER BY version",
            [item.id, max(first - 1, 1), last],
        )
        rows = [dict(zip(_NAMES, row, strict=True)) for row in cursor.fetchall()]
    expected = list(range(max(first - 1, 1), last + 1))
    if [row["version"] for row in rows] != expected:
        raise IntegrityFailure(
            f"Memory item {item.key!r} is missing versions between {first} and {last}: "
            "they were removed outside Quicksave.",
            detail={"item": str(item.id)},
        )
    previous: bytes | None = None
    for row in rows:
        row["payload"], row["integrity"] = bytes(row["payload"]), bytes(row["integrity"])
        if row["version"] >= first:
            mac = sealing.version_mac(
                previous=previous, item_id=item.id, namespace_id=item.space.id, key=item.key,
                version=row["version"], kind=row["kind"], created_at=row["created_at"],
                fields=store.version_fields(row), payload=row["payload"],
            )  # fmt: skip
            if not hmac.compare_digest(mac, row["integrity"]):
                raise IntegrityFailure(
                    f"Version {row['version']} of memory item {item.key!r} fails its integrity check: "
                    "it was altered outside Quicksave.",
                    detail={"item": str(item.id), "version": row["version"]},
                )
        previous = row["integrity"]
    if last == item.version and rows and rows[-1]["integrity"] != item.integrity:
        raise IntegrityFailure(
            f"Memory item {item.key!r}'s newest version does not match its head: a version was altered or removed.",
            detail={"item": str(item.id)},
        )
    return [row for row in rows if row["version"] >= first]


def _snapshot_before(item: _Item, version: int) -> int:
    """The newest version at or before `version` whose payload is whole (a snapshot or a deletion)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT max(version) FROM memory_itemversion WHERE item_id = %s AND version <= %s AND kind <> %s",
            [item.id, version, int(VersionKind.DELTA)],
        )
        row = cursor.fetchone()
    if row is None or row[0] is None:
        raise IntegrityFailure(
            f"Memory item {item.key!r} has no whole version before version {version}.", detail={"item": str(item.id)}
        )
    return int(row[0])


def _materialise(item: _Item, rows: list[dict[str, Any]]) -> list[Version]:
    """The versions of `rows` (consecutive, the first one whole) with their values."""
    out: list[Version] = []
    value: Any = None
    for row in rows:
        kind = VersionKind(row["kind"])
        if kind == VersionKind.DELETED:
            value = None
        else:
            opened = sealing.open_value(item.space, item.id, row["version"], row["payload"])
            value = opened if kind == VersionKind.SNAPSHOT else apply_patch(value, opened, measure=False).doc
        out.append(Version(
            version=row["version"], kind=kind, value=value, created_at=row["created_at"], writer=row["writer"],
            agent_id=row["agent_id"], agent_key_id=row["agent_key_id"], user_id=row["user_id"], rule=row["rule"],
            thread_id=row["thread_id"], checkpoint_id=row["checkpoint_id"], value_bytes=row["value_bytes"],
        ))  # fmt: skip
    return out


def item_history(
    *, namespace: Path | list[str], key: str, scope: Scope, limit: int = 50, before: int | None = None
) -> list[Version] | None:
    """Up to `limit` versions of the item, newest first (older than version `before` if given),
    with their values; None when there is no such item for the scope."""
    item = _item(namespace_path(namespace), item_key(key), scope)
    if item is None:
        return None
    last = min(item.version, before - 1) if before is not None else item.version
    if last < 1:
        return []
    first = max(last - limit + 1, 1)
    whole = _snapshot_before(item, first)
    versions = _materialise(item, _versions(item, whole, last))
    return [version for version in reversed(versions) if version.version >= first]


@dataclass(frozen=True, slots=True)
class ReadBy:
    """A version of an item read from a thread (at a checkpoint of it, when known), when."""

    version: int
    thread_id: UUID
    checkpoint_id: UUID | None
    read_at: datetime


def item_reads(*, namespace: Path | list[str], key: str, scope: Scope, limit: int = 50) -> list[ReadBy]:
    """The newest `limit` reads of the item from threads (memory.reads), newest first."""
    space = _space_for_read(namespace_path(namespace), scope)
    if space is None:
        return []
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT r.version, r.thread_id, r.checkpoint_id, r.read_at FROM memory_itemread r "
            "JOIN memory_item i ON i.id = r.item_id WHERE i.namespace_id = %s AND i.key = %s "
            "ORDER BY r.read_at DESC, r.id DESC LIMIT %s",
            [space.id, item_key(key), limit],
        )
        return [ReadBy(*row) for row in cursor.fetchall()]


def item_as_of(
    *, namespace: Path | list[str], key: str, scope: Scope, at: datetime, reader: reads.Reader | None = None
) -> Found | None:
    """The item as it was at `at`: the value of the newest version written by then (None if it
    did not exist yet or was deleted). A read from a thread (`reader`, by its id) is recorded
    with the version it read (memory.reads)."""
    path = namespace_path(namespace)
    item = _item(path, item_key(key), scope)
    if item is None:
        return None
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT max(version) FROM memory_itemversion WHERE item_id = %s AND created_at <= %s", [item.id, at]
        )
        row = cursor.fetchone()
    if row is None or row[0] is None:
        return None
    version = int(row[0])
    versions = _materialise(item, _versions(item, _snapshot_before(item, version), version))
    target = versions[-1]
    if target.deleted:
        return None
    with connection.cursor() as cursor:
        # Created when it was first written after its last deletion before then.
        cursor.execute(
            "SELECT min(created_at) FROM memory_itemversion WHERE item_id = %(item)s AND version <= %(version)s "
            "AND version > coalesce((SELECT max(version) FROM memory_itemversion WHERE item_id = %(item)s "
            "AND version <= %(version)s AND kind = %(deleted)s), 0)",
            {"item": item.id, "version": version, "deleted": int(VersionKind.DELETED)},
        )
        created = cursor.fetchone()[0]
    found = Found(
        item_id=item.id, namespace=path, key=item.key, value=target.value, version=target.version,
        created_at=created, updated_at=target.created_at,
    )  # fmt: skip
    if reader is not None:
        _record_read(found, reader, resolved=None)
    return found


def verify_item(*, namespace: Path | list[str], key: str, scope: Scope) -> int:
    """Check the item's whole chain, from its first version to its head; returns how many versions
    were checked (IntegrityFailure at the first that fails)."""
    item = _item(namespace_path(namespace), item_key(key), scope)
    if item is None:
        return 0
    versions = _materialise(item, _versions(item, 1, item.version))
    return len(versions)
