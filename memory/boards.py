"""Blackboards: namespaces several agents coordinate through, with leases on keys, fencing tokens
and a live feed of changes.

A namespace is made a blackboard (`make_board`) when it is made, and stays one, so every process
may remember it (memory.spaces). On a board:

- every change of an item (memory.store's put and delete) and of a lease takes the board's row
  lock, is numbered by the board's `board_seq` and appended to `memory_boardevent` in its
  transaction; after the commit it goes to the board's channel-layer group (checkpoints.live's
  publisher), and a client that missed one replays it from the table (memory.consumers);
- a lease (`acquire_lease`, `renew_lease`, `release_lease`) gives one holder a key until its
  time-to-live runs out, measured by the database's clock; a holder that dies loses it then.
  Its fencing token is the event number of the acquire, so a later lease's is larger. A write
  naming a token (`fencing_token`) is refused unless that token is the key's live lease and the
  writer's agent took it (a token is no secret: it is the number of an event on the feed); a
  write naming none is refused while someone holds the key. Leases coordinate agents that may
  already write the namespace: who may use it at all is memory.access's business.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.contrib.auth.models import User
from django.db import connection, transaction

from audit import trail
from checkpoints import live
from memory import access, spaces
from memory.access import Scope
from memory.errors import InvalidValue, ItemNotFound, LeaseHeld, LeaseLost, NotABoard
from memory.models import BoardEvent
from memory.paths import Path, dotted, item_key, namespace_path

MAX_TTL_SECONDS = 24 * 3600.0
MIN_TTL_SECONDS = 0.1
MAX_HOLDER = 200
ITEM_WRITTEN = "item.written"
ITEM_DELETED = "item.deleted"
LEASE_ACQUIRED = "lease.acquired"
LEASE_RELEASED = "lease.released"


def group(namespace_id: int) -> str:
    """The channel-layer group of one board's sockets."""
    return f"memoryboard.{namespace_id}"


def message(*, space: spaces.Space, seq: int, kind: str, key: str, data: dict[str, Any]) -> dict[str, Any]:
    """A board's event as websocket clients receive it."""
    return {"type": kind, "seq": seq, "board": dotted(space.path), "key": key, "data": data}


@dataclass(frozen=True, slots=True)
class Lease:
    """A live lease as its holder gets it: the token its writes name, and until when it holds."""

    namespace: Path
    key: str
    holder: str
    token: int
    expires_at: datetime
    took_over_from: str | None = None  # a holder whose lease had expired unreleased


def make_board(
    *, namespace: Path | list[str], scope: Scope, user: User | None = None, address: str | None = None
) -> tuple[spaces.Space, bool]:
    """The blackboard at `namespace`, made now (owned by the scope's agent) unless it exists; and
    whether it was made. A namespace that exists as a plain one stays plain (NotABoard): processes
    that know it as such would not take the board's lock. A person's making one is audited."""
    path = namespace_path(namespace)
    space = spaces.find(path)
    created = False
    if space is None:
        with transaction.atomic():
            space, created = spaces.ensure(path, agent_id=scope.agent_id, board=True)
            if created and user is not None:
                trail.record(
                    actor=user, action="memory.board", target_type="memory_namespace", target_id=dotted(path)[:64],
                    after={"namespace": list(path)}, address=address,
                )  # fmt: skip
    if not access.may_use(scope, space):
        raise _not_found(path)
    if not space.board:
        raise NotABoard(
            f"The namespace {dotted(path)} already holds plain memory; a namespace becomes a blackboard when it is "
            "made, so make the board under a new path.",
            detail={"namespace": list(path)},
        )
    return space, created


def _not_found(path: Path) -> ItemNotFound:
    return ItemNotFound(f"There is no blackboard {dotted(path)}.", detail={"namespace": list(path)})


def board_for(namespace: Path | list[str], scope: Scope) -> spaces.Space:
    """The board at `namespace` if the scope may use it; ItemNotFound (a namespace the scope may not
    use is one that does not exist) or NotABoard."""
    path = namespace_path(namespace)
    space = spaces.find(path)
    if space is None or not access.may_use(scope, space):
        raise _not_found(path)
    if not space.board:
        raise NotABoard(f"The namespace {dotted(path)} is not a blackboard.", detail={"namespace": list(path)})
    return space


def _lock(space: spaces.Space) -> None:
    """Take the board's row lock until the transaction ends: its changes happen one at a time."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT board_seq FROM memory_namespace WHERE id = %s FOR UPDATE", [space.id])


def _record(space: spaces.Space, kind: str, key: str, data: dict[str, Any]) -> int:
    """Number the change (under the board's lock), append its event, and publish it after commit."""
    with connection.cursor() as cursor:
        cursor.execute("UPDATE memory_namespace SET board_seq = board_seq + 1 WHERE id = %s RETURNING board_seq",
                       [space.id])  # fmt: skip
        seq = int(cursor.fetchone()[0])
    BoardEvent.objects.create(namespace_id=space.id, seq=seq, kind=kind, key=key, data=data)
    live.send_on_commit(group(space.id), message(space=space, seq=seq, kind=kind, key=key, data=data))
    return seq


@dataclass(frozen=True, slots=True)
class _Row:
    """A key's lease row as a write sees it (locked)."""

    holder: str
    token: int
    expires_at: datetime
    live: bool
    released: bool
    agent_id: int | None

    def usable_by(self, scope: Scope) -> bool:
        """Whether the scope may write, renew or release under this lease when it names its token:
        the agent that took it (or a person, who may write the namespace anyway). A token is no
        secret (it is the number of the acquire's event, on the feed)."""
        return scope.agent_id is None or scope.agent_id == self.agent_id


_LEASE_SQL = (
    "SELECT holder, token, expires_at, released_at IS NULL AND expires_at > clock_timestamp(), "
    "released_at IS NOT NULL, agent_id FROM memory_lease WHERE namespace_id = %s AND key = %s FOR UPDATE"
)


def _lease_row(space: spaces.Space, key: str) -> _Row | None:
    with connection.cursor() as cursor:
        cursor.execute(_LEASE_SQL, [space.id, key])
        row = cursor.fetchone()
    return None if row is None else _Row(row[0], int(row[1]), row[2], bool(row[3]), bool(row[4]), row[5])


def _held(key: str, holder: str, expires_at: datetime) -> LeaseHeld:
    return LeaseHeld(
        f"Key {key!r} is leased to {holder!r} until {expires_at.isoformat()}.",
        detail={"key": key, "holder": holder, "expires_at": expires_at.isoformat()},
    )


def _lost(key: str, token: int, row: _Row | None) -> LeaseLost:
    detail: dict[str, Any] = {"key": key, "fencing_token": token}
    if row is None:
        return LeaseLost(f"Key {key!r} was never leased: fencing token {token} names no lease.", detail=detail)
    if row.token != token:
        return LeaseLost(
            f"Fencing token {token} is not the lease on key {key!r} any more: {row.holder!r} took it since "
            "with a newer token.",
            detail={**detail, "holder": row.holder},
        )
    how = "was released" if row.released else "expired"
    return LeaseLost(
        f"The lease with fencing token {token} on key {key!r} {how} at {row.expires_at.isoformat()}.",
        detail={**detail, "ended_at": row.expires_at.isoformat()},
    )


def _check_token(key: str, token: int, row: _Row | None, scope: Scope) -> _Row:
    """The live lease `token` names, if the scope may act under it; LeaseLost or LeaseHeld."""
    if row is None or row.token != token or not row.live:
        raise _lost(key, token, row)
    if not row.usable_by(scope):
        raise _held(key, row.holder, row.expires_at)  # another agent's lease, whatever token is named
    return row


def guard_write(space: spaces.Space, key: str, fencing_token: int | None, scope: Scope) -> None:
    """Inside the write's transaction, before it: take the board's lock and refuse the write
    unless `fencing_token` is the key's live lease, taken by the scope's agent (or, without a
    token, nobody holds the key)."""
    _lock(space)
    row = _lease_row(space, key)
    if fencing_token is not None:
        _check_token(key, fencing_token, row, scope)
        return
    if row is not None and row.live:
        raise _held(key, row.holder, row.expires_at)


def record_write(space: spaces.Space, *, key: str, version: int, deleted: bool, writer: dict[str, Any]) -> int:
    """The event of a put or delete memory.store just made (under guard_write's lock)."""
    kind = ITEM_DELETED if deleted else ITEM_WRITTEN
    return _record(space, kind, key, {"version": version, **writer})


def _ttl(ttl_seconds: Any) -> float:
    if (
        isinstance(ttl_seconds, bool)
        or not isinstance(ttl_seconds, (int, float))
        or not MIN_TTL_SECONDS <= ttl_seconds <= MAX_TTL_SECONDS
    ):
        raise InvalidValue(
            f"ttl_seconds is a number of seconds from {MIN_TTL_SECONDS:g} to {MAX_TTL_SECONDS:g}.",
            detail={"field": "ttl_seconds", "min": MIN_TTL_SECONDS, "max": MAX_TTL_SECONDS},
        )
    return float(ttl_seconds)


def _holder(holder: Any) -> str:
    if not isinstance(holder, str) or not holder.strip() or len(holder) > MAX_HOLDER or "\x00" in holder:
        raise InvalidValue(
            f"holder names who takes the lease: 1 to {MAX_HOLDER} characters, no NUL.",
            detail={"field": "holder", "limit": MAX_HOLDER},
        )
    return holder


def _token(token: Any) -> int:
    if isinstance(token, bool) or not isinstance(token, int) or token < 1:
        raise InvalidValue(
            "fencing_token is the positive integer an acquire returned.", detail={"field": "fencing_token"}
        )
    return token


def acquire_lease(*, namespace: Path | list[str], key: str, holder: str, ttl_seconds: float, scope: Scope) -> Lease:
    """Give `holder` the key for `ttl_seconds` (by the database's clock) with a new fencing token;
    LeaseHeld while another live lease holds it (the same holder included: renew instead)."""
    key, holder, ttl = item_key(key), _holder(holder), _ttl(ttl_seconds)
    space = board_for(namespace, scope)
    with transaction.atomic():
        _lock(space)
        row = _lease_row(space, key)
        if row is not None and row.live:
            raise _held(key, row.holder, row.expires_at)
        took_over = row.holder if row is not None and not row.released else None
        seq = _record(space, LEASE_ACQUIRED, key, {"holder": holder, "agent": scope.agent_id, "ttl_seconds": ttl,
                                                    "took_over_from": took_over})  # fmt: skip
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO memory_lease (namespace_id, key, holder, agent_id, token, acquired_at, expires_at, "
                "released_at) VALUES (%(ns)s, %(key)s, %(holder)s, %(agent)s, %(token)s, clock_timestamp(), "
                "clock_timestamp() + %(ttl)s * interval '1 second', NULL) ON CONFLICT (namespace_id, key) DO UPDATE "
                "SET holder = excluded.holder, agent_id = excluded.agent_id, token = excluded.token, "
                "acquired_at = excluded.acquired_at, expires_at = excluded.expires_at, released_at = NULL "
                "RETURNING expires_at",
                {"ns": space.id, "key": key, "holder": holder, "agent": scope.agent_id, "token": seq, "ttl": ttl},
            )
            expires_at = cursor.fetchone()[0]
    return Lease(namespace=space.path, key=key, holder=holder, token=seq, expires_at=expires_at,
                 took_over_from=took_over)  # fmt: skip


def renew_lease(
    *, namespace: Path | list[str], key: str, fencing_token: int, ttl_seconds: float, scope: Scope
) -> Lease:
    """Hold the key `ttl_seconds` from now; LeaseLost unless `fencing_token` is its live lease."""
    key, token, ttl = item_key(key), _token(fencing_token), _ttl(ttl_seconds)
    space = board_for(namespace, scope)
    with transaction.atomic():
        row = _check_token(key, token, _lease_row(space, key), scope)  # the lease row stays locked
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE memory_lease SET expires_at = clock_timestamp() + %s * interval '1 second' "
                "WHERE namespace_id = %s AND key = %s RETURNING expires_at",
                [ttl, space.id, key],
            )
            expires_at = cursor.fetchone()[0]
    return Lease(namespace=space.path, key=key, holder=row.holder, token=token, expires_at=expires_at)


def release_lease(*, namespace: Path | list[str], key: str, fencing_token: int, scope: Scope) -> None:
    """Give the key up at once; LeaseLost unless `fencing_token` is its live lease."""
    key, token = item_key(key), _token(fencing_token)
    space = board_for(namespace, scope)
    with transaction.atomic():
        _lock(space)
        row = _check_token(key, token, _lease_row(space, key), scope)
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE memory_lease SET released_at = clock_timestamp(), expires_at = clock_timestamp() "
                "WHERE namespace_id = %s AND key = %s",
                [space.id, key],
            )
        _record(space, LEASE_RELEASED, key, {"holder": row.holder})


@dataclass(frozen=True, slots=True)
class HeldKey:
    key: str
    holder: str
    agent_id: int | None
    acquired_at: datetime
    expires_at: datetime


def live_leases(*, namespace: Path | list[str], scope: Scope) -> list[HeldKey]:
    """The board's keys held now, by key (tokens are their holders' alone)."""
    space = board_for(namespace, scope)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT key, holder, agent_id, acquired_at, expires_at FROM memory_lease WHERE namespace_id = %s "
            "AND released_at IS NULL AND expires_at > clock_timestamp() ORDER BY key",
            [space.id],
        )
        return [HeldKey(*row) for row in cursor.fetchall()]


def events_after(*, space: spaces.Space, seq: int, limit: int) -> list[dict[str, Any]]:
    """The board's events after `seq`, oldest first, as the feed sends them."""
    rows = (
        BoardEvent.objects.filter(namespace_id=space.id, seq__gt=seq)
        .order_by("seq")
        .values_list("seq", "kind", "key", "data")[:limit]
    )
    return [message(space=space, seq=s, kind=kind, key=key, data=data) for s, kind, key, data in rows]
