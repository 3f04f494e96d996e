"""The in-process runtime and the demo agents, driven by a real worker loop in this process."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import pytest
from django.contrib.auth.models import User

from approvals.models import ApprovalRequest, ApprovalStatus
from approvals.services import decide
from checkpoints import storage
from checkpoints.models import Checkpoint, Thread, ThreadStatus
from checkpoints.storage import nodes
from quicksave.roles import grant_role
from quicksave_agents import runtime
from quicksave_agents.demo import CodeReviewAgent, MigrationAgent, TravelAgent
from quicksave_agents.models import Run, RunStatus
from quicksave_agents.runtime import Agent, Context, Continue, Done, StepResult, start_thread
from quicksave_agents.worker import Worker
from tests.conftest import password_hash


@pytest.fixture
def ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "side-effects.log"
    monkeypatch.setenv("QUICKSAVE_DEMO_LEDGER", str(path))
    return path


def effects(ledger: Path) -> list[str]:
    return ledger.read_text().splitlines() if ledger.exists() else []


@pytest.fixture
def reviewer(db: Any) -> User:
    user = User.objects.create(username="rita", password=password_hash("pw-12345678"))
    grant_role(user=user, role="reviewer")
    return user


def drain(worker: Worker | None = None) -> int:
    worker = worker or Worker(name="test-worker")
    driven = 0
    while worker.run_once():
        driven += 1
    return driven


def pending(thread: Thread) -> ApprovalRequest:
    return ApprovalRequest.objects.get(thread=thread, status=ApprovalStatus.PENDING)


def final_state(thread: Thread) -> dict[str, Any]:
    return storage.latest_state(thread=thread)[1]


def test_travel_books_only_after_approval(ledger: Path, reviewer: User) -> None:
    thread = start_thread(agent_class=TravelAgent, external_id="trip", destination="FCO")
    drain()
    thread.refresh_from_db()
    assert thread.status == ThreadStatus.WAITING_FOR_APPROVAL
    approval = pending(thread)
    assert approval.action == "book_flight"
    assert not [line for line in effects(ledger) if line.startswith("book_flight")]

    decide(approval=approval, user=reviewer, decision="approve")
    drain()

    thread.refresh_from_db()
    assert thread.status == ThreadStatus.COMPLETED
    state = final_state(thread)
    assert state["booking"]["flight"] == approval.args["flight"]
    assert [line.split("\t")[0] for line in effects(ledger)] == ["search_flights", "check_price", "book_flight"]


def test_travel_asks_again_when_the_price_moved(ledger: Path, reviewer: User) -> None:
    thread = start_thread(agent_class=TravelAgent, external_id="trip", destination="LIS", price_jump=True)
    drain()
    first = pending(thread)
    decide(approval=first, user=reviewer, decision="approve")
    drain()

    second = pending(thread)  # asked again instead of booking
    assert second.args["flight"] == first.args["flight"]
    assert second.args["price"] == first.args["price"] + 45
    assert not [line for line in effects(ledger) if line.startswith("book_flight")]
    decide(approval=second, user=reviewer, decision="approve")
    drain()
    assert final_state(thread)["booking"]["price"] == second.args["price"]


def test_travel_books_the_edited_args_and_respects_a_rejection(ledger: Path, reviewer: User) -> None:
    edited = start_thread(agent_class=TravelAgent, external_id="edited")
    refused = start_thread(agent_class=TravelAgent, external_id="refused")
    drain()
    offers = {offer["flight"]: offer["price"] for offer in final_state(edited)["offers"]}
    decide(
        approval=pending(edited), user=reviewer, decision="approve", args={"flight": "AZ611", "price": offers["AZ611"]}
    )
    decide(approval=pending(refused), user=reviewer, decision="reject", comment="Too expensive this week")
    drain()

    assert final_state(edited)["booking"]["flight"] == "AZ611"
    assert final_state(refused)["phase"] == "declined"
    assert "Too expensive this week" in final_state(refused)["messages"][-1]["content"]
    assert effects(ledger).count("book_flight\tAZ611") == 1


def test_code_review_reviews_every_file_once_one_step_each(ledger: Path, db: Any) -> None:
    thread = start_thread(agent_class=CodeReviewAgent, external_id="review")
    drain()
    thread.refresh_from_db()
    assert thread.status == ThreadStatus.COMPLETED
    reviewed = [line.split("\t")[1] for line in effects(ledger)]
    assert reviewed == CodeReviewAgent().initial_state()["files"]
    labels = list(Checkpoint.objects.filter(thread=thread).order_by("seq").values_list("label", flat=True))
    assert labels[0] == "start" and labels[-1] == "review complete"
    assert len(labels) == 12


def test_migration_fails_at_step_20_because_of_step_15(ledger: Path, db: Any) -> None:
    thread = start_thread(agent_class=MigrationAgent, external_id="migration")
    drain()
    thread.refresh_from_db()
    assert (thread.status, thread.step) == (ThreadStatus.FAILED, 20)
    assert thread.head_id is not None
    head = Checkpoint.objects.get(pk=thread.head_id)
    assert "batch_size 5000" in head.metadata["error"]
    assert storage.state_at(Checkpoint.objects.get(thread=thread, seq=16))["settings"] == {"batch_size": 5000}
    assert Run.objects.get(thread=thread).status == RunStatus.FAILED


class _NotesV1(Agent):
    name = "notes-test"
    schema_version = 1

    def step(self, ctx: Context) -> StepResult:
        ctx.state["note"] = "written by v1"
        return Continue("note")


class _NotesV2(Agent):
    name = "notes-test"
    schema_version = 2
    upcasters: ClassVar[dict[int, Any]] = {1: lambda state: {"notes": [state.pop("note")], **state}}

    def step(self, ctx: Context) -> StepResult:
        ctx.state["notes"].append("written by v2")
        return Done("notes")


def test_a_state_written_by_v1_is_upcast_for_a_v2_agent(db: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from quicksave_agents.models import RunReason
    from quicksave_agents.runs import enqueue_run

    monkeypatch.setitem(runtime._registry, "notes-test", _NotesV1)
    thread = start_thread(agent_class=_NotesV1, external_id="notes")
    worker = Worker(name="v1", agent_names=["notes-test"])
    assert worker.run_once()
    head = Checkpoint.objects.filter(thread=thread).order_by("-seq").first()
    assert head is not None and head.schema_version == 1

    monkeypatch.setitem(runtime._registry, "notes-test", _NotesV2)
    enqueue_run(thread=thread, checkpoint=head, reason=RunReason.MANUAL)
    Run.objects.filter(thread=thread, status=RunStatus.RUNNING).update(status=RunStatus.COMPLETED)
    assert Worker(name="v2", agent_names=["notes-test"]).run_once()

    latest = Checkpoint.objects.filter(thread=thread).order_by("-seq").first()
    assert latest is not None and latest.schema_version == 2
    assert storage.state_at(latest)["notes"] == ["written by v1", "written by v2"]


class _Counter(Agent):
    """Counts; during its third step an admin cancels the thread (as from the dashboard)."""

    name = "counter-test"

    def step(self, ctx: Context) -> StepResult:
        ctx.state["n"] = ctx.state.get("n", 0) + 1
        if ctx.state["n"] == 3:
            from checkpoints.forks import cancel

            admin = User.objects.create(
                username="ada-cancel", password=password_hash("pw-12345678"), is_staff=True, is_superuser=True
            )
            cancel(thread=ctx.thread, user=admin, reason="wrong customer")
        return Continue(f"count {ctx.state['n']}") if ctx.state["n"] < 10 else Done("counted")


def test_a_run_stops_without_committing_when_its_thread_is_cancelled_mid_step(
    db: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(runtime._registry, "counter-test", _Counter)
    thread = start_thread(agent_class=_Counter, external_id="count")

    assert Worker(name="counter", agent_names=["counter-test"]).run_once()

    thread.refresh_from_db()
    assert thread.status == ThreadStatus.CANCELLED
    labels = list(Checkpoint.objects.filter(thread=thread).order_by("seq").values_list("label", flat=True))
    assert labels[-2:] == ["count 1", "count 2"]  # step 3's result was not written
    assert Run.objects.get(thread=thread).status == RunStatus.CANCELLED


@pytest.mark.django_db(transaction=True)  # the cache keeps a written state once its transaction commits
def test_a_worker_keeps_no_cached_state_of_a_thread_once_its_run_ends(ledger: Path) -> None:
    thread = start_thread(agent_class=TravelAgent, external_id="trip", destination="FCO")

    drain()

    thread.refresh_from_db()
    assert thread.status == ThreadStatus.WAITING_FOR_APPROVAL  # its run ended at the approval
    written = Checkpoint.objects.filter(thread=thread).values_list("pk", flat=True)
    assert written and not [pk for pk in written if nodes.states.get(pk) is not None]
