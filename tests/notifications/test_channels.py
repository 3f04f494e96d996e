"""What each kind of channel receives, which notices each subscription hears, and the events they
come from: an approval requested, an in-doubt call, an approval about to expire, one escalated, a
thread that failed. Email is read from Django's outbox; Slack from a receiver on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
from django.contrib.auth.models import User
from django.core import mail
from django.core.mail import EmailMultiAlternatives
from django.utils import timezone

from approvals.services import file_in_doubt
from checkpoints import storage
from checkpoints.models import Thread
from notifications import dispatch
from notifications.endpoints import SubscriptionSpec, create_endpoint
from notifications.models import Delivery, DeliveryStatus
from quicksave_agents import tool_calls
from quicksave_agents.keys import get_or_create_agent
from tests.notifications.conftest import suspend, webhook
from tests.notifications.receiver import Receiver

pytestmark = pytest.mark.django_db


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    with httpx.Client() as client:
        yield client


def dispatch_all(client: httpx.Client) -> None:
    """What a dispatcher does, in this test's transaction: fan out everything queued, send what is due."""
    while dispatch.fan_out() + dispatch.notice_expiring():
        pass
    dispatch.send_due(client=client)


def test_an_email_channel_mails_its_recipients_a_link_to_the_approval(
    admin: User, thread: Thread, client: httpx.Client
) -> None:
    create_endpoint(name="on-call mail", kind="email", recipients=["oncall@example.com", "lead@example.com"],
                    subscriptions=[SubscriptionSpec(events=["approval.requested"])], actor=admin)  # fmt: skip

    approval = suspend(thread, action="wire_money", args={"amount": 9000, "to": "ACME <ops@acme.test>"})
    dispatch_all(client)

    [email] = mail.outbox
    assert isinstance(email, EmailMultiAlternatives)
    assert email.to == ["oncall@example.com", "lead@example.com"]
    assert email.subject == "[Quicksave] travel asks to wire_money (thread trip-1, high risk)"
    assert f"http://127.0.0.1:8000/inbox/{approval.pk}/" in email.body
    assert '"to": "ACME <ops@acme.test>"' in email.body
    html, mime = email.alternatives[0]
    assert mime == "text/html" and isinstance(html, str)
    assert "ACME &lt;ops@acme.test&gt;" in html, "the HTML part escapes what the agent wrote"
    assert Delivery.objects.get().status == DeliveryStatus.DELIVERED


def test_a_slack_channel_gets_blocks_with_the_request_its_args_and_buttons(
    admin: User, thread: Thread, receiver: Receiver, client: httpx.Client
) -> None:
    create_endpoint(name="#approvals", kind="slack", url=receiver.url, decision_links=True,
                    subscriptions=[SubscriptionSpec(events=["approval.requested"])], actor=admin)  # fmt: skip

    approval = suspend(thread, action="deploy", args={"env": "prod", "note": "<b>&"})
    dispatch_all(client)

    [request] = receiver.wait_for(1)
    assert "x-quicksave-signature" not in request.headers  # a Slack hook's URL is its credential
    message = request.json()
    assert message["text"] == "travel asks to deploy (thread trip-1, high risk)"
    text = "\n".join(block["text"]["text"] for block in message["blocks"] if "text" in block)
    assert "&lt;b&gt;&amp;" in text, "what the agent wrote is not Slack markup"
    [actions] = [block for block in message["blocks"] if block["type"] == "actions"]
    buttons = {button["action_id"]: button["url"] for button in actions["elements"]}
    assert buttons["open"] == f"http://127.0.0.1:8000/inbox/{approval.pk}/"
    assert buttons["approve"].startswith("http://127.0.0.1:8000/notifications/decide/")
    assert buttons["reject"].startswith("http://127.0.0.1:8000/notifications/decide/")


def test_subscriptions_filter_by_agent_action_and_risk(admin: User, thread: Thread, client: httpx.Client) -> None:
    url = "http://127.0.0.1:9/unused"
    webhook(admin, url, name="travel payments", agents=["travel"], actions=["pay"])
    webhook(admin, url, name="high risk anywhere", risks=["high"])
    webhook(admin, url, name="other agent", agents=["code-review"])

    suspend(thread, action="pay", risk="high")
    dispatch.fan_out()

    heard = set(Delivery.objects.values_list("endpoint__name", flat=True))
    assert heard == {"travel payments", "high risk anywhere"}


def test_a_low_risk_request_is_not_heard_by_a_high_risk_subscription(
    admin: User, thread: Thread, client: httpx.Client
) -> None:
    webhook(admin, "http://127.0.0.1:9/unused", risks=["high"])
    suspend(thread, action="pay", risk="low")
    dispatch.fan_out()
    assert not Delivery.objects.exists()


def test_an_in_doubt_call_is_its_own_event(admin: User, thread: Thread, client: httpx.Client) -> None:
    webhook(admin, "http://127.0.0.1:9/unused", "approval.in_doubt", name="doubts")
    webhook(admin, "http://127.0.0.1:9/unused", "approval.requested", name="requests")
    head = storage.append_checkpoint(thread=thread, parent=None, state={"n": 1})
    call = tool_calls.begin(thread_id=thread.pk, key="charge-1", tool="charge_card", args={"cents": 500}).call

    file_in_doubt(call=call, checkpoint=head)
    dispatch.fan_out()

    delivery = Delivery.objects.get()
    assert (delivery.endpoint.name, delivery.notice) == ("doubts", "approval.in_doubt")
    assert delivery.body["approval"]["kind"] == "in_doubt"
    assert delivery.body["approval"]["decide"] is None


def test_an_approval_near_its_deadline_is_noticed_once(
    admin: User, thread: Thread, client: httpx.Client, settings: Any
) -> None:
    settings.QUICKSAVE_NOTIFY_EXPIRING_SECONDS = 600
    webhook(admin, "http://127.0.0.1:9/unused", "approval.expiring")
    soon = suspend(thread, expires_at=timezone.now() + timedelta(minutes=5))
    later_thread = storage.create_thread(agent=thread.agent, external_id="later")[0]
    suspend(later_thread, expires_at=timezone.now() + timedelta(hours=2))

    assert dispatch.notice_expiring() == 1
    assert dispatch.notice_expiring() == 0

    delivery = Delivery.objects.get()
    assert (delivery.notice, delivery.approval_id) == ("approval.expiring", soon.pk)
    assert delivery.key == f"expiring:{soon.pk}"


def test_an_escalation_event_is_delivered_to_escalation_subscribers(
    admin: User, thread: Thread, client: httpx.Client
) -> None:
    webhook(admin, "http://127.0.0.1:9/unused", "approval.escalated")
    approval = suspend(thread)
    # What approval policies record when a deadline escalates a request: an event on the thread.
    storage.record_event(thread=thread, type="approval.escalated",
                         data={"approval": str(approval.pk), "agent": "travel", "to": "leads"})  # fmt: skip
    dispatch.fan_out()

    delivery = Delivery.objects.get()
    assert delivery.notice == "approval.escalated"
    assert delivery.body["event"]["data"]["to"] == "leads"
    assert delivery.body["approval"]["id"] == str(approval.pk)


def test_a_thread_that_fails_is_noticed_with_its_agent(admin: User, thread: Thread, client: httpx.Client) -> None:
    webhook(admin, "http://127.0.0.1:9/unused", "thread.failed", agents=["travel"])
    first = storage.append_checkpoint(thread=thread, parent=None, state={"n": 1})
    storage.append_checkpoint(thread=thread, parent=first.pk, state={"n": 2}, status="failed", label="gave up")
    other = storage.create_thread(agent=get_or_create_agent(name="code-review"), external_id="pr-7")[0]
    storage.set_thread_status(thread=other, status="failed")
    dispatch.fan_out()

    delivery = Delivery.objects.get()
    assert (delivery.notice, delivery.thread_id, delivery.approval_id) == ("thread.failed", thread.pk, None)
    assert delivery.body["thread"]["url"] == f"http://127.0.0.1:8000/threads/{thread.pk}/"


def test_a_request_decided_before_it_was_fanned_out_notifies_nobody(
    admin: User, reviewer: User, thread: Thread
) -> None:
    from approvals.services import decide

    webhook(admin, "http://127.0.0.1:9/unused")
    approval = suspend(thread)
    decide(approval=approval, user=reviewer, decision="approve")
    dispatch.fan_out()
    assert not Delivery.objects.exists()


def test_the_receivers_refusal_is_kept_and_a_connection_error_too(
    admin: User, thread: Thread, receiver: Receiver, client: httpx.Client
) -> None:
    webhook(admin, receiver.url, name="refuses")
    webhook(admin, "http://127.0.0.1:9/nothing-listens", name="unreachable")
    receiver.script = [410]

    suspend(thread)
    dispatch_all(client)

    refused = Delivery.objects.get(endpoint__name="refuses")
    assert (refused.status, refused.response_code, refused.error) == ("pending", 410, "HTTP 410: try later")
    unreachable = Delivery.objects.get(endpoint__name="unreachable")
    assert unreachable.response_code is None
    assert unreachable.error.startswith("ConnectError")
    assert unreachable.next_attempt_at > timezone.now()


def test_deleting_a_thread_takes_its_deliveries_and_decision_links_with_it(admin: User, thread: Thread) -> None:
    from notifications.models import DecisionLink

    create_endpoint(name="ops", kind="webhook", url="http://127.0.0.1:9/unused", decision_links=True,
                    subscriptions=[SubscriptionSpec(events=["approval.requested"])], actor=admin)  # fmt: skip
    suspend(thread)
    dispatch.fan_out()
    assert Delivery.objects.exists() and DecisionLink.objects.exists()

    storage.delete_thread(thread)

    assert not Delivery.objects.exists()
    assert not DecisionLink.objects.exists()


def test_an_event_that_cannot_be_made_into_a_message_does_not_hold_up_the_next(
    admin: User, thread: Thread, monkeypatch: pytest.MonkeyPatch
) -> None:
    from notifications import messages
    from notifications.models import QueuedEvent

    webhook(admin, "http://127.0.0.1:9/unused")
    broken = suspend(thread)
    fine = suspend(storage.create_thread(agent=thread.agent, external_id="trip-2")[0])
    made = messages.approval_body

    def approval_body(**kwargs: Any) -> Any:
        if kwargs["approval"].pk == broken.pk:
            raise RuntimeError("a message that cannot be built")
        return made(**kwargs)

    monkeypatch.setattr(messages, "approval_body", approval_body)
    assert dispatch.fan_out() == 2

    assert list(Delivery.objects.values_list("approval_id", flat=True)) == [fine.pk]
    assert not QueuedEvent.objects.exists()
