"""Load and soak benchmark: many agents writing, reviewers deciding and sockets watching, against 1, 2
and 4 server processes with 2 workers, then a soak at 2 processes.

Usage (from the repository root, with REDIS_URL pointing at a Redis and DATABASE_URL at a PostgreSQL
server; the data goes to a database of its own there, ``quicksave_load_bench``, unless
``--database-url`` names one already migrated)::

    .venv/bin/python bench/load.py                                       # the issue's size: about 35 minutes
    .venv/bin/python bench/load.py --agents 20 --reviewers 4 --sockets 20 --minutes 0.5 --soak-minutes 1

Everything runs on loopback, as real processes this script starts and stops (SIGTERM, then SIGKILL
after a timeout), with ``MALLOC_ARENA_MAX=2`` as the production image sets it unless the bench's own
environment says otherwise: P uvicorn processes (``quicksave.asgi``), each on a port of its own, clients
spread over them round-robin, sharing the channel layer in Redis; and W ``manage.py run_agents
--agent demo-travel`` workers. For each setting of ``--processes`` (1, 2 and 4) the load runs for
``--minutes``; then, at 2 processes, for ``--soak-minutes``. In each:

- **Agents** (``--agents``): each its own agent with its own key (``load-NNN``), one thread each,
  writing a checkpoint (a patch that adds a message and keeps the last 20) after a think time of
  ``--think`` seconds on average (uniform from half to one and a half times). A write's latency is
  its request's round trip; checkpoints a second count these writes (the workers' checkpoints of
  the travel threads come on top). A write the server refuses, or a request that fails, is an error.
- **Reviewers** (``--reviewers``): each a person with the reviewer role, signed in once through the
  sign-in page (a session), deciding pending approvals through ``/api/v1/approvals/`` every
  ``--review-think`` seconds on average. The approvals come from the demo travel agent, which the
  workers drive: the bench starts its threads the way ``seed_demo`` does (``start_thread``, there is
  no HTTP route that starts an in-process agent), keeping two per reviewer waiting, one more for each
  decision. Two reviewers deciding the same approval is the service working (one gets 409
  ``already_decided``): counted apart, not as an error.
  **Decision to resume**: until the ``created_at`` of the thread's next checkpoint, which the worker
  that resumed it stamped just before writing it, from the approval's ``decided_at``, which the
  server stamps as it starts deciding (an upper bound: it counts the decision's whole transaction);
  and, as a lower bound, from the moment the decision's 200 is back (the worker, woken by NOTIFY at
  the commit, may write before the response has crossed loopback, so this one can be negative). A
  decision whose thread is not resumed within a grace time after the phase is an error.
- **Sockets** (``--sockets``): socket j watches agent j's thread (modulo the agents) from
  ``after_seq=0`` on a server other than the one that agent writes through (with several), so its
  events cross processes. Every message's ``seq`` must be the previous one plus one: a gap, a repeat or a step
  back counts in ``ws_lost``, and so does every event of the thread that has not arrived a grace
  time after the writes stopped. A socket closed by the server is an error (it reconnects from its
  last seq, as the dashboard does).
- **Errors** also count every exception a server or worker logged (a traceback in its log), even
  one no client saw.
- **Resident memory** (``VmRSS``) of every server and worker process: at minute 1 of the soak (at
  half the soak when it is shorter than 2 minutes), every minute after it and at its end;
  ``soak_rss_growth`` is the largest growth among them from the first sample to the last, and
  ``soak_rss_growth_second_half`` the largest from the sample halfway through to the last: memory
  that fills a bound early and then holds (a warm cache) grows in the first, not the second; a leak
  grows in both.

The sockets, agents and reviewers share this one process's asyncio loop; on a machine short of
cores this process, the servers, the workers and PostgreSQL compete, so the figures are those of
the whole machine. The load average is printed with them. The last line printed is one JSON object
with ``load_cps_1``, ``load_cps_2``, ``load_cps_4``, ``load_p99_ms_2``, ``load_errors``,
``ws_lost``, ``soak_rss_growth`` and ``soak_rss_growth_second_half`` (null for a setting or soak not run).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import random
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import httpx
import psycopg
import websockets

# Run as a script, bench/ heads sys.path and bench/langgraph.py would shadow the real
# `langgraph` package: drop that folder and put the project root there instead.
_HERE = Path(__file__).resolve().parent
ROOT = _HERE.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from quicksave.serving import UVICORN_OPTIONS  # noqa: E402  (the project root first on the path)

DATABASE = "quicksave_load_bench"
TRAVEL = "demo-travel"  # the demo travel agent (quicksave_agents.demo.TravelAgent)
# Messages an agent's state keeps: its state stays the same size however long the soak.
WINDOW = 20
# After the writes stop: how long sockets may take to catch up, and workers to resume what was decided.
GRACE_SECONDS = 30.0
STOP_SECONDS = 20.0
CONNECT_BATCH = 50
SOAK_PROCESSES = 2
# Bounds on the counts (the durations are bounded in main): a bench, not a load generator for hire.
MAX_AGENTS, MAX_REVIEWERS, MAX_SOCKETS = 2000, 200, 5000
RSS_GROWTH_TARGET = 0.10
RSS_EVERY_SECONDS = 60.0

T = TypeVar("T")


# --- processes ------------------------------------------------------------------------------------


def database_url(explicit: str | None) -> str:
    """`--database-url`, or DATABASE_URL's server with the benchmark's own database (created when
    missing)."""
    if explicit:
        return explicit
    server = os.environ.get("DATABASE_URL") or "postgresql://postgres@127.0.0.1:5432/postgres"
    parts = urlsplit(server)
    with psycopg.connect(urlunsplit((*parts[:2], "/postgres", parts.query, "")), autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [DATABASE]).fetchone() is None:
            conn.execute(f"CREATE DATABASE {DATABASE}")
    return urlunsplit((*parts[:2], f"/{DATABASE}", parts.query, ""))


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def rss_kib(pid: int) -> int:
    """The process's resident memory (VmRSS) in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for process {pid}")


@dataclass
class Process:
    role: str  # "server :port" or "worker n"
    popen: subprocess.Popen[bytes]
    log: Path

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:] if self.log.exists() else ""


def stop(processes: list[Process]) -> None:
    """SIGTERM to all, as an operator stops them; SIGKILL to those not gone within STOP_SECONDS."""
    for process in processes:
        if process.popen.poll() is None:
            process.popen.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_SECONDS
    for process in processes:
        try:
            process.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.popen.kill()
            process.popen.wait(timeout=STOP_SECONDS)


def wait_for(what: str, ready: Callable[[], bool], process: Process, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if process.popen.poll() is not None:
            raise RuntimeError(f"{process.role} exited with {process.popen.returncode}:\n{process.tail()}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{process.role}: no {what} within {timeout:.0f} s:\n{process.tail()}")
        time.sleep(0.2)


def spawn_server(port: int, env: dict[str, str], directory: Path) -> Process:
    log = directory / f"server-{port}.log"
    with log.open("wb") as handle:
        popen = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "quicksave.asgi:application", "--host", "127.0.0.1", "--port",
             str(port), "--log-level", "warning", "--no-access-log", "--timeout-keep-alive", "75", *UVICORN_OPTIONS],
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=handle,
        )  # fmt: skip
    return Process(f"server :{port}", popen, log)


def spawn_worker(n: int, env: dict[str, str], directory: Path) -> Process:
    log = directory / f"worker-{n}.log"
    with log.open("wb") as handle:
        popen = subprocess.Popen(
            [sys.executable, "manage.py", "run_agents", "--agent", TRAVEL, "--name", f"load-worker-{n}"],
            cwd=ROOT, env=env, stdout=handle, stderr=subprocess.STDOUT,
        )  # fmt: skip
    return Process(f"worker {n}", popen, log)


def ready(process: Process) -> bool:
    """A server answers /healthz with 200; a worker has said it is serving."""
    if process.role.startswith("worker"):
        return "serving" in process.log.read_text(errors="replace")
    try:
        return httpx.get(f"http://127.0.0.1:{process.role.split(':')[1]}/healthz", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


@contextlib.contextmanager
def topology(servers: int, workers: int, env: dict[str, str], directory: Path) -> Iterator[list[Process]]:
    """`servers` uvicorn processes and `workers` workers, all started at once, stopped however the
    block ends."""
    started: list[Process] = []
    try:
        started += [spawn_server(free_port(), env, directory) for _ in range(servers)]
        started += [spawn_worker(n, env, directory) for n in range(1, workers + 1)]
        for process in started:
            wait_for("readiness (/healthz, or 'serving')", functools.partial(ready, process), process)
        yield started
    finally:
        stop(started)


def ports_of(processes: list[Process]) -> list[int]:
    return [int(p.role.split(":")[1]) for p in processes if p.role.startswith("server")]


# --- the database side (Django, on one thread of its own) -----------------------------------------


def setup_django(url: str, redis_url: str) -> None:
    os.environ["DATABASE_URL"] = url
    os.environ["REDIS_URL"] = redis_url
    os.environ["QUICKSAVE_EMBEDDED_WORKER"] = "false"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "quicksave.settings")
    import django

    django.setup()


def migrate() -> None:
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def create_principals(agents: int, reviewers: int, tag: str) -> tuple[list[str], list[tuple[str, str]]]:
    """A key for each agent (`load-NNN`, created when missing) and a reviewer with a fresh password each."""
    from django.contrib.auth.models import User

    from quicksave.roles import grant_role
    from quicksave_agents.keys import issue_key

    keys = [issue_key(agent_name=f"load-{i:03d}", label=f"bench/load.py {tag}")[1] for i in range(agents)]
    people = []
    for i in range(reviewers):
        password = secrets.token_urlsafe(16)
        user, _ = User.objects.get_or_create(username=f"load-reviewer-{i:02d}")
        user.set_password(password)
        user.save()
        grant_role(user=user, role="reviewer")
        people.append((user.username, password))
    return keys, people


def start_trip(external_id: str) -> None:
    from quicksave_agents.demo import TravelAgent
    from quicksave_agents.runtime import start_thread

    start_thread(agent_class=TravelAgent, external_id=external_id)


def final_seqs(thread_ids: list[str]) -> dict[str, int]:
    from checkpoints.models import Thread

    return {str(pk): seq for pk, seq in Thread.objects.filter(pk__in=thread_ids).values_list("pk", "event_seq")}


def resumed(approval_ids: list[str]) -> dict[str, tuple[float, float]]:
    """For each decided approval whose thread was resumed: its `decided_at` and the `created_at` of
    the thread's next checkpoint (wall-clock seconds)."""
    from approvals.models import ApprovalRequest
    from checkpoints.models import Checkpoint

    found: dict[str, tuple[float, float]] = {}
    for approval in ApprovalRequest.objects.filter(pk__in=approval_ids).select_related("checkpoint"):
        after = approval.checkpoint
        created = (
            Checkpoint.objects.filter(thread_id=after.thread_id, branch_id=after.branch_id, seq=after.seq + 1)
            .values_list("created_at", flat=True)
            .first()
        )
        if created is not None and approval.decided_at is not None:
            found[str(approval.pk)] = (approval.decided_at.timestamp(), created.timestamp())
    return found


def close_connections() -> None:
    from django.db import connections

    connections.close_all()


# --- the load -------------------------------------------------------------------------------------


@dataclass
class Phase:
    name: str
    ports: list[int]
    seconds: float
    write_ms: list[float] = field(default_factory=list)
    writes: int = 0
    write_span: float = 0.0
    errors: Counter[str] = field(default_factory=Counter)
    decisions: dict[str, float] = field(default_factory=dict)
    resume_ms: list[float] = field(default_factory=list)
    resume_from_response_ms: list[float] = field(default_factory=list)
    conflicts: int = 0
    trips: int = 0
    ws_messages: int = 0
    ws_gaps: int = 0
    ws_disorder: int = 0
    ws_missing: int = 0
    rss: dict[str, list[int]] = field(default_factory=dict)
    # What the first failed requests raised, for the report (a count alone does not say why).
    error_details: list[str] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)

    @property
    def cps(self) -> float:
        return self.writes / self.write_span if self.write_span else 0.0

    @property
    def ws_lost(self) -> int:
        return self.ws_gaps + self.ws_disorder + self.ws_missing

    @property
    def error_count(self) -> int:
        return sum(self.errors.values())


def percentile(values: list[float], fraction: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def think(mean: float) -> float:
    return random.uniform(0.5 * mean, 1.5 * mean)


class Agent:
    """One simulated agent: its own key, one thread, a checkpoint after each think time."""

    def __init__(self, number: int, key: str, port: int, phase: Phase) -> None:
        self.number = number
        self.port = port
        self.phase = phase
        self.http = httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60,
                                      headers={"Authorization": f"Bearer {key}"})  # fmt: skip
        self.key = key
        self.thread_id = ""
        self.head: str | None = None
        self.messages = 0

    async def begin(self, tag: str) -> None:
        thread = await self.http.post("/api/v1/threads/", json={"external_id": f"load-{tag}-{self.number}"})
        thread.raise_for_status()
        self.thread_id = thread.json()["id"]
        body: dict[str, Any] = {"parent": None, "state": {"messages": []}, "step": 0, "label": "start"}
        first = await self.http.post(f"/api/v1/threads/{self.thread_id}/checkpoints/", json=body)
        first.raise_for_status()
        self.head = first.json()["id"]

    def _body(self) -> dict[str, Any]:
        self.messages += 1
        patch: list[dict[str, Any]] = [{"op": "add", "path": "/messages/-", "value": {
            "role": "assistant", "content": f"step {self.messages}: " + "x" * random.randint(40, 400)}}]  # fmt: skip
        if self.messages > WINDOW:
            patch.append({"op": "remove", "path": "/messages/0"})
        return {"parent": self.head, "patch": patch, "step": self.messages, "label": "think",
                "model": {"name": "load-model", "temperature": 0.2}}  # fmt: skip

    async def run(self, stopping: asyncio.Event, mean_think: float) -> None:
        while not stopping.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(think(mean_think)):
                    await stopping.wait()
            if stopping.is_set():
                return
            body = self._body()
            started = time.perf_counter()
            try:
                response = await self.http.post(f"/api/v1/threads/{self.thread_id}/checkpoints/", json=body)
            except httpx.HTTPError as error:
                self.phase.errors[f"write {type(error).__name__}"] += 1
                self.phase.error_details.append(f"write at {time.monotonic() - self.phase.started:.1f} s: "
                                                f"{error!r} (from {error.__context__!r})")  # fmt: skip
                continue
            elapsed = (time.perf_counter() - started) * 1000
            if response.status_code == 201:
                self.head = response.json()["id"]
                self.phase.write_ms.append(elapsed)
                self.phase.writes += 1
            else:
                self.phase.errors[f"write {response.status_code}"] += 1
                self.messages -= 1
                if response.status_code == 409:  # nobody else writes this thread: should not happen
                    self.head = response.json()["error"]["detail"]["head"]["id"]

    async def close(self) -> None:
        await self.http.aclose()


async def sign_in(port: int, username: str, password: str) -> dict[str, str]:
    """A reviewer's session through the sign-in page: its cookies (session, CSRF)."""
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as browser:
        page = await browser.get("/login/")
        page.raise_for_status()
        form = {"username": username, "password": password, "csrfmiddlewaretoken": browser.cookies["csrftoken"]}
        signed = await browser.post("/login/", data=form)
        if signed.status_code != 302 or "sessionid" not in browser.cookies:
            raise RuntimeError(f"{username} could not sign in: {signed.status_code}")
        return {"sessionid": browser.cookies["sessionid"], "csrftoken": browser.cookies["csrftoken"]}


class Reviewer:
    """A person deciding pending travel approvals through the API, with a session."""

    def __init__(self, number: int, count: int, cookies: dict[str, str], port: int, phase: Phase) -> None:
        self.number = number
        self.count = count
        self.phase = phase
        self.http = httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60, cookies=cookies,
                                      headers={"X-CSRFToken": cookies["csrftoken"]})  # fmt: skip

    def _pick(self, pending: list[dict[str, Any]]) -> dict[str, Any]:
        # Each reviewer takes its share first (by id), so two rarely reach for the same approval.
        mine = [a for a in pending if int(a["id"].replace("-", "")[-6:], 16) % self.count == self.number]
        return random.choice(mine or pending)

    async def run(self, stopping: asyncio.Event, mean_think: float, decided: Callable[[], None]) -> None:
        while not stopping.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(think(mean_think)):
                    await stopping.wait()
            if stopping.is_set():
                return
            try:
                listed = await self.http.get("/api/v1/approvals/", params={"status": "pending", "agent": TRAVEL})
                if listed.status_code != 200:
                    self.phase.errors[f"approvals list {listed.status_code}"] += 1
                    continue
                pending = listed.json()["results"]
                if not pending:
                    continue
                approval = self._pick(pending)
                response = await self.http.post(f"/api/v1/approvals/{approval['id']}/decide/",
                                                json={"decision": "approve"})  # fmt: skip
            except httpx.HTTPError as error:
                self.phase.errors[f"decide {type(error).__name__}"] += 1
                continue
            if response.status_code == 200:
                self.phase.decisions[approval["id"]] = time.time()
                decided()
            elif response.status_code == 409 and response.json()["error"]["code"] == "already_decided":
                self.phase.conflicts += 1
            else:
                self.phase.errors[f"decide {response.status_code}"] += 1

    async def close(self) -> None:
        await self.http.aclose()


class Watcher:
    """A socket on one thread checking that every event's seq is the last one plus one."""

    def __init__(self, port: int, thread_id: str, key: str, phase: Phase) -> None:
        self.port = port
        self.thread_id = thread_id
        self.headers = {"Authorization": f"Bearer {key}", "Origin": f"http://127.0.0.1:{port}"}
        self.phase = phase
        self.last_seq = 0
        self.target: int | None = None
        self.caught_up = asyncio.Event()
        self.opened = asyncio.Event()

    def _note(self, event: dict[str, Any]) -> None:
        if event.get("type") == "pong":
            return
        seq = int(event["seq"])
        self.phase.ws_messages += 1
        if seq <= self.last_seq:
            self.phase.ws_disorder += 1  # a repeat or a step back
            return
        if seq > self.last_seq + 1:
            self.phase.ws_gaps += seq - self.last_seq - 1
        self.last_seq = seq
        if self.target is not None and self.last_seq >= self.target:
            self.caught_up.set()

    def expect(self, target: int) -> None:
        """The thread's last event is `target`: caught up once it has arrived."""
        self.target = target
        if self.last_seq >= target:
            self.caught_up.set()

    def missing(self) -> int:
        """Events up to the expected last one that have not arrived (0 before `expect`)."""
        return max(0, self.target - self.last_seq) if self.target is not None else 0

    async def run(self) -> None:
        """Watch until cancelled; a socket the server closes reconnects from its last seq."""
        while True:
            url = f"ws://127.0.0.1:{self.port}/ws/threads/{self.thread_id}/?after_seq={self.last_seq}"
            try:
                async with websockets.connect(url, additional_headers=self.headers, max_queue=None,
                                              ping_interval=None, open_timeout=60) as socket:  # fmt: skip
                    self.opened.set()
                    async for raw in socket:
                        self._note(json.loads(raw))
                self.phase.errors["socket closed by the server"] += 1
            except websockets.ConnectionClosed as closed:
                code = closed.rcvd.code if closed.rcvd else None
                self.phase.errors[f"socket closed {code}"] += 1
            except (OSError, websockets.InvalidHandshake, TimeoutError) as error:
                self.phase.errors[f"socket {type(error).__name__}"] += 1
            self.opened.set()
            await asyncio.sleep(1)


class Database:
    """Django's ORM on one thread of its own, so the loop never blocks on it."""

    def __init__(self) -> None:
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="load-db")

    async def call(self, function: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.executor, function, *args)

    def close(self) -> None:
        self.executor.submit(close_connections).result()
        self.executor.shutdown()


async def gather_in_batches(work: list[Awaitable[Any]], size: int = CONNECT_BATCH) -> None:
    for start in range(0, len(work), size):
        await asyncio.gather(*work[start : start + size])


async def run_phase(phase: Phase, *, db: Database, processes: list[Process], keys: list[str],
                    sessions: list[dict[str, str]], sockets: int, agent_think: float, review_think: float,
                    rss_at: float | None = None) -> None:  # fmt: skip
    """Agents, reviewers and sockets against `phase.ports` for `phase.seconds`; fills `phase`."""
    ports = phase.ports
    tag = f"{phase.name}-{time.time_ns()}"
    agents = [Agent(i, key, ports[i % len(ports)], phase) for i, key in enumerate(keys)]
    reviewers = [Reviewer(i, len(sessions), cookies, ports[i % len(ports)], phase)
                 for i, cookies in enumerate(sessions)]  # fmt: skip
    await gather_in_batches([agent.begin(tag) for agent in agents], 20)
    # Socket j watches agent j's thread on the next server round, so its events cross processes.
    watchers = [Watcher(ports[(j + 1) % len(ports)], agents[j % len(agents)].thread_id, agents[j % len(agents)].key,
                        phase) for j in range(sockets)]  # fmt: skip
    watching = [asyncio.create_task(w.run()) for w in watchers]
    for start in range(0, len(watchers), CONNECT_BATCH):
        await asyncio.gather(*(w.opened.wait() for w in watchers[start : start + CONNECT_BATCH]))

    # Two travel threads waiting per reviewer, one more per decision: the workers' share of the load.
    trips = asyncio.Queue[None]()
    for _ in range(2 * len(reviewers)):
        trips.put_nowait(None)

    async def feed() -> None:
        while True:
            await trips.get()
            phase.trips += 1
            try:
                await db.call(start_trip, f"load-{tag}-trip-{phase.trips}")
            except Exception as error:  # counted, and the load goes on
                phase.errors[f"trip start {type(error).__name__}"] += 1

    async def sample_rss(after: float) -> None:
        await asyncio.sleep(after)
        while True:
            for process in processes:
                phase.rss.setdefault(process.role, []).append(rss_kib(process.popen.pid))
            await asyncio.sleep(RSS_EVERY_SECONDS)

    stopping = asyncio.Event()
    feeder = asyncio.create_task(feed())
    sampler = asyncio.create_task(sample_rss(rss_at)) if rss_at is not None else None
    started = time.monotonic()
    working = [asyncio.create_task(a.run(stopping, agent_think)) for a in agents]
    deciding = [asyncio.create_task(r.run(stopping, review_think, lambda: trips.put_nowait(None)))
                for r in reviewers]  # fmt: skip
    await asyncio.sleep(phase.seconds)
    stopping.set()
    await asyncio.gather(*working, *deciding)
    phase.write_span = time.monotonic() - started
    feeder.cancel()
    if sampler is not None:
        sampler.cancel()
    for process in processes:
        phase.rss.setdefault(process.role, []).append(rss_kib(process.popen.pid))

    # The sockets catch up with their threads' last events; the workers resume what was decided.
    finals = await db.call(final_seqs, [a.thread_id for a in agents])
    for watcher in watchers:
        watcher.expect(finals[watcher.thread_id])
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(GRACE_SECONDS):
            await asyncio.gather(*(w.caught_up.wait() for w in watchers))
    phase.ws_missing = sum(w.missing() for w in watchers)
    for task in watching:
        task.cancel()
    await asyncio.gather(*watching, return_exceptions=True)
    # A grace of its own, counted after the sockets': a socket that waited its whole grace must
    # not leave the resumes none (a run once counted every decision of a phase "not resumed").
    deadline = time.monotonic() + GRACE_SECONDS
    found = await db.call(resumed, list(phase.decisions))
    while len(found) < len(phase.decisions) and time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        found = await db.call(resumed, list(phase.decisions))
    phase.resume_ms = [(next_at - decided_at) * 1000 for decided_at, next_at in found.values()]
    phase.resume_from_response_ms = [(found[a][1] - answered) * 1000 for a, answered in phase.decisions.items()
                                     if a in found]  # fmt: skip
    if len(found) < len(phase.decisions):
        phase.errors["decision not resumed"] += len(phase.decisions) - len(found)
    await asyncio.gather(*(a.close() for a in agents), *(r.close() for r in reviewers))


def report(phase: Phase) -> None:
    p50, p99 = percentile(phase.write_ms, 0.5), percentile(phase.write_ms, 0.99)
    r50, r95 = percentile(phase.resume_ms, 0.5), percentile(phase.resume_ms, 0.95)
    a50, a95 = percentile(phase.resume_from_response_ms, 0.5), percentile(phase.resume_from_response_ms, 0.95)
    print(f"    {phase.writes} checkpoints in {phase.write_span:.1f} s: {phase.cps:.1f}/s; write p50 "
          f"{fmt(p50)} ms, p99 {fmt(p99)} ms", flush=True)  # fmt: skip
    print(f"    {len(phase.decisions)} decisions ({phase.conflicts} lost to another reviewer, {phase.trips} trips "
          f"started): decision to resume from decided_at p50 {fmt(r50)} ms, p95 {fmt(r95)} ms; from the "
          f"decision's response p50 {fmt(a50)} ms, p95 {fmt(a95)} ms", flush=True)  # fmt: skip
    print(f"    sockets: {phase.ws_messages} events, {phase.ws_gaps} missing in a gap, {phase.ws_disorder} repeated or "
          f"out of order, {phase.ws_missing} not arrived", flush=True)  # fmt: skip
    errors = ", ".join(f"{what}: {n}" for what, n in sorted(phase.errors.items())) or "none"
    print(f"    errors: {errors}", flush=True)
    for detail in phase.error_details[:5]:
        print(f"      {detail}", flush=True)
    for role, samples in phase.rss.items():
        print(f"    {role} resident memory: {' -> '.join(f'{kib / 1024:.1f} MiB' for kib in samples)}", flush=True)


def fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def rss_growth(phase: Phase, *, second_half: bool = False) -> float | None:
    """The largest growth of a process's resident memory over the phase's samples: from the first,
    or (`second_half`) from the one halfway through, to the last."""
    growths = [samples[-1] / samples[(len(samples) - 1) // 2 if second_half else 0] - 1
               for samples in phase.rss.values() if len(samples) >= 2]  # fmt: skip
    return max(growths) if growths else None


async def bench(args: argparse.Namespace, env: dict[str, str], db: Database, keys: list[str],
                people: list[tuple[str, str]], directory: Path) -> list[Phase]:  # fmt: skip
    # Told to stop (SIGTERM), the bench stops what it started before it goes.
    running = asyncio.current_task()
    assert running is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, running.cancel)
    phases: list[Phase] = []
    sessions: list[dict[str, str]] = []
    # (name, server processes, seconds, when to sample resident memory before the end)
    settings: list[tuple[str, int, float, float | None]] = [
        (f"{n} process{'es' if n > 1 else ''}", n, args.minutes * 60, None) for n in args.processes
    ]
    if args.soak_minutes > 0:
        soak = args.soak_minutes * 60
        settings.append(("soak", SOAK_PROCESSES, soak, 60.0 if soak >= 120 else soak / 2))
    for name, servers, seconds, rss_at in settings:
        print(f"==> {name}: {servers} server process{'es' if servers > 1 else ''}, {args.workers} workers, "
              f"{len(keys)} agents, {len(people)} reviewers, {args.sockets} sockets, {seconds / 60:g} min",
              flush=True)  # fmt: skip
        with topology(servers, args.workers, env, directory) as processes:
            ports = ports_of(processes)
            if not sessions:  # signed in once: the sessions outlive the server processes
                sessions = [await sign_in(ports[0], username, password) for username, password in people]
            phase = Phase(name, ports, seconds)
            await run_phase(phase, db=db, processes=processes, keys=keys, sessions=sessions, sockets=args.sockets,
                            agent_think=args.think, review_think=args.review_think, rss_at=rss_at)  # fmt: skip
        # An exception a process logged (in a request, the publisher, a run) is an error, even when no
        # client saw it; its log is printed for whoever looks into it.
        for process in processes:
            logged = process.log.read_text(errors="replace")
            if count := logged.count("Traceback (most recent call last)"):
                phase.errors[f"{process.role.split(' ')[0]} logged an exception"] += count
                print(f"--- {process.role} log\n{logged[-6000:]}", file=sys.stderr, flush=True)
        report(phase)
        phases.append(phase)
    return phases


def summary(args: argparse.Namespace, phases: list[Phase], load: tuple[float, float]) -> dict[str, Any]:
    by_name = {p.name: p for p in phases}

    def setting(n: int) -> Phase | None:
        return next((p for p in phases if p.name != "soak" and len(p.ports) == n), None)

    out: dict[str, Any] = {}
    for n in (1, 2, 4):
        phase = setting(n)
        out[f"load_cps_{n}"] = round(phase.cps, 2) if phase else None
    for n in (1, 2, 4):
        phase = setting(n)
        out[f"load_p99_ms_{n}"] = rounded(percentile(phase.write_ms, 0.99)) if phase else None
    out["load_errors"] = sum(p.error_count for p in phases)
    out["ws_lost"] = sum(p.ws_lost for p in phases)
    soak = by_name.get("soak")
    growth = rss_growth(soak) if soak else None
    out["soak_rss_growth"] = round(growth, 4) if growth is not None else None
    later = rss_growth(soak, second_half=True) if soak else None
    out["soak_rss_growth_second_half"] = round(later, 4) if later is not None else None
    out["decision_to_resume_p95_ms"] = rounded(percentile([ms for p in phases for ms in p.resume_ms], 0.95))
    out["soak_cps"] = round(soak.cps, 2) if soak else None
    out["decide_conflicts"] = sum(p.conflicts for p in phases)
    out["size"] = {"agents": args.agents, "reviewers": args.reviewers, "sockets": args.sockets,
                   "minutes": args.minutes, "soak_minutes": args.soak_minutes, "workers": args.workers,
                   "think_s": args.think, "review_think_s": args.review_think}  # fmt: skip
    out["loadavg_1m"] = [round(load[0], 2), round(load[1], 2)]
    out["phases"] = [{
        "name": p.name, "servers": len(p.ports), "cps": round(p.cps, 2), "writes": p.writes,
        "p50_ms": rounded(percentile(p.write_ms, 0.5)), "p99_ms": rounded(percentile(p.write_ms, 0.99)),
        "errors": p.error_count, "ws_lost": p.ws_lost, "ws_events": p.ws_messages, "decisions": len(p.decisions),
        "conflicts": p.conflicts, "resume_p50_ms": rounded(percentile(p.resume_ms, 0.5)),
        "resume_p95_ms": rounded(percentile(p.resume_ms, 0.95)),
        "resume_from_response_p95_ms": rounded(percentile(p.resume_from_response_ms, 0.95)),
        "rss_mib": {role: [round(kib / 1024, 1) for kib in samples] for role, samples in p.rss.items()},
    } for p in phases]  # fmt: skip
    return out


def rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def positive_int(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {number}")
    return number


def processes_list(value: str) -> list[int]:
    counts = [positive_int(part) for part in value.split(",") if part.strip()]
    if not counts or any(n > 16 for n in counts):
        raise argparse.ArgumentTypeError("a comma-separated list of 1 to 16 processes each")
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--agents", type=positive_int, default=200)
    parser.add_argument("--reviewers", type=int, default=20)
    parser.add_argument("--sockets", type=int, default=200)
    parser.add_argument("--minutes", type=float, default=3.0, help="each setting's duration (default 3)")
    parser.add_argument("--soak-minutes", type=float, default=20.0, help="the soak at 2 processes (0: none)")
    parser.add_argument("--processes", type=processes_list, default=[1, 2, 4], help="server processes (1,2,4)")
    parser.add_argument("--workers", type=positive_int, default=2, help="run_agents processes (default 2)")
    parser.add_argument("--think", type=float, default=1.0, help="an agent's mean think time in seconds")
    parser.add_argument("--review-think", type=float, default=2.0, help="a reviewer's mean think time in seconds")
    parser.add_argument("--database-url", default=None, help="a database already migrated (default: its own)")
    args = parser.parse_args(argv)
    if args.reviewers < 0 or args.sockets < 0 or args.think < 0 or args.review_think < 0:
        parser.error("--reviewers, --sockets, --think and --review-think cannot be negative")
    if args.agents > MAX_AGENTS or args.reviewers > MAX_REVIEWERS or args.sockets > MAX_SOCKETS or args.workers > 16:
        parser.error(f"at most {MAX_AGENTS} agents, {MAX_REVIEWERS} reviewers, {MAX_SOCKETS} sockets and 16 workers")
    if not 0 < args.minutes <= 60 or not 0 <= args.soak_minutes <= 240:
        parser.error("--minutes is above 0 and at most 60; --soak-minutes 0 to 240")
    redis_url = os.environ.get("REDIS_URL")
    if not redis_url:
        sys.exit("bench/load.py runs its servers on channels-redis: set REDIS_URL")

    url = database_url(args.database_url)
    setup_django(url, redis_url)
    if args.database_url is None:
        migrate()
    env = {name: value for name, value in os.environ.items() if name != "DJANGO_ALLOW_ASYNC_UNSAFE"}
    # Two malloc arenas, as the production image has them (deploy/Dockerfile); MALLOC_ARENA_MAX=0 in
    # the bench's environment gives its processes glibc's default.
    env.setdefault("MALLOC_ARENA_MAX", "2")
    env.update({"DATABASE_URL": url, "REDIS_URL": redis_url, "QUICKSAVE_EMBEDDED_WORKER": "false",
                "DJANGO_SETTINGS_MODULE": "quicksave.settings", "LOG_LEVEL": "WARNING"})  # fmt: skip
    keys, people = create_principals(args.agents, args.reviewers, time.strftime("%Y-%m-%dT%H:%M:%S"))
    close_connections()  # the loop's database work runs on a thread of its own from here on
    load_before = os.getloadavg()
    db = Database()
    with tempfile.TemporaryDirectory(prefix="quicksave-load-") as scratch:
        try:
            phases = asyncio.run(bench(args, env, db, keys, people, Path(scratch)))
        except asyncio.CancelledError:
            print("bench/load.py was told to stop (SIGTERM); the processes it started are stopped", file=sys.stderr)
            return 128 + signal.SIGTERM
        finally:
            db.close()
    load_after = os.getloadavg()
    figures = summary(args, phases, (load_before[0], load_after[0]))
    if figures["soak_rss_growth"] is not None:
        verdict = "met" if figures["soak_rss_growth"] <= RSS_GROWTH_TARGET else "MISSED"
        print(f"soak: largest resident memory growth {figures['soak_rss_growth']:.1%} "
              f"(target <= {RSS_GROWTH_TARGET:.0%}: {verdict}); over its second half "
              f"{figures['soak_rss_growth_second_half']:.1%}", flush=True)  # fmt: skip
    print(f"load average (1 min) before {load_before[0]:.2f}, after {load_after[0]:.2f} on {os.cpu_count()} cores: "
          "a shared machine's figures vary from run to run", flush=True)  # fmt: skip
    print(json.dumps(figures), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
