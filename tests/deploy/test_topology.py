"""deploy/compose.yaml's topology as local processes: PgBouncer (Debian's, from deploy/pgbouncer.ini,
in transaction mode) in front of PostgreSQL, Redis, two uvicorn processes and two `run_agents`
workers, configured as the compose file configures them.

Through it an SDK agent writes, the travel agent runs until it asks for approval, a reviewer
decides and a worker resumes the thread at once (woken by NOTIFY on its direct LISTEN
connection: the workers poll only every 2 minutes), and an admin forks the thread and a worker resumes
the fork. Stopping a server with SIGTERM lets its in-flight request finish and closes its sockets
with 1012 (clients reconnect); a worker stops at once and cleanly.
"""

from __future__ import annotations

import asyncio
import configparser
import contextlib
import json
import os
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import websockets
from django.conf import settings
from django.test import Client as BrowserClient

from approvals.models import ApprovalRequest, ApprovalStatus
from checkpoints.models import Branch, Checkpoint, Thread, ThreadStatus
from quicksave_agents.demo import TravelAgent
from quicksave_agents.keys import create_agent_key, get_or_create_agent
from quicksave_agents.models import Run, RunReason, RunStatus
from quicksave_agents.runtime import start_thread
from tests.conftest import person
from tests.processes import ROOT, RedisServer, database_url, free_port, start_server, stop
from tests.processes import Workers as WorkerProcesses
from tests.waiting import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]

PGBOUNCER_INI = ROOT / "deploy" / "pgbouncer.ini"
# Far longer than any wait below: a worker that is not woken by NOTIFY (or that sits out its poll
# when told to stop) fails the test.
WORKER_POLL_SECONDS = 120
# What the waits below allow, on a loaded machine.
PROMPTLY = 20


def pgbouncer_binary() -> str:
    binary = shutil.which("pgbouncer")
    if binary is None:
        pytest.fail("pgbouncer is not on PATH: install it (apt-get install pgbouncer)", pytrace=False)
    return binary


def pgbouncer_version(binary: str) -> tuple[int, int]:
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True).stdout
    match = re.search(r"PgBouncer (\d+)\.(\d+)", out)
    assert match, out
    return int(match[1]), int(match[2])


class PgBouncer:
    """deploy/pgbouncer.ini with this machine's addresses, trust authentication and files of its own."""

    def __init__(self) -> None:
        self.binary = pgbouncer_binary()
        # It keeps the prepared statements of psycopg from 1.21 on; an older one refuses the setting.
        self.keeps_prepared_statements = pgbouncer_version(self.binary) >= (1, 21)
        self.port = free_port()
        self.directory = Path(tempfile.mkdtemp(prefix="pgbouncer-"))
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        db = settings.DATABASES["default"]
        config = configparser.ConfigParser(interpolation=None)
        config.read(PGBOUNCER_INI)
        target = f"host={db['HOST'] or '127.0.0.1'} port={db['PORT'] or 5432} dbname={db['NAME']} user={db['USER']}"
        config.remove_section("databases")
        config.add_section("databases")
        config.set("databases", db["NAME"], target + (f" password={db['PASSWORD']}" if db["PASSWORD"] else ""))
        replaced = {
            "listen_addr": "127.0.0.1", "listen_port": str(self.port), "auth_type": "trust",
            "auth_file": str(self.directory / "userlist.txt"), "logfile": str(self.directory / "pgbouncer.log"),
            "pidfile": str(self.directory / "pgbouncer.pid"), "admin_users": db["USER"], "stats_users": db["USER"],
        }  # fmt: skip
        for key, value in replaced.items():
            config.set("pgbouncer", key, value)
        assert config.get("pgbouncer", "pool_mode") == "transaction"
        if not self.keeps_prepared_statements:
            config.remove_option("pgbouncer", "max_prepared_statements")
        with (self.directory / "pgbouncer.ini").open("w") as ini:
            config.write(ini)
        (self.directory / "userlist.txt").write_text(f'"{db["USER"]}" ""\n')
        command = [self.binary, str(self.directory / "pgbouncer.ini")]
        if os.geteuid() == 0:  # PgBouncer refuses to run as root
            owner = pwd.getpwnam("postgres" if _user_exists("postgres") else "nobody")
            for path in [self.directory, *self.directory.iterdir()]:
                os.chown(path, owner.pw_uid, owner.pw_gid)
            command[1:1] = ["-u", owner.pw_name]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(self._answers, what=f"PgBouncer to answer on :{self.port}", timeout=20)

    def _answers(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise RuntimeError(f"PgBouncer exited: {self.log()}")
        try:
            with psycopg.connect(self.url(), connect_timeout=2):
                return True
        except psycopg.OperationalError:
            return False

    def url(self) -> str:
        db = settings.DATABASES["default"]
        password = f":{db['PASSWORD']}" if db["PASSWORD"] else ""
        return f"postgresql://{db['USER']}{password}@127.0.0.1:{self.port}/{db['NAME']}"

    def transactions(self) -> int:
        """Transactions PgBouncer has passed to the database (its admin console's SHOW STATS)."""
        admin = self.url().rsplit("/", 1)[0] + "/pgbouncer"
        with psycopg.connect(admin, autocommit=True, cursor_factory=psycopg.ClientCursor) as console:
            cursor = console.execute("SHOW STATS")
            names = [column.name for column in cursor.description or []]
            rows = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
        return sum(
            int(row["total_xact_count"]) for row in rows if row["database"] == settings.DATABASES["default"]["NAME"]
        )

    def log(self) -> str:
        path = self.directory / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)
        shutil.rmtree(self.directory, ignore_errors=True)


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


class Topology:
    def __init__(self, bouncer: PgBouncer, redis_server: RedisServer, directory: Path) -> None:
        # What deploy/compose.yaml sets for the web and worker services.
        self.env = {
            "DATABASE_URL": bouncer.url(),
            "DATABASE_LISTEN_URL": database_url(),
            "DATABASE_TRANSACTION_POOLING": "true",
            "DATABASE_PREPARED_STATEMENTS": "true" if bouncer.keeps_prepared_statements else "false",
            "REDIS_URL": redis_server.url,
            "QUICKSAVE_EMBEDDED_WORKER": "false",
        }
        self.bouncer = bouncer
        self.ports = [free_port(), free_port()]
        self.servers: list[subprocess.Popen[bytes]] = []
        self.workers = WorkerProcesses(directory, agent=TravelAgent.name, lease_seconds=10, env=self.env,
                                       poll_seconds=WORKER_POLL_SECONDS)  # fmt: skip

    def start(self) -> None:
        for port in self.ports:  # one at a time: stop() stops those started before a failure
            self.servers.append(start_server(port, self.env))
        started = [self.workers.start() for _ in range(2)]
        # Serving once it says so (its agents imported, its LISTEN about to open).
        wait_until(lambda: all("serving" in self.workers.log_of(worker) for worker in started),
                   what="both workers to start", timeout=120, details=self.workers.logs)  # fmt: skip

    def url(self, n: int) -> str:
        return f"http://127.0.0.1:{self.ports[n]}"

    def stop(self) -> None:
        self.workers.kill_all()
        for server in self.servers:
            stop(server)


@pytest.fixture
def topology(tmp_path: Path) -> Iterator[Topology]:
    bouncer = PgBouncer()
    redis_server = RedisServer()
    redis_server.start()
    bouncer.start()
    running = Topology(bouncer, redis_server, tmp_path)
    try:
        running.start()
        yield running
    finally:
        running.stop()
        bouncer.stop()
        if redis_server.process is not None:
            redis_server.kill()


def session(url: str, user: Any) -> httpx.Client:
    """An HTTP client signed in as `user`, with the CSRF cookie a page sets."""
    browser = BrowserClient()
    browser.force_login(user)
    http = httpx.Client(base_url=url, cookies={"sessionid": browser.cookies["sessionid"].value}, timeout=30)
    assert http.get("/").status_code == 200
    http.headers["X-CSRFToken"] = http.cookies["csrftoken"]
    return http


def test_an_agent_a_decision_and_a_fork_run_through_pgbouncer_in_transaction_mode(topology: Topology) -> None:
    before = topology.bouncer.transactions()
    # An external agent: enough writes through one server that psycopg would have prepared its
    # statements on connections PgBouncer hands from client to client.
    _, key = create_agent_key(agent=get_or_create_agent(name="sdk-agent"))
    with httpx.Client(base_url=topology.url(0), headers={"Authorization": f"Bearer {key}"}, timeout=30) as api:
        thread = api.post("/api/v1/threads/", json={"external_id": "through-pgbouncer"}).json()
        parent = None
        for i in range(30):
            body = {"parent": parent, "state": {"i": i}} if i % 5 == 0 or parent is None else {
                "parent": parent, "patch": [{"op": "replace", "path": "/i", "value": i}]}  # fmt: skip
            response = api.post(f"/api/v1/threads/{thread['id']}/checkpoints/", json=body)
            assert response.status_code == 201, response.text
            parent = response.json()["id"]
        assert api.get(f"/api/v1/checkpoints/{parent}/").json()["state"] == {"i": 29}

    # The travel agent, driven by the workers, asks for approval.
    trip = start_thread(agent_class=TravelAgent, external_id="trip-through-pgbouncer")
    wait_until(lambda: ApprovalRequest.objects.filter(thread=trip, status=ApprovalStatus.PENDING).exists(),
               what="the travel agent to ask for approval", timeout=20, details=topology.workers.logs)  # fmt: skip
    approval = ApprovalRequest.objects.get(thread=trip, status=ApprovalStatus.PENDING)

    # A reviewer decides through the other server; a worker wakes on NOTIFY and books the flight.
    with contextlib.closing(session(topology.url(1), person("rita", "reviewer"))) as reviewer:
        decided = reviewer.post(f"/api/v1/approvals/{approval.pk}/decide/", json={"decision": "approve"})
    assert decided.status_code == 200, decided.text
    decided_at = time.monotonic()
    wait_until(lambda: Thread.objects.get(pk=trip.pk).status == ThreadStatus.COMPLETED,
               what="a worker to resume and finish the trip", timeout=PROMPTLY,
               details=topology.workers.logs)  # fmt: skip
    assert time.monotonic() - decided_at < PROMPTLY  # woken, not polled

    # An admin forks the trip at its quote and resumes it: the fork asks for approval again.
    quote = Checkpoint.objects.get(thread=trip, label="search_flights")
    with contextlib.closing(session(topology.url(0), person("ada", "admin"))) as admin:
        forked = admin.post(f"/api/v1/checkpoints/{quote.pk}/fork/", json={"reason": "try another date",
                                                                          "resume": True})  # fmt: skip
    assert forked.status_code == 201, forked.text
    wait_until(lambda: ApprovalRequest.objects.filter(thread=trip, status=ApprovalStatus.PENDING).exists(),
               what="a worker to resume the fork", timeout=PROMPTLY,
               details=topology.workers.logs)  # fmt: skip
    # The run files the approval, then ends in a transaction of its own: wait for that one too.
    wait_until(lambda: Run.objects.get(thread=trip, reason=RunReason.FORK).status == RunStatus.COMPLETED,
               what="the fork's run to end", timeout=PROMPTLY, details=topology.workers.logs)  # fmt: skip
    assert Branch.objects.filter(thread=trip).count() == 2

    # All of it went through PgBouncer.
    assert topology.bouncer.transactions() - before > 100
    assert "prepared statement" not in topology.bouncer.log()


def test_sigterm_lets_a_servers_request_finish_and_closes_its_sockets_for_a_reconnect(topology: Topology) -> None:
    _, key = create_agent_key(agent=get_or_create_agent(name="sdk-agent"))
    thread_id = httpx.post(f"{topology.url(1)}/api/v1/threads/", json={"external_id": "watched"},
                           headers={"Authorization": f"Bearer {key}"}).json()["id"]  # fmt: skip
    server = topology.servers[1]
    results: dict[str, Any] = {}

    def long_poll() -> None:
        # Nothing is queued for this agent: the claim waits its full 3 s, during the shutdown.
        results["claim"] = httpx.post(f"{topology.url(1)}/api/v1/runs/claim/", json={"wait": 3},
                                      headers={"Authorization": f"Bearer {key}"}, timeout=30)  # fmt: skip

    async def watch() -> int | None:
        url = f"ws://127.0.0.1:{topology.ports[1]}/ws/threads/{thread_id}/?after_seq=0"
        headers = {"Authorization": f"Bearer {key}", "Origin": topology.url(1)}
        async with websockets.connect(url, additional_headers=headers) as socket:
            await socket.recv()  # thread.created, replayed: the socket is open and joined
            poller = threading.Thread(target=long_poll)
            poller.start()
            results["poller"] = poller
            await asyncio.sleep(0.5)  # the claim is in flight (it waits 3 s)
            server.send_signal(signal.SIGTERM)
            try:
                async with asyncio.timeout(10):
                    while True:
                        await socket.recv()
            except websockets.ConnectionClosed as closed:
                return closed.rcvd.code if closed.rcvd else None
        return None

    code = asyncio.run(watch())
    results["poller"].join(timeout=30)
    assert code == 1012  # "service restart": the page's live.js reconnects, to another server
    assert results["claim"].status_code == 204  # the in-flight request finished before the server went
    # After draining, uvicorn ends by the signal it was stopped with, as a process manager expects.
    assert server.wait(timeout=30) == -signal.SIGTERM

    # The workers stop cleanly on SIGTERM too, without sitting out their poll.
    for process in topology.workers.processes:
        asked = time.monotonic()
        assert topology.workers.stop(process) == 0, topology.workers.logs()
        assert time.monotonic() - asked < PROMPTLY
    assert json.loads(httpx.get(f"{topology.url(0)}/healthz").text)["status"] in {"ok", "degraded"}
