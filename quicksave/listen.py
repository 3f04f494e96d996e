"""LISTEN for a PostgreSQL notification channel over a connection of its own.

LISTEN must sit outside Django's transactions, and it needs a session of its own: through a
transaction pooler (PgBouncer in transaction mode) the session would be handed to someone else
between statements and the listener never woken. So every listener connects to
settings.DATABASE_LISTEN: DATABASE_LISTEN_URL, a direct connection to PostgreSQL, else
DATABASE_URL's. (NOTIFY, sent inside the notifying transaction, works through a pooler.)

Open it before looking for work, so work queued between the look and the wait still wakes the
waiter. The worker's run queue (`quicksave_agents.runs`) and the notifications dispatcher listen
through it.
"""

from __future__ import annotations

import re
from typing import Any

import psycopg
from django.conf import settings
from psycopg import sql
from psycopg.conninfo import make_conninfo

_PLAIN_NAME = re.compile(r"[a-z_][a-z0-9_]*")


class Listener:
    """A LISTEN on `channel`: `wait` blocks until a notification or a timeout."""

    def __init__(self, channel: str) -> None:
        if not _PLAIN_NAME.fullmatch(channel):
            raise ValueError(f"A channel is a lower-case identifier, got {channel!r}")
        db = settings.DATABASE_LISTEN
        # The URL's connection options (sslmode, say) too; not the pool's or psycopg's own settings.
        options = {key: value for key, value in db["OPTIONS"].items() if isinstance(value, str)}
        self._channel = channel
        self._conninfo = make_conninfo(
            dbname=db["NAME"], user=db["USER"] or None, password=db["PASSWORD"] or None,
            host=db["HOST"] or None, port=db["PORT"] or None, **options,
        )  # fmt: skip
        self._connection: psycopg.Connection[Any] | None = None

    def __enter__(self) -> Listener:
        self._open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _open(self) -> psycopg.Connection[Any]:
        if self._connection is None or self._connection.closed:
            self._connection = psycopg.connect(self._conninfo, autocommit=True)
            self._connection.execute(sql.SQL(f"LISTEN {self._channel}"))  # a plain name: checked above
        return self._connection

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def wait(self, timeout: float) -> bool:
        """Block until notified or `timeout` seconds pass; True when woken by a notification.
        Opens the connection again if it was closed (after a psycopg.Error, say)."""
        woken = False
        for _ in self._open().notifies(timeout=timeout, stop_after=1):
            woken = True
        return woken
