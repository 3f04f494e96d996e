"""Crash recovery with the worker as a separate OS process: SIGKILLed, restarted, and nothing lost or repeated.

Each test drives the code-review demo agent with `manage.py run_agents` against this
test's database (committed data, hence `transaction=True`), kills the worker with
SIGKILL, starts a fresh one and checks that the thread completes, every fake tool's
side effect happened exactly once (counted in a ledger file shared across processes),
and every checkpoint committed before the kill is still there. The worker's lease is
2 s, so the fresh worker takes the run over soon after the dead one stops renewing it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from uuid import UUID

import psycopg
import pytest
from django.conf import settings
from django.db import connection
from psycopg.conninfo import make_conninfo

from checkpoints.models import Checkpoint, Event, Thread, ThreadStatus
from quicksave_agents.demo import FILES, CodeReviewAgent
from quicksave_agents.models import Run, RunStatus
from quicksave_agents.runtime import start_thread
from tests.processes import database_url
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
LEASE_SECONDS = 2
TIMEOUT = 60.0

pytestmark = pytest.mark.django_db(transaction=True)


class Workers:
    """Starts `run_agents` processes against the test database; kills whatever is left at the end."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.ledger = directory / "side-effects.log"
        self.processes: list[subprocess.Popen[bytes]] = []

    def start(self, *, crash: str | None = None) -> subprocess.Popen[bytes]:
        env = {**os.environ, "DATABASE_URL": database_url(), "QUICKSAVE_DEMO_LEDGER": str(self.ledger)}
        env.pop("QUICKSAVE_DEMO_CRASH", None)
        if crash:
            env["QUICKSAVE_DEMO_CRASH"] = crash
        log = open(self.directory / f"worker-{len(self.processes) + 1}.log", "wb")  # noqa: SIM115
        with log:
            process = subprocess.Popen(
                [sys.executable, "manage.py", "run_agents", "--agent", CodeReviewAgent.name,
                 "--lease", str(LEASE_SECONDS), "--poll", "0.2"],
                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        self.processes.append(process)
        return process

    def logs(self) -> str:
        return "\n".join(
            f"--- {path.name}\n{path.read_text(errors='replace')}"
            for path in sorted(self.directory.glob("worker-*.log"))
        )

    def reviewed(self) -> list[str]:
        """The files whose review_file side effect happened, one entry per time it happened."""
        lines = self.ledger.read_text().splitlines() if self.ledger.exists() else []
        return [line.split("\t")[1] for line in lines if line.startswith("review_file\t")]

    def kill_all(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
            process.wait(timeout=30)


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Workers]:
    started = Workers(tmp_path)
    try:
        yield started
    finally:
        started.kill_all()  # before pytest-django empties the tables these processes hold locks on


def checkpoint_ids(thread: Thread) -> list[UUID]:
    return list(Checkpoint.objects.filter(thread=thread).order_by("seq").values_list("pk", flat=True))


def wait_until_completed(thread: Thread, workers: Workers, worker: subprocess.Popen[bytes]) -> None:
    """Wait for the thread to complete and its run to be closed (the run closes just after the last checkpoint)."""

    def completed() -> bool:
        # Runs first: a run closes after its last checkpoint, so a closed run means the thread is final.
        running = Run.objects.filter(thread=thread, status__in=[RunStatus.QUEUED, RunStatus.RUNNING]).exists()
        thread.refresh_from_db()
        if thread.status == ThreadStatus.COMPLETED and not running:
            return True
        assert running, f"no run is left to drive the {thread.status} thread\n{workers.logs()}"
        assert worker.poll() is None, f"the restarted worker exited ({worker.returncode})\n{workers.logs()}"
        return False

    wait_until(completed, what="the thread to complete and its run to close", timeout=TIMEOUT, every=0.1,
               details=lambda: f"it is {thread.status} at step {thread.step}\n{workers.logs()}")  # fmt: skip


def assert_recovered(thread: Thread, workers: Workers, acknowledged: list[UUID]) -> None:
    """The thread finished on one gapless branch, keeping every checkpoint committed before the kill,
    after exactly one side effect per file, driven by one run that a second worker took over."""
    assert workers.reviewed() == FILES
    checkpoints = list(Checkpoint.objects.filter(thread=thread).order_by("seq"))
    assert {checkpoint.branch_id for checkpoint in checkpoints} == {checkpoints[0].branch_id}
    assert [checkpoint.seq for checkpoint in checkpoints] == list(range(1, len(checkpoints) + 1))
    assert [checkpoint.label for checkpoint in checkpoints] == (
        ["start"] + [f"review {path}" for path in FILES] + ["review complete"]
    )
    assert [checkpoint.pk for checkpoint in checkpoints[: len(acknowledged)]] == acknowledged
    assert thread.head_id == checkpoints[-1].pk

    run = Run.objects.get(thread=thread)
    assert (run.status, run.attempts) == (RunStatus.COMPLETED, 2)
    claims = list(
        Event.objects.filter(thread=thread, type="run.claimed").order_by("seq").values_list("data", flat=True)
    )
    assert [claim["recovered"] for claim in claims] == [False, True]
    assert claims[0]["worker"] != claims[1]["worker"] == run.claimed_by


def _crash_and_restart(workers: Workers, point: str) -> tuple[Thread, list[UUID]]:
    thread = start_thread(agent_class=CodeReviewAgent, external_id=f"crash-{point}")
    first = workers.start(crash=f"{CodeReviewAgent.name}:8:{point}")
    assert first.wait(timeout=TIMEOUT) == -signal.SIGKILL, workers.logs()
    acknowledged = checkpoint_ids(thread)
    assert len(acknowledged) == 8  # start + files 1 to 7: file 8's step never got its checkpoint
    assert workers.reviewed() == (FILES[:8] if point == "after_tool" else FILES[:7])
    wait_until_completed(thread, workers, workers.start())
    return thread, acknowledged


def test_a_worker_killed_between_a_tool_call_and_its_checkpoint_does_not_repeat_the_call(workers: Workers) -> None:
    thread, acknowledged = _crash_and_restart(workers, "after_tool")
    assert_recovered(thread, workers, acknowledged)


def test_a_worker_killed_in_the_middle_of_a_step_resumes_at_that_step(workers: Workers) -> None:
    thread, acknowledged = _crash_and_restart(workers, "before_tool")
    assert_recovered(thread, workers, acknowledged)


@pytest.fixture
def gate() -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    """A connection of the test's own, for a transaction the worker has to wait on."""
    db = settings.DATABASES["default"]
    conninfo = make_conninfo(
        dbname=db["NAME"], user=db["USER"] or None, password=db["PASSWORD"] or None,
        host=db["HOST"] or None, port=db["PORT"] or None,
    )  # fmt: skip
    with psycopg.connect(conninfo) as own:
        yield own


def worker_waits_on_a_lock() -> bool:
    # Asked on Django's connection, not the gate's: activity stats are frozen for a transaction's length.
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT 1 FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
            " AND query LIKE %s",
            ["%INSERT INTO checkpoints_checkpoint%"],
        )
        return cursor.fetchone() is not None


def test_a_worker_killed_from_outside_mid_checkpoint_loses_and_repeats_nothing(
    workers: Workers, gate: psycopg.Connection[tuple[object, ...]]
) -> None:
    thread = start_thread(agent_class=CodeReviewAgent, external_id="killed-from-outside")
    # The ten steps take ~80 ms, too quick to catch by polling alone. An uncommitted row
    # holding seq 5 of the branch makes the worker's own seq 5 insert (file 4's checkpoint,
    # after file 4's review) wait on this transaction: the kill lands there, deterministically.
    gate.execute(
        "INSERT INTO checkpoints_checkpoint SELECT (jsonb_populate_record(NULL::checkpoints_checkpoint,"
        " to_jsonb(c) || jsonb_build_object('id', gen_random_uuid(), 'seq', 5))).*"
        " FROM checkpoints_checkpoint c WHERE c.thread_id = %s AND c.seq = 1",
        [thread.pk],
    )
    worker = workers.start()

    def waits_on_the_gate() -> bool:
        assert worker.poll() is None, workers.logs()
        return worker_waits_on_a_lock()

    wait_until(waits_on_the_gate, what="the worker's checkpoint insert to wait on the gate's row lock",
               timeout=TIMEOUT, every=0.01, details=workers.logs)  # fmt: skip

    acknowledged = checkpoint_ids(thread)
    worker.send_signal(signal.SIGKILL)
    assert worker.wait(timeout=TIMEOUT) == -signal.SIGKILL
    gate.rollback()
    assert len(acknowledged) == 4  # start + files 1 to 3
    assert workers.reviewed() == FILES[:4]  # file 4 was reviewed, its checkpoint was in flight

    wait_until_completed(thread, workers, workers.start())
    assert_recovered(thread, workers, acknowledged)
