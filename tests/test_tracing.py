"""Traces across processes: two ASGI servers and a worker export spans over OTLP/HTTP to a receiver
this test runs on loopback, switched on by the OTEL_* variables alone.

An agent's write through the SDK, made inside the agent's own span, is one trace: the agent's
span, the server's request, its database statements, the publisher's send and the push to a
websocket held by the *other* server. A reviewer's decision is another: the request, and the
worker's resume of the thread that it queued, with the resume's own statements and publishes.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets
from django.test import Client as BrowserClient
from opentelemetry import propagate
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from quicksave_sdk import Client

from approvals.models import ApprovalRequest, ApprovalStatus
from quicksave_agents.demo import TravelAgent
from quicksave_agents.keys import create_agent_key, get_or_create_agent
from quicksave_agents.models import Run, RunReason
from quicksave_agents.runtime import start_thread
from tests.conftest import person
from tests.otlp import Receiver
from tests.processes import ROOT, Workers, database_url, free_port, servers_running
from tests.waiting import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]


def otel_env(receiver: Receiver, service: str) -> dict[str, str]:
    """What an operator sets: the OTLP endpoint and the service's name (spans exported every 50 ms)."""
    return {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_SERVICE_NAME": service, "OTEL_BSP_SCHEDULE_DELAY": "50"}


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver() as running:
        yield running


@pytest.fixture
def topology(receiver: Receiver, tmp_path: Path) -> Iterator[tuple[int, int, Workers]]:
    """Two servers (a, b) sharing Redis, and a worker for the travel agent, all tracing."""
    ports = [free_port(), free_port()]
    servers = ((port, otel_env(receiver, f"web-{name}")) for port, name in zip(ports, "ab", strict=True))
    workers = Workers(tmp_path, agent=TravelAgent.name, lease_seconds=10, env=otel_env(receiver, "worker"))
    with servers_running(*servers):
        try:
            yield ports[0], ports[1], workers
        finally:
            workers.kill_all()


def agent_tracer() -> tuple[Any, InMemorySpanExporter]:
    """The agent's own tracing, in this process (not the global provider: other tests share it)."""
    exported = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exported))
    return provider.get_tracer("agent"), exported


def test_an_agents_write_is_one_trace_from_its_span_through_the_store_to_a_socket_on_the_other_server(
    receiver: Receiver, topology: tuple[int, int, Workers]
) -> None:
    server_a, server_b, _ = topology
    _, key = create_agent_key(agent=get_or_create_agent(name="sdk-agent"))
    tracer, _ = agent_tracer()
    with Client(f"http://127.0.0.1:{server_a}", key) as sdk:
        thread = sdk.thread(external_id="traced")
        first = thread.checkpoint({"messages": []}, label="start")

        async def watch_and_write() -> dict[str, Any]:
            url = f"ws://127.0.0.1:{server_b}/ws/threads/{thread.id}/?after_seq=0"
            headers = {"Authorization": f"Bearer {key}", "Origin": f"http://127.0.0.1:{server_b}"}
            async with websockets.connect(url, additional_headers=headers) as socket:
                async with asyncio.timeout(30):
                    while json.loads(await socket.recv()).get("data", {}).get("checkpoint") != first.id:
                        pass  # the replay, up to the first checkpoint: the socket has joined its group
                    await asyncio.to_thread(write)
                    while True:
                        event = json.loads(await socket.recv())
                        if event["type"] == "checkpoint.created":
                            return dict(event)

        def write() -> None:
            with tracer.start_as_current_span("agent.step") as step:
                thread.checkpoint({"messages": ["hello"]}, label="greet")
                written.append(step.get_span_context())

        written: list[Any] = []
        event = asyncio.run(watch_and_write())
    assert event["data"]["label"] == "greet"
    step = written[0]
    trace_id, step_id = format(step.trace_id, "032x"), format(step.span_id, "016x")

    def complete() -> bool:
        names = {(span.service, span.name) for span in receiver.trace(trace_id)}
        return ("web-a", "quicksave.live.publish") in names and ("web-b", "quicksave.websocket.push") in names

    wait_until(complete, what="the write's spans from both servers", timeout=30)
    spans = receiver.trace(trace_id)
    by_id = {span.span_id: span for span in spans}
    (request,) = [span for span in spans if span.service == "web-a" and span.parent_id == step_id]
    assert request.attributes.get("http.route", "").endswith("checkpoints/")
    statements = [span for span in spans if span.attributes.get("db.system") == "postgresql"]
    assert statements and all(span.service == "web-a" for span in statements)
    assert any("checkpoints_checkpoint" in str(span.attributes.get("db.statement", "")) for span in statements)
    (publish,) = [span for span in spans if span.name == "quicksave.live.publish"]
    (push,) = [span for span in spans if span.name == "quicksave.websocket.push"]
    assert push.parent_id == publish.span_id
    # The publish descends from the request that committed the write.
    ancestors = []
    span = publish
    while span.parent_id in by_id:
        span = by_id[span.parent_id]
        ancestors.append(span.span_id)
    assert request.span_id in ancestors


def test_a_decision_and_the_workers_resume_of_the_thread_are_one_trace(
    receiver: Receiver, topology: tuple[int, int, Workers]
) -> None:
    server_a, _, workers = topology
    thread = start_thread(agent_class=TravelAgent, external_id="traced-trip")
    workers.start()
    wait_until(lambda: ApprovalRequest.objects.filter(thread=thread, status=ApprovalStatus.PENDING).exists(),
               what="the travel agent to ask for approval", timeout=60)  # fmt: skip
    approval = ApprovalRequest.objects.get(thread=thread, status=ApprovalStatus.PENDING)
    browser = BrowserClient()
    browser.force_login(person("rita", "reviewer"))
    tracer, _ = agent_tracer()
    with httpx.Client(base_url=f"http://127.0.0.1:{server_a}",
                      cookies={"sessionid": browser.cookies["sessionid"].value}) as http:  # fmt: skip
        assert http.get("/").status_code == 200  # a page sets the CSRF cookie
        with tracer.start_as_current_span("reviewer.decide") as decide:
            headers = {"X-CSRFToken": http.cookies["csrftoken"]}
            propagate.inject(headers)
            response = http.post(f"/api/v1/approvals/{approval.pk}/decide/", json={"decision": "approve"},
                                 headers=headers)  # fmt: skip
    assert response.status_code == 200, response.text
    run = Run.objects.get(thread=thread, reason=RunReason.APPROVAL)
    trace_id = format(decide.get_span_context().trace_id, "032x")
    assert run.trace_context is not None
    assert run.trace_context["traceparent"].split("-")[1] == trace_id

    def resumed() -> bool:
        spans = receiver.trace(trace_id)
        return any(s.name == "quicksave.run.resume" for s in spans) and any(
            s.service == "worker" and s.name == "quicksave.live.publish" for s in spans
        )

    wait_until(resumed, what="the worker's resume spans", timeout=60)
    spans = receiver.trace(trace_id)
    by_id = {span.span_id: span for span in spans}
    (resume,) = [span for span in spans if span.name == "quicksave.run.resume"]
    assert resume.service == "worker"
    assert resume.attributes["quicksave.run"] == str(run.pk)
    # Its parent is a span of the decision's request on server A.
    assert by_id[resume.parent_id].service == "web-a"
    worker_statements = [s for s in spans if s.service == "worker" and s.attributes.get("db.system") == "postgresql"]
    assert any("checkpoints_checkpoint" in str(s.attributes.get("db.statement", "")) for s in worker_statements)


ADAPTER_SCRIPT = """
import asyncio
import django

django.setup()
from opentelemetry import trace

from checkpoints import live
from integrations.openai_agents.session import QuicksaveSession
from quicksave import telemetry


async def turn() -> str:
    with trace.get_tracer("agent").start_as_current_span("agent.turn") as span:
        await QuicksaveSession("traced-chat").add_items([{"role": "user", "content": "Book me a flight."}])
        return format(span.get_span_context().trace_id, "032x")


print(asyncio.run(turn()))
live.flush()
telemetry.shutdown()
"""


def test_a_framework_adapters_write_joins_the_trace_of_the_agent_that_makes_it(receiver: Receiver) -> None:
    # The OpenAI Agents SDK's session writes on a thread of its own (database_sync_to_async): the
    # context crosses with it, to the statements and to the publisher.
    env = {**os.environ, "DATABASE_URL": database_url(), **otel_env(receiver, "agent-process")}
    env.pop("REDIS_URL", None)  # the in-memory channel layer: this process publishes to itself
    result = subprocess.run([sys.executable, "-c", ADAPTER_SCRIPT], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr
    trace_id = result.stdout.strip().splitlines()[-1]

    spans = receiver.trace(trace_id)
    (turn,) = [span for span in spans if span.name == "agent.turn"]
    statements = [span for span in spans if span.attributes.get("db.system") == "postgresql"]
    assert any("checkpoints_checkpoint" in str(span.attributes.get("db.statement", "")) for span in statements)
    assert all(span.trace_id == turn.trace_id for span in statements)
    assert any(span.name == "quicksave.live.publish" for span in spans)
