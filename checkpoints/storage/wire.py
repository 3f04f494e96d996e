"""A statement prepared once per connection, sent through libpq and answered later.

The store's append is its hot write, and psycopg's Cursor spends on it a good part of
the append's CPU between the Python values and the wire (looking up dumpers, reordering
named parameters, keeping its cache of prepared statements), then blocks until the
server answers. `Statement` binds its parameters with psycopg's own dumpers, prepares
itself once on each connection, and sends its bound execution, with the Sync that ends
an autocommit transaction, in one write. The caller then does the rest of its work while
the server executes and commits, and reads the answer when it needs it: `Statement.sent`
is a context manager whose exit always reads it, so the connection is never left with
an answer unread.

Only for a connection in autocommit: inside a transaction psycopg would first have to
send its BEGIN, which only its own cursors do.

Besides psycopg's documented libpq wrapper (`psycopg.pq`) this uses parts of psycopg that
its cursors are built on (`psycopg.generators`, `Connection.wait`, `Connection.lock`,
`errors.error_from_result`); requirements.txt pins the psycopg release it was written for.
Like psycopg's own cursors used directly, it raises psycopg's exceptions, not Django's, and
Django's query log does not see the statement.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import abc, errors, generators, pq
from psycopg.adapt import AdaptersMap, PyFormat, Transformer
from psycopg.types.numeric import Int8BinaryDumper

from checkpoints.storage.pool import Pool

Row = tuple[bytes | None, ...]
# SQLSTATE invalid_sql_statement_name: the statement is not prepared on this connection.
_UNKNOWN_STATEMENT = b"26000"
# SQLSTATE duplicate_prepared_statement.
_DUPLICATE_STATEMENT = b"42P05"


class _Binding:
    """The adaptation context of every Statement: psycopg's global dumpers, with every int as int8.

    It names no connection, so a transformer made from it holds none.
    """

    connection = None

    def __init__(self) -> None:
        self.adapters = AdaptersMap(psycopg.adapters)
        self.adapters.register_dumper(int, Int8BinaryDumper)


_binding = _Binding()
_names: set[bytes] = set()


class Statement:
    """One SQL statement with `$1`..`$n` placeholders for `names`, in that order.

    Every placeholder must carry a cast to the type it stands for (`$1::uuid`): the
    statement is prepared without parameter types, so the server takes them from the
    casts, and the values go in psycopg's binary format for their Python types. A value
    whose type is not the one its cast asks for is refused before anything is sent
    (the server would read its bytes as the other type). Python ints go as int8
    whatever their size: cast them `::bigint`.
    """

    @classmethod
    def named(cls, name: str, sql: str) -> Statement:
        """The statement whose SQL names its parameters psycopg's way, `%(name)s`; each name
        becomes one placeholder however often it appears."""
        names: list[str] = []

        def placeholder(match: re.Match[str]) -> str:
            if match[1] not in names:
                names.append(match[1])
            return f"${names.index(match[1]) + 1}"

        return cls(name, re.sub(r"%\((\w+)\)s", placeholder, sql), names)

    def __init__(self, name: str, sql: str, names: Sequence[str]) -> None:
        self._name = name.encode()
        if self._name in _names:
            raise ValueError(f"A statement named {name!r} exists already: each needs a name of its own.")
        _names.add(self._name)
        self._sql = sql.encode()
        self._names = tuple(names)
        self._formats = [PyFormat.BINARY] * len(self._names)
        self._prepared_on: weakref.WeakSet[psycopg.Connection[Any]] = weakref.WeakSet()
        # The parameter types the server gave the prepared statement, and the last types a
        # call's values dumped to that matched them (most calls dump to the very same).
        self._param_types: tuple[int, ...] | None = None
        self._matching: tuple[int, ...] | None = None
        # A transformer keeps the dumpers it found for each parameter: one per concurrent call.
        self._transformers: Pool[abc.Transformer] = Pool(lambda: Transformer(_binding))

    @contextmanager
    def sent(self, conn: psycopg.Connection[Any], params: Mapping[str, Any]) -> Iterator[Reply]:
        """Send the statement with `params` on `conn` (in autocommit) and yield its Reply,
        which is read, if the caller did not read it, before the block ends.

        The connection's lock is not held across the block, which may read the reply and
        then run other queries; a query sent before the reply is read fails in libpq
        ("another command is already in progress").
        """
        if not conn.autocommit:
            raise psycopg.ProgrammingError("Statement.sent runs a statement of its own: use it in autocommit.")
        transformer = self._transformers.take()
        try:
            values = transformer.dump_sequence([params[name] for name in self._names], self._formats)
            types, formats = transformer.types, transformer.formats  # new lists each bind
        finally:
            self._transformers.give_back(transformer)
        with conn.lock:
            if conn not in self._prepared_on:
                self._prepare(conn)
            self._check_types(types)
            self._send(conn, values, formats)
        reply = Reply(conn, resend=lambda: self._resend(conn, values, formats))
        try:
            yield reply
        finally:
            reply.wait()

    def _prepare(self, conn: psycopg.Connection[Any]) -> None:
        conn.pgconn.send_prepare(self._name, self._sql)
        (result,) = conn.wait(generators.execute(conn.pgconn))
        # A duplicate was prepared by an earlier call that did not live to note it (interrupted
        # while waiting for the server's answer): this statement's own, as names are unique.
        if (
            result.status == pq.ExecStatus.FATAL_ERROR
            and result.error_field(pq.DiagnosticField.SQLSTATE) != _DUPLICATE_STATEMENT
        ):
            raise errors.error_from_result(result, encoding=conn.info.encoding)
        if self._param_types is None:
            conn.pgconn.send_describe_prepared(self._name)
            (described,) = conn.wait(generators.execute(conn.pgconn))
            if described.status == pq.ExecStatus.FATAL_ERROR:
                raise errors.error_from_result(described, encoding=conn.info.encoding)
            self._param_types = tuple(described.param_type(index) for index in range(described.nparams))
        self._prepared_on.add(conn)

    def _check_types(self, types: Sequence[int] | None) -> None:
        if types == self._matching:
            return
        assert types is not None and self._param_types is not None  # dumped; described when prepared
        for name, dumped, expected in zip(self._names, types, self._param_types, strict=True):
            if dumped and dumped != expected:  # 0: a NULL, which fits any type
                raise psycopg.ProgrammingError(
                    f"Parameter {name!r} dumps to type oid {dumped}, but the statement casts it to oid {expected}."
                )
        self._matching = tuple(types)

    def _send(self, conn: psycopg.Connection[Any], values: Sequence[abc.Buffer | None], formats: Any) -> None:
        conn.pgconn.send_query_prepared(self._name, values, param_formats=formats)
        conn.wait(generators.send(conn.pgconn))

    def _resend(self, conn: psycopg.Connection[Any], values: Sequence[abc.Buffer | None], formats: Any) -> None:
        """Prepare the statement again and send it again: the server did not know its name."""
        self._prepared_on.discard(conn)
        self._prepare(conn)
        self._send(conn, values, formats)


class Reply:
    """The server's answer to one sent statement: its rows (each value as the bytes of its
    text form), read off the connection once; `rows()` then gives them, or raises the
    server's error, as often as it is called."""

    def __init__(self, conn: psycopg.Connection[Any], *, resend: Callable[[], None]) -> None:
        self._conn = conn
        self._resend = resend
        self._read = False
        self._rows: list[Row] = []
        self._error: psycopg.Error | None = None

    def rows(self) -> list[Row]:
        """The rows the statement returned; raises the server's error as psycopg's exception."""
        self.wait()
        if self._error is not None:
            raise self._error
        return self._rows

    def wait(self) -> None:
        """Read the answer off the connection, if it has not been read yet."""
        if self._read:
            return
        # Read once, even if reading fails (a broken connection): the block's exit must not
        # try again and hide that error behind another.
        self._read = True
        with self._conn.lock:
            result = self._conn.wait(generators.fetch_many(self._conn.pgconn))[-1]
            if (
                result.status == pq.ExecStatus.FATAL_ERROR
                and result.error_field(pq.DiagnosticField.SQLSTATE) == _UNKNOWN_STATEMENT
            ):
                # psycopg deallocates every prepared statement after a rollback: prepare this
                # one again and send it again (it never ran: the server refused its name).
                self._resend()
                result = self._conn.wait(generators.fetch_many(self._conn.pgconn))[-1]
        if result.status in (pq.ExecStatus.TUPLES_OK, pq.ExecStatus.COMMAND_OK):  # rows, or none to give
            self._rows = [
                tuple(result.get_value(row, column) for column in range(result.nfields))
                for row in range(result.ntuples)
            ]
        elif result.status == pq.ExecStatus.FATAL_ERROR:
            self._error = errors.error_from_result(result, encoding=self._conn.info.encoding)
        else:
            self._error = psycopg.InterfaceError(f"unexpected answer to a prepared statement: {result.status.name}")
