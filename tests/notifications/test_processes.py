"""The dispatcher as operators run it: inside `run_agents`, and on its own, killed mid-delivery and
started again (the delivery is sent again, not lost)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.contrib.auth.models import User

from checkpoints.models import Thread
from notifications.models import Delivery, DeliveryStatus
from quicksave_agents.demo import TravelAgent
from tests.notifications.conftest import suspend, webhook
from tests.notifications.receiver import Receiver
from tests.processes import ROOT, Workers, database_url
from tests.waiting import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Workers]:
    started = Workers(tmp_path, agent=TravelAgent.name, lease_seconds=30)
    yield started
    started.kill_all()


class Dispatchers:
    """`manage.py run_notifications` processes against the test database."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.processes: list[subprocess.Popen[bytes]] = []

    def start(self, **env: str) -> subprocess.Popen[bytes]:
        with open(self.directory / f"dispatcher-{len(self.processes) + 1}.log", "wb") as log:
            process = subprocess.Popen(
                [sys.executable, "manage.py", "run_notifications", "--poll", "0.5"],
                cwd=ROOT, env={**os.environ, "DATABASE_URL": database_url(), **env}, stdout=log,
                stderr=subprocess.STDOUT,
            )  # fmt: skip
        self.processes.append(process)
        return process

    def logs(self) -> str:
        return "\n".join(path.read_text(errors="replace") for path in sorted(self.directory.glob("dispatcher-*.log")))

    def kill_all(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
            process.wait(timeout=30)


@pytest.fixture
def dispatchers(tmp_path: Path) -> Iterator[Dispatchers]:
    started = Dispatchers(tmp_path)
    yield started
    started.kill_all()


def test_run_agents_sends_notifications_beside_the_agents(
    admin: User, thread: Thread, receiver: Receiver, workers: Workers
) -> None:
    secret = webhook(admin, receiver.url)[1]
    workers.start()

    approval = suspend(thread)

    [request] = receiver.wait_for(1, timeout=60)
    assert request.signed_by(secret)
    assert request.json()["approval"]["id"] == str(approval.pk)


def test_a_dispatcher_killed_mid_delivery_leaves_it_to_the_next_one(
    admin: User, thread: Thread, receiver: Receiver, dispatchers: Dispatchers
) -> None:
    webhook(admin, receiver.url)
    receiver.hold.clear()  # the receiver reads the request and does not answer
    first = dispatchers.start(QUICKSAVE_NOTIFY_TIMEOUT_SECONDS="1")
    suspend(thread)
    assert receiver.entered.wait(60), dispatchers.logs()

    first.send_signal(signal.SIGKILL)  # mid-delivery: claimed, sent, nothing recorded
    first.wait(timeout=30)
    receiver.hold.set()
    dispatchers.start(QUICKSAVE_NOTIFY_TIMEOUT_SECONDS="1")

    requests = receiver.wait_for(2, timeout=60)
    assert requests[0].json()["id"] == requests[1].json()["id"]
    delivery = wait_until(lambda: Delivery.objects.filter(status=DeliveryStatus.DELIVERED).first(),
                          what="the delivery recorded as delivered", details=dispatchers.logs)  # fmt: skip
    assert delivery.attempts == 2
