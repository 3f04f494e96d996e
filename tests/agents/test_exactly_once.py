"""Exactly-once effects proven by fault injection: real `run_agents` processes killed with SIGKILL at
every boundary of a tool call, and frozen with SIGSTOP past their lease.

The agent (tests/agents/ledger_agent.py) makes one call per step, three steps a thread, and each
real execution of a call leaves a row in a ledger table Quicksave does not control. A worker kills
itself at one boundary of one call; a second worker takes the run over when the lease (1 s) runs
out. Each boundary is hit at each of the three calls. For every case:

- an idempotent tool (`charge`, deduplicated by its idempotency key) is in the ledger once per call,
  and nothing is put to a person;
- a tool that is not idempotent (`send_email`) runs at most once per call; where it may have run
  without a stored result there is exactly one in-doubt item, answered as a person would after
  looking at the world, and then it is in the ledger exactly once;
- the thread completes on one gapless branch, and no worker exits non-zero.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from subprocess import Popen
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection

from approvals.models import ApprovalKind, ApprovalRequest, ApprovalStatus
from approvals.services import resolve_in_doubt
from checkpoints.models import Checkpoint, Thread, ThreadStatus
from quicksave.roles import grant_role
from quicksave_agents.models import Run, RunStatus, ToolCall, ToolCallState
from quicksave_agents.runtime import start_thread
from tests.agents.ledger_agent import LEDGER_DDL, LEDGER_TABLE, LedgerAgent
from tests.processes import Workers, database_url, process_state
from tests.waiting import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

LEASE_SECONDS = 1
TIMEOUT = 60.0
STEPS = 3
BOUNDARIES = ["before_intent", "before_effect", "after_effect", "after_result"]


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Workers]:
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE IF EXISTS {LEDGER_TABLE}")
        cursor.execute(LEDGER_DDL)
    started = Workers(
        tmp_path, agent=LedgerAgent.name, lease_seconds=LEASE_SECONDS,
        env={"QUICKSAVE_AGENT_MODULES": "tests.agents.ledger_agent", "QUICKSAVE_TEST_LEDGER_URL": database_url()},
    )  # fmt: skip
    try:
        yield started
    finally:
        started.kill_all()
        with connection.cursor() as cursor:
            cursor.execute(f"DROP TABLE IF EXISTS {LEDGER_TABLE}")


@pytest.fixture
def person(db: Any) -> User:
    user = User.objects.create_user("pat", password="pw-12345678")
    grant_role(user=user, role="reviewer")
    return user


def ledger(thread: Thread) -> list[int]:
    """The step of every real execution of a call of this thread, in order."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT step FROM {LEDGER_TABLE} WHERE thread = %s ORDER BY id", [str(thread.pk)])
        return [row[0] for row in cursor.fetchall()]


def in_doubt(thread: Thread) -> list[ApprovalRequest]:
    return list(ApprovalRequest.objects.filter(thread=thread, kind=ApprovalKind.IN_DOUBT).order_by("created_at"))


def settle(thread: Thread, workers: Workers, worker: Popen[bytes]) -> str:
    """Wait until the thread completed with its runs closed ("completed") or waits on an in-doubt item
    with its runs closed ("in_doubt")."""

    def outcome() -> str | None:
        open_runs = Run.objects.filter(thread=thread, status__in=[RunStatus.QUEUED, RunStatus.RUNNING]).exists()
        thread.refresh_from_db()
        if not open_runs and thread.status == ThreadStatus.COMPLETED:
            return "completed"
        if not open_runs and thread.status == ThreadStatus.WAITING_FOR_APPROVAL:
            return "in_doubt"
        assert worker.poll() is None, f"the worker exited ({worker.returncode})\n{workers.logs()}"
        return None

    def where() -> str:
        return f"it is {thread.status} at step {thread.step}\n{workers.logs()}"

    return wait_until(outcome, what="the thread to complete or wait on an in-doubt item, its runs closed",
                      timeout=TIMEOUT, details=where)  # fmt: skip


def answer_as_a_person(item: ApprovalRequest, person: User, thread: Thread, step: int) -> None:
    """Look at the world (the ledger), then say whether the call happened."""
    if step in ledger(thread):
        resolve_in_doubt(approval=item, user=person, resolution="happened",
                         result={"sent_to": f"user{step}@example.com"})  # fmt: skip
    else:
        resolve_in_doubt(approval=item, user=person, resolution="not_happened")


def assert_completed_once_each(thread: Thread, workers: Workers) -> None:
    assert ledger(thread) == list(range(1, STEPS + 1)), workers.logs()
    checkpoints = list(Checkpoint.objects.filter(thread=thread).order_by("seq"))
    assert len({checkpoint.branch_id for checkpoint in checkpoints}) == 1
    assert [checkpoint.label for checkpoint in checkpoints] == (
        ["start"] + [f"call {n}" for n in range(1, STEPS + 1)] + ["all sent"]
    )
    assert [checkpoint.seq for checkpoint in checkpoints] == list(range(1, len(checkpoints) + 1))
    assert set(ToolCall.objects.filter(thread=thread).values_list("state", flat=True)) == {ToolCallState.DONE}


# Three kills and takeovers of about 6 s each, every wait bounded by TIMEOUT: the named waits, not
# the global timeout, should be what reports a slow step.
@pytest.mark.timeout(600)
@pytest.mark.parametrize("idempotent", [True, False], ids=["idempotent", "not-idempotent"])
@pytest.mark.parametrize("boundary", BOUNDARIES)
def test_a_worker_killed_at_a_boundary_of_a_call_neither_repeats_nor_loses_the_call(
    workers: Workers, person: User, boundary: str, idempotent: bool
) -> None:
    may_have_run_without_a_result = boundary in ("before_effect", "after_effect")
    for step in range(1, STEPS + 1):
        thread = start_thread(agent_class=LedgerAgent, external_id=f"{boundary}-{step}", steps=STEPS,
                              idempotent=idempotent)  # fmt: skip
        killed = workers.start({"QUICKSAVE_TEST_FAULT": f"kill:{boundary}:{step}"})
        assert killed.wait(timeout=TIMEOUT) == -signal.SIGKILL, workers.logs()
        effects_before_takeover = ledger(thread)
        assert effects_before_takeover == list(range(1, step + (boundary in ("after_effect", "after_result"))))

        takeover = workers.start()
        outcome = settle(thread, workers, takeover)
        items = in_doubt(thread)
        if idempotent or not may_have_run_without_a_result:
            assert (outcome, items) == ("completed", []), workers.logs()
        else:
            assert outcome == "in_doubt", workers.logs()
            assert len(items) == 1 and items[0].status == ApprovalStatus.PENDING
            assert items[0].action == "send_email" and items[0].args == {"step": step, "to": f"user{step}@example.com"}
            call = items[0].tool_call
            assert call is not None
            assert (call.state, call.attempt) == (ToolCallState.IN_DOUBT, 1)  # the attempt that died
            assert ledger(thread) == effects_before_takeover  # the replay did not send it again
            answer_as_a_person(items[0], person, thread, step)
            assert settle(thread, workers, takeover) == "completed"
            assert len(in_doubt(thread)) == 1

        assert_completed_once_each(thread, workers)
        assert workers.stop(takeover) == 0, workers.logs()


@pytest.mark.parametrize("idempotent", [True, False], ids=["idempotent", "not-idempotent"])
@pytest.mark.parametrize("boundary", ["before_intent", "after_result"])
def test_a_worker_frozen_past_its_lease_stops_when_it_wakes_and_writes_nothing(
    workers: Workers, person: User, boundary: str, idempotent: bool
) -> None:
    thread = start_thread(agent_class=LedgerAgent, external_id=f"frozen-{boundary}", steps=STEPS,
                          idempotent=idempotent)  # fmt: skip
    frozen = workers.start({"QUICKSAVE_TEST_FAULT": f"freeze:{boundary}:2"})

    def frozen_stopped() -> bool:
        assert frozen.poll() is None, workers.logs()
        return process_state(frozen) == "T"

    wait_until(frozen_stopped, what="the worker to stop itself at its fault", timeout=TIMEOUT, every=0.02,
               details=workers.logs)  # fmt: skip

    takeover = workers.start()
    assert settle(thread, workers, takeover) == "completed"
    assert_completed_once_each(thread, workers)
    written = list(Checkpoint.objects.filter(thread=thread).values_list("pk", flat=True))

    frozen.send_signal(signal.SIGCONT)

    def lost_its_lease() -> bool:
        assert frozen.poll() is None, workers.logs()
        return "lost its lease" in workers.log_of(frozen)

    wait_until(lost_its_lease, what="the woken worker to log that it lost its lease", timeout=TIMEOUT,
               details=workers.logs)  # fmt: skip

    assert frozen.poll() is None, workers.logs()  # it goes on serving
    assert_completed_once_each(thread, workers)
    assert list(Checkpoint.objects.filter(thread=thread).values_list("pk", flat=True)) == written
    run = Run.objects.get(thread=thread)
    assert (run.status, run.attempts) == (RunStatus.COMPLETED, 2)
    assert workers.stop(frozen) == 0, workers.logs()
    assert workers.stop(takeover) == 0, workers.logs()
