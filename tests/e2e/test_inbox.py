"""A reviewer decides a suspended step in Chromium, and the agent carries on."""

from __future__ import annotations

from typing import Any

import pytest

from approvals.models import ApprovalRequest, ApprovalStatus
from checkpoints import storage
from quicksave_agents.demo import TravelAgent
from quicksave_agents.runtime import start_thread
from quicksave_agents.worker import Worker
from tests.e2e.conftest import Pages, make_person

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def drain() -> None:
    worker = Worker(name="e2e-worker")
    while worker.run_once():
        pass


def test_a_reviewer_edits_the_args_approves_and_the_agent_books(tab: Pages, db: Any) -> None:
    make_person("rita", "reviewer")
    thread = start_thread(agent_class=TravelAgent, external_id="trip-rome", destination="FCO")
    drain()
    approval = ApprovalRequest.objects.get(thread=thread, status=ApprovalStatus.PENDING)

    tab.login("rita")
    tab.goto("/inbox/")
    assert tab.page.title() == "Inbox · Quicksave"
    row = tab.page.locator(f"tr[data-approval='{approval.pk}']")
    assert "book_flight" in row.inner_text()
    tab.shot("inbox")

    row.locator("a").first.click()
    tab.page.wait_for_load_state()
    assert "book_flight" in tab.page.title()
    assert tab.page.locator("#agent-message").inner_text().startswith("Book ")
    tab.shot("approval")

    tab.page.click("#edit-approve summary")
    tab.page.fill("#edit-args", '{"flight": "AZ611", "price": }')
    assert "not valid JSON" in tab.page.locator("#args-errors").inner_text()  # checked as you type
    tab.page.fill("#edit-args", '{"flight": "not a flight", "price": 10}')
    tab.page.click("#edit-form button[type=submit]")  # high risk: confirmed with the edited arguments in view
    assert "these edited arguments" in tab.page.locator("#confirm-approve").inner_text()
    assert '"not a flight"' in tab.page.locator("#confirm-approve-args").inner_text()
    tab.follow("#confirm-approve-yes")
    assert "/flight" in tab.page.locator("#args-errors").inner_text()  # the agent's schema, checked by the server
    tab.errors.clear()  # the 400 answer to the bad args is itself logged by Chromium
    tab.shot("schema error")

    offers = {offer["flight"]: offer["price"] for offer in storage.latest_state(thread=thread)[1]["offers"]}
    tab.page.fill("#edit-args", f'{{"flight": "AZ611", "price": {offers["AZ611"]}}}')
    tab.page.click("#edit-form button[type=submit]")
    tab.follow("#confirm-approve-yes")
    decided = tab.page.locator("#decision").inner_text()
    assert "Approved" in decided and "rita" in decided and "edited arguments" in decided
    tab.shot("decided")

    drain()
    assert storage.latest_state(thread=thread)[1]["booking"]["flight"] == "AZ611"


def test_a_rejection_needs_a_comment_and_a_viewer_sees_no_buttons(
    tab: Pages, browser: Any, server_url: str, db: Any
) -> None:
    make_person("rita", "reviewer")
    make_person("vera", "viewer")
    thread = start_thread(agent_class=TravelAgent, external_id="trip-lisbon", destination="LIS")
    drain()
    approval = ApprovalRequest.objects.get(thread=thread, status=ApprovalStatus.PENDING)

    viewer_context = browser.new_context()
    viewer = Pages(viewer_context.new_page(), server_url, "viewer")
    viewer.login("vera")
    viewer.goto(f"/inbox/{approval.pk}/")
    assert viewer.page.locator("#approve").count() == 0
    assert "needs the reviewer role" in viewer.page.locator("#decision").inner_text()

    tab.login("rita")
    tab.goto(f"/inbox/{approval.pk}/")
    tab.page.click("#reject summary")
    tab.page.click("#reject-form button[type=submit]")
    assert tab.page.url.endswith(f"/inbox/{approval.pk}/")  # the browser refuses an empty comment
    tab.page.fill("#reject-comment", "Prices are too high this week")
    tab.page.click("#reject-form button[type=submit]")
    tab.page.wait_for_load_state()
    assert "Rejected" in tab.page.locator("#decision").inner_text()

    viewer.goto("/inbox/")
    assert viewer.page.locator(f"tr[data-approval='{approval.pk}']").count() == 0
    assert viewer.errors == []
    viewer_context.close()


def test_a_reviewer_on_a_phone_reads_and_decides_without_scrolling_sideways(
    browser: Any, server_url: str, db: Any
) -> None:
    make_person("rita", "reviewer")
    thread = start_thread(agent_class=TravelAgent, external_id="trip-phone", destination="FCO")
    drain()
    approval = ApprovalRequest.objects.get(thread=thread, status=ApprovalStatus.PENDING)
    context = browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True)
    phone = Pages(context.new_page(), server_url, "phone")
    phone.login("rita")

    for path in ("/inbox/", f"/threads/{thread.pk}/", f"/checkpoints/{approval.checkpoint_id}/", "/"):
        phone.goto(path)
        width = phone.page.evaluate("document.documentElement.scrollWidth")
        assert width <= 390, f"{path} is {width}px wide on a 390px screen"

    phone.goto(f"/inbox/{approval.pk}/")
    approve = phone.page.locator("#approve").bounding_box()
    assert approve is not None and approve["x"] >= 0 and approve["x"] + approve["width"] <= 390
    phone.shot("approval")
    phone.page.tap("#approve")
    dialog = phone.page.locator("#confirm-approve").bounding_box()
    assert dialog is not None and dialog["x"] >= 0 and dialog["x"] + dialog["width"] <= 390
    phone.shot("confirm")
    with phone.page.expect_navigation():
        phone.page.tap("#confirm-approve-yes")
    assert "Approved" in phone.page.locator("#decision").inner_text()
    assert phone.errors == []
    context.close()
