"""The notifications API: admins configure endpoints with precise field errors, read the delivery
log and send a delivery again; nobody else may."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from audit.models import AuditEntry
from checkpoints.models import Thread
from notifications import dispatch, endpoints
from notifications.models import Delivery, Endpoint
from tests.notifications.conftest import suspend, webhook

pytestmark = pytest.mark.django_db

ENDPOINTS = "/api/v1/notifications/endpoints/"


def api_as(user: User) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def send(client: APIClient, method: str, url: str, body: Any = None) -> Any:
    return client.generic(method, url, json.dumps(body) if body is not None else "", content_type="application/json")


def test_an_admin_creates_a_webhook_and_sees_its_secret_once(admin: User) -> None:
    client = api_as(admin)
    created = send(client, "POST", ENDPOINTS, {
        "name": "ops", "kind": "webhook", "url": "https://hooks.example.com/quicksave/T0K3N?x=1",
        "subscriptions": [{"events": ["approval.requested", "approval.escalated"], "risks": ["high"]}],
    })  # fmt: skip

    assert created.status_code == 201, created.content
    body = created.json()
    assert body["secret"].startswith("whsec_")
    assert body["url"] == "https://hooks.example.com/…", "the path may be a credential: only the host is shown"
    assert body["subscriptions"][0]["events"] == ["approval.requested", "approval.escalated"]
    endpoint = Endpoint.objects.get()
    assert endpoints.credentials(endpoint) == {"url": "https://hooks.example.com/quicksave/T0K3N?x=1",
                                               "secret": body["secret"]}  # fmt: skip
    assert b"T0K3N" not in bytes(endpoint.credentials), "credentials are sealed at rest"
    read = send(client, "GET", f"{ENDPOINTS}{endpoint.pk}/").json()
    assert "secret" not in read
    assert AuditEntry.objects.filter(action="notification_endpoint.create", actor=admin).count() == 1


@pytest.mark.parametrize(
    ("body", "field", "message"),
    [
        ({"name": "m", "kind": "email", "url": "https://x.test/"}, "url", "An email channel sends to `recipients`"),
        ({"name": "m", "kind": "email"}, "recipients", "An email channel needs at least one address."),
        ({"name": "w", "kind": "webhook", "url": "ftp://x.test/"}, "url", "The URL must start with http://"),
        ({"name": "w", "kind": "webhook"}, "url", "This kind of channel needs a URL."),
        ({"name": "w", "kind": "pager", "url": "https://x.test/"}, "kind", '"pager" is not a valid choice.'),
        ({"name": "w", "kind": "webhook", "url": "https://x.test/", "colour": "red"}, "colour", "is not a field here"),
        ({"name": "w", "kind": "email", "recipients": ["not-an-address"]}, "recipients", "Enter a valid email"),
    ],
)
def test_a_bad_endpoint_is_a_400_naming_its_field(admin: User, body: dict[str, Any], field: str, message: str) -> None:
    response = send(api_as(admin), "POST", ENDPOINTS, body)

    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "invalid"
    assert field in error["detail"]["fields"], error
    assert message in str(error["detail"]["fields"][field]), error
    assert not Endpoint.objects.exists()


def test_a_bad_subscription_names_its_place_in_the_list(admin: User) -> None:
    response = send(api_as(admin), "POST", ENDPOINTS, {
        "name": "w", "kind": "webhook", "url": "https://x.test/",
        "subscriptions": [{"events": ["approval.requested"]}, {"events": ["approval.eaten"]}],
    })  # fmt: skip

    assert response.status_code == 400
    fields = response.json()["error"]["detail"]["fields"]
    assert fields["subscriptions"][1]["events"] == {"0": ['"approval.eaten" is not a valid choice.']}


def test_a_second_channel_with_a_taken_name_is_refused(admin: User) -> None:
    body = {"name": "ops", "kind": "webhook", "url": "https://x.test/"}
    send(api_as(admin), "POST", ENDPOINTS, body)
    again = send(api_as(admin), "POST", ENDPOINTS, body)
    assert again.status_code == 400
    assert again.json()["error"]["detail"]["fields"] == {"name": "A channel is already named 'ops'."}


def test_patch_changes_what_is_given_and_keeps_the_rest(admin: User) -> None:
    endpoint, secret = webhook(admin, "https://x.test/hook")
    client = api_as(admin)

    changed = send(client, "PATCH", f"{ENDPOINTS}{endpoint.pk}/", {"enabled": False, "subscriptions": [
        {"events": ["thread.failed"], "agents": ["travel"]}]})  # fmt: skip

    assert changed.status_code == 200, changed.content
    body = changed.json()
    assert (body["enabled"], body["name"], body["url"]) == (False, "ops", "https://x.test/…")
    assert [sub["events"] for sub in body["subscriptions"]] == [["thread.failed"]]
    assert endpoints.credentials(Endpoint.objects.get()) == {"url": "https://x.test/hook", "secret": secret}
    kind = send(client, "PATCH", f"{ENDPOINTS}{endpoint.pk}/", {"kind": "email"})
    assert kind.json()["error"]["detail"]["fields"] == {"kind": ["A channel's kind cannot change; make a new channel."]}
    bad_url = send(client, "PATCH", f"{ENDPOINTS}{endpoint.pk}/", {"url": "javascript:alert(1)"})
    assert bad_url.status_code == 400
    assert "url" in bad_url.json()["error"]["detail"]["fields"]


def test_rotating_the_secret_returns_a_new_one_and_the_old_one_stops(admin: User) -> None:
    endpoint, old = webhook(admin, "https://x.test/hook")

    rotated = send(api_as(admin), "POST", f"{ENDPOINTS}{endpoint.pk}/rotate-secret/")

    assert rotated.status_code == 200
    new = rotated.json()["secret"]
    assert new != old
    assert endpoints.credentials(Endpoint.objects.get())["secret"] == new


def test_the_delivery_log_lists_an_endpoints_deliveries_and_one_is_sent_again(admin: User, thread: Thread) -> None:
    endpoint, _ = webhook(admin, "http://127.0.0.1:9/unused")
    suspend(thread)
    dispatch.fan_out()
    client = api_as(admin)

    page = send(client, "GET", f"/api/v1/notifications/deliveries/?endpoint={endpoint.pk}").json()
    [listed] = page["results"]
    assert (listed["event"], listed["status"], listed["thread"], page["next"]) == (
        "approval.requested", "pending", str(thread.pk), None)  # fmt: skip

    again = send(client, "POST", f"/api/v1/notifications/deliveries/{listed['id']}/redeliver/")

    assert again.status_code == 201
    assert again.json()["resend_of"] == listed["id"]
    original, copy = Delivery.objects.order_by("id")
    assert copy.body == original.body
    assert AuditEntry.objects.filter(action="notification_delivery.resend", actor=admin).exists()


def test_deleting_an_endpoint_drops_its_log(admin: User, thread: Thread) -> None:
    endpoint, _ = webhook(admin, "http://127.0.0.1:9/unused")
    suspend(thread)
    dispatch.fan_out()

    assert send(api_as(admin), "DELETE", f"{ENDPOINTS}{endpoint.pk}/").status_code == 204
    assert not Delivery.objects.exists()


def test_a_huge_delivery_id_is_a_404(admin: User) -> None:
    response = send(api_as(admin), "GET", f"/api/v1/notifications/deliveries/{10**30}/")
    assert response.status_code == 404


@pytest.mark.parametrize("role", ["viewer", "reviewer"])
def test_only_admins_configure_notifications(role: str, admin: User) -> None:
    from tests.conftest import person

    endpoint, _ = webhook(admin, "https://x.test/hook")
    client = api_as(person(f"someone-{role}", role))
    assert send(client, "GET", ENDPOINTS).status_code == 403
    new = {"name": "x", "kind": "webhook", "url": "https://x.test/"}
    assert send(client, "POST", ENDPOINTS, new).status_code == 403
    assert send(client, "DELETE", f"{ENDPOINTS}{endpoint.pk}/").status_code == 403
    assert Endpoint.objects.count() == 1


def test_the_documented_schemas_name_every_field_the_api_returns(admin: User, thread: Thread) -> None:
    client = api_as(admin)
    new = {"name": "ops", "kind": "webhook", "url": "http://127.0.0.1:9/x",
           "subscriptions": [{"events": ["approval.requested"]}]}  # fmt: skip
    created = send(client, "POST", ENDPOINTS, new).json()
    suspend(thread)
    dispatch.fan_out()
    delivery = send(client, "GET", f"/api/v1/notifications/deliveries/{Delivery.objects.get().pk}/").json()
    # Imported once a request has loaded the API (quicksave.api cannot be the first module to import DRF's views).
    from notifications.serializers import (
        DeliverySchemaSerializer,
        EndpointSchemaSerializer,
        SubscriptionSchemaSerializer,
    )

    assert set(created) == set(EndpointSchemaSerializer().fields)
    assert set(created["subscriptions"][0]) == set(SubscriptionSchemaSerializer().fields)
    assert set(delivery) == set(DeliverySchemaSerializer().fields)


def test_a_patch_with_a_subscription_missing_its_events_is_a_400(admin: User) -> None:
    endpoint, _ = webhook(admin, "https://x.test/hook")

    response = send(api_as(admin), "PATCH", f"{ENDPOINTS}{endpoint.pk}/", {"subscriptions": [{"agents": []}]})

    assert response.status_code == 400, response.content
    assert response.json()["error"]["detail"]["fields"] == {"subscriptions": [{"events": ["This field is required."]}]}
