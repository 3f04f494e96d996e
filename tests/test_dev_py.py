"""The first five minutes with `dev.py`: `run` ends with a box that says where to go, who to sign in
as and where the password is; the console keeps Quicksave's own lines while every line goes to a log
file; `stop` ends the server and the embedded PostgreSQL, and nothing else.

`run` is started with its install step left out (`ensure_venv`): the test shares the checkout's
virtualenv, which is installed already, and must not reinstall it under other tests' feet.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.processes import ROOT, database_url, free_port, server_environment
from tests.waiting import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]

RUN_WITHOUT_INSTALL = "import sys, dev; dev.ensure_venv = lambda lock: None; sys.exit(dev.main(sys.argv[1:]))"


@pytest.fixture
def var(tmp_path: Path) -> Path:
    return tmp_path / "var"


def environment(var: Path, **extra: str) -> dict[str, str]:
    return {**server_environment(), "DATABASE_URL": database_url(), "QUICKSAVE_VAR_DIR": str(var),
            "QUICKSAVE_EMBEDDED_WORKER": "false", **extra}  # fmt: skip


def dev(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "dev.py", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip


@pytest.fixture
def running(var: Path, tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path, int]]:
    """`dev.py run` on a free port against the test database; its console in a file."""
    port = free_port()
    console = tmp_path / "console.txt"
    with open(console, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-c", RUN_WITHOUT_INSTALL, "run", "--port", str(port)],
            cwd=ROOT, env=environment(var), stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        wait_until(lambda: "Quicksave is running at" in console.read_text(), what="dev.py run's closing box",
                   timeout=240, every=0.5, details=console.read_text)  # fmt: skip
        yield process, console, port
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=30)


def box(console: str) -> list[str]:
    lines = console.splitlines()
    start = next(i for i, line in enumerate(lines) if "Quicksave is running at" in line)
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("+-"))
    return [line.strip("| ").rstrip() for line in lines[start:end]]


def test_run_says_where_to_sign_in_keeps_the_console_quiet_and_stop_ends_it(
    running: tuple[subprocess.Popen[bytes], Path, int], var: Path
) -> None:
    """One `dev.py run` for the whole first five minutes (seeding the demo takes a while)."""
    process, console, port = running

    # The closing box: the address, who signs in, where the password is and how to reset it.
    shown = box(console.read_text())
    assert shown[0] == f"Quicksave is running at http://127.0.0.1:{port}/"
    assert "Sign in as   admin" in shown
    assert f"Password     in {var / 'admin-password'}" in shown
    assert "New password python3 dev.py reset-password" in shown
    assert f"Log          {var / 'log' / 'quicksave.log'}" in shown
    password = (var / "admin-password").read_text().strip()
    with httpx.Client(base_url=f"http://127.0.0.1:{port}") as browser:
        form = browser.get("/login/")
        signed_in = browser.post("/login/", data={"username": "admin", "password": password,
                                                  "csrfmiddlewaretoken": form.cookies["csrftoken"]})  # fmt: skip
        browser.get("/no-such-page/")  # django.request warns: Not Found
    assert signed_in.status_code == 302 and signed_in.headers["location"] == "/"

    # Every line goes to the log file; the console keeps Quicksave's own.
    log = var / "log" / "quicksave.log"
    wait_until(lambda: "/no-such-page/" in log.read_text(), what="the 404 in the log file", timeout=30)
    text = console.read_text()
    assert '"GET /login/ HTTP/1.1" 200' in log.read_text()  # uvicorn's access log
    assert "/login/" not in text and "/no-such-page/" not in text
    assert "Traceback" not in text and "WARNING" not in text
    assert "failed at step 20" in text  # the demo's migration fails on purpose, and seed_demo says so
    assert "Applying " not in text  # migrate's list of migrations is in the file (the test database has them)

    # A second run while this one serves is refused.
    again = subprocess.run([sys.executable, "-c", RUN_WITHOUT_INSTALL, "run", "--port", str(free_port())], cwd=ROOT,
                           env=environment(var), capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert again.returncode != 0
    assert "Quicksave is already running (pid" in again.stderr and "python3 dev.py stop" in again.stderr

    # `stop` ends the server, and leaves alone a database DATABASE_URL names.
    stopped = dev("stop", env=environment(var))
    assert stopped.returncode == 0, stopped.stderr
    assert "the server stopped" in stopped.stdout and "not ours to stop" in stopped.stdout
    assert process.wait(timeout=30) == 0
    assert not (var / "run" / "server.pid").exists()
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)


def sleeper(*marks: str) -> subprocess.Popen[bytes]:
    """A process whose command line carries `marks`, standing in for a server or PostgreSQL. It is
    reaped as soon as it ends, as PostgreSQL is by init: a zombie would still answer kill(pid, 0)."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", *marks])
    threading.Thread(target=process.wait, daemon=True).start()
    return process


def test_stop_ends_the_embedded_postgresql_by_its_pid_file(var: Path) -> None:
    postgres = sleeper("postgres", "-D", str(var / "pgdata"))
    (var / "pgdata").mkdir(parents=True)
    (var / "pgdata" / "postmaster.pid").write_text(f"{postgres.pid}\n{var / 'pgdata'}\n")
    env = {key: value for key, value in environment(var).items() if key != "DATABASE_URL"}

    stopped = dev("stop", env=env)

    assert stopped.returncode == 0, stopped.stderr
    assert "the server is not running" in stopped.stdout
    assert "the embedded PostgreSQL stopped" in stopped.stdout
    assert postgres.wait(timeout=10) != 0  # SIGINT: PostgreSQL's fast shutdown


def test_stop_never_signals_a_process_that_took_over_a_stale_pid(var: Path) -> None:
    stranger = sleeper("not-quicksave")
    (var / "run").mkdir(parents=True)
    (var / "run" / "server.pid").write_text(f"{stranger.pid}\n")
    (var / "pgdata").mkdir(parents=True)
    (var / "pgdata" / "postmaster.pid").write_text(f"{os.getpid()}\n")  # this very test: no postgres in its name
    env = {key: value for key, value in environment(var).items() if key != "DATABASE_URL"}
    try:
        stopped = dev("stop", env=env)

        assert stopped.returncode == 0, stopped.stderr
        assert "the server is not running" in stopped.stdout
        assert "the embedded PostgreSQL is not running" in stopped.stdout
        assert stranger.poll() is None
        assert not (var / "run" / "server.pid").exists()
    finally:
        stranger.kill()
        stranger.wait()
