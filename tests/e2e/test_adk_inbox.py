"""An ADK agent's tool confirmation appears in an open inbox without a reload; a reviewer edits
its payload and approves in Chromium, the server's own worker answers the confirmation, the agent
books what was approved, and the session's checkpoints appear on the thread's timeline."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any
from uuid import uuid4

import pytest
from google.adk.runners import Runner
from google.genai import types

from approvals.models import ApprovalRequest, ApprovalStatus
from checkpoints.models import Checkpoint, Thread
from integrations.adk import demo
from integrations.adk.sessions import QuicksaveSessionService, find_thread
from tests.e2e.conftest import Pages, make_person

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture(scope="module")
def server_url(django_db_setup: Any) -> Iterator[str]:
    """A server of its own whose embedded worker resumes the ADK demo concierge."""
    from tests.processes import free_port, start_server, stop

    port = free_port()
    process = start_server(
        port,
        {"QUICKSAVE_EMBEDDED_WORKER": "true", "QUICKSAVE_AGENT_MODULES": "quicksave_agents.demo,integrations.adk.demo"},
    )
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(process)


def ask_for_a_hotel(session_id: str) -> None:
    """What an application does: run the concierge on a QuicksaveSessionService. In a thread of its
    own, as Playwright's sync API keeps an event loop on this one."""

    async def run() -> None:
        service = QuicksaveSessionService()
        await service.create_session(app_name=demo.APP, user_id="ana", session_id=session_id)
        runner = Runner(app_name=demo.APP, agent=demo.concierge(), session_service=service)
        message = types.Content(role="user", parts=[types.Part(text="A hotel in Rome for three nights")])
        async for _ in runner.run_async(user_id="ana", session_id=session_id, new_message=message):
            pass

    worker = threading.Thread(target=asyncio.run, args=(run(),))
    worker.start()
    worker.join(timeout=60)


def test_an_edited_confirmation_resumes_the_adk_agent_onto_its_timeline(tab: Pages) -> None:
    make_person("rita", "reviewer")
    tab.login("rita")
    tab.goto("/inbox/")
    tab.page.wait_for_selector("#live-status[data-state='live']", timeout=15_000)

    session_id = f"rome-{uuid4().hex[:8]}"
    ask_for_a_hotel(session_id)
    found = find_thread(demo.APP, "ana", session_id)
    assert found is not None
    thread = Thread.objects.get(pk=found.pk)
    assert thread.metadata["framework"] == "adk"
    approval = ApprovalRequest.objects.get(thread=thread, status=ApprovalStatus.PENDING)
    row = f"tr[data-approval='{approval.pk}']"
    tab.page.wait_for_selector(row, timeout=15_000)  # no reload
    assert "book_hotel" in tab.page.locator(row).inner_text()
    tab.shot("adk confirmation in the inbox")

    tab.follow(f"{row} a >> nth=0")
    assert tab.page.locator("#agent-message").inner_text() == "Book a hotel in Rome for 3 nights?"
    tab.page.click("#edit-approve summary")
    tab.page.fill("#edit-args", '{"hotel": "Hotel Raphael", "city": "Rome", "nights": 5}')
    tab.page.click("#edit-form button[type=submit]")  # high risk: confirmed with the edited payload in view
    assert '"Hotel Raphael"' in tab.page.locator("#confirm-approve-args").inner_text()
    tab.follow("#confirm-approve-yes")
    assert "Approved" in tab.page.locator("#decision").inner_text()

    asked_at = Checkpoint.objects.get(pk=approval.checkpoint_id).seq
    tab.goto(f"/threads/{thread.pk}/")
    # The worker answers the confirmation (one event), the tool books (one) and the model says so (one),
    # after the tool's own answer that followed the confirmation request.
    last = f"#timeline tbody tr[data-seq='{asked_at + 4}']"
    tab.page.wait_for_selector(last, timeout=30_000)
    assert "concierge: message" in tab.page.locator(last).inner_text()
    assert "book_hotel returned" in tab.page.locator(f"#timeline tbody tr[data-seq='{asked_at + 3}']").inner_text()
    tab.shot("adk resumed")

    session = QuicksaveSessionService().get_session_sync(app_name=demo.APP, user_id="ana", session_id=session_id)
    assert session is not None and session.events[-1].content is not None and session.events[-1].content.parts
    assert session.events[-1].content.parts[0].text == "Booked Hotel Raphael in Rome for 5 nights."
