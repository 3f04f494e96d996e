"""Runs: claimed under a lease with SKIP LOCKED, kept by heartbeats, re-claimed when a worker dies,
and long-polled by external agents who are woken by NOTIFY."""

from __future__ import annotations

import json
import threading
import time
from datetime import timedelta
from typing import Any

import httpx
import pytest
from django.db import connections
from django.utils import timezone
from rest_framework.test import APIClient

from agents.models import Agent, Run, RunReason, RunStatus
from agents.runs import LeaseLost, claim_run, enqueue_run, finish_run, heartbeat
from checkpoints import storage
from checkpoints.models import Thread


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
    time.sleep(1.0)  # the poll is waiting now
    run = enqueue_run(thread=thread, checkpoint=checkpoint, reason=RunReason.MANUAL)
    poller.join()

    assert outcome["status"] == 200
    assert outcome["body"]["run"]["id"] == str(run.pk)
    assert outcome["seconds"] < 10  # woken by NOTIFY, well before the 20 s wait ran out
