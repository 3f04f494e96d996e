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
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from django.db import connection
from django.db.backends.utils import CursorWrapper
from psycopg import pq
from psycopg.types.json import set_json_loads
from psycopg.types.numeric import Int8BinaryDumper, Int8Dumper

from checkpoints.storage import codec


@contextlib.contextmanager
def cursor(*, json: bool = False) -> Iterator[CursorWrapper]:
    """Django's cursor on the default connection, returning binary results and sending ints as int8."""
    with connection.cursor() as wrapper:
        driver = wrapper.cursor  # the psycopg cursor Django wraps
        driver.format = pq.Format.BINARY
        driver.adapters.register_dumper(int, Int8Dumper)
        driver.adapters.register_dumper(int, Int8BinaryDumper)
        if json:
            set_json_loads(codec.loads, driver)
        yield wrapper
