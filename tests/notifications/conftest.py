"""Fixtures for notification tests: a loopback webhook receiver, a dispatcher running in a thread of
the test process (so it reads Django's mail outbox and the test's settings), an admin, a reviewer,
and a way to make an agent wait on a person."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connections

from approvals.models import ApprovalRequest
from approvals.services import request_approval
from checkpoints import storage
from checkpoints.models import Thread
from notifications.dispatch import Dispatcher
from notifications.endpoints import SubscriptionSpec, create_endpoint
from notifications.models import Endpoint
from tests.conftest import person
from tests.notifications.receiver import Receiver, receiving


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    yield from receiving()


@pytest.fixture
def admin(db: Any) -> User:
    return person("ada", "admin")


@pytest.fixture
def reviewer(db: Any) -> User:
    return person("rita", "reviewer")


@pytest.fixture
def fast_retries(settings: Any) -> None:
    settings.QUICKSAVE_NOTIFY_RETRY_SECONDS = 0.05


class RunningDispatcher:
    def __init__(self) -> None:
        self.stopping = threading.Event()
        self.dispatcher = Dispatcher(poll_seconds=0.5)
        self.thread = threading.Thread(target=self._run, name="test-dispatcher", daemon=True)

    def _run(self) -> None:
        try:
            self.dispatcher.run_forever(self.stopping)
        finally:
            connections.close_all()

    def start(self) -> RunningDispatcher:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(timeout=30)
        assert not self.thread.is_alive(), "the dispatcher did not stop"


@pytest.fixture
def dispatcher(transactional_db: Any) -> Iterator[RunningDispatcher]:
    """A dispatcher running in a thread, as `run_agents` runs one; it sees only committed rows."""
    running = RunningDispatcher().start()
    try:
        yield running
    finally:
        running.stop()


def webhook(admin: User, url: str, *events: str, name: str = "ops", **filters: Any) -> tuple[Endpoint, str]:
    """A webhook endpoint subscribed to `events` (approval.requested by default); returns it and its secret."""
    endpoint, secret = create_endpoint(
        name=name, kind="webhook", url=url, actor=admin,
        subscriptions=[SubscriptionSpec(events=list(events or ["approval.requested"]), **filters)],
    )  # fmt: skip
    assert secret is not None
    return endpoint, secret


def suspend(thread: Thread, *, action: str = "book_flight", args: Any = None, risk: str = "high",
            **extra: Any) -> ApprovalRequest:  # fmt: skip
    """Make `thread` wait on a person: a checkpoint, then an approval request at it."""
    head = storage.append_checkpoint(thread=thread, parent=thread.head_id if thread.head_id else None,
                                     state={"step": action}, label=action, status="waiting_for_approval")  # fmt: skip
    thread.head_id = head.pk
    return request_approval(thread=thread, checkpoint=head, action=action,
                            args={"flight": "SK123", "price": 420} if args is None else args, risk=risk,
                            message=f"May I {action}?", **extra)  # fmt: skip
