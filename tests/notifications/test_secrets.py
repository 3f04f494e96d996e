"""An endpoint's URL and signing secret are sealed at rest under the master keyring, follow it when
a new master key heads it, and a delivery whose credentials no longer open fails saying why."""

from __future__ import annotations

import base64
import os
from typing import Any

import httpx
import pytest
from django.contrib.auth.models import User

from checkpoints.models import Thread
from notifications import dispatch, endpoints, secrets
from notifications.models import Delivery, DeliveryStatus, Endpoint
from tests.notifications.conftest import suspend, webhook

pytestmark = pytest.mark.django_db


def key_entry(key_id: str) -> str:
    return f"{key_id}:{base64.b64encode(os.urandom(32)).decode()}"


def test_credentials_are_sealed_and_bound_to_their_endpoint(admin: User) -> None:
    first, _ = webhook(admin, "https://hooks.example.com/T0K3N", name="first")
    second, _ = webhook(admin, "https://hooks.example.com/other", name="second")

    assert b"T0K3N" not in bytes(first.credentials)
    # Sealed values copied from one endpoint's row into another's do not open there.
    Endpoint.objects.filter(pk=second.pk).update(credentials=first.credentials)
    with pytest.raises(secrets.UnreadableCredentials):
        endpoints.credentials(Endpoint.objects.get(pk=second.pk))


def test_a_new_master_key_reseals_credentials_so_the_old_one_can_go(admin: User, settings: Any) -> None:
    old = key_entry("old")
    settings.QUICKSAVE_ENCRYPTION_KEYS = old
    endpoint, secret = webhook(admin, "https://hooks.example.com/q")
    settings.QUICKSAVE_ENCRYPTION_KEYS = f"{key_entry('new')},{old}"

    assert endpoints.reseal_stale() == 1
    assert endpoints.reseal_stale() == 0

    settings.QUICKSAVE_ENCRYPTION_KEYS = settings.QUICKSAVE_ENCRYPTION_KEYS.split(",")[0]  # the old key retired
    assert endpoints.credentials(Endpoint.objects.get(pk=endpoint.pk))["secret"] == secret


def test_a_delivery_whose_credentials_do_not_open_fails_at_once_saying_why(admin: User, thread: Thread) -> None:
    endpoint, _ = webhook(admin, "http://127.0.0.1:9/unused")
    suspend(thread)
    dispatch.fan_out()
    key_id = secrets.sealed_under(endpoint.credentials)
    Endpoint.objects.update(credentials=key_id.encode() + b":" + os.urandom(60))  # altered outside Quicksave

    with httpx.Client() as client:
        dispatch.send_due(client=client)

    delivery = Delivery.objects.get()
    assert (delivery.status, delivery.attempts) == (DeliveryStatus.FAILED, 1)
    assert "do not open" in delivery.error
