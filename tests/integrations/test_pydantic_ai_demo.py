"""`manage.py seed_demo` starts the Pydantic AI demo agent on its scripted model, so the first
screen shows a Pydantic AI run waiting in the inbox; approving it lets the worker finish the run."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.management import call_command

from approvals.models import ApprovalRequest, ApprovalStatus
from approvals.services import decide
from checkpoints import storage
from checkpoints.models import Thread, ThreadStatus
from integrations.pydantic_ai import demo
from quicksave_agents.worker import Worker
from tests.conftest import person

pytestmark = pytest.mark.django_db(transaction=True)


def test_seed_demo_leaves_a_pydantic_ai_run_waiting_that_a_decision_finishes(transactional_db: Any) -> None:
    call_command("seed_demo", "--no-run")
    call_command("seed_demo", "--no-run")  # a second seed leaves the first conversation be

    thread = Thread.objects.get(agent__name=demo.DEMO)
    assert (thread.external_id, thread.status, thread.metadata["framework"]) == (
        demo.CONVERSATION, ThreadStatus.WAITING_FOR_APPROVAL, "pydantic-ai",
    )  # fmt: skip
    approval = ApprovalRequest.objects.get(thread=thread, status=ApprovalStatus.PENDING)
    assert (approval.action, approval.args) == ("book_fare", {"flight": "FR8342", "price": 89})

    decide(approval=approval, user=person("rita", "reviewer"), decision="approve")
    assert Worker(agent_names=[demo.DEMO], name="test").run_once()

    thread.refresh_from_db()
    assert thread.status == ThreadStatus.COMPLETED
    assert thread.head_id is not None
    assert storage.state_at(thread.head_id)["output"] == "All done: Booked FR8342 for 89 EUR, reference QS-FR8342."
