"""GET /metrics: behind a bearer token, request latency by route pattern, checkpoint writes and their
bytes, conflicts, the run queue, decision to resume, websockets and publish lag, and the gauges the
database answers when scraped."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families
from rest_framework.test import APIClient

from approvals.models import ApprovalRequest
from checkpoints import live, storage
from checkpoints.models import Thread
from quicksave.asgi import application
from quicksave_agents.models import Agent, Run, RunReason
from quicksave_agents.runs import claim_run, enqueue_run
from tests.conftest import handshake, person

TOKEN = "metrics-token-for-tests-0123456789abcdef"
WRITE_ROUTE = "api/v1/threads/<uuid:thread_id>/checkpoints/"


@pytest.fixture
def scraper(settings: Any) -> Client:
    settings.QUICKSAVE_METRICS_TOKEN = TOKEN
    return Client(headers={"Authorization": f"Bearer {TOKEN}"})


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def scraped(client: Client) -> dict[str, float]:
    """Every sample of a scrape, keyed by name and labels as Prometheus writes them."""
    response = client.get("/metrics")
    assert response.status_code == 200, response.content
    values = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            values[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return values


def post(client: APIClient, url: str, body: Any) -> Any:
    return client.post(url, data=json.dumps(body), content_type="application/json")


def test_metrics_are_off_without_a_token(settings: Any, db: Any) -> None:
    settings.QUICKSAVE_METRICS_TOKEN = ""
    response = Client(headers={"Authorization": "Bearer anything"}).get("/metrics")
    assert response.status_code == 404


def test_metrics_refuse_a_missing_or_wrong_token(scraper: Client) -> None:
    assert Client().get("/metrics").status_code == 401
    wrong = Client(headers={"Authorization": "Bearer " + "x" * len(TOKEN)}).get("/metrics")
    assert wrong.status_code == 401
    assert wrong["WWW-Authenticate"].startswith("Bearer")


def test_a_checkpoint_write_counts_its_route_its_commit_and_its_bytes(
    scraper: Client, owner_client: APIClient, thread: Thread, django_capture_on_commit_callbacks: Any
) -> None:
    labels = {"method": "POST", "route": WRITE_ROUTE}
    before = (sample("quicksave_http_request_duration_seconds_count", **labels),
              sample("quicksave_checkpoint_writes_total"), sample("quicksave_checkpoint_payload_bytes_total"),
              sample("quicksave_http_responses_total", **labels, status="201"))  # fmt: skip

    with django_capture_on_commit_callbacks(execute=True):
        response = post(owner_client, f"/api/v1/threads/{thread.pk}/checkpoints/", {"parent": None, "state": {"a": 1}})
    assert response.status_code == 201

    values = scraped(scraper)
    route = f'method="POST",route="{WRITE_ROUTE}"'
    assert values[f"quicksave_http_request_duration_seconds_count{{{route}}}"] == before[0] + 1
    assert values["quicksave_checkpoint_writes_total"] == before[1] + 1
    assert values["quicksave_checkpoint_payload_bytes_total"] > before[2]
    assert values[f'quicksave_http_responses_total{{{route},status="201"}}'] == before[3] + 1
    # The route's pattern, never its path: no thread id in any label.
    assert not any(str(thread.pk) in key for key in values)


def test_each_status_of_one_route_is_a_series_of_its_own(owner_client: APIClient, thread: Thread) -> None:
    url = f"/api/v1/threads/{thread.pk}/checkpoints/"
    labels = {"method": "POST", "route": WRITE_ROUTE}
    before = {status: sample("quicksave_http_responses_total", **labels, status=status) for status in ("201", "409")}
    timed = sample("quicksave_http_request_duration_seconds_count", **labels)

    assert post(owner_client, url, {"parent": None, "state": {"a": 1}}).status_code == 201
    assert post(owner_client, url, {"parent": None, "state": {"a": 2}}).status_code == 409
    assert post(owner_client, url, {"parent": None, "state": {"a": 3}}).status_code == 409

    assert sample("quicksave_http_responses_total", **labels, status="201") == before["201"] + 1
    assert sample("quicksave_http_responses_total", **labels, status="409") == before["409"] + 2
    assert sample("quicksave_http_request_duration_seconds_count", **labels) == timed + 3


def test_a_stale_parent_counts_as_a_conflict_by_its_code(owner_client: APIClient, thread: Thread) -> None:
    first = storage.append_checkpoint(thread=thread, parent=None, state={"a": 1})
    storage.append_checkpoint(thread=thread, parent=first, state={"a": 2})
    before = sample("quicksave_conflicts_total", code="stale_parent")

    response = post(owner_client, f"/api/v1/threads/{thread.pk}/checkpoints/", {"parent": str(first.pk),
                                                                                "state": {"a": 3}})  # fmt: skip

    assert response.status_code == 409
    assert sample("quicksave_conflicts_total", code="stale_parent") == before + 1


def test_pending_approvals_and_the_run_queue_are_read_from_the_database_when_scraped(
    scraper: Client, owner_client: APIClient, thread: Thread, agent: Agent
) -> None:
    checkpoint = storage.append_checkpoint(thread=thread, parent=None, state={"a": 1}, status="waiting_for_approval")
    response = post(owner_client, f"/api/v1/threads/{thread.pk}/approvals/",
                    {"checkpoint": str(checkpoint.pk), "action": "book", "args": {}})  # fmt: skip
    assert response.status_code == 201
    ApprovalRequest.objects.update(created_at=timezone.now() - timedelta(minutes=10))
    enqueue_run(thread=thread, checkpoint=checkpoint, reason=RunReason.MANUAL)
    Run.objects.update(created_at=timezone.now() - timedelta(minutes=3))

    values = scraped(scraper)

    assert values["quicksave_approvals_pending"] == 1
    assert 600 <= values["quicksave_approval_oldest_pending_age_seconds"] < 700
    assert values["quicksave_in_doubt_calls_pending"] == 0
    assert values['quicksave_runs{status="queued"}'] == 1
    assert values['quicksave_runs{status="running"}'] == 0
    assert 180 <= values["quicksave_run_queue_oldest_age_seconds"] < 280


def test_a_claim_measures_the_queue_wait_and_decision_to_resume(
    owner_client: APIClient, thread: Thread, agent: Agent, django_capture_on_commit_callbacks: Any
) -> None:
    reviewer: User = person("rita", "reviewer")
    checkpoint = storage.append_checkpoint(thread=thread, parent=None, state={"a": 1}, status="waiting_for_approval")
    approval = post(owner_client, f"/api/v1/threads/{thread.pk}/approvals/",
                    {"checkpoint": str(checkpoint.pk), "action": "book", "args": {}}).json()  # fmt: skip
    queued_before = sample("quicksave_runs_queued_total", reason="approval")
    resumed_before = sample("quicksave_decision_to_resume_seconds_count")
    people = APIClient()
    people.force_authenticate(reviewer)
    with django_capture_on_commit_callbacks(execute=True):
        assert post(people, f"/api/v1/approvals/{approval['id']}/decide/", {"decision": "approve"}).status_code == 200
    assert sample("quicksave_runs_queued_total", reason="approval") == queued_before + 1
    Run.objects.update(created_at=timezone.now() - timedelta(seconds=7))

    assert claim_run(agents=[agent], worker="w1") is not None

    assert sample("quicksave_decision_to_resume_seconds_count") == resumed_before + 1
    assert sample("quicksave_decision_to_resume_seconds_sum") >= 7


def test_a_run_claimed_again_after_its_lease_ran_out_counts_as_lost(thread: Thread, agent: Agent) -> None:
    checkpoint = storage.append_checkpoint(thread=thread, parent=None, state={"a": 1})
    run = enqueue_run(thread=thread, checkpoint=checkpoint, reason=RunReason.MANUAL)
    claim_run(agents=[agent], worker="dies", lease_seconds=30)
    Run.objects.filter(pk=run.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    before = sample("quicksave_runs_lost_total")

    assert claim_run(agents=[agent], worker="w2") is not None

    assert sample("quicksave_runs_lost_total") == before + 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_open_websockets_are_counted_by_feed_until_they_close(agent_key: str, thread: Thread) -> None:
    before = sample("quicksave_websocket_connections", feed="thread")
    socket = WebsocketCommunicator(application, f"/ws/threads/{thread.pk}/",
                                   headers=[(b"authorization", f"Bearer {agent_key}".encode()),
                                            (b"origin", b"http://testserver")])  # fmt: skip
    assert await handshake(socket) is None
    assert sample("quicksave_websocket_connections", feed="thread") == before + 1

    await socket.disconnect()

    assert sample("quicksave_websocket_connections", feed="thread") == before


@pytest.mark.django_db(transaction=True)
def test_a_published_event_records_its_lag_from_the_commit(thread: Thread) -> None:
    before = sample("quicksave_live_publish_lag_seconds_count")

    storage.append_checkpoint(thread=thread, parent=None, state={"a": 1})
    live.flush()

    assert sample("quicksave_live_publish_lag_seconds_count") >= before + 1


@pytest.mark.django_db(transaction=True)
def test_with_a_multiprocess_directory_one_scrape_adds_up_every_process(tmp_path: Any) -> None:
    import os
    import subprocess
    import sys

    from tests.processes import ROOT, database_url

    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path), "DJANGO_SETTINGS_MODULE": "quicksave.settings",
           "DATABASE_URL": database_url()}  # fmt: skip
    write = "from quicksave import metrics; metrics.checkpoint_writes_total.inc(3)"
    for _ in range(2):  # two server processes, each counting its own writes
        subprocess.run([sys.executable, "-c", write], cwd=ROOT, env=env, check=True, timeout=60)
    scrape = ("import django; django.setup(); from quicksave.scrape import exposition; "
              "print(exposition().decode())")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", scrape], cwd=ROOT, env=env, check=True, timeout=60,
                         capture_output=True, text=True).stdout  # fmt: skip
    values = {s.name: s.value for f in text_string_to_metric_families(out) for s in f.samples}
    assert values["quicksave_checkpoint_writes_total"] == 6
    assert "quicksave_approvals_pending" in values  # and the database's gauges, read at the scrape
