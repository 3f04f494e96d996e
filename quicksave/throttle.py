"""Throttling of repeated authentication failures per client address, shared across processes.

A failure (an unknown or revoked agent key, a failed sign-in) is one upsert into
quicksave_authfailurewindow; past QUICKSAVE_AUTH_FAILURES_PER_MINUTE failures in a window of
one minute from the first, the address gets 429 until the window ends. A successful
authentication with an agent key costs no query here.
"""

from __future__ import annotations

import math

from django.conf import settings
from django.db import connection

from quicksave.models import AuthFailureWindow

WINDOW_SECONDS = 60
# Rows of addresses that have been quiet this long are deleted when a new window opens.
STALE_SECONDS = 600

_TABLE = AuthFailureWindow._meta.db_table
_NOTE_FAILURE = f"""
    INSERT INTO {_TABLE} AS f (address, window_start, failures) VALUES (%(address)s, now(), 1)
    ON CONFLICT (address) DO UPDATE SET
        failures = CASE WHEN f.window_start > now() - make_interval(secs => %(window)s) THEN f.failures + 1 ELSE 1 END,
        window_start = CASE WHEN f.window_start > now() - make_interval(secs => %(window)s)
                            THEN f.window_start ELSE now() END
    RETURNING failures, EXTRACT(EPOCH FROM f.window_start + make_interval(secs => %(window)s) - now())
"""
_RECENT_FAILURES = f"""
    SELECT failures, EXTRACT(EPOCH FROM window_start + make_interval(secs => %(window)s) - now())
    FROM {_TABLE} WHERE address = %(address)s AND window_start > now() - make_interval(secs => %(window)s)
"""
_DELETE_STALE = f"DELETE FROM {_TABLE} WHERE window_start < now() - make_interval(secs => %(stale)s)"


def _key(address: str | None) -> str:
    return (address or "unknown")[:64]


def _limit() -> int:
    limit: int = settings.QUICKSAVE_AUTH_FAILURES_PER_MINUTE
    return limit


def note_failure(address: str | None) -> int | None:
    """Count one failed authentication from `address`; the seconds to wait if it is now over the limit."""
    with connection.cursor() as cursor:
        cursor.execute(_NOTE_FAILURE, {"address": _key(address), "window": WINDOW_SECONDS})
        failures, remaining = cursor.fetchone()
        if failures == 1:
            cursor.execute(_DELETE_STALE, {"stale": STALE_SECONDS})
    if failures <= _limit():
        return None
    return max(1, math.ceil(remaining))


def retry_after(address: str | None) -> int | None:
    """The seconds `address` must wait before trying again, or None when it may try now.

    For sign-in, checked before the password: otherwise a guess that happened to be right
    would still get in after the limit.
    """
    with connection.cursor() as cursor:
        cursor.execute(_RECENT_FAILURES, {"address": _key(address), "window": WINDOW_SECONDS})
        row = cursor.fetchone()
    if row is None or row[0] < _limit():
        return None
    return max(1, math.ceil(row[1]))
