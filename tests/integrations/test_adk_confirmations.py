"""An ADK tool confirmation is an approval in the inbox whose payload a person can edit; the
decision goes back as the confirmation response, the worker resumes the invocation, and a decision
that no longer matches what the session asks fails closed."""

from __future__ import annotations

import asyncio
from typing import Any
from uuid import uuid4

import pytest

pytest.importorskip("google.adk")

from django.contrib.auth.models import User
from google.adk.runners import Runner
from google.genai import types

from approvals.models import ApprovalRequest, ApprovalStatus
from approvals.services import decide
from checkpoints.models import Checkpoint, CheckpointStatus, Thread, ThreadStatus
from integrations.adk import demo
from integrations.adk.sessions import QuicksaveSessionService, find_thread
from quicksave_agents.models import Run, RunStatus
from quicksave_agents.worker import Worker
from tests.conftest import person
from tests.integrations import adk_agents

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def rita(transactional_db: Any) -> User:
    return person("rita", "reviewer")


def start(app: str, factory: Any, words: str) -> Thread:
    """Create a session and run the agent on one user message, as an application would."""
    session_id = uuid4().hex

    async def run() -> None:
        service = QuicksaveSessionService()
        await service.create_session(app_name=app, user_id="ana", session_id=session_id)
        runner = Runner(app_name=app, agent=factory(), session_service=service)
        message = types.Content(role="user", parts=[types.Part(text=words)])
        async for _ in runner.run_async(user_id="ana", session_id=session_id, new_message=message):
            pass

    asyncio.run(run())
    thread = find_thread(app, "ana", session_id)
    assert thread is not None
    return Thread.objects.get(pk=thread.pk)


def drive(app: str) -> list[Run]:
    worker = Worker(agent_names=[app], name="adk-test")
    while worker.run_once():
        pass
    return list(Run.objects.filter(agent__name=app).order_by("created_at"))


def final_text(thread: Thread) -> str:
    """The text of the session's last event, as ADK reads it back."""
    info = thread.metadata["adk"]
    session = asyncio.run(QuicksaveSessionService().get_session(app_name=info["app_name"], user_id=info["user_id"],
                                                                session_id=info["session_id"]))  # fmt: skip
    assert session is not None and session.events[-1].content is not None and session.events[-1].content.parts
    return f"{session.events[-1].author}: {session.events[-1].content.parts[0].text}"


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
