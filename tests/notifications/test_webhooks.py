"""Webhooks to a real receiver on loopback: signed, retried after a 500, in order, never in the
agent's way, and not lost when no dispatcher runs for a while."""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connections

from approvals.models import ApprovalRequest
from approvals.services import decide
from checkpoints import storage
from checkpoints.models import Thread
from notifications import dispatch
from notifications.endpoints import update_endpoint
from notifications.models import Delivery, DeliveryStatus, QueuedEvent
from tests.notifications.conftest import RunningDispatcher, suspend, webhook
from tests.notifications.receiver import Receiver
from tests.waiting import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_approval_request_reaches_a_subscribed_webhook_signed(
    admin: User, thread: Thread, receiver: Receiver, dispatcher: RunningDispatcher
) -> None:
    _, secret = webhook(admin, receiver.url)

    approval = suspend(thread, args={"flight": "SK123", "price": 420})

    [request] = receiver.wait_for(1)
    assert request.signed_by(secret)
    assert abs(int(request.headers["x-quicksave-timestamp"]) - time.time()) < 60
    assert request.headers["x-quicksave-event"] == "approval.requested"
    body = request.json()
    assert (body["type"], body["agent"], body["thread"]["external_id"]) == ("approval.requested", "travel", "trip-1")
    assert body["approval"]["id"] == str(approval.pk)
    assert (body["approval"]["action"], body["approval"]["args"]) == ("book_flight", {"flight": "SK123", "price": 420})
    assert body["approval"]["url"] == f"http://127.0.0.1:8000/inbox/{approval.pk}/"
    delivery = wait_until(lambda: Delivery.objects.filter(status=DeliveryStatus.DELIVERED).first(),
                          what="the delivery to be recorded as delivered")  # fmt: skip
    assert (delivery.response_code, delivery.attempts) == (200, 1)


def test_a_signature_made_with_another_secret_does_not_verify(
    admin: User, thread: Thread, receiver: Receiver, dispatcher: RunningDispatcher
) -> None:
    webhook(admin, receiver.url)
    suspend(thread)
    [request] = receiver.wait_for(1)
    assert not request.signed_by("whsec_not-the-endpoints-secret")


def test_a_500_is_retried_until_the_receiver_takes_it(
    admin: User, thread: Thread, receiver: Receiver, fast_retries: None, dispatcher: RunningDispatcher
) -> None:
    _, secret = webhook(admin, receiver.url)
    receiver.script = [500, 500]

    suspend(thread)

    requests = receiver.wait_for(3)
    assert [request.status for request in requests] == [500, 500, 200]
    assert all(request.signed_by(secret) for request in requests)
    assert len({request.body for request in requests}) == 1, "every attempt sends the same message"
    delivery = wait_until(lambda: Delivery.objects.filter(status=DeliveryStatus.DELIVERED).first(),
                          what="the delivery to be recorded as delivered")  # fmt: skip
    assert delivery.attempts == 3
    assert [attempt.response_code for attempt in delivery.attempt_log.all()] == [500, 500, 200]


def test_a_receiver_that_keeps_failing_is_given_up_after_the_last_attempt(
    admin: User, thread: Thread, receiver: Receiver, fast_retries: None, settings: Any, dispatcher: RunningDispatcher
) -> None:
    settings.QUICKSAVE_NOTIFY_MAX_ATTEMPTS = 3
    webhook(admin, receiver.url)
    receiver.script = [503] * 10

    suspend(thread)

    delivery = wait_until(lambda: Delivery.objects.filter(status=DeliveryStatus.FAILED).first(),
                          what="the delivery to be given up")  # fmt: skip
    assert (delivery.attempts, delivery.response_code) == (3, 503)
    assert delivery.error.startswith("HTTP 503")
    assert len(receiver.received) == 3


def test_a_threads_notices_arrive_in_order_even_when_the_first_is_retried(
    admin: User, thread: Thread, receiver: Receiver, fast_retries: None, dispatcher: RunningDispatcher
) -> None:
    webhook(admin, receiver.url, "approval.requested", "thread.failed")
    receiver.script = [500]  # the first notice fails once

    first = suspend(thread, action="book_flight")
    # The second notice is recorded while the first still waits for its retry.
    wait_until(lambda: Delivery.objects.filter(attempts__gte=1).exists(), what="the first attempt")
    storage.append_checkpoint(thread=thread, parent=first.checkpoint_id, state={"gave": "up"}, label="gave up",
                              status="failed")  # fmt: skip

    requests = receiver.wait_for(3)
    assert [(request.json()["type"], request.status) for request in requests] == [
        ("approval.requested", 500), ("approval.requested", 200), ("thread.failed", 200),
    ]  # fmt: skip


def test_a_failing_receiver_does_not_hold_up_other_threads(
    admin: User, agent: Any, receiver: Receiver, settings: Any, dispatcher: RunningDispatcher
) -> None:
    settings.QUICKSAVE_NOTIFY_RETRY_SECONDS = 60  # the failed one waits a minute
    webhook(admin, receiver.url)
    receiver.script = [500]
    first_thread = storage.create_thread(agent=agent, external_id="first")[0]
    other_thread = storage.create_thread(agent=agent, external_id="other")[0]

    suspend(first_thread)
    receiver.wait_for(1)
    suspend(other_thread)

    second = receiver.wait_for(2)[1]
    assert (second.json()["thread"]["external_id"], second.status) == ("other", 200)


def test_the_agents_write_commits_while_the_receiver_still_holds_the_request(
    admin: User, thread: Thread, receiver: Receiver, dispatcher: RunningDispatcher
) -> None:
    webhook(admin, receiver.url)
    receiver.hold.clear()  # the receiver takes the request and does not answer

    first = suspend(thread)
    assert receiver.entered.wait(30), "the delivery never reached the receiver"
    # The agent goes on writing while its notice is still in flight: the write never waited for it.
    storage.append_checkpoint(thread=thread, parent=first.checkpoint_id, state={"more": 1}, label="more")
    decide(approval=first, user=admin, decision="approve")

    assert ApprovalRequest.objects.get(pk=first.pk).status == "approved"
    assert Delivery.objects.get().status == DeliveryStatus.PENDING
    receiver.hold.set()
    wait_until(lambda: Delivery.objects.filter(status=DeliveryStatus.DELIVERED).exists(), what="the delivery")


def test_an_event_queued_while_no_dispatcher_runs_is_delivered_when_one_starts(
    admin: User, thread: Thread, receiver: Receiver
) -> None:
    webhook(admin, receiver.url)

    approval = suspend(thread)
    assert QueuedEvent.objects.count() == 1  # committed with the request, in PostgreSQL

    running = RunningDispatcher().start()
    try:
        [request] = receiver.wait_for(1)
    finally:
        running.stop()
    assert request.json()["approval"]["id"] == str(approval.pk)
    assert not QueuedEvent.objects.exists()


def test_a_delivery_whose_dispatcher_died_mid_attempt_is_sent_again(
    admin: User, thread: Thread, receiver: Receiver, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.QUICKSAVE_NOTIFY_TIMEOUT_SECONDS = 1
    monkeypatch.setattr(dispatch, "LEASE_MARGIN_SECONDS", 0)
    webhook(admin, receiver.url)
    suspend(thread)
    dispatch.fan_out()
    [claimed] = dispatch.claim_due(limit=10)  # ... and the process dies before sending
    connections.close_all()

    running = RunningDispatcher().start()
    try:
        [request] = receiver.wait_for(1)
    finally:
        running.stop()
    delivery = Delivery.objects.get()
    assert request.json()["id"] == delivery.key
    assert (delivery.status, delivery.attempts) == (DeliveryStatus.DELIVERED, 2)
    assert claimed.pk == delivery.pk


def test_nothing_is_queued_while_no_endpoint_is_enabled(admin: User, thread: Thread, receiver: Receiver) -> None:
    endpoint, _ = webhook(admin, receiver.url)
    update_endpoint(endpoint=endpoint, actor=admin, enabled=False)

    suspend(thread)

    assert not QueuedEvent.objects.exists()
