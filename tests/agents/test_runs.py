"""Runs: claimed under a lease with SKIP LOCKED, kept by heartbeats, re-claimed when a worker dies,
long-polled by external agents who are woken by NOTIFY, and picked up by idle workers woken by
NOTIFY (or, when no notification comes, by their poll)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.db import connection, connections
from django.utils import timezone
from rest_framework.test import APIClient

from checkpoints import storage
from checkpoints.models import Thread
from quicksave_agents.demo import CodeReviewAgent
from quicksave_agents.keys import get_or_create_agent
from quicksave_agents.models import Agent, Run, RunReason, RunStatus
from quicksave_agents.runs import CHANNEL, LeaseLost, claim_run, enqueue_run, finish_run, heartbeat
from quicksave_agents.runtime import start_thread
from tests.processes import Workers
from tests.waiting import wait_until


def queued(thread: Thread, n: int = 1) -> list[Run]:
    checkpoint = storage.append_checkpoint(thread=thread, parent=None, state={"a": 1})
    return [enqueue_run(thread=thread, checkpoint=checkpoint, reason=RunReason.MANUAL) for _ in range(n)]


def post(client: APIClient, url: str, body: Any = None) -> Any:
    return client.post(url, data=json.dumps(body or {}), content_type="application/json")


def test_a_claim_takes_the_oldest_queued_run_under_a_lease(thread: Thread, agent: Agent) -> None:
    first, second = queued(thread, 2)
    run = claim_run(agents=[agent], worker="w1", lease_seconds=30)
    assert run is not None and run.pk == first.pk
    assert (run.status, run.claimed_by, run.attempts) == (RunStatus.RUNNING, "w1", 1)
    assert run.lease_expires_at is not None and run.lease_expires_at > timezone.now()
    assert claim_run(agents=[agent], worker="w2").pk == second.pk  # type: ignore[union-attr]
    assert claim_run(agents=[agent], worker="w3") is None


def test_a_run_whose_worker_died_is_claimed_again(thread: Thread, agent: Agent) -> None:
    (run,) = queued(thread)
    claim_run(agents=[agent], worker="dead-worker", lease_seconds=30)
    Run.objects.filter(pk=run.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))

    again = claim_run(agents=[agent], worker="w2")

    assert again is not None and again.pk == run.pk
    assert (again.claimed_by, again.attempts) == ("w2", 2)
    with pytest.raises(LeaseLost):
        heartbeat(run=run, worker="dead-worker")
    with pytest.raises(LeaseLost):
        finish_run(run=run, worker="dead-worker", status=RunStatus.COMPLETED)


def test_heartbeats_keep_the_lease_and_complete_closes_the_run(thread: Thread, agent: Agent) -> None:
    queued(thread)
    claimed = claim_run(agents=[agent], worker="w1", lease_seconds=5)
    assert claimed is not None
    before = claimed.lease_expires_at
    renewed = heartbeat(run=claimed, worker="w1", lease_seconds=60)
    assert renewed.lease_expires_at > before  # type: ignore[operator]
    done = finish_run(run=claimed, worker="w1", status=RunStatus.COMPLETED)
    assert (done.status, done.lease_expires_at) == (RunStatus.COMPLETED, None)
    assert claim_run(agents=[agent], worker="w2") is None


@pytest.mark.django_db(transaction=True)
def test_concurrent_workers_never_claim_the_same_run(agent: Agent) -> None:
    thread, _ = storage.create_thread(agent=agent)
    queued(thread, 12)
    claimed: list[str] = []
    lock = threading.Lock()

    def work(name: str) -> None:
        try:
            while (run := claim_run(agents=[agent], worker=name)) is not None:
                with lock:
                    claimed.append(str(run.pk))
        finally:
            connections.close_all()

    workers = [threading.Thread(target=work, args=(f"w{n}",)) for n in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()

    assert len(claimed) == 12
    assert len(set(claimed)) == 12


def test_an_agent_claims_over_http_and_completes(owner_client: APIClient, thread: Thread) -> None:
    (run,) = queued(thread)
    claimed = post(owner_client, "/api/v1/runs/claim/", {"agent": "travel"})
    assert claimed.status_code == 200
    body = claimed.json()["run"]
    assert (body["id"], body["reason"], body["status"]) == (str(run.pk), "manual", "running")
    assert post(owner_client, "/api/v1/runs/claim/").status_code == 204

    assert post(owner_client, f"/api/v1/runs/{run.pk}/heartbeat/").status_code == 200
    assert post(owner_client, f"/api/v1/runs/{run.pk}/complete/").json()["run"]["status"] == "completed"
    again = post(owner_client, f"/api/v1/runs/{run.pk}/complete/")
    assert (again.status_code, again.json()["error"]["code"]) == (409, "run_finished")


def test_runs_are_scoped_to_the_keys_agent(owner_client: APIClient, foreign_client: APIClient, thread: Thread) -> None:
    (run,) = queued(thread)
    assert post(foreign_client, "/api/v1/runs/claim/", {"agent": "travel"}).status_code == 403
    assert post(foreign_client, "/api/v1/runs/claim/").status_code == 204
    assert post(foreign_client, f"/api/v1/runs/{run.pk}/heartbeat/").status_code == 404
    assert post(owner_client, "/api/v1/runs/claim/", {"wait": 31}).status_code == 400


def test_failing_a_run_records_the_error(owner_client: APIClient, thread: Thread) -> None:
    (run,) = queued(thread)
    post(owner_client, "/api/v1/runs/claim/")
    failed = post(owner_client, f"/api/v1/runs/{run.pk}/fail/", {"error": "tool timed out"}).json()["run"]
    assert failed["status"] == "failed"
    assert Run.objects.get(pk=run.pk).error == "tool timed out"


@pytest.mark.django_db(transaction=True)
def test_a_long_poll_is_woken_by_the_notification_not_the_timeout(
    live_server: Any, agent: Agent, agent_key: str
) -> None:
    thread, _ = storage.create_thread(agent=agent)
    checkpoint = storage.append_checkpoint(thread=thread, parent=None, state={"a": 1})
    outcome: dict[str, Any] = {}

    def poll() -> None:
        started = time.monotonic()
        with httpx.Client(base_url=live_server.url, headers={"Authorization": f"Bearer {agent_key}"}) as http:
            response = http.post("/api/v1/runs/claim/", json={"wait": 20}, timeout=30)
        outcome.update(status=response.status_code, seconds=time.monotonic() - started, body=response.json())

    poller = threading.Thread(target=poll)
    poller.start()
    # Queued before the request looked, the run would be claimed at once without any NOTIFY.
    wait_until(
        the_long_poll_waits,
        what="the long poll to listen, look, find nothing and wait",
        details=lambda: f"other sessions: {other_sessions()}",
    )
    run = enqueue_run(thread=thread, checkpoint=checkpoint, reason=RunReason.MANUAL)
    poller.join()

    assert outcome["status"] == 200
    assert outcome["body"]["run"]["id"] == str(run.pk)
    assert outcome["seconds"] < 10  # woken by NOTIFY, well before the 20 s wait ran out


def other_sessions() -> list[tuple[str, str]]:
    """The state and last statement of every other session on the test database (for a failure message)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT state, query FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return cursor.fetchall()


def the_long_poll_waits() -> bool:
    """Whether a claim committed, and went idle, after a session started to LISTEN: the claim view
    listens, then looks for a run, then waits (its pooled connection stays idle meanwhile)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT EXISTS (SELECT 1 FROM pg_stat_activity listener, pg_stat_activity claim"
            " WHERE listener.datname = current_database() AND claim.datname = current_database()"
            " AND listener.query = %s AND claim.pid NOT IN (listener.pid, pg_backend_pid())"
            " AND claim.state = 'idle' AND claim.query = 'COMMIT' AND claim.state_change > listener.state_change)",
            [f"LISTEN {CHANNEL}"],
        )
        return bool(cursor.fetchone()[0])


IDLE = "idle, waiting up to"  # what quicksave_agents.worker logs (at DEBUG) each time it finds no run and waits


@contextmanager
def worker_polling_every(directory: Path, seconds: float) -> Iterator[tuple[Workers, Any]]:
    """A `run_agents` process for the code-review agent that polls every `seconds`, logging at DEBUG;
    yields once it has looked for work, found none and is waiting."""
    workers = Workers(directory, agent=CodeReviewAgent.name, lease_seconds=30, poll_seconds=seconds,
                      env={"LOG_LEVEL": "DEBUG"})  # fmt: skip
    try:
        process = workers.start()
        wait_until(lambda: IDLE in workers.log_of(process), what="the worker to find no run and wait",
                   details=workers.logs)  # fmt: skip
        yield workers, process
    finally:
        workers.kill_all()  # SIGKILL: a worker waiting on an hour-long poll would not see SIGTERM soon


def claimed(run: Run) -> bool:
    return Run.objects.filter(pk=run.pk).exclude(status=RunStatus.QUEUED).exists()


@pytest.mark.django_db(transaction=True)
def test_an_idle_worker_is_woken_by_the_notification_of_a_queued_run(tmp_path: Path) -> None:
    # An hour between polls: only the NOTIFY sent at enqueue can wake it within the wait below.
    with worker_polling_every(tmp_path, 3600) as (workers, _):
        thread = start_thread(agent_class=CodeReviewAgent, external_id="notified")
        (run,) = Run.objects.filter(thread=thread)
        wait_until(lambda: claimed(run), what="the notified worker to claim the run", timeout=20,
                   details=workers.logs)  # fmt: skip


@pytest.mark.django_db(transaction=True)
def test_an_idle_worker_still_finds_a_run_queued_without_a_notification(tmp_path: Path) -> None:
    with worker_polling_every(tmp_path, 0.5) as (workers, _):
        thread, _ = storage.create_thread(agent=get_or_create_agent(name=CodeReviewAgent.name))
        checkpoint = storage.append_checkpoint(thread=thread, parent=None, state={"files": []})
        # What enqueue_run does, less its NOTIFY: a notification lost (the LISTEN connection was
        # down at the time, say) leaves the run to the poll.
        run = Run.objects.create(agent_id=thread.agent_id, thread=thread, checkpoint=checkpoint,
                                 reason=RunReason.MANUAL)  # fmt: skip
        wait_until(lambda: claimed(run), what="the polling worker to claim the run", timeout=20,
                   details=workers.logs)  # fmt: skip
