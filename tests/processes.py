"""Helpers for tests that run Quicksave in other OS processes against the test database."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote, urlencode, urlunsplit

import httpx
import pytest
import redis
from django.conf import settings

from quicksave.serving import UVICORN_OPTIONS
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parent.parent


def database_url() -> str:
    """DATABASE_URL for the database this test runs against, in the form quicksave.settings reads."""
    db = settings.DATABASES["default"]
    userinfo = quote(db["USER"] or "", safe="")
    if db["PASSWORD"]:
        userinfo += ":" + quote(db["PASSWORD"], safe="")
    host = db["HOST"] or ""
    socket_dir = host.startswith("/")  # the embedded server listens on a socket in a directory
    netloc = (userinfo + "@" if userinfo else "") + ("" if socket_dir else host)
    if db["PORT"]:
        netloc += f":{db['PORT']}"
    query = {key: value for key, value in db["OPTIONS"].items() if isinstance(value, str)}
    if socket_dir:
        query["host"] = host
    return urlunsplit(("postgresql", netloc, "/" + quote(db["NAME"]), urlencode(query), ""))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def server_environment() -> dict[str, str]:
    """This process's environment, less the switch that turns Django's async-safety check off (the
    browser tests set it for themselves): the server under test always runs with the check on."""
    return {name: value for name, value in os.environ.items() if name != "DJANGO_ALLOW_ASYNC_UNSAFE"}


def start_server(port: int, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """A uvicorn process serving quicksave.asgi on 127.0.0.1:port; returns once /healthz answers."""
    # Its log goes to a file, not a pipe: nobody drains a pipe during the run, and a server
    # that logs a warning per 4xx would block on a full one. The server keeps its own handle.
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "quicksave.asgi:application", "--port", str(port),
             "--log-level", "warning", *UVICORN_OPTIONS],
            cwd=ROOT,
            env={**server_environment(), "DATABASE_URL": database_url(), "QUICKSAVE_EMBEDDED_WORKER": "false", **env},
            stdout=subprocess.DEVNULL,
            stderr=log,
        )  # fmt: skip

        def healthy() -> bool:
            if process.poll() is not None:
                log.seek(0)
                raise RuntimeError(f"server on :{port} exited: {log.read().decode(errors='replace')}")
            try:
                return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code in (200, 503)
            except httpx.TransportError:
                return False

        try:
            wait_until(healthy, what=f"the server on :{port} to answer /healthz", timeout=60, every=0.2)
        except BaseException:
            process.kill()
            raise
        return process


@contextlib.contextmanager
def servers_running(*servers: tuple[int, dict[str, str]]) -> Iterator[list[subprocess.Popen[bytes]]]:
    """A server per (port, env), each stopped at the end: those already started too when a later
    one fails to answer (a loaded machine), so no server outlives its test."""
    with contextlib.ExitStack() as started:
        processes = []
        for port, env in servers:
            process = start_server(port, env)
            started.callback(stop, process)
            processes.append(process)
        yield processes


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def redis_server_binary() -> str:
    """The redis-server executable. Without it the test fails: a skip would let CI pass untested."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail("redis-server is not on PATH: install it (apt-get install redis-server)", pytrace=False)
    return binary


class RedisServer:
    """A private redis-server process on its own port: what the test stops and starts again."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        binary = redis_server_binary()
        self.process = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = self.client()

        def answers() -> bool:
            try:
                return bool(client.ping())
            except redis.ConnectionError:
                return False

        wait_until(answers, what=f"redis-server to answer on :{self.port}", timeout=10)

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url)


class Workers:
    """`manage.py run_agents` processes against the test database, each logging to a file of its own.

    Whatever is left running is killed by `kill_all`, which a fixture calls before pytest-django
    empties the tables these processes hold locks on.
    """

    def __init__(self, directory: Path, *, agent: str, lease_seconds: int, env: dict[str, str] | None = None,
                 poll_seconds: float = 0.2) -> None:  # fmt: skip
        self.directory = directory
        self.agent = agent
        self.lease_seconds = lease_seconds
        self.poll_seconds = poll_seconds
        self.env = env or {}
        self.processes: list[subprocess.Popen[bytes]] = []

    def start(self, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        log = open(self.directory / f"worker-{len(self.processes) + 1}.log", "wb")  # noqa: SIM115
        with log:
            process = subprocess.Popen(
                [sys.executable, "manage.py", "run_agents", "--agent", self.agent,
                 "--lease", str(self.lease_seconds), "--poll", str(self.poll_seconds)],
                cwd=ROOT, env={**os.environ, "DATABASE_URL": database_url(), **self.env, **(env or {})},
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        self.processes.append(process)
        return process

    def log_of(self, process: subprocess.Popen[bytes]) -> str:
        index = self.processes.index(process) + 1
        return (self.directory / f"worker-{index}.log").read_text(errors="replace")

    def logs(self) -> str:
        return "\n".join(f"--- worker {n}\n{self.log_of(p)}" for n, p in enumerate(self.processes, 1))

    def stop(self, process: subprocess.Popen[bytes]) -> int:
        """SIGTERM, as an operator stops a worker; returns its exit status."""
        if process.poll() is None:
            process.terminate()
        return process.wait(timeout=30)

    def kill_all(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
            process.wait(timeout=30)


def process_state(process: subprocess.Popen[bytes]) -> str:
    """The process's state letter from /proc (R running, S sleeping, T stopped, Z zombie)."""
    stat = Path(f"/proc/{process.pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0]
