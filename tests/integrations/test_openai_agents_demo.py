"""`manage.py seed_demo` starts the OpenAI Agents SDK demo (a scripted model, no network): its run
waits in the inbox on the hotel booking, and approving it lets the worker finish the run."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.management import call_command

from approvals.models import ApprovalRequest, ApprovalStatus
from approvals.services import decide
from checkpoints.models import Thread, ThreadStatus
from integrations.openai_agents import demo
from integrations.openai_agents.session import QuicksaveSession
from quicksave_agents.worker import Worker
from tests.conftest import person

pytestmark = pytest.mark.django_db(transaction=True)


def test_seed_demo_leaves_the_openai_agents_demo_waiting_and_a_decision_finishes_it(transactional_db: Any) -> None:
    call_command("seed_demo", "--no-run")
    call_command("seed_demo", "--no-run")  # a second seed leaves the conversation as it is

    thread = Thread.objects.get(agent__name=demo.DEMO, external_id=demo.CONVERSATION)
    assert thread.metadata["framework"] == "openai-agents"
    approval = ApprovalRequest.objects.get(thread=thread, status=ApprovalStatus.PENDING)
    assert (approval.action, approval.args) == ("book_hotel", {"hotel": "Casa do Rio", "city": "Porto", "nights": 3})

    decide(approval=approval, user=person("rita", "reviewer"), decision="approve", args={**approval.args, "nights": 2})
    worker = Worker(agent_names=[demo.DEMO], name="test")
    while worker.run_once():
        pass

    assert Thread.objects.get(pk=thread.pk).status == ThreadStatus.COMPLETED
    last: Any = QuicksaveSession(demo.CONVERSATION, agent=demo.DEMO).read_items()[-1]
    assert last["content"][0]["text"] == "Done: Booked 2 nights at Casa do Rio, Porto; reference QS-POR2."
