"""Notifications in Chromium: an admin adds a webhook, its first notice reaches a receiver on
loopback signed with the secret the page showed once, and the admin sends it again from the log;
a reviewer follows a decision link from a message, signs in, and approves."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest

from approvals.models import ApprovalRequest, ApprovalStatus
from checkpoints import storage
from notifications import dispatch
from notifications.endpoints import SubscriptionSpec, create_endpoint
from notifications.models import Delivery, DeliveryStatus
from quicksave_agents.keys import get_or_create_agent
from tests.e2e.conftest import PASSWORD, Pages, make_person
from tests.notifications.conftest import RunningDispatcher, suspend
from tests.notifications.receiver import Receiver, receiving
from tests.waiting import wait_until

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    yield from receiving()


def test_an_admin_adds_a_webhook_sees_it_deliver_and_sends_it_again(tab: Pages, receiver: Receiver, db: Any) -> None:
    make_person("ada", "admin")
    tab.login("ada")
    tab.follow("nav >> text=Notifications")
    assert tab.page.title() == "Notifications · Quicksave"
    tab.page.fill("#f-name", "on-call")
    tab.page.select_option("#f-kind", "webhook")
    tab.page.fill("#f-url", receiver.url)
    tab.page.check("#f-decision-links")
    tab.shot("add a channel")
    tab.follow("#add-channel")
    secret = tab.page.locator("#signing-secret").inner_text().strip()
    assert secret.startswith("whsec_")
    tab.follow("text=Done")
    assert secret not in tab.page.content()

    running = RunningDispatcher().start()
    try:
        thread = storage.create_thread(agent=get_or_create_agent(name="travel"), external_id="trip-9")[0]
        approval = suspend(thread)
        [first] = receiver.wait_for(1)
        assert first.signed_by(secret)
        wait_until(lambda: Delivery.objects.filter(status=DeliveryStatus.DELIVERED).exists(), what="the delivery")
        tab.goto(urlsplit(tab.page.url).path)
        row = tab.page.locator("#deliveries tbody tr").first
        assert "Delivered" in row.inner_text() and "200" in row.inner_text()
        tab.shot("delivery log")
        tab.follow("#deliveries tbody tr >> text=Details · send again…")
        tab.shot("send again")
        tab.follow("#confirm-send-again")
        assert "Sending it again as delivery" in tab.page.locator(".flash").inner_text()
        [_, again] = receiver.wait_for(2)
    finally:
        running.stop()
    assert again.signed_by(secret)
    assert first.json()["approval"]["id"] == str(approval.pk)
    assert again.json()["id"] == first.json()["id"], "a receiver can tell the same notice sent again"


def test_a_reviewer_follows_a_decision_link_signs_in_and_approves(tab: Pages, db: Any) -> None:
    make_person("rita", "reviewer")
    create_endpoint(name="ops", kind="webhook", url="http://127.0.0.1:9/unused", decision_links=True,
                    subscriptions=[SubscriptionSpec(events=["approval.requested"])],
                    actor=make_person("ada", "admin"))  # fmt: skip
    thread = storage.create_thread(agent=get_or_create_agent(name="travel"), external_id="trip-10")[0]
    approval = suspend(thread, action="book_hotel", args={"hotel": "Grand", "nights": 2})
    dispatch.fan_out()
    link = urlsplit(Delivery.objects.get().body["approval"]["decide"]["approve"]).path

    tab.goto(link)  # from the message: not signed in yet
    assert tab.page.url.endswith(f"/login/?next={link}")
    tab.page.fill("#id_username", "rita")
    tab.page.fill("#id_password", PASSWORD)
    tab.follow("button[type=submit]")
    assert urlsplit(tab.page.url).path == link
    assert '"hotel": "Grand"' in tab.page.locator("#proposed-args").inner_text()
    tab.shot("decide from a message")
    tab.page.fill("#decide-comment", "two nights is fine")
    tab.follow("#confirm-decision")

    assert urlsplit(tab.page.url).path == f"/inbox/{approval.pk}/"
    assert "Approved: book_hotel" in tab.page.locator(".flash").inner_text()
    approval = ApprovalRequest.objects.select_related("decided_by").get(pk=approval.pk)
    assert (approval.status, approval.decided_by.get_username()) == (ApprovalStatus.APPROVED, "rita")  # type: ignore[union-attr]
