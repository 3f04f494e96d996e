"""An OpenAI Agents SDK run paused on a tool that needs approval appears in the inbox live; a
reviewer edits its arguments and approves in Chromium, the server's own worker resumes the run
from its RunState, and its checkpoints appear on the thread's timeline."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any
from uuid import uuid4

import pytest
from asgiref.sync import async_to_sync
from django.db import connections

from approvals.models import ApprovalRequest, ApprovalStatus
from checkpoints.models import Checkpoint, Thread, ThreadStatus
from integrations.openai_agents.runner import run_agent
from integrations.openai_agents.session import QuicksaveSession
from tests.e2e.conftest import Pages, make_person
from tests.integrations.openai_agents_agents import RUN_CONFIG, TRANSFER, transfer
from tests.waiting import wait_until

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture(scope="module")
def server_url(django_db_setup: Any) -> Iterator[str]:
    """A server of its own whose embedded worker runs the test agents."""
    from tests.processes import free_port, start_server, stop

    port = free_port()
    process = start_server(
        port,
        {"QUICKSAVE_EMBEDDED_WORKER": "true", "QUICKSAVE_AGENT_MODULES": "tests.integrations.openai_agents_agents"},
    )
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(process)


def run_until_it_pauses(session_id: str) -> None:
    """Run the agent in a thread of its own: Playwright keeps an event loop on this one."""

    def run() -> None:
        try:
            session = QuicksaveSession(session_id, agent=TRANSFER)
            async_to_sync(run_agent)(transfer(), "Pay ACME", session=session, run_config=RUN_CONFIG)
        finally:
            connections.close_all()

    runner = threading.Thread(target=run)
    runner.start()
    runner.join(timeout=60)


def test_a_paused_openai_agents_run_is_edited_approved_and_finishes_on_its_timeline(tab: Pages) -> None:
    make_person("rita", "reviewer")
    tab.login("rita")
    tab.goto("/inbox/")

    session_id = f"pay-{uuid4().hex[:8]}"
    run_until_it_pauses(session_id)
    thread = Thread.objects.get(agent__name=TRANSFER, external_id=session_id)
    assert thread.metadata["framework"] == "openai-agents"
    approval = ApprovalRequest.objects.get(thread=thread, status=ApprovalStatus.PENDING)
    # Live: the page was open before the run paused.
    row = tab.page.wait_for_selector(f"tr[data-approval='{approval.pk}']", timeout=20_000)
    assert row is not None
    assert "pay" in row.inner_text()
    tab.shot("openai-agents inbox")

    tab.follow(f"tr[data-approval='{approval.pk}'] a >> nth=0")
    tab.page.click("#edit-approve summary")
    tab.page.fill("#edit-args", '{"to": "ACME Ltd", "amount": 99}')
    tab.page.click("#edit-form button[type=submit]")  # high risk: confirmed with the edited arguments in view
    tab.follow("#confirm-approve-yes")
    assert "edited arguments" in tab.page.locator("#decision").inner_text()

    waiting_seq = Checkpoint.objects.get(pk=approval.checkpoint_id).seq
    tab.goto(f"/threads/{thread.pk}/")
    # The server's worker resumes the run: the tool's output, then the model's answer.
    answer = tab.page.wait_for_selector(f"#timeline tbody tr[data-seq='{waiting_seq + 2}']", timeout=30_000)
    assert answer is not None and "message" in answer.inner_text()
    assert "function_call_output" in tab.page.locator(f"#timeline tbody tr[data-seq='{waiting_seq + 1}']").inner_text()
    tab.shot("openai-agents finished")
    wait_until(lambda: Thread.objects.get(pk=thread.pk).status == ThreadStatus.COMPLETED, what="the thread to complete")
    text: Any = QuicksaveSession(session_id, agent=TRANSFER).read_items()[-1]
    assert text["content"][0]["text"] == "Result: paid 99 to ACME Ltd"
