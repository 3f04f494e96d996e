"""The embedded default: a private PostgreSQL from the `pgserver` wheel under var/.

Used only when DATABASE_URL is unset, so a fresh clone runs with no system
database. The server outlives the Python process (cleanup_mode=None) and is
reused by the next process that asks for the same data directory.
"""

from __future__ import annotations

import fcntl
from pathlib import Path


def embedded_database_url(var_dir: Path) -> str:
    """Start (or reuse) the embedded server and return a URL for database `quicksave`."""
    import pgserver  # imported lazily: only the embedded default needs it

    var_dir.mkdir(parents=True, exist_ok=True)
    pgdata = var_dir / "pgdata"
    # Several processes (server, worker, tests) may start at once: one at a time
    # initialises and starts the cluster, the rest reuse it.
    with open(var_dir / "pgserver.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        server = pgserver.get_server(pgdata, cleanup_mode=None)  # type: ignore[attr-defined]
        exists = server.psql("SELECT 1 FROM pg_database WHERE datname = 'quicksave';")
        if "(1 row)" not in exists:
            server.psql("CREATE DATABASE quicksave;")
    return f"postgresql://postgres@/quicksave?host={pgdata}"
