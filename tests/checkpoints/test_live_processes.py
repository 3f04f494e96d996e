"""Live updates across processes: two ASGI servers sharing Redis, plus a worker process.

A websocket connected to one server receives the events caused by an API write through
the other server and by the worker.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis
import websockets

from agents.demo import CodeReviewAgent
from agents.keys import create_agent_key, get_or_create_agent
from agents.runtime import start_thread
from tests.processes import ROOT, database_url, free_port, start_server, stop

REDIS_URL = os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0"

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(scope="module")
def redis_available() -> str:
    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1).ping()
    except redis.RedisError as exc:
        pytest.skip(f"Redis is not reachable at {REDIS_URL}: {exc}")
    return REDIS_URL


@pytest.fixture
def servers(redis_available: str) -> Iterator[list[int]]:
    ports = [free_port(), free_port()]
    processes = [start_server(port, {"REDIS_URL": redis_available}) for port in ports]
    try:
        yield ports
    finally:
        for process in processes:
            stop(process)


async def collect(url: str, key: str, port: int, count: int, timeout: float) -> list[dict[str, Any]]:
    headers = {"Authorization": f"Bearer {key}", "Origin": f"http://127.0.0.1:{port}"}
    received: list[dict[str, Any]] = []
    async with websockets.connect(url, additional_headers=headers) as socket:
        async with asyncio.timeout(timeout):
            while len(received) < count:
                received.append(json.loads(await socket.recv()))
    return received


def test_a_websocket_on_one_server_sees_writes_through_the_other_and_the_worker(
    servers: list[int], redis_available: str
) -> None:
    server_a, server_b = servers
    agent = get_or_create_agent(name="code-review")
    _, key = create_agent_key(agent=agent)
    api_b = httpx.Client(base_url=f"http://127.0.0.1:{server_b}", headers={"Authorization": f"Bearer {key}"})
    written_thread = api_b.post("/api/v1/threads/", json={"external_id": "through-b"}).json()
    reviewed = start_thread(agent_class=CodeReviewAgent, external_id="by-the-worker")
    reviewed.refresh_from_db()

    async def scenario() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        through_api = asyncio.create_task(collect(
            f"ws://127.0.0.1:{server_a}/ws/threads/{written_thread['id']}/?after_seq=1", key, server_a,
            count=1, timeout=30,
        ))  # fmt: skip
        by_worker = asyncio.create_task(collect(
            f"ws://127.0.0.1:{server_a}/ws/threads/{reviewed.pk}/?after_seq={reviewed.event_seq}", key, server_a,
            count=3, timeout=60,
        ))  # fmt: skip
        await asyncio.sleep(1.5)  # both sockets are connected and subscribed on server A
        response = await asyncio.to_thread(
            api_b.post, f"/api/v1/threads/{written_thread['id']}/checkpoints/",
            json={"parent": None, "state": {"via": "server B"}, "label": "through B"},
        )  # fmt: skip
        assert response.status_code == 201, response.text
        worker = subprocess.Popen(
            [sys.executable, "manage.py", "run_agents", "--agent", "code-review", "--poll", "0.2"],
            cwd=ROOT, env={**os.environ, "DATABASE_URL": database_url(), "REDIS_URL": redis_available},
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            return await through_api, await by_worker
        finally:
            worker.kill()
            worker.wait()

    api_events, worker_events = asyncio.run(scenario())
    api_b.close()
    assert [(event["seq"], event["type"], event["data"]["label"]) for event in api_events] == [
        (2, "checkpoint.created", "through B")
    ]
    assert [event["seq"] for event in worker_events] == list(range(reviewed.event_seq + 1, reviewed.event_seq + 4))
    assert worker_events[0]["type"] == "run.claimed"
    assert {event["type"] for event in worker_events[1:]} == {"checkpoint.created"}
