"""`seed_demo` says what each demo thread is doing, read from the database; `reset_demo` puts the
demo back (after a confirmation) and touches no other agent's threads."""

from __future__ import annotations

import re
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from approvals.models import ApprovalRequest, ApprovalStatus
from approvals.services import decide
from audit.models import AuditEntry
from checkpoints import storage
from checkpoints.models import Thread, ThreadStatus
from quicksave_agents.demo import TravelAgent
from quicksave_agents.keys import get_or_create_agent
from quicksave_agents.models import Agent
from quicksave_agents.runs import claim_run
from quicksave_agents.worker import Worker
from tests.conftest import person

pytestmark = pytest.mark.django_db(transaction=True)


def seed(*args: str) -> str:
    out = StringIO()
    call_command("seed_demo", *args, stdout=out)
    return out.getvalue()


def reset(*args: str) -> str:
    out = StringIO()
    call_command("reset_demo", *args, stdout=out)
    return out.getvalue()


def line_of(output: str, name: str) -> str:
    lines = [line for line in output.splitlines() if re.match(rf"\s+{re.escape(name)}\s", line)]
    assert len(lines) == 1, output
    return lines[0]


def rome() -> Thread:
    return Thread.objects.get(agent__name=TravelAgent.name, external_id="demo-trip-rome")


def test_a_second_seed_says_a_decided_trip_is_done_not_waiting() -> None:
    first = seed()
    assert "waits for a person in the inbox: book_flight" in line_of(first, "demo-trip-rome")

    approval = ApprovalRequest.objects.get(thread=rome(), status=ApprovalStatus.PENDING)
    decide(approval=approval, user=person("rita", "reviewer"), decision="approve")
    worker = Worker(name="test")
    while worker.run_once():
        pass
    again = seed()

    assert line_of(again, "demo-trip-rome").split() == ["demo-trip-rome", "completed"]
    pending = ApprovalRequest.objects.filter(status=ApprovalStatus.PENDING, thread__agent__name__startswith="demo-")
    assert f"{pending.count()} demo request(s) wait in the inbox." in again


def test_a_seed_that_only_queues_says_the_trips_are_queued_not_waiting() -> None:
    output = seed("--no-run")

    assert "queued: the worker drives it once the server runs" in line_of(output, "demo-trip-rome")
    assert "queued: the worker drives it once the server runs" in line_of(output, "demo-trip-lisbon")
    # The framework demos run their first turn as they are seeded: theirs do wait.
    pending = ApprovalRequest.objects.filter(status=ApprovalStatus.PENDING, thread__agent__name__startswith="demo-")
    assert not pending.filter(thread__agent__name=TravelAgent.name).exists()
    assert f"{pending.count()} demo request(s) wait in the inbox." in output


def test_reset_without_yes_off_a_terminal_refuses_and_deletes_nothing() -> None:
    seed("--no-run")
    before = set(Thread.objects.values_list("pk", flat=True))

    with pytest.raises(CommandError, match="confirm on a terminal, or pass --yes"):
        reset()

    assert set(Thread.objects.values_list("pk", flat=True)) == before


def test_reset_answered_with_anything_but_yes_deletes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    seed("--no-run")
    before = set(Thread.objects.values_list("pk", flat=True))
    monkeypatch.setattr("sys.stdin.isatty", lambda: True)
    monkeypatch.setattr("builtins.input", lambda prompt: "no")

    with pytest.raises(CommandError, match="Not resetting: nothing was deleted"):
        reset()

    assert set(Thread.objects.values_list("pk", flat=True)) == before


def test_reset_starts_the_demo_again_and_leaves_other_agents_threads() -> None:
    seed()
    approval = ApprovalRequest.objects.get(thread=rome(), status=ApprovalStatus.PENDING)
    decide(approval=approval, user=person("rita", "reviewer"), decision="reject", comment="too dear")
    Worker(name="test").run_once()
    old_rome = rome().pk
    demo_threads = Thread.objects.filter(agent__name__startswith="demo-").count()
    yours, _ = storage.create_thread(agent=get_or_create_agent(name="travel"), external_id="demo-trip-rome")

    output = reset("--yes")

    assert re.search(rf"This deletes the {demo_threads} threads of the demo agents \(demo-", output)
    assert f"Deleted {demo_threads} demo thread(s)." in output
    assert rome().pk != old_rome
    assert "waits for a person in the inbox: book_flight" in line_of(output, "demo-trip-rome")
    assert Thread.objects.get(pk=yours.pk).agent.name == "travel"
    deleted = AuditEntry.objects.filter(action="thread.delete", reason="reset the demo")
    assert deleted.count() == demo_threads and str(old_rome) in set(deleted.values_list("target_id", flat=True))


def test_reset_is_refused_while_a_worker_runs_a_demo_step() -> None:
    seed("--no-run")
    held = claim_run(agents=list(Agent.objects.filter(name=TravelAgent.name)), worker="busy")
    assert held is not None
    before = set(Thread.objects.values_list("pk", flat=True))

    with pytest.raises(CommandError, match=r"A worker is running a step of demo-trip-\w+ right now"):
        reset("--yes")

    assert set(Thread.objects.values_list("pk", flat=True)) == before
    assert Thread.objects.get(pk=held.thread_id).status == ThreadStatus.RUNNING
