"""The tool calls of an ADK invocation the worker resumes go through Quicksave's tool-call log: a
call its attempt made before it lost the run is not made again when the next attempt resends the
confirmation, one cut off without its result goes to a person, whose answer the agent gets, and an
idempotent one cut off runs again."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import google.adk  # noqa: F401  (a missing framework fails the run)
import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.utils import timezone

from approvals.models import ApprovalKind, ApprovalRequest, ApprovalStatus
from approvals.services import decide, resolve_in_doubt
from checkpoints.models import Thread, ThreadStatus
from quicksave_agents import runtime
from quicksave_agents.models import Agent, Run, ToolCall, ToolCallState
from quicksave_agents.runs import claim_run
from tests.conftest import person
from tests.integrations import adk_agents
from tests.integrations.adk_agents import final_text, start
from tests.waiting import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def rita(transactional_db: Any) -> User:
    return person("rita", "reviewer")


@pytest.fixture(autouse=True)
def fresh_transfers() -> None:
    adk_agents.DONE.clear()
    adk_agents.DURING_TRANSFER.clear()


def approved_transfer(rita: User, app: str = adk_agents.TRANSFER) -> tuple[Thread, list[Agent]]:
    """A banker session whose transfer a person approved: its run is queued."""
    factory = adk_agents.idempotent_banker if app == adk_agents.IDEMPOTENT_TRANSFER else adk_agents.banker
    thread = start(app, factory, "Pay Ana")
    decide(approval=ApprovalRequest.objects.get(thread=thread), user=rita, decision="approve")
    return thread, [Agent.objects.get(name=app)]


def cut_off(first: Run, agents: list[Agent]) -> Run:
    """Execute `first` while another worker takes its run over during the transfer; returns the
    other worker's attempt."""
    taken: list[Run | None] = []

    def another_worker_takes_the_run() -> None:
        def take() -> None:  # in a thread of its own: the tool runs in ADK's event loop
            Run.objects.filter(pk=first.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
            taken.append(claim_run(agents=agents, worker="w2"))
            connection.close()

        taking = threading.Thread(target=take)
        taking.start()
        taking.join()

    adk_agents.DURING_TRANSFER.append(another_worker_takes_the_run)
    # The transfer ran, but its attempt lost the run before it could record the result.
    assert runtime.execute(first) == "lease_lost"
    adk_agents.DURING_TRANSFER.clear()
    assert taken and taken[0] is not None
    return taken[0]


def test_a_transfer_that_ran_before_its_attempt_lost_the_run_is_not_made_again(rita: User) -> None:
    thread, agents = approved_transfer(rita)
    first = claim_run(agents=agents, worker="w1", lease_seconds=1)
    assert first is not None

    # The attempt loses its lease right after the transfer ran: the tool's result is not in the session.
    assert runtime.execute(first, lease_held=lambda: adk_agents.DONE == []) == "lease_lost"
    second = wait_until(lambda: claim_run(agents=agents, worker="w2"), what="the lease of the first attempt to run out")

    assert runtime.execute(second) == "done"
    assert adk_agents.DONE == [{"to": "ana", "amount": 40}]
    call = ToolCall.objects.get(thread=thread, tool="transfer")
    assert (call.state, call.starts, call.args) == (ToolCallState.DONE, 1, {"to": "ana", "amount": 40})
    assert final_text(thread) == "banker: Transfer: sent"
    assert Thread.objects.get(pk=thread.pk).status == ThreadStatus.COMPLETED


def test_a_transfer_cut_off_without_its_result_goes_to_a_person_and_their_answer_is_used(rita: User) -> None:
    thread, agents = approved_transfer(rita)
    first = claim_run(agents=agents, worker="w1")
    assert first is not None
    second = cut_off(first, agents)

    assert runtime.execute(second) == "suspended"
    doubt = ApprovalRequest.objects.get(thread=thread, status=ApprovalStatus.PENDING)
    assert (doubt.kind, doubt.action, doubt.args) == (ApprovalKind.IN_DOUBT, "transfer", {"to": "ana", "amount": 40})
    assert adk_agents.DONE == [{"to": "ana", "amount": 40}]
    resolve_in_doubt(approval=doubt, user=rita, resolution="happened", result={"status": "sent (bank statement)"})
    third = claim_run(agents=agents, worker="w3")
    assert third is not None

    assert runtime.execute(third) == "done"
    assert adk_agents.DONE == [{"to": "ana", "amount": 40}]
    assert final_text(thread) == "banker: Transfer: sent (bank statement)"
    assert Thread.objects.get(pk=thread.pk).status == ThreadStatus.COMPLETED


def test_an_idempotent_transfer_cut_off_without_its_result_runs_again_under_the_same_key(rita: User) -> None:
    thread, agents = approved_transfer(rita, adk_agents.IDEMPOTENT_TRANSFER)
    first = claim_run(agents=agents, worker="w1")
    assert first is not None
    second = cut_off(first, agents)

    assert runtime.execute(second) == "done"
    # Run again, not put to a person: an idempotent tool makes its effect once however often it is called.
    assert adk_agents.DONE == [{"to": "ana", "amount": 40}] * 2
    assert not ApprovalRequest.objects.filter(thread=thread, kind=ApprovalKind.IN_DOUBT).exists()
    call = ToolCall.objects.get(thread=thread, tool="transfer")
    assert (call.state, call.starts) == (ToolCallState.DONE, 2)
    assert final_text(thread) == "banker: Transfer: sent"
