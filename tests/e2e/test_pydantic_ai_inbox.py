"""A Pydantic AI run paused on a deferred tool call appears in the inbox live; a reviewer edits
its arguments and approves in Chromium, the server's own worker resumes the agent, and its
checkpoints appear on the thread's timeline."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any
from uuid import uuid4

import pytest
from asgiref.sync import async_to_sync
from django.db import connections

from approvals.models import ApprovalRequest, ApprovalStatus
from checkpoints import storage
from checkpoints.models import Checkpoint, Thread
from integrations.pydantic_ai.agent import QuicksaveAgent
from tests.e2e.conftest import Pages, make_person
from tests.integrations.pydantic_agents import TRIPS, trips

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture(scope="module")
def server_url(django_db_setup: Any) -> Iterator[str]:
    """A server of its own whose embedded worker runs the test agents."""
    from tests.processes import free_port, start_server, stop

    port = free_port()
    process = start_server(
        port, {"QUICKSAVE_EMBEDDED_WORKER": "true", "QUICKSAVE_AGENT_MODULES": "tests.integrations.pydantic_agents"}
    )
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(process)


def run_until_it_pauses(conversation: str) -> None:
    """Run the agent in a thread of its own: Playwright keeps an event loop on this one."""

    def run() -> None:
        try:
            async_to_sync(QuicksaveAgent(trips(), name=TRIPS).run)("Book me a flight", conversation_id=conversation)
        finally:
            connections.close_all()

    runner = threading.Thread(target=run)
    runner.start()
    runner.join(timeout=60)


def test_a_paused_pydantic_ai_run_is_edited_approved_and_finishes_on_its_timeline(tab: Pages) -> None:
    make_person("rita", "reviewer")
    tab.login("rita")
    tab.goto("/inbox/")

    conversation = f"trip-{uuid4().hex[:8]}"
    run_until_it_pauses(conversation)
    thread = Thread.objects.get(agent__name=TRIPS, external_id=conversation)
    approval = ApprovalRequest.objects.get(thread=thread, status=ApprovalStatus.PENDING)
    # Live: the page was open before the run paused.
    row = tab.page.wait_for_selector(f"tr[data-approval='{approval.pk}']", timeout=20_000)
    assert row is not None
    assert "book_flight" in row.inner_text()
    assert row.query_selector(".badge.framework[data-framework='pydantic-ai']") is not None
    tab.shot("pydantic-ai inbox")

    tab.follow(f"tr[data-approval='{approval.pk}'] a >> nth=0")
    assert "book-1" in tab.page.locator("#agent-message").inner_text()
    tab.page.click("#edit-approve summary")
    tab.page.fill("#edit-args", '{"flight": "TP1350", "price": 99}')
    tab.page.click("#edit-form button[type=submit]")  # high risk: confirmed with the edited arguments in view
    tab.follow("#confirm-approve-yes")
    assert "edited arguments" in tab.page.locator("#decision").inner_text()

    waiting_seq = Checkpoint.objects.get(pk=approval.checkpoint_id).seq
    tab.goto(f"/threads/{thread.pk}/")
    assert tab.page.locator(".thread-title .badge.framework").inner_text() == "pydantic-ai"
    # The server's worker resumes the agent: the tool's return, the model's answer and the end.
    done = tab.page.wait_for_selector(f"#timeline tbody tr[data-seq='{waiting_seq + 3}']", timeout=30_000)
    assert done is not None and "done" in done.inner_text()
    for seq, label in ((waiting_seq + 1, "tools: book_flight"), (waiting_seq + 2, "model: answer")):
        assert label in tab.page.locator(f"#timeline tbody tr[data-seq='{seq}']").inner_text()
    tab.shot("pydantic-ai finished")
    thread.refresh_from_db()
    assert thread.head_id is not None
    assert storage.state_at(thread.head_id)["output"] == "Done: booked TP1350 for 99 EUR"
