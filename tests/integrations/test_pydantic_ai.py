"""A Pydantic AI agent wrapped in QuicksaveAgent: its message history is checkpointed after every
model response and tool return, as small deltas; a run that ends with `DeferredToolRequests`
waits in the inbox, and decisions resume it through the worker as `DeferredToolResults`."""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import timedelta
from typing import Any
from uuid import uuid4

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth.models import User
from django.db import connection
from django.utils import timezone

from approvals.models import ApprovalRequest, ApprovalStatus
from approvals.services import decide, resolve_in_doubt
from checkpoints import forks, storage
from checkpoints.models import Checkpoint, CheckpointStatus, PayloadKind, Thread, ThreadStatus
from integrations.pydantic_ai.agent import QuicksaveAgent
from quicksave_agents import runtime
from quicksave_agents.models import Agent, Run, RunStatus, ToolCall
from quicksave_agents.runs import claim_run
from tests.conftest import person, signed_in
from tests.integrations import pydantic_agents
from tests.integrations.conftest import WorkerThread
from tests.waiting import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def rita(transactional_db: Any) -> User:
    return person("rita", "reviewer")


@pytest.fixture
def admin(transactional_db: Any) -> User:
    return person("ada", "admin")


@pytest.fixture
def worker(transactional_db: Any) -> Iterator[WorkerThread]:
    running = WorkerThread([pydantic_agents.TRIPS, pydantic_agents.PAIR, pydantic_agents.QUOTE])
    running.thread.start()
    yield running
    running.worker.stopping.set()
    running.thread.join(timeout=10)


@pytest.fixture(autouse=True)
def fresh_counts() -> None:
    pydantic_agents.calls.clear()
    pydantic_agents.during_booking.clear()
    pydantic_agents.model_outage.clear()


def start(name: str, prompt: str = "Book me a flight to Lisbon") -> Thread:
    """Run an agent until it ends or pauses; returns its thread."""
    conversation = f"{name}-{uuid4().hex[:8]}"
    agent = QuicksaveAgent(getattr(pydantic_agents, name.removeprefix("pai-"))(), name=name)
    async_to_sync(agent.run)(prompt, conversation_id=conversation)
    return Thread.objects.get(agent__name=name, external_id=conversation)


def timeline(thread: Thread) -> list[Checkpoint]:
    thread.refresh_from_db()
    return list(Checkpoint.objects.filter(thread=thread, branch=thread.active_branch).order_by("seq"))


def pending(thread: Thread) -> ApprovalRequest:
    return ApprovalRequest.objects.get(thread=thread, status=ApprovalStatus.PENDING)


def final_output(thread: Thread) -> Any:
    return storage.state_at(timeline(thread)[-1])["output"]


def test_every_model_response_and_tool_return_is_a_checkpoint() -> None:
    thread = start(pydantic_agents.TRIPS)

    labels = [checkpoint.label for checkpoint in timeline(thread)]
    assert labels == ["request", "model: find_flights", "tools: find_flights", "model: book_flight",
                      "approval: book_flight"]  # fmt: skip
    counts = [len(storage.state_at(checkpoint)["messages"]) for checkpoint in timeline(thread)]
    assert counts == [1, 2, 3, 4, 4]
    assert thread.metadata["framework"] == "pydantic-ai"


def test_a_long_conversation_stores_each_turn_as_a_small_delta() -> None:
    thread = start(pydantic_agents.TRIPS, prompt="Lisbon, please. " + os.urandom(20_000).hex())

    first, *rest = timeline(thread)
    assert first.state_bytes > 40_000
    assert all(checkpoint.kind == PayloadKind.DELTA for checkpoint in rest)
    assert all(len(bytes(checkpoint.payload)) < 2_000 for checkpoint in rest), [
        len(bytes(checkpoint.payload)) for checkpoint in rest
    ]


def test_a_deferred_approval_is_filed_with_the_tool_its_args_and_its_call_id() -> None:
    thread = start(pydantic_agents.TRIPS)

    approval = pending(thread)
    assert (approval.action, approval.args) == ("book_flight", {"flight": "TP1350", "price": 129})
    assert "book-1" in approval.message
    waiting = timeline(thread)[-1]
    assert approval.checkpoint_id == waiting.pk
    assert waiting.status == CheckpointStatus.WAITING_FOR_APPROVAL
    thread.refresh_from_db()
    assert thread.status == ThreadStatus.WAITING_FOR_APPROVAL
    assert pydantic_agents.calls == {"find_flights": 1}


def test_approving_resumes_the_agent_in_the_worker_and_it_finishes(rita: User, worker: WorkerThread) -> None:
    thread = start(pydantic_agents.TRIPS)

    decide(approval=pending(thread), user=rita, decision="approve")

    runs = worker.wait_for_runs(thread)
    assert [run.status for run in runs] == [RunStatus.COMPLETED]
    assert final_output(thread) == "Done: booked TP1350 for 129 EUR"
    assert timeline(thread)[-1].status == CheckpointStatus.COMPLETED
    thread.refresh_from_db()
    assert thread.status == ThreadStatus.COMPLETED
    # The tool ran once, after the approval; the lookup before it was not run again.
    assert pydantic_agents.calls == {"find_flights": 1, "book_flight": 1}


def test_edited_args_are_what_the_tool_runs_with(rita: User, worker: WorkerThread) -> None:
    thread = start(pydantic_agents.TRIPS)

    decide(approval=pending(thread), user=rita, decision="approve", args={"flight": "TP1350", "price": 99})

    worker.wait_for_runs(thread)
    assert final_output(thread) == "Done: booked TP1350 for 99 EUR"


def test_a_rejection_reaches_the_model_as_the_reviewers_comment(rita: User, worker: WorkerThread) -> None:
    thread = start(pydantic_agents.TRIPS)

    decide(approval=pending(thread), user=rita, decision="reject", comment="Too expensive; wait for a sale.")

    worker.wait_for_runs(thread)
    assert final_output(thread) == "Done: Too expensive; wait for a sale."
    assert "book_flight" not in pydantic_agents.calls


def test_two_deferred_calls_are_decided_one_after_the_other_and_resume_together(
    rita: User, worker: WorkerThread
) -> None:
    thread = start(pydantic_agents.PAIR)

    first = pending(thread)
    assert first.args == {"flight": "TP1350", "price": 129}
    decide(approval=first, user=rita, decision="approve")
    worker.wait_for_runs(thread)
    second = pending(thread)
    assert second.args == {"flight": "TP1351", "price": 99}
    assert second.checkpoint_id == first.checkpoint_id
    decide(approval=second, user=rita, decision="reject", comment="One way only.")

    worker.wait_for_runs(thread)
    assert final_output(thread) == "booked TP1350 for 129 EUR | One way only."


def test_a_person_supplies_the_result_of_a_call_that_runs_outside_the_agent(rita: User, worker: WorkerThread) -> None:
    thread = start(pydantic_agents.QUOTE)

    item = pending(thread)
    assert (item.action, item.args, item.message, item.risk) == (
        "ask_finance", {"args": {"item": "laptop"}, "result": None}, "What does a laptop cost us?", "low"
    )  # fmt: skip
    decide(approval=item, user=rita, decision="approve", args={"args": {"item": "laptop"}, "result": "1,200 EUR"})

    worker.wait_for_runs(thread)
    assert final_output(thread) == "Finance says: 1,200 EUR"


def test_a_tool_that_defers_its_call_leaves_no_call_in_doubt_behind() -> None:
    thread = start(pydantic_agents.QUOTE)

    call = ToolCall.objects.get(thread=thread, tool="ask_finance")
    # Recorded as deferred, so a replay defers again instead of asking whether the call happened.
    asked = {"message": "What does a laptop cost us?", "risk": "low"}
    assert (call.state, call.result) == ("done", {"quicksave:deferral": "external", "metadata": asked})


def test_a_decision_made_at_another_checkpoint_fails_closed(rita: User, worker: WorkerThread) -> None:
    thread = start(pydantic_agents.TRIPS)
    approval = pending(thread)
    waiting = timeline(thread)[-1]
    worker.worker.stopping.set()
    worker.thread.join(timeout=10)
    decide(approval=approval, user=rita, decision="approve")
    # Someone else moves the thread on before the worker resumes it.
    storage.append_checkpoint(thread=thread, parent=waiting, patch=[], label="elsewhere")

    assert worker.worker.run_once()

    run = Run.objects.get(thread=thread)
    assert run.status == RunStatus.FAILED
    assert "decision was made at checkpoint" in run.error
    assert "book_flight" not in pydantic_agents.calls


def test_a_decision_on_other_args_than_the_waiting_call_fails_closed(rita: User, worker: WorkerThread) -> None:
    thread = start(pydantic_agents.TRIPS)
    approval = pending(thread)
    worker.worker.stopping.set()
    worker.thread.join(timeout=10)
    # The request's args no longer match the call the checkpoint waits on (a row altered behind our back).
    ApprovalRequest.objects.filter(pk=approval.pk).update(action="book_hotel")
    decide(approval=ApprovalRequest.objects.get(pk=approval.pk), user=rita, decision="approve")

    assert worker.worker.run_once()

    failed = timeline(thread)[-1]
    assert failed.status == CheckpointStatus.FAILED
    assert "does not fit call book-1" in failed.metadata["error"]
    assert "book_flight" not in pydantic_agents.calls


def test_a_dashboard_fork_runs_on_from_the_edited_history(admin: User, worker: WorkerThread) -> None:
    thread = start(pydantic_agents.TRIPS)
    waiting = timeline(thread)[-1]
    messages = storage.state_at(waiting)["messages"]
    book_call = messages[-1]["parts"][0]
    assert book_call["tool_call_id"] == "book-1"

    forked = forks.fork(checkpoint=waiting, user=admin, reason="Ask for the cheaper fare", resume=True, patch=[
        {"op": "replace", "path": f"/messages/{len(messages) - 1}/parts/0/args", "value": {"flight": "TP1350",
                                                                                           "price": 79}},
    ])  # fmt: skip

    worker.wait_for_runs(thread)
    assert "deferred" not in storage.state_at(forked)
    approval = pending(thread)
    # Pydantic AI asks again, on the new branch, for the call as the admin edited it.
    assert approval.args == {"flight": "TP1350", "price": 79}
    assert Checkpoint.objects.get(pk=approval.checkpoint_id).branch_id == forked.branch_id


def test_a_fork_that_carries_a_decision_over_is_not_asked_again(rita: User, admin: User, worker: WorkerThread) -> None:
    thread = start(pydantic_agents.TRIPS)
    waiting = timeline(thread)[-1]
    approval = decide(approval=pending(thread), user=rita, decision="approve", args={"flight": "TP1350", "price": 99})
    worker.wait_for_runs(thread)

    forks.fork(checkpoint=waiting, user=admin, reason="Book it again on a branch", resume=True,
               carry_approval=approval, patch=[])  # fmt: skip

    worker.wait_for_runs(thread)
    assert not ApprovalRequest.objects.filter(thread=thread, status=ApprovalStatus.PENDING).exists()
    assert final_output(thread) == "Done: booked TP1350 for 99 EUR"
    # The fork runs the agent anew: its booking is a call of its own.
    assert pydantic_agents.calls["book_flight"] == 2


def test_a_tool_that_ran_before_its_attempt_lost_the_run_is_not_run_again(rita: User) -> None:
    thread = start(pydantic_agents.TRIPS)
    decide(approval=pending(thread), user=rita, decision="approve")
    agents = [Agent.objects.get(name=pydantic_agents.TRIPS)]
    first = claim_run(agents=agents, worker="w1", lease_seconds=1)
    assert first is not None

    # The attempt loses its lease right after the booking ran: it writes no checkpoint after it.
    outcome = runtime.execute(first, lease_held=lambda: pydantic_agents.calls["book_flight"] == 0)

    assert outcome == "lease_lost"
    assert timeline(thread)[-1].status == CheckpointStatus.WAITING_FOR_APPROVAL
    second = wait_until(lambda: claim_run(agents=agents, worker="w2"), what="the lease of the first attempt to run out")
    assert runtime.execute(second) == "done"
    assert final_output(thread) == "Done: booked TP1350 for 129 EUR"
    assert pydantic_agents.calls["book_flight"] == 1
    assert ToolCall.objects.get(thread=thread, tool="book_flight").starts == 1


def test_a_call_cut_off_without_its_result_goes_to_a_person_and_their_answer_is_used(rita: User) -> None:
    thread = start(pydantic_agents.TRIPS)
    decide(approval=pending(thread), user=rita, decision="approve")
    agents = [Agent.objects.get(name=pydantic_agents.TRIPS)]
    first = claim_run(agents=agents, worker="w1")
    assert first is not None
    taken: list[Run | None] = []

    def another_worker_takes_the_run() -> None:
        Run.objects.filter(pk=first.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
        taken.append(claim_run(agents=agents, worker="w2"))
        connection.close()  # the tool ran in a thread of Pydantic AI's

    pydantic_agents.during_booking.append(another_worker_takes_the_run)
    # The booking ran, but its attempt lost the run before it could record the result.
    assert runtime.execute(first) == "lease_lost"
    pydantic_agents.during_booking.clear()
    second = taken[0]
    assert second is not None

    assert runtime.execute(second) == "suspended"
    in_doubt = pending(thread)
    assert (in_doubt.kind, in_doubt.action) == ("in_doubt", "book_flight")
    resolve_in_doubt(approval=in_doubt, user=rita, resolution="happened", result="booked TP1350, ref QS-1")
    third = claim_run(agents=agents, worker="w3")
    assert third is not None
    assert runtime.execute(third) == "done"

    assert final_output(thread) == "Done: booked TP1350, ref QS-1"
    assert pydantic_agents.calls["book_flight"] == 1


def test_a_failing_model_fails_the_thread_and_a_resume_goes_on_without_booking_again(
    rita: User, admin: User, worker: WorkerThread
) -> None:
    thread = start(pydantic_agents.TRIPS)
    pydantic_agents.model_outage.append("the model's API is down")
    decide(approval=pending(thread), user=rita, decision="approve")

    assert [run.status for run in worker.wait_for_runs(thread)] == [RunStatus.FAILED]
    failed = timeline(thread)[-1]
    assert (failed.status, failed.metadata["error"]) == (
        CheckpointStatus.FAILED,
        "RuntimeError: the model's API is down",
    )
    assert timeline(thread)[-2].label == "tools: book_flight"
    thread.refresh_from_db()
    assert thread.status == ThreadStatus.FAILED

    pydantic_agents.model_outage.clear()
    forks.resume_failed(thread=thread, user=admin, reason="The API is back")
    worker.wait_for_runs(thread)
    assert final_output(thread) == "Done: booked TP1350 for 129 EUR"
    assert pydantic_agents.calls["book_flight"] == 1


def test_a_model_checkpoint_names_its_model() -> None:
    thread = start(pydantic_agents.TRIPS)

    assert timeline(thread)[1].model_name == "function:_trips_model:"


def test_the_inbox_and_the_thread_page_show_the_framework_as_a_badge(rita: User) -> None:
    thread = start(pydantic_agents.TRIPS)
    plain = storage.create_thread(agent=Agent.objects.get(name=pydantic_agents.TRIPS), external_id="by-the-sdk")[0]
    badge = '<span class="badge framework" data-framework="pydantic-ai"'
    client = signed_in(rita)

    inbox = client.get("/inbox/").content.decode()
    row = inbox[inbox.index(f'data-approval="{pending(thread).pk}"') :]
    assert badge in row[: row.index("</tr>")]
    assert badge in client.get(f"/threads/{thread.pk}/").content.decode()
    assert 'class="badge framework"' not in client.get(f"/threads/{plain.pk}/").content.decode()
