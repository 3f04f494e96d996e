"""Live-updates benchmark: commit-to-websocket latency over 1,000 events, and one event fanned out
to 500 sockets on one thread, over channels-redis with two server processes.

Usage (from the repository root, with REDIS_URL pointing at a Redis and DATABASE_URL at a
PostgreSQL server; the data goes to a database of its own, ``quicksave_live_bench`` there)::

    .venv/bin/python bench/live.py
    .venv/bin/python bench/live.py --events 1000 --sockets 500 --rounds 5

Two uvicorn processes (A and B) serve Quicksave on loopback and share the channel layer in Redis.
An agent writes checkpoints to one thread through A's API, one after another.

- **Commit to websocket**: one socket on A and one on B watch the thread while `--events`
  checkpoints are written. An event's latency is the time from its checkpoint's `created_at`
  (stamped by the server just before the statement that writes and commits it, so the figure is
  an upper bound by that statement's time) until a socket has it; both sockets' deliveries count.
  The clock is shared: everything runs on this machine.
- **Fan-out**: `--sockets` sockets on the thread, half on A and half on B, all joined before the
  write; the time from one checkpoint's `created_at` until the last socket has its event. The
  figure is the median of `--rounds` writes.

The sockets are held by this one process (one asyncio loop), so a busy loop here adds to the
figures. On a shared, loaded machine the figures vary from run to run; the load average is
printed with them. The last line printed is one JSON object with `commit_to_ws_p50_ms`,
`commit_to_ws_p95_ms` and `fanout_500_ms`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import psycopg
import websockets

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from quicksave.serving import UVICORN_OPTIONS  # noqa: E402  (the project root first on the path)

DATABASE = "quicksave_live_bench"
AGENT = "bench-live"
P95_TARGET_MS = 50.0
FANOUT_TARGET_MS = 1000.0
CONNECT_BATCH = 50


def database_url() -> str:
    """DATABASE_URL's server, with the benchmark's own database (created when missing)."""
    server = os.environ.get("DATABASE_URL") or "postgresql://postgres@127.0.0.1:5432/postgres"
    parts = urlsplit(server)
    with psycopg.connect(urlunsplit((*parts[:2], "/postgres", parts.query, "")), autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [DATABASE]).fetchone() is None:
            conn.execute(f"CREATE DATABASE {DATABASE}")
    return urlunsplit((*parts[:2], f"/{DATABASE}", parts.query, ""))


def prepare(env: dict[str, str]) -> str:
    """Migrate the benchmark database and return a new key for the benchmark's agent."""
    script = (
        "import django; django.setup(); from django.core.management import call_command; "
        "call_command('migrate', verbosity=0); "
        "from quicksave_agents.keys import create_agent_key, get_or_create_agent; "
        f"print(create_agent_key(agent=get_or_create_agent(name={AGENT!r}), label='bench/live.py')[1])"
    )
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                            check=True)  # fmt: skip
    return result.stdout.strip().splitlines()[-1]


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_server(port: int, env: dict[str, str], log: Any) -> subprocess.Popen[bytes]:
    process = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "quicksave.asgi:application", "--host", "127.0.0.1", "--port", str(port),
         "--log-level", "warning", "--no-access-log", *UVICORN_OPTIONS],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=log,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server on :{port} exited (its log: {log.name})")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                return process
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    process.kill()
    raise RuntimeError(f"the server on :{port} did not answer /healthz within 60 s")


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def stamp(created_at: str) -> float:
    return datetime.fromisoformat(created_at.replace("Z", "+00:00")).timestamp()


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


class Watcher:
    """A socket on one server that notes when each checkpoint's event arrives (wall clock)."""

    def __init__(self, port: int, thread_id: str, key: str) -> None:
        # From the start: the replay brings the thread's first checkpoint, which no figure counts.
        self.url = f"ws://127.0.0.1:{port}/ws/threads/{thread_id}/?after_seq=0"
        self.headers = {"Authorization": f"Bearer {key}", "Origin": f"http://127.0.0.1:{port}"}
        self.arrived: dict[str, float] = {}
        self.socket: Any = None

    async def open(self) -> None:
        # Joined to the thread's group once the handshake is over (the consumer joins, then accepts).
        self.socket = await websockets.connect(self.url, additional_headers=self.headers, max_queue=None,
                                               ping_interval=None)  # fmt: skip

    async def listen(self, count: int) -> None:
        """Note arrivals until `count` checkpoints' events have come (the replayed first one included)."""
        while len(self.arrived) < count:
            event = json.loads(await self.socket.recv())
            if event.get("type") == "checkpoint.created":
                self.arrived.setdefault(event["data"]["checkpoint"], time.time())

    async def close(self) -> None:
        await self.socket.close()


class Writer:
    """The agent: one checkpoint after another through server A's API."""

    def __init__(self, api: httpx.AsyncClient, thread_id: str) -> None:
        self.api = api
        self.thread_id = thread_id
        self.head: str | None = None
        self.created: dict[str, float] = {}

    async def write(self, i: int) -> str:
        body: dict[str, Any] = (
            {"parent": None, "state": {"messages": []}} if self.head is None
            else {"parent": self.head, "step": i, "label": "bench",
                  "patch": [{"op": "add", "path": "/messages/-", "value": {"role": "assistant", "content": f"m{i}"}}]}
        )  # fmt: skip
        response = await self.api.post(f"/api/v1/threads/{self.thread_id}/checkpoints/", json=body)
        response.raise_for_status()
        summary = response.json()
        self.head = summary["id"]
        self.created[summary["id"]] = stamp(summary["created_at"])
        return str(summary["id"])


async def commit_to_ws(ports: list[int], key: str, events: int) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{ports[0]}", timeout=30,
                                 headers={"Authorization": f"Bearer {key}"}) as api:  # fmt: skip
        thread = (await api.post("/api/v1/threads/", json={"external_id": f"latency-{time.time_ns()}"})).json()
        writer = Writer(api, thread["id"])
        await writer.write(0)  # the first checkpoint, before anyone watches
        watchers = [Watcher(port, thread["id"], key) for port in ports]
        for watcher in watchers:
            await watcher.open()
        listening = [asyncio.create_task(w.listen(events + 1)) for w in watchers]
        written = [await writer.write(i) for i in range(1, events + 1)]
        async with asyncio.timeout(60):
            await asyncio.gather(*listening)
        for watcher in watchers:
            await watcher.close()
    per_server = [[(w.arrived[c] - writer.created[c]) * 1000 for c in written] for w in watchers]
    every = [ms for server in per_server for ms in server]
    return {
        "p50": statistics.median(every),
        "p95": percentile(every, 0.95),
        "max": max(every),
        "by_server": [{"p50": statistics.median(s), "p95": percentile(s, 0.95)} for s in per_server],
    }


async def fanout(ports: list[int], key: str, sockets: int, rounds: int) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{ports[0]}", timeout=30,
                                 headers={"Authorization": f"Bearer {key}"}) as api:  # fmt: skip
        thread = (await api.post("/api/v1/threads/", json={"external_id": f"fanout-{time.time_ns()}"})).json()
        writer = Writer(api, thread["id"])
        await writer.write(0)
        watchers = [Watcher(ports[i % len(ports)], thread["id"], key) for i in range(sockets)]
        opened = time.monotonic()
        for start in range(0, sockets, CONNECT_BATCH):
            await asyncio.gather(*(w.open() for w in watchers[start : start + CONNECT_BATCH]))
        print(f"    {sockets} sockets open in {time.monotonic() - opened:.1f} s", flush=True)
        figures = []
        for round_number in range(1, rounds + 1):
            listening = [asyncio.create_task(w.listen(round_number + 1)) for w in watchers]
            written = await writer.write(round_number)
            async with asyncio.timeout(60):
                await asyncio.gather(*listening)
            last = max(w.arrived[written] for w in watchers)
            first = min(w.arrived[written] for w in watchers)
            figures.append((last - writer.created[written]) * 1000)
            print(f"    round {round_number}: first socket {(first - writer.created[written]) * 1000:.1f} ms, "
                  f"all {sockets} {figures[-1]:.1f} ms", flush=True)  # fmt: skip
        await asyncio.gather(*(w.close() for w in watchers))
    return {"median": statistics.median(figures), "rounds": figures}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1000)
    parser.add_argument("--sockets", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    redis_url = os.environ.get("REDIS_URL")
    if not redis_url:
        sys.exit("bench/live.py measures channels-redis: set REDIS_URL")
    env = {**os.environ, "DATABASE_URL": database_url(), "REDIS_URL": redis_url, "QUICKSAVE_EMBEDDED_WORKER": "false",
           "DJANGO_SETTINGS_MODULE": "quicksave.settings", "LOG_LEVEL": "WARNING"}  # fmt: skip
    key = prepare(env)
    load_before = os.getloadavg()
    ports = [free_port(), free_port()]
    with tempfile.NamedTemporaryFile("wb", prefix="live-a-", suffix=".log", delete=False) as log_a, \
         tempfile.NamedTemporaryFile("wb", prefix="live-b-", suffix=".log", delete=False) as log_b:  # fmt: skip
        servers = [start_server(ports[0], env, log_a), start_server(ports[1], env, log_b)]
        try:
            print(f"==> commit to websocket: {args.events} checkpoints through A, one socket on A and one on B",
                  flush=True)  # fmt: skip
            latency = asyncio.run(commit_to_ws(ports, key, args.events))
            print(f"    p50 {latency['p50']:.1f} ms, p95 {latency['p95']:.1f} ms (target <= {P95_TARGET_MS:.0f} ms), "
                  f"max {latency['max']:.1f} ms; on A p95 {latency['by_server'][0]['p95']:.1f} ms, "
                  f"on B p95 {latency['by_server'][1]['p95']:.1f} ms", flush=True)  # fmt: skip
            print(f"==> fan-out: one checkpoint to {args.sockets} sockets (half on A, half on B), "
                  f"{args.rounds} rounds", flush=True)  # fmt: skip
            spread = asyncio.run(fanout(ports, key, args.sockets, args.rounds))
            print(f"    median {spread['median']:.1f} ms (target <= {FANOUT_TARGET_MS:.0f} ms)", flush=True)
        finally:
            for server in servers:
                stop(server)
    load_after = os.getloadavg()
    print(f"load average (1 min) before {load_before[0]:.2f}, after {load_after[0]:.2f} on {os.cpu_count()} cores: "
          "a shared machine's figures vary from run to run", flush=True)  # fmt: skip
    print(json.dumps({
        "commit_to_ws_p50_ms": round(latency["p50"], 2),
        "commit_to_ws_p95_ms": round(latency["p95"], 2),
        "commit_to_ws_p95_target_ratio": round(latency["p95"] / P95_TARGET_MS, 3),
        "fanout_500_ms" if args.sockets == 500 else f"fanout_{args.sockets}_ms": round(spread["median"], 2),
        "fanout_target_ratio": round(spread["median"] / FANOUT_TARGET_MS, 3),
        "events": args.events, "sockets": args.sockets, "rounds": args.rounds,
        "loadavg_1m": [round(load_before[0], 2), round(load_after[0], 2)],
    }))  # fmt: skip


if __name__ == "__main__":
    main()
