"""An ADK tool confirmation is an approval in the inbox whose payload a person can edit; the
decision goes back as the confirmation response, the worker resumes the invocation, and a decision
that no longer matches what the session asks fails closed."""

from __future__ import annotations

from typing import Any

import google.adk  # noqa: F401  (a missing framework fails the run)
import pytest
from django.contrib.auth.models import User

from approvals.models import ApprovalRequest, ApprovalStatus
from approvals.services import decide
from checkpoints.models import Checkpoint, CheckpointStatus, Thread, ThreadStatus
from integrations.adk import demo
from integrations.adk.sessions import QuicksaveSessionService
from quicksave_agents.models import RunStatus
from tests.conftest import person
from tests.integrations import adk_agents
from tests.integrations.adk_agents import drive, final_text, start

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def rita(transactional_db: Any) -> User:
    return person("rita", "reviewer")


def test_a_confirmation_waits_in_the_inbox_with_its_payload_and_hint(rita: User) -> None:
    thread = start(demo.APP, demo.concierge, "A hotel in Rome")

    approval = ApprovalRequest.objects.get(thread=thread)
    asked_at = Checkpoint.objects.get(pk=approval.checkpoint_id)
    assert (approval.action, approval.status) == ("book_hotel", ApprovalStatus.PENDING)
    assert approval.args == {"hotel": "Albergo del Senato", "city": "Rome", "nights": 3}
    assert approval.message == "Book a hotel in Rome for 3 nights?"
    assert asked_at.status == CheckpointStatus.WAITING_FOR_APPROVAL
    assert Thread.objects.get(pk=thread.pk).status == ThreadStatus.WAITING_FOR_APPROVAL


def test_an_edited_payload_reaches_the_tool_and_the_agent_finishes(rita: User) -> None:
    thread = start(demo.APP, demo.concierge, "A hotel in Rome")
    approval = ApprovalRequest.objects.get(thread=thread)

    decide(approval=approval, user=rita, decision="approve", args={**approval.args, "nights": 5, "hotel": "Raphael"})
    runs = drive(demo.APP)

    assert [run.status for run in runs] == [RunStatus.COMPLETED]
    assert final_text(thread) == "concierge: Booked Raphael in Rome for 5 nights."
    assert Thread.objects.get(pk=thread.pk).status == ThreadStatus.COMPLETED


def test_a_rejection_answers_not_confirmed_and_the_tool_does_not_run(rita: User) -> None:
    adk_agents.DONE.clear()
    thread = start(adk_agents.TRANSFER, adk_agents.banker, "Pay Ana")
    approval = ApprovalRequest.objects.get(thread=thread)
    assert approval.args == {"to": "ana", "amount": 40}

    decide(approval=approval, user=rita, decision="reject", comment="Not this month")
    drive(adk_agents.TRANSFER)

    assert adk_agents.DONE == []
    assert final_text(thread) == "banker: Transfer: This tool call is rejected."


def test_an_approved_require_confirmation_call_runs_with_the_models_arguments(rita: User) -> None:
    adk_agents.DONE.clear()
    thread = start(adk_agents.TRANSFER, adk_agents.banker, "Pay Ana")

    decide(approval=ApprovalRequest.objects.get(thread=thread), user=rita, decision="approve")
    drive(adk_agents.TRANSFER)

    assert adk_agents.DONE == [{"to": "ana", "amount": 40}]
    assert final_text(thread) == "banker: Transfer: sent"


def test_an_edit_the_tool_cannot_receive_fails_closed(rita: User) -> None:
    adk_agents.DONE.clear()
    thread = start(adk_agents.TRANSFER, adk_agents.banker, "Pay Ana")

    decide(approval=ApprovalRequest.objects.get(thread=thread), user=rita, decision="approve",
           args={"to": "mallory", "amount": 4000})  # fmt: skip
    runs = drive(adk_agents.TRANSFER)

    assert adk_agents.DONE == []
    assert runs[-1].status == RunStatus.FAILED and "cannot reach it" in runs[-1].error


def test_a_decision_whose_confirmation_was_answered_already_fails_closed(rita: User) -> None:
    thread = start(demo.APP, demo.concierge, "A hotel in Rome")
    approval = ApprovalRequest.objects.get(thread=thread)
    decide(approval=approval, user=rita, decision="approve")
    drive(demo.APP)
    # The same decision delivered again (a replayed run): the session answered it already.
    from quicksave_agents.models import RunReason
    from quicksave_agents.runs import enqueue_run

    enqueue_run(thread=thread, checkpoint=approval.checkpoint, reason=RunReason.APPROVAL, approval=approval)
    runs = drive(demo.APP)

    assert runs[-1].status == RunStatus.FAILED and "answered already" in runs[-1].error
    assert final_text(thread) == "concierge: Booked Albergo del Senato in Rome for 3 nights."


def test_a_resumed_fork_has_nothing_to_run_and_the_session_goes_on_from_it(rita: User) -> None:
    from checkpoints import forks

    thread = start(demo.APP, demo.concierge, "A hotel in Rome")
    asked = Checkpoint.objects.get(pk=ApprovalRequest.objects.get(thread=thread).checkpoint_id)
    before_asking = Checkpoint.objects.get(thread=thread, branch_id=asked.branch_id, seq=asked.seq - 1)

    forks.fork(checkpoint=before_asking, user=person("ada", "admin"), reason="ask again later", resume=True)
    runs = drive(demo.APP)

    assert [run.status for run in runs] == [RunStatus.COMPLETED]
    assert ApprovalRequest.objects.get(thread=thread).status == ApprovalStatus.CANCELLED  # left on the old branch
    info = thread.metadata["adk"]
    session = QuicksaveSessionService().get_session_sync(app_name=demo.APP, user_id=info["user_id"],
                                                         session_id=info["session_id"])  # fmt: skip
    assert session is not None
    assert [call.name for call in session.events[-1].get_function_calls()] == ["book_hotel"]  # before it asked


def test_two_confirmations_in_one_turn_are_two_approvals_decided_apart_and_answered_together(rita: User) -> None:
    adk_agents.BOOKED.clear()
    thread = start(adk_agents.ROOMS, adk_agents.rooms, "Rooms in Rome and Milan")
    rome = ApprovalRequest.objects.get(thread=thread)
    assert (rome.action, rome.args, rome.status) == ("book_room", {"city": "Rome", "nights": 2}, ApprovalStatus.PENDING)

    decide(approval=rome, user=rita, decision="approve", args={"city": "Rome", "nights": 4})
    drive(adk_agents.ROOMS)

    # Rome's decision waits for Milan's, filed at the same checkpoint; nothing ran yet.
    milan = ApprovalRequest.objects.get(thread=thread, status=ApprovalStatus.PENDING)
    assert (milan.action, milan.args, milan.checkpoint_id) == ("book_room", {"city": "Milan", "nights": 2},
                                                               rome.checkpoint_id)  # fmt: skip
    assert adk_agents.BOOKED == []
    assert Thread.objects.get(pk=thread.pk).status == ThreadStatus.WAITING_FOR_APPROVAL

    decide(approval=milan, user=rita, decision="reject", comment="Not Milan")
    runs = drive(adk_agents.ROOMS)

    assert [run.status for run in runs] == [RunStatus.COMPLETED, RunStatus.COMPLETED]
    assert adk_agents.BOOKED == [{"city": "Rome", "nights": 4}]
    assert final_text(thread) == "rooms: Rome: booked for 4 nights; Milan: rejected"
    info = thread.metadata["adk"]
    session = QuicksaveSessionService().get_session_sync(app_name=adk_agents.ROOMS, user_id=info["user_id"],
                                                         session_id=info["session_id"])  # fmt: skip
    assert session is not None
    answers = [event for event in session.events if event.author == "user" and event.get_function_responses()]
    assert [[reply.response for reply in event.get_function_responses()] for event in answers] == [
        [{"confirmed": True, "payload": {"city": "Rome", "nights": 4}}, {"confirmed": False}]
    ]
    assert Thread.objects.get(pk=thread.pk).status == ThreadStatus.COMPLETED


def test_an_app_name_adk_cannot_run_is_refused_when_it_is_registered() -> None:
    from integrations.adk.runner import register_adk_agent

    with pytest.raises(ValueError, match="Invalid app name"):
        register_adk_agent("travel desk")
