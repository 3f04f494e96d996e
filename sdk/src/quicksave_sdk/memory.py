"""Long-term memory and blackboards over the REST API: items under namespace paths with every
version kept, search, history, and boards where agents coordinate with compare-and-set writes,
leases with fencing tokens, and a feed of changes.

`Client.memory` is a `Memory`; `Memory.board(...)` makes (or opens) a `Board`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

from quicksave_sdk.errors import LeaseHeld, LeaseLost, NotFound, error_from_response

if TYPE_CHECKING:
    from quicksave_sdk.client import Client

log = logging.getLogger("quicksave_sdk")
Namespace = Sequence[str]
# A refused socket's close code, as the HTTP status the API would answer.
_CLOSE_STATUS = {4400: 400, 4401: 401, 4403: 403, 4404: 404, 4503: 503}


def _time(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value else None


def _dotted(namespace: Namespace) -> str:
    """A namespace as its URL segment: labels joined by `.`, each percent-encoded."""
    if isinstance(namespace, str):
        raise TypeError("a namespace is a sequence of labels, e.g. ('users', 'alice'), not a string")
    labels = list(namespace)
    if not labels:
        raise ValueError("a namespace needs at least one label")
    for label in labels:
        if not isinstance(label, str) or not label or "." in label or "/" in label:
            raise ValueError(f"namespace label {label!r}: a non-empty string without '.' or '/'")
    return quote(".".join(labels), safe="")


def _key(key: str) -> str:
    if not isinstance(key, str) or not key:
        raise ValueError("an item key is a non-empty string")
    return quote(key, safe="")


def _query(params: dict[str, Any]) -> str:
    present = {name: value for name, value in params.items() if value is not None}
    return "?" + urlencode(present) if present else ""


@dataclass(frozen=True)
class MemoryItem:
    """An item as read: its value at `version` (the newest, or the one in force at `as_of`)."""

    namespace: tuple[str, ...]
    key: str
    value: Any
    version: int
    created_at: datetime | None
    updated_at: datetime | None
    expires_at: datetime | None = None
    score: float | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> MemoryItem:
        return cls(
            namespace=tuple(data["namespace"]), key=data["key"], value=data["value"], version=data["version"],
            created_at=_time(data["created_at"]), updated_at=_time(data["updated_at"]),
            expires_at=_time(data.get("expires_at")), score=data.get("score"),
        )  # fmt: skip


@dataclass(frozen=True)
class Written:
    """What a put or delete wrote: the item's new version (`created`: it did not exist before)."""

    namespace: tuple[str, ...]
    key: str
    version: int
    created: bool
    deleted: bool
    updated_at: datetime | None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Written:
        return cls(
            namespace=tuple(data["namespace"]), key=data["key"], version=data["version"], created=data["created"],
            deleted=data["deleted"], updated_at=_time(data["updated_at"]),
        )  # fmt: skip


@dataclass(frozen=True)
class MemoryVersion:
    """One version of an item: its value (None for a deletion), who wrote it, from where, when."""

    version: int
    deleted: bool
    value: Any
    created_at: datetime | None
    writer: str  # agent, person, rule or system
    agent: str | None
    agent_key: str | None
    user: str | None
    rule: str
    thread_id: str | None
    checkpoint_id: str | None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> MemoryVersion:
        return cls(
            version=data["version"], deleted=data["deleted"], value=data["value"],
            created_at=_time(data["created_at"]), writer=data["writer"], agent=data["agent"],
            agent_key=data["agent_key"], user=data["user"], rule=data["rule"], thread_id=data["thread"],
            checkpoint_id=data["checkpoint"],
        )  # fmt: skip


@dataclass(frozen=True)
class BoardEvent:
    """A change on a board: `type` is item.written, item.deleted, lease.acquired or lease.released."""

    type: str
    seq: int
    key: str
    data: dict[str, Any]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BoardEvent:
        return cls(type=data["type"], seq=data["seq"], key=data["key"], data=data["data"])


class Memory:
    """Long-term memory as the client's agent may use it (its own namespaces and those shared with it)."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def _pages(self, path: str) -> Iterator[dict[str, Any]]:
        """Every result of a cursor-paginated list, following `next`."""
        while True:
            page = self._client.request("GET", path)
            yield from page["results"]
            if not page["next"]:
                return
            path = page["next"].split("/api/v1", 1)[1]

    def put(
        self,
        namespace: Namespace,
        key: str,
        value: Any,
        *,
        index: list[str] | None = None,
        ttl_minutes: float | None = None,
        expected_version: int | None = None,
        fencing_token: int | None = None,
        thread_id: str | None = None,
        checkpoint_id: str | None = None,
    ) -> Written:
        """Write a new version of the item. `expected_version` (0: must not exist) makes it a
        compare-and-set (VersionConflict otherwise); on a board, `fencing_token` names your lease
        (LeaseLost when it ended; LeaseHeld when someone else holds the key and you name none)."""
        body: dict[str, Any] = {"value": value}
        optional = {"index": index, "ttl_minutes": ttl_minutes, "expected_version": expected_version,
                    "fencing_token": fencing_token, "thread": thread_id, "checkpoint": checkpoint_id}  # fmt: skip
        body.update((name, item) for name, item in optional.items() if item is not None)
        path = f"/memory/namespaces/{_dotted(namespace)}/items/{_key(key)}/"
        return Written.from_json(self._client.request("PUT", path, body))

    def get(
        self,
        namespace: Namespace,
        key: str,
        *,
        as_of: datetime | str | None = None,
        thread_id: str | None = None,
        checkpoint_id: str | None = None,
    ) -> MemoryItem | None:
        """The item now (or as it was at `as_of`), or None. A read naming the thread (and checkpoint)
        it is made from is recorded: the item's history in the dashboard lists it among its readers."""
        when = as_of.isoformat() if isinstance(as_of, datetime) else as_of
        query = _query({"as_of": when, "thread": thread_id, "checkpoint": checkpoint_id})
        path = f"/memory/namespaces/{_dotted(namespace)}/items/{_key(key)}/" + query
        try:
            return MemoryItem.from_json(self._client.request("GET", path))
        except NotFound:
            return None

    def delete(
        self,
        namespace: Namespace,
        key: str,
        *,
        expected_version: int | None = None,
        fencing_token: int | None = None,
    ) -> Written | None:
        """Write a deletion as the item's next version (its history stays); None when there was no item."""
        query = _query({"expected_version": expected_version, "fencing_token": fencing_token})
        path = f"/memory/namespaces/{_dotted(namespace)}/items/{_key(key)}/" + query
        try:
            return Written.from_json(self._client.request("DELETE", path))
        except NotFound:
            return None

    def search(
        self,
        prefix: Namespace = (),
        *,
        query: str | None = None,
        filter: dict[str, Any] | None = None,
        limit: int | None = None,
        page_size: int = 50,
    ) -> list[MemoryItem]:
        """Items under `prefix` matching `filter` (and `query`'s words first), newest first; all of
        them, or the first `limit`."""
        params = {"query": query, "filter": json.dumps(filter) if filter is not None else None,
                  "limit": min(page_size, limit) if limit else page_size}  # fmt: skip
        if prefix:
            path = f"/memory/namespaces/{_dotted(prefix)}/items/" + _query(params)
        else:
            path = "/memory/items/" + _query(params)
        found: list[MemoryItem] = []
        for data in self._pages(path):
            found.append(MemoryItem.from_json(data))
            if limit is not None and len(found) >= limit:
                break
        return found

    def namespaces(
        self, *, prefix: Namespace = (), suffix: Namespace = (), max_depth: int | None = None
    ) -> list[tuple[str, ...]]:
        """Namespaces holding items that this agent may use; `*` in prefix or suffix matches any label."""
        params = {"prefix": ".".join(prefix) or None, "suffix": ".".join(suffix) or None, "max_depth": max_depth}
        return [tuple(row["namespace"]) for row in self._pages("/memory/namespaces/" + _query(params))]

    def history(self, namespace: Namespace, key: str, *, page_size: int = 50) -> Iterator[MemoryVersion]:
        """Every version of the item, newest first, fetched a page at a time."""
        path = f"/memory/namespaces/{_dotted(namespace)}/items/{_key(key)}/history/" + _query({"limit": page_size})
        for data in self._pages(path):
            yield MemoryVersion.from_json(data)

    def board(self, namespace: Namespace) -> Board:
        """The blackboard at `namespace`, made now if there is none."""
        data = self._client.request("POST", "/memory/boards/", {"namespace": list(namespace)})
        return Board(self, tuple(data["namespace"]))


class Board:
    """A blackboard: items (read and written as in `Memory`, here under this namespace), leases on
    its keys, and its feed of changes."""

    def __init__(self, memory: Memory, namespace: tuple[str, ...]) -> None:
        self.memory = memory
        self.namespace = namespace
        self._client = memory._client
        self._base = f"/memory/boards/{_dotted(namespace)}/"

    def __repr__(self) -> str:
        return f"<Board {'.'.join(self.namespace)}>"

    def get(self, key: str) -> MemoryItem | None:
        return self.memory.get(self.namespace, key)

    def put(self, key: str, value: Any, *, lease: Lease | None = None, expected_version: int | None = None) -> Written:
        """Write the key: under `lease` (its fencing token) and/or only at `expected_version`."""
        token = lease.fencing_token if lease is not None else None
        return self.memory.put(self.namespace, key, value, expected_version=expected_version, fencing_token=token)

    def delete(self, key: str, *, lease: Lease | None = None, expected_version: int | None = None) -> Written | None:
        token = lease.fencing_token if lease is not None else None
        return self.memory.delete(self.namespace, key, expected_version=expected_version, fencing_token=token)

    def items(self, *, filter: dict[str, Any] | None = None, query: str | None = None) -> list[MemoryItem]:
        return self.memory.search(self.namespace, filter=filter, query=query)

    def acquire(self, key: str, *, holder: str, ttl_seconds: float) -> Lease | None:
        """A lease on `key` for `ttl_seconds`, or None while someone else holds it."""
        try:
            data = self._client.request(
                "POST", self._base + "leases/", {"key": key, "holder": holder, "ttl_seconds": ttl_seconds}
            )
        except LeaseHeld:
            return None
        return Lease(self, data)

    def leases(self) -> list[dict[str, Any]]:
        """The keys held now: key, holder, agent, acquired_at, expires_at."""
        return list(self._client.request("GET", self._base + "leases/")["results"])

    def events(self, *, after_seq: int = 0, limit: int = 200) -> list[BoardEvent]:
        """The board's events after `after_seq`, oldest first (what the websocket feed replays)."""
        page = self._client.request("GET", self._base + "events/" + _query({"after_seq": after_seq, "limit": limit}))
        return [BoardEvent.from_json(data) for data in page["results"]]

    def watch(self, *, after_seq: int = 0, timeout: float | None = None) -> Generator[BoardEvent, None, None]:
        """Follow the board's websocket: its events after `after_seq` (replayed), then live ones as
        they happen, in order. Needs the `websockets` package (`events()` polls without it).
        `timeout` bounds the wait for each event (TimeoutError); a refused socket raises the
        error its close code means (NotFound for a board this agent may not use)."""
        try:
            from websockets.exceptions import ConnectionClosed
            from websockets.sync.client import connect
        except ImportError as exc:  # pragma: no cover - the test set installs it
            raise RuntimeError("Board.watch needs the websockets package; Board.events polls without it.") from exc
        http = self._client._http
        base = str(http.base_url).rstrip("/")
        url = "ws" + base.removeprefix("http") + f"/ws/memory/boards/{_dotted(self.namespace)}/?after_seq={after_seq}"
        headers = {"Authorization": http.headers["Authorization"]}
        with connect(url, additional_headers=headers, origin=base, open_timeout=self._client.timeout) as socket:  # type: ignore[arg-type]
            while True:
                try:
                    raw = socket.recv(timeout=timeout)
                except ConnectionClosed as closed:
                    code = closed.rcvd.code if closed.rcvd is not None else 1006
                    raise error_from_response(
                        _CLOSE_STATUS.get(code, 0), None, f"websocket closed with {code}"
                    ) from None
                message = json.loads(raw)
                if message.get("type") != "pong":
                    yield BoardEvent.from_json(message)


class Lease:
    """A live lease on a board's key. Write under it (`Board.put(..., lease=lease)`), `renew()` it
    before `expires_at`, `release()` it when done. Once it ended (LeaseLost), stop: a holder that
    took the key since has a newer fencing token, and writes naming this one are refused."""

    def __init__(self, board: Board, data: dict[str, Any]) -> None:
        self.board = board
        self.key: str = data["key"]
        self.holder: str = data["holder"]
        self.fencing_token: int = data["fencing_token"]
        self.took_over_from: str | None = data.get("took_over_from")
        self._absorb(data)

    def _absorb(self, data: dict[str, Any]) -> None:
        self.expires_at = _time(data["expires_at"])

    def __repr__(self) -> str:
        return f"<Lease {self.key} {self.holder} token={self.fencing_token}>"

    def renew(self, ttl_seconds: float) -> None:
        """Hold the key `ttl_seconds` from now; LeaseLost when the lease already ended."""
        body = {"key": self.key, "fencing_token": self.fencing_token, "ttl_seconds": ttl_seconds}
        self._absorb(self.board._client.request("POST", self.board._base + "leases/renew/", body))

    def release(self) -> None:
        """Give the key up now; LeaseLost when the lease already ended."""
        body = {"key": self.key, "fencing_token": self.fencing_token}
        self.board._client.request("POST", self.board._base + "leases/release/", body)

    @contextlib.contextmanager
    def keeping(self, ttl_seconds: float, *, every: float | None = None) -> Iterator[threading.Event]:
        """Renew the lease from a side thread every `every` seconds (a third of `ttl_seconds` by
        default) while the block runs; the event it yields is set once the lease is lost."""
        stopped, lost = threading.Event(), threading.Event()

        def beat() -> None:
            while not stopped.wait(every if every is not None else ttl_seconds / 3):
                try:
                    self.renew(ttl_seconds)
                except LeaseLost:
                    lost.set()
                    return
                except Exception:  # the server may answer the next one
                    log.warning("renewing the lease on %s failed", self.key, exc_info=True)

        thread = threading.Thread(target=beat, name=f"quicksave-board-lease-{self.key}", daemon=True)
        thread.start()
        try:
            yield lost
        finally:
            stopped.set()
            thread.join()
