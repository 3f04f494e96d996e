"""The notifications pages: admins add channels, change them, read the delivery log and send a
delivery again after confirming; the forms name what is wrong; nobody else gets in."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from checkpoints import storage
from checkpoints.models import Thread
from notifications import dispatch, endpoints
from notifications.models import Delivery, Endpoint, Subscription
from tests.conftest import person, signed_in
from tests.notifications.conftest import suspend, webhook

pytestmark = pytest.mark.django_db


def test_an_admin_adds_a_webhook_and_sees_its_secret_once(admin: User) -> None:
    page = signed_in(admin)

    created = page.post("/notifications/new/", {
        "name": "on-call", "kind": "webhook", "url": "https://hooks.example.com/q", "events": ["approval.requested",
        "thread.failed"], "agents": "travel, code-review", "risks": ["high"],
    })  # fmt: skip

    assert created.status_code == 200
    endpoint = Endpoint.objects.get()
    secret = endpoints.credentials(endpoint)["secret"]
    assert secret.encode() in created.content
    assert created["Cache-Control"].startswith("max-age=0")
    subscription = Subscription.objects.get()
    assert (subscription.events, subscription.agents, subscription.risks) == (
        ["approval.requested", "thread.failed"], ["travel", "code-review"], ["high"])  # fmt: skip
    assert secret.encode() not in page.get(f"/notifications/{endpoint.pk}/").content


def test_an_email_channel_goes_straight_to_its_page(admin: User) -> None:
    created = signed_in(admin).post("/notifications/new/", {
        "name": "mail", "kind": "email", "recipients": "a@example.com b@example.com", "events": ["approval.in_doubt"],
    })  # fmt: skip
    endpoint = Endpoint.objects.get()
    assert created["Location"] == f"/notifications/{endpoint.pk}/"
    assert endpoint.recipients == ["a@example.com", "b@example.com"]


@pytest.mark.parametrize(
    ("form", "message"),
    [
        ({"name": "m", "kind": "email", "recipients": "nobody", "events": ["approval.requested"]},
         "&#x27;nobody&#x27; is not an email address."),
        ({"name": "w", "kind": "webhook", "url": "gopher://x", "events": ["approval.requested"]},
         "The URL must start with http:// or https://"),
        ({"name": "w", "kind": "webhook", "url": "https://x.test/"}, "Choose at least one event."),
        ({"name": "w", "kind": "webhook", "url": "https://x.test/", "events": ["approval.requested"],
          "agents": "Not An Agent"}, "Agent names are 1 to 64 lowercase letters"),
    ],
)  # fmt: skip
def test_the_add_form_names_what_is_wrong(admin: User, form: dict[str, Any], message: str) -> None:
    response = signed_in(admin).post("/notifications/new/", form)
    assert response.status_code == 400
    assert message.encode() in response.content
    assert not Endpoint.objects.exists()


def test_the_channel_page_shows_the_delivery_log_in_a_few_queries(
    admin: User, thread: Thread, django_assert_max_num_queries: Any
) -> None:
    endpoint, _ = webhook(admin, "http://127.0.0.1:9/unused")
    for n in range(3):
        other = storage.create_thread(agent=thread.agent, external_id=f"trip-{n + 2}")[0]
        suspend(other)
    dispatch.fan_out()
    Delivery.objects.filter(pk=Delivery.objects.order_by("id").first().pk).update(response_code=503, attempts=2)  # type: ignore[union-attr]
    page = signed_in(admin)

    with django_assert_max_num_queries(12):
        response = page.get(f"/notifications/{endpoint.pk}/")

    assert response.status_code == 200
    assert response.content.count(b"data-delivery=") == 3
    assert b'<span class="mono">503</span>' in response.content


def test_send_again_asks_first_then_makes_a_new_delivery(admin: User, thread: Thread) -> None:
    webhook(admin, "http://127.0.0.1:9/unused")
    suspend(thread)
    dispatch.fan_out()
    original = Delivery.objects.get()
    page = signed_in(admin)

    confirm = page.get(f"/notifications/deliveries/{original.pk}/")
    assert confirm.status_code == 200
    assert b'id="confirm-send-again"' in confirm.content
    assert Delivery.objects.count() == 1, "the confirmation page sends nothing"

    sent = page.post(f"/notifications/deliveries/{original.pk}/send-again/")

    again = Delivery.objects.exclude(pk=original.pk).get()
    assert sent["Location"] == f"/notifications/deliveries/{again.pk}/"
    assert (again.resend_of_id, again.requested_by, again.body) == (original.pk, admin, original.body)
    assert page.get(f"/notifications/deliveries/{original.pk}/send-again/").status_code == 405


def test_settings_subscriptions_secret_and_deletion_from_the_channel_page(admin: User) -> None:
    endpoint, old_secret = webhook(admin, "https://x.test/hook")
    page = signed_in(admin)
    url = f"/notifications/{endpoint.pk}/"

    saved = page.post(url, {"name": "ops two", "url": "", "decision_links": "on"})
    assert saved.status_code == 302
    endpoint.refresh_from_db()
    assert (endpoint.name, endpoint.enabled, endpoint.decision_links) == ("ops two", False, True)
    assert endpoints.credentials(endpoint)["url"] == "https://x.test/hook", "a blank URL keeps the current one"

    page.post(f"{url}subscriptions/", {"events": ["approval.expiring"], "actions": "deploy, pay"})
    added = Subscription.objects.order_by("-id").first()
    assert added is not None and (added.events, added.actions) == (["approval.expiring"], ["deploy", "pay"])
    page.post(f"{url}subscriptions/{added.pk}/remove/")
    assert Subscription.objects.count() == 1

    assert b"old one stops at once" in page.get(f"{url}secret/").content
    rotated = page.post(f"{url}secret/")
    new_secret = endpoints.credentials(Endpoint.objects.get())["secret"]
    assert new_secret != old_secret and new_secret.encode() in rotated.content

    assert b"It cannot be undone" in page.get(f"{url}delete/").content
    assert page.post(f"{url}delete/")["Location"] == "/notifications/"
    assert not Endpoint.objects.exists()


@pytest.mark.parametrize("role", ["viewer", "reviewer"])
def test_only_admins_open_the_notifications_pages(admin: User, role: str) -> None:
    endpoint, _ = webhook(admin, "https://x.test/hook")
    page = signed_in(person(f"p-{role}", role))
    for url in ("/notifications/", f"/notifications/{endpoint.pk}/", f"/notifications/{endpoint.pk}/delete/"):
        assert page.get(url).status_code == 403, url
    assert page.post(f"/notifications/{endpoint.pk}/delete/").status_code == 403
    assert Endpoint.objects.exists()


def test_a_signed_out_visitor_is_sent_to_sign_in(admin: User) -> None:
    response = Client().get("/notifications/")
    assert response["Location"] == "/login/?next=/notifications/"


def test_admins_see_notifications_in_the_navigation(admin: User, reviewer: User) -> None:
    assert b'href="/notifications/"' in signed_in(admin).get("/").content
    assert b'href="/notifications/"' not in signed_in(reviewer).get("/").content
