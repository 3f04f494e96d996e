"""Live pages in Chromium against a real ASGI server (uvicorn) with websockets.

A decision taken in one browser removes the approval from another browser's open inbox;
with Redis killed under the server, the page shows it is offline, and once Redis is back
it reconnects and catches up from the database.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from django.contrib.auth.models import User
from playwright.sync_api import expect

from approvals.models import ApprovalRequest, ApprovalStatus
from approvals.services import decide
from quicksave_agents.demo import TravelAgent
from quicksave_agents.keys import create_agent_key, get_or_create_agent
from quicksave_agents.runtime import start_thread
from quicksave_agents.worker import Worker
from tests.e2e.conftest import Pages, make_person
from tests.processes import RedisServer, free_port, start_server, stop

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def suspended_trip(external_id: str) -> ApprovalRequest:
    thread = start_thread(agent_class=TravelAgent, external_id=external_id)
    worker = Worker(name="e2e")
    while worker.run_once():
        pass
    return ApprovalRequest.objects.get(thread=thread, status=ApprovalStatus.PENDING)


def open_inbox(browser: Any, base_url: str, username: str, name: str) -> tuple[Any, Pages]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    pages = Pages(context.new_page(), base_url, name)
    pages.login(username)
    pages.goto("/inbox/")
    pages.page.wait_for_selector("#live-status[data-state='live']", timeout=15_000)
    return context, pages


def test_a_decision_in_one_browser_removes_the_item_from_anothers_inbox(browser: Any, server_url: str) -> None:
    make_person("rita", "reviewer")
    make_person("ravi", "reviewer")
    approval = suspended_trip("trip-live")
    mine, rita = open_inbox(browser, server_url, "rita", "live-rita")
    theirs, ravi = open_inbox(browser, server_url, "ravi", "live-ravi")
    row = f"tr[data-approval='{approval.pk}']"
    assert ravi.page.locator(row).count() == 1
    ravi.shot("inbox before")

    rita.goto(f"/inbox/{approval.pk}/")
    rita.page.click("#approve")
    with rita.page.expect_navigation():
        rita.page.click("#confirm-approve-yes")

    ravi.page.wait_for_selector(row, state="detached", timeout=15_000)  # no reload
    ravi.shot("inbox after")
    assert ravi.page.url.endswith("/inbox/")

    # An external agent asks for approval through the same server: it appears without a reload.
    _, key = create_agent_key(agent=get_or_create_agent(name="travel"))
    with httpx.Client(base_url=server_url, headers={"Authorization": f"Bearer {key}"}) as api:
        thread = api.post("/api/v1/threads/", json={"external_id": "trip-live-2"}).json()
        first = api.post(f"/api/v1/threads/{thread['id']}/checkpoints/", json={"parent": None, "state": {}}).json()
        request = {"checkpoint": first["id"], "action": "book_hotel", "args": {"nights": 2}}
        another = api.post(f"/api/v1/threads/{thread['id']}/approvals/", json=request).json()
    ravi.page.wait_for_selector(f"tr[data-approval='{another['id']}']", timeout=15_000)
    assert rita.errors == [] and ravi.errors == []
    mine.close()
    theirs.close()


def test_with_redis_killed_the_page_shows_offline_then_catches_up(browser: Any) -> None:
    make_person("ravi", "reviewer")
    approval = suspended_trip("trip-offline")
    redis_server = RedisServer()  # of this test's own: killing it touches nothing else on the machine
    redis_server.start()
    port = free_port()
    server = start_server(port, {"REDIS_URL": redis_server.url})
    try:
        context, ravi = open_inbox(browser, f"http://127.0.0.1:{port}", "ravi", "offline")
        row = f"tr[data-approval='{approval.pk}']"
        assert ravi.page.locator(row).count() == 1

        redis_server.kill()
        ravi.page.wait_for_selector("#live-status[data-state='down']", timeout=20_000)
        ravi.shot("offline")
        # Decided while the page cannot hear about it: the event is in the table, not on the wire.
        reviewer = User.objects.create_user("rita", password="pw-12345678")
        from quicksave.roles import grant_role

        grant_role(user=reviewer, role="reviewer")
        decide(approval=approval, user=User.objects.get(pk=reviewer.pk), decision="approve")
        assert ravi.page.locator(row).count() == 1

        redis_server.start()
        ravi.page.wait_for_selector("#live-status[data-state='live']", timeout=40_000)
        ravi.page.wait_for_selector(row, state="detached", timeout=15_000)  # caught up on reconnect
        ravi.shot("back online")
        # While Redis was down the browser logged failed websocket handshakes; that is the scenario.
        ravi.errors.clear()
        context.close()
    finally:
        stop(server)
        redis_server.kill()


def test_an_inbox_filtered_to_an_agent_with_nothing_pending_stays_put(browser: Any, server_url: str) -> None:
    """The feed tells of every pending approval, the filtered-out ones too: the empty page must not
    take them for news and reload itself on every sync (it did, four times a second)."""
    make_person("rita", "reviewer")
    suspended_trip("trip-elsewhere")  # pending, for the agent `demo-travel`
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    rita = Pages(context.new_page(), server_url, "filtered-inbox")
    rita.login("rita")
    loads: list[str] = []
    rita.page.on("load", lambda page: loads.append(page.url))

    rita.goto("/inbox/?agent=nobody")
    rita.page.wait_for_selector("#live-status[data-state='live']", timeout=15_000)
    rita.page.wait_for_timeout(3_000)  # several syncs' worth of time

    assert len(loads) == 1, loads
    assert rita.page.locator("h2").first.inner_text() == "No approvals match these filters"
    assert rita.page.locator("#f-agent").input_value() == "nobody"
    assert rita.page.locator(f"#agents-list option[value='{TravelAgent.name}']").count() == 1
    rita.shot("filtered to nothing")
    context.close()


def test_an_approval_page_asks_before_a_high_risk_approval_and_shows_a_decision_taken_elsewhere(
    browser: Any, server_url: str
) -> None:
    rita, ravi = make_person("rita", "reviewer"), make_person("ravi", "reviewer")
    approval = suspended_trip("trip-two-desks")
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = Pages(context.new_page(), server_url, "two-desks")
    page.login("rita")
    page.goto(f"/inbox/{approval.pk}/")
    page.page.wait_for_selector("#live-status[data-state='live']", timeout=15_000)

    # Approve opens the confirmation with the arguments; Cancel decides nothing.
    page.page.click("#approve")
    assert page.page.locator("#confirm-approve").is_visible()
    assert '"flight"' in page.page.locator("#confirm-approve pre").inner_text()
    page.shot("confirm")
    page.page.click("#confirm-approve-no")
    assert not page.page.locator("#confirm-approve").is_visible()
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.PENDING

    # While the arguments are being edited, the plain Approve would drop the edit: it waits. (A
    # details element reports its toggle in a task of its own, after the click returns: awaited.)
    page.page.click("#edit-approve summary")
    expect(page.page.locator("#approve")).to_be_disabled()
    expect(page.page.locator("#approve-hint")).to_be_visible()
    page.page.click("#edit-approve summary")
    expect(page.page.locator("#approve")).to_be_enabled()

    # Ravi decides elsewhere: Rita's page shows it without a reload, and no form is left to conflict.
    decide(approval=approval, user=ravi, decision="reject", comment="too dear")
    page.page.wait_for_selector("#decision:not([data-pending])", timeout=15_000)
    decided = page.page.locator("#decision").inner_text()
    assert "Rejected" in decided and "ravi" in decided and "too dear" in decided
    assert page.page.locator("#decision form").count() == 0
    assert page.page.locator("#nav-inbox .nav-count").count() == 0  # nothing else is pending
    assert rita.username == "rita" and page.errors == []
    page.shot("decided elsewhere")
    context.close()
