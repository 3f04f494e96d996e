"""Quicksave's contenders for bench/checkpoint_store.py: the store by patch, by full state, and over HTTP.

Each runs the workload of :mod:`bench.peers` against the same `quicksave_bench`
database as the peers, with Quicksave's schema migrated into it. Storage is
`pg_total_relation_size` of every table a checkpoint write touches (checkpoints,
events, threads, branches), measured on tables emptied before each run.
"""

from __future__ import annotations

import gc
import http.client
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from bench.peers import (
    BENCH_DB_NAME,
    Result,
    ensure_bench_database,
    median_ms,
    server_url,
    settle,
    window_cps,
    workload,
)
from quicksave.serving import UVICORN_OPTIONS

ROOT = Path(__file__).resolve().parent.parent
TABLES = (
    "checkpoints_checkpoint", "checkpoints_event", "checkpoints_thread", "checkpoints_branch", "checkpoints_threadkey",
    "checkpoints_materialisedhead", "checkpoints_snapshotchunk",
)  # fmt: skip
READS = 21


def bench_database_url() -> str:
    ensure_bench_database()
    parts = urlsplit(server_url())
    return urlunsplit((parts.scheme, parts.netloc, f"/{BENCH_DB_NAME}", parts.query, ""))


def bench_redis_url() -> str:
    """REDIS_URL for the channel layer (the HTTP contender's live events): the environment's, else
    a local server on 6379 if one answers."""
    import redis

    url = os.environ.get("BENCH_REDIS_URL") or "redis://127.0.0.1:6379/15"
    try:
        redis.Redis.from_url(url, socket_connect_timeout=0.5).ping()
    except redis.RedisError:
        print(f"[note] no Redis at {url}: live events go through the in-memory channel layer", flush=True)
        return ""
    return url


def setup_django() -> None:
    """Point Django at the bench database and migrate Quicksave's schema into it (once)."""
    import django
    from django.conf import settings

    if settings.configured:
        return
    os.environ["DATABASE_URL"] = bench_database_url()
    os.environ.setdefault("REDIS_URL", bench_redis_url())
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "quicksave.settings")
    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def _reset() -> Any:
    from django.db import connection

    from checkpoints import storage
    from quicksave_agents.keys import get_or_create_agent

    storage.clear_caches()
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {', '.join(TABLES)}, checkpoints_toolresult CASCADE")
    return get_or_create_agent(name="bench")


def _bytes() -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT sum(pg_total_relation_size(t::regclass)) FROM unnest(%s::text[]) t", [list(TABLES)])
        row = cursor.fetchone()
    return int(row[0]) if row else 0


def _reads(thread: Any, written: list[Any], steps: int, name: str, cps: float, t0: float,
           stamps: list[float], extra: dict[str, Any]) -> Result:  # fmt: skip
    """Latest-state, random state-at and history timings, each from a cold cache like a fresh reader."""

    from checkpoints import selectors, storage
    from checkpoints.storage import crypto

    work = list(workload(steps))

    def latest() -> dict[str, Any]:
        storage.clear_caches()
        crypto.forget_keys()
        return storage.latest_state(thread=thread)[1]

    # The first read is the truly cold one: it replays the deltas since the last snapshot and
    # saves the head's state as the branch's materialised head (storage._materialise_head).
    # The median that follows reads the same head again, so it measures reading that saved
    # state: it helps only a head read more than once, which this repetition favours.
    started = time.perf_counter()
    state = latest()
    first_ms = (time.perf_counter() - started) * 1000
    assert state["step"] == steps and len(state["messages"]) == steps
    assert state["messages"][-1] == work[-1].message and state["facts"] == work[-1].facts
    latest_ms = median_ms(latest, READS)
    storage.latest_state(thread=thread)
    warm_ms = median_ms(lambda: storage.latest_state(thread=thread), READS)

    rng = random.Random(steps)
    samples = []
    for _ in range(READS):
        k = rng.randint(1, steps - 1)
        storage.clear_caches()
        crypto.forget_keys()
        started = time.perf_counter()
        at = storage.state_at(written[k])
        samples.append((time.perf_counter() - started) * 1000)
        assert at["step"] == k and len(at["messages"]) == k and at["facts"] == work[k - 1].facts

    branch = thread.active_branch
    history_ms = median_ms(lambda: selectors.timeline(thread=thread, branch=branch, limit=steps + 1), 5)
    return Result(
        name=name, steps=steps, cps=cps, bytes_per_cp=_bytes() / steps, latest_read_ms=latest_ms,
        state_at_ms=statistics.median(samples), history_ms=history_ms,
        extra={**extra, **window_cps(t0, stamps), "latest_read_first_ms": round(first_ms, 3),
               "latest_read_warm_ms": round(warm_ms, 3)},
    )  # fmt: skip


def run_store(steps: int, *, full_state: bool, encrypted: bool = False) -> Result:
    """Write the workload through `storage.append_checkpoint`, by patch or by full state, into a
    thread with a data key (every payload sealed with AES-256-GCM) or without one."""
    setup_django()
    from django.test import override_settings

    from checkpoints import storage
    from checkpoints.models import Checkpoint, PayloadKind

    agent = _reset()
    with override_settings(QUICKSAVE_ENCRYPT=encrypted):
        thread, _ = storage.create_thread(agent=agent)
    work = list(workload(steps))
    state: dict[str, Any] = {"messages": [], "step": 0, "facts": {}}
    parent = storage.append_checkpoint(thread=thread, parent=None, state=state, step=0)
    written = [parent]
    gc.collect()
    stamps: list[float] = []
    t0 = time.perf_counter()
    for s in work:
        if full_state:
            state["messages"].append(s.message)  # the agent's own state object, as an agent would keep it
            state = {"messages": state["messages"], "step": s.step, "facts": s.facts}
            parent = storage.append_checkpoint(thread=thread, parent=parent, state=state, step=s.step)
        else:
            ops: list[dict[str, Any]] = [
                {"op": "add", "path": "/messages/-", "value": s.message},
                {"op": "replace", "path": "/step", "value": s.step},
                {"op": "replace", "path": "/facts", "value": s.facts},
            ]
            parent = storage.append_checkpoint(thread=thread, parent=parent, patch=ops, step=s.step)
        written.append(parent)
        stamps.append(time.perf_counter())
    cps = steps / (stamps[-1] - t0)
    snapshots = Checkpoint.objects.filter(thread=thread, kind=PayloadKind.SNAPSHOT).count()
    thread.refresh_from_db()
    name = "quicksave_full_state" if full_state else "quicksave_encrypted" if encrypted else "quicksave"
    return _reads(thread, written, steps, name, cps, t0, stamps, {"snapshots": snapshots})


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_http(steps: int) -> Result:
    """POST the workload as patches to a running ASGI server (uvicorn) over one keep-alive connection.

    The client is the standard library's http.client: the figure is the server's, not a client library's.
    """
    setup_django()
    from quicksave_agents.keys import create_agent_key

    agent = _reset()
    _, key = create_agent_key(agent=agent)
    port = _free_port()
    env = {**os.environ, "DATABASE_URL": bench_database_url(), "LOG_LEVEL": "WARNING"}
    server = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "quicksave.asgi:application", "--port", str(port),
         "--no-access-log", "--log-level", "warning", *UVICORN_OPTIONS],
        cwd=ROOT, env=env,
    )  # fmt: skip
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

    def call(method: str, path: str, body: Any = None) -> tuple[int, Any]:
        connection.request(method, path, body=json.dumps(body) if body is not None else None, headers=headers)
        response = connection.getresponse()
        return response.status, json.loads(response.read() or b"null")

    try:
        for _ in range(300):
            try:
                if call("GET", "/healthz")[0] == 200:
                    break
            except OSError:
                connection.close()
                time.sleep(0.1)
        _, thread = call("POST", "/api/v1/threads/", {"agent": "bench"})
        url = f"/api/v1/threads/{thread['id']}/checkpoints/"
        _, first = call("POST", url, {"parent": None, "state": {"messages": [], "step": 0, "facts": {}}})
        parent = first["id"]
        latencies: list[float] = []
        stamps: list[float] = []
        t0 = time.perf_counter()
        for s in workload(steps):
            body = {
                "parent": parent, "step": s.step,
                "patch": [
                    {"op": "add", "path": "/messages/-", "value": s.message},
                    {"op": "replace", "path": "/step", "value": s.step},
                    {"op": "replace", "path": "/facts", "value": s.facts},
                ],
            }  # fmt: skip
            started = time.perf_counter()
            status, written = call("POST", url, body)
            done = time.perf_counter()
            assert status == 201, written
            parent = written["id"]
            latencies.append((done - started) * 1000)
            stamps.append(done)
        cps = steps / (stamps[-1] - t0)
        _, latest = call("GET", f"/api/v1/checkpoints/{parent}/")
        assert latest["state"]["step"] == steps and len(latest["state"]["messages"]) == steps
    finally:
        connection.close()
        server.terminate()
        server.wait(timeout=30)
    p99 = statistics.quantiles(latencies, n=100)[98]
    return Result(
        name="quicksave_http", steps=steps, cps=cps, bytes_per_cp=_bytes() / steps, latest_read_ms=float("nan"),
        state_at_ms=float("nan"), history_ms=float("nan"),
        extra={"p99_ms": round(p99, 2), "p50_ms": round(statistics.median(latencies), 2), **window_cps(t0, stamps)},
    )  # fmt: skip


def run_quicksave(steps: int) -> list[Result]:
    """Each of Quicksave's contenders, each from flushed pages like every other contender."""
    runs: tuple[Callable[[], Result], ...] = (
        lambda: run_store(steps, full_state=False),
        lambda: run_store(steps, full_state=False, encrypted=True),
        lambda: run_store(steps, full_state=True),
        lambda: run_http(steps),
    )
    results = []
    for run in runs:
        settle()
        results.append(run())
    return results
