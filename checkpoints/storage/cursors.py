"""The storage engine's cursor: Django's own, set up the way the engine's statements want it.

Every statement of the engine runs on a cursor from `connection.cursor()`, so Django's query log,
`CaptureQueriesContext`, the debug toolbar, `connection.execute_wrapper` and OpenTelemetry's
Django and psycopg instrumentations see it. On it, through psycopg's public cursor API:

- results come in PostgreSQL's binary format (`Cursor.format`): a replay reads dozens of rows of
  uuids, timestamps and bytea payloads, which psycopg loads from binary in C but parses from
  text in Python (timestamps) or decodes from hex (bytea); binary halves a replay's client CPU;
- a Python int is sent as int8 whatever its value: psycopg would send int2, int4 or int8 by
  value, and each combination of parameter types is a statement of its own to prepare, so a
  thread's growing sizes would prepare the append again each time one crossed a boundary
  (every engine statement casts its integer parameters, so int8 is what each asks for anyway);
- with `json=True`, jsonb values are parsed by the codec that stores every JSON value
  (Django's own cursors leave jsonb as text for its JSONField to parse).

The hottest statements (the append, the insert of tool results, LangGraph's newest-checkpoint
read) each run on a cursor of their own kept with the connection object they run on
(`kept_cursor`): psycopg's cursor remembers the dumper it found for each parameter's type and the
statement it prepared, which a new cursor looks up again each time (about 180,000 instructions of
a one-row tool-result insert's 420,000), and Django's wrapper around it is made once. It is kept
with the connection object rather than the thread: LangGraph runs a graph's checkpoint writes on
threads it starts for every run, which borrow the process's lent connections (`lent_connection`),
so a cursor kept by the thread was made afresh for nearly every write. A connection object serves
one thread at a time, and so do its cursors. One is made again
whenever it would no longer be the cursor `connection.cursor()` gives: another connection (a new
request's, from the pool), a closed one, or the query log switched on or off
(`CaptureQueriesContext`, `DEBUG`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from django.db import DEFAULT_DB_ALIAS, connection, connections
from django.db.backends.utils import CursorDebugWrapper, CursorWrapper
from psycopg import pq
from psycopg.types.json import set_json_loads
from psycopg.types.numeric import Int8BinaryDumper, Int8Dumper

from checkpoints.storage import codec


@contextlib.contextmanager
def cursor(*, json: bool = False) -> Iterator[CursorWrapper]:
    """Django's cursor on the default connection, returning binary results and sending ints as int8."""
    with connection.cursor() as wrapper:
        _set_up(wrapper, json=json)
        yield wrapper


# The attribute of a connection object that holds its kept cursor (of each role but the writes').
_KEPT = "quicksave_kept_cursor"


def kept_cursor(role: str = "") -> CursorWrapper:
    """`cursor()`'s kind of cursor, kept with this thread's connection object for its next
    statement; not to be closed. Each hot statement keeps one of its own, under a `role` (the
    append the default one): psycopg's cursor keeps the dumpers it found for each parameter
    position and the loaders of the results it last read, so statements of other shapes taking
    turns on one cursor each found them again (the append, the pending writes' insert and
    LangGraph's newest-checkpoint read on one cursor cost 0.29 M instructions a step more than
    on three: docs/langgraph-benchmark.md)."""
    db = connections[DEFAULT_DB_ALIAS]
    db.ensure_connection()
    kept = f"{_KEPT}_{role}" if role else _KEPT
    wrapper: CursorWrapper | None = getattr(db, kept, None)
    if (
        wrapper is None
        or wrapper.cursor.closed
        or wrapper.cursor.connection is not db.connection
        or isinstance(wrapper, CursorDebugWrapper) is not db.queries_logged
    ):
        wrapper = db.cursor()
        _set_up(wrapper, json=False)
        setattr(db, kept, wrapper)
    return wrapper


@contextlib.contextmanager
def unprepared(wrapper: CursorWrapper) -> Iterator[CursorWrapper]:
    """Run the block's statements on `wrapper` without preparing them: the server plans each
    execution with its parameters and the tables' statistics of the moment.

    For a statement whose good plan depends on how large a table has grown: psycopg prepares a
    statement once it has run `prepare_threshold` times, and PostgreSQL then settles on a generic
    plan, which a connection the process keeps for its whole life keeps too. One made while the
    tables were young (a new installation, a table just emptied) stays the plan of a table of a
    few rows. The connection's other statements stay prepared.
    """
    driver = wrapper.cursor.connection  # the psycopg connection under Django's cursor
    threshold = driver.prepare_threshold
    driver.prepare_threshold = None  # psycopg's public switch: None prepares nothing
    try:
        yield wrapper
    finally:
        driver.prepare_threshold = threshold


def _set_up(wrapper: CursorWrapper, *, json: bool) -> None:
    driver = wrapper.cursor  # the psycopg cursor Django wraps
    driver.format = pq.Format.BINARY
    driver.adapters.register_dumper(int, Int8Dumper)
    driver.adapters.register_dumper(int, Int8BinaryDumper)
    if json:
        set_json_loads(codec.loads, driver)
