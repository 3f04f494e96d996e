"""Live updates across processes: two ASGI servers sharing Redis, plus a worker process.

A websocket connected to one server receives the events caused by an API write through
the other server and by the worker, over the channel layer (its replay is over before they
are written), and replays from the table what a server it cannot hear wrote while it was away.
It is closed (4401) when a request to the other server revokes its key or signs its session
out. With Redis down, a websocket is refused with 4503.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis
import websockets
from django.conf import settings
from django.test import Client

from checkpoints import storage
from checkpoints.models import Thread
from quicksave_agents.demo import CodeReviewAgent
from quicksave_agents.keys import create_agent_key, get_or_create_agent
from quicksave_agents.runtime import start_thread
from tests.conftest import person
from tests.processes import ROOT, RedisServer, database_url, free_port, servers_running, start_server, stop

REDIS_URL = os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0"

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(scope="module")
def redis_available() -> str:
    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1).ping()
    except redis.RedisError as exc:
        pytest.fail(f"Redis is not reachable at {REDIS_URL} ({exc}): start it, or set REDIS_URL", pytrace=False)
    return REDIS_URL


@pytest.fixture
def servers(redis_available: str) -> Iterator[list[int]]:
    ports = [free_port(), free_port()]
    with servers_running(*((port, {"REDIS_URL": redis_available}) for port in ports)):
        yield ports


async def collect(url: str, key: str, port: int, count: int, timeout: float,
                  subscribed: asyncio.Event) -> list[dict[str, Any]]:  # fmt: skip
    """Connect, read the one event the socket's `after_seq` leaves to replay, set `subscribed`, then
    collect `count` more: those can only have come live, over the channel layer."""
    headers = {"Authorization": f"Bearer {key}", "Origin": f"http://127.0.0.1:{port}"}
    received: list[dict[str, Any]] = []
    async with websockets.connect(url, additional_headers=headers) as socket:
        async with asyncio.timeout(timeout):
            # The consumer joins its group before it accepts and replays after: with the replayed
            # event here, the socket hears the group and the table has nothing more to give it.
            json.loads(await socket.recv())
            subscribed.set()
            while len(received) < count:
                received.append(json.loads(await socket.recv()))
    return received


def last_seq(thread_id: Any) -> int:
    return Thread.objects.values_list("event_seq", flat=True).get(pk=thread_id)


def test_a_websocket_on_one_server_hears_writes_through_the_other_and_the_worker_over_redis(
    servers: list[int], redis_available: str
) -> None:
    server_a, server_b = servers
    agent = get_or_create_agent(name=CodeReviewAgent.name)
    _, key = create_agent_key(agent=agent)
    api_b = httpx.Client(base_url=f"http://127.0.0.1:{server_b}", headers={"Authorization": f"Bearer {key}"})
    written_thread = api_b.post("/api/v1/threads/", json={"external_id": "through-b"}).json()
    written_seq = last_seq(written_thread["id"])
    reviewed = start_thread(agent_class=CodeReviewAgent, external_id="by-the-worker")
    reviewed.refresh_from_db()

    async def scenario() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        subscribed = [asyncio.Event(), asyncio.Event()]
        through_api = asyncio.create_task(collect(
            f"ws://127.0.0.1:{server_a}/ws/threads/{written_thread['id']}/?after_seq={written_seq - 1}", key,
            server_a, count=1, timeout=30, subscribed=subscribed[0],
        ))  # fmt: skip
        by_worker = asyncio.create_task(collect(
            f"ws://127.0.0.1:{server_a}/ws/threads/{reviewed.pk}/?after_seq={reviewed.event_seq - 1}", key,
            server_a, count=3, timeout=60, subscribed=subscribed[1],
        ))  # fmt: skip
        async with asyncio.timeout(30):
            await asyncio.gather(*(event.wait() for event in subscribed))
        response = await asyncio.to_thread(
            api_b.post, f"/api/v1/threads/{written_thread['id']}/checkpoints/",
            json={"parent": None, "state": {"via": "server B"}, "label": "through B"},
        )  # fmt: skip
        assert response.status_code == 201, response.text
        worker = subprocess.Popen(
            [sys.executable, "manage.py", "run_agents", "--agent", CodeReviewAgent.name, "--poll", "0.2"],
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
        (written_seq + 1, "checkpoint.created", "through B")
    ]
    assert [event["seq"] for event in worker_events] == list(range(reviewed.event_seq + 1, reviewed.event_seq + 4))
    assert worker_events[0]["type"] == "run.claimed"
    assert {event["type"] for event in worker_events[1:]} == {"checkpoint.created"}


def test_what_a_server_on_another_redis_wrote_reaches_a_socket_by_replay_when_it_reconnects(
    redis_available: str, db: Any
) -> None:
    # Server B publishes to a Redis that server A never reads: its events cannot come live.
    elsewhere = RedisServer()
    elsewhere.start()
    server_a, server_b = free_port(), free_port()
    agent = get_or_create_agent(name="code-review")
    _, key = create_agent_key(agent=agent)
    thread, _ = storage.create_thread(agent=agent, external_id="unheard")
    seen = last_seq(thread.pk)
    headers = {"Authorization": f"Bearer {key}", "Origin": f"http://127.0.0.1:{server_a}"}
    url = f"ws://127.0.0.1:{server_a}/ws/threads/{thread.pk}/?after_seq={seen}"

    def write_through_b() -> None:
        with httpx.Client(base_url=f"http://127.0.0.1:{server_b}", headers={"Authorization": f"Bearer {key}"}) as b:
            response = b.post(f"/api/v1/threads/{thread.pk}/checkpoints/",
                              json={"parent": None, "state": {}, "label": "unheard"})  # fmt: skip
            assert response.status_code == 201, response.text

    async def scenario() -> dict[str, Any]:
        async with websockets.connect(url, additional_headers=headers) as socket:
            await asyncio.to_thread(write_through_b)
            # Waiting for something that must not come takes a window: 2 s is many times what
            # delivery over the same Redis takes (the test above).
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(2):
                    await socket.recv()
        async with websockets.connect(url, additional_headers=headers) as socket:
            async with asyncio.timeout(30):
                return dict(json.loads(await socket.recv()))

    # Server A's tail watch, which would replay B's write on the open socket, is kept out of the
    # window: what this proves is the replay a reconnecting socket gets.
    unwatched = {"REDIS_URL": redis_available, "QUICKSAVE_LIVE_RECHECK_SECONDS": "3600"}
    try:
        with servers_running((server_a, unwatched), (server_b, {"REDIS_URL": elsewhere.url})):
            replayed = asyncio.run(scenario())
    finally:
        elsewhere.kill()

    assert (replayed["seq"], replayed["type"], replayed["data"]["label"]) == (seen + 1, "checkpoint.created", "unheard")


WITHIN_SECONDS = 2.0  # a revoke or a sign-out closes the sockets it ends within this long


def _csrf(browser: httpx.Client, page: str) -> str:
    """The CSRF form token of `page` (fetching it also sets the csrftoken cookie)."""
    response = browser.get(page)
    found = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', response.text)
    assert found, f"no CSRF token on {page} ({response.status_code})"
    return found.group(1)


def _session_browser(port: int, user: Any) -> httpx.Client:
    """A browser signed in as `user` (the session row is in the shared database)."""
    session = Client()
    session.force_login(user)
    name = settings.SESSION_COOKIE_NAME
    return httpx.Client(base_url=f"http://127.0.0.1:{port}", cookies={name: session.cookies[name].value})


async def _close_code_after(url: str, headers: dict[str, str], action: Any) -> tuple[int | None, float]:
    """Open a socket, run `action` (blocking, in a thread), then wait for the socket to close: its
    code and the seconds it took after the action returned."""
    async with websockets.connect(url, additional_headers=headers) as socket:
        await asyncio.to_thread(action)
        acted = time.monotonic()
        try:
            async with asyncio.timeout(10):
                async for _ in socket:
                    pass  # replayed events, an inbox sync: the socket is open
        except TimeoutError:
            return None, time.monotonic() - acted
        except websockets.ConnectionClosed:
            pass  # closed with a code other than 1000
        return socket.close_code, time.monotonic() - acted


@pytest.mark.parametrize("path", ["/ws/threads/{thread}/", "/ws/inbox/"])
def test_revoking_a_key_through_one_server_closes_its_sockets_on_the_other(servers: list[int], path: str) -> None:
    server_a, server_b = servers
    agent = get_or_create_agent(name="code-review")
    key_row, key = create_agent_key(agent=agent)
    thread, _ = storage.create_thread(agent=agent, external_id="revoked")
    admin = person("ada", "admin")
    browser_b = _session_browser(server_b, admin)
    revoke_page = f"/agents/keys/{key_row.prefix}/revoke/"
    token = _csrf(browser_b, revoke_page)

    def revoke() -> None:
        response = browser_b.post(revoke_page, data={"csrfmiddlewaretoken": token})
        assert response.status_code == 302, response.text

    headers = {"Authorization": f"Bearer {key}", "Origin": f"http://127.0.0.1:{server_a}"}
    url = f"ws://127.0.0.1:{server_a}" + path.format(thread=thread.pk)
    code, took = asyncio.run(_close_code_after(url, headers, revoke))
    browser_b.close()

    assert code == 4401
    assert took < WITHIN_SECONDS


@pytest.mark.parametrize("path", ["/ws/threads/{thread}/", "/ws/threads/", "/ws/inbox/"])
def test_signing_out_through_one_server_closes_the_sessions_sockets_on_the_other(servers: list[int], path: str) -> None:
    server_a, server_b = servers
    thread, _ = storage.create_thread(agent=get_or_create_agent(name="code-review"), external_id="signed-out")
    browser_b = _session_browser(server_b, person("vera", "viewer"))
    token = _csrf(browser_b, "/")  # every page has the sign-out form

    def sign_out() -> None:
        response = browser_b.post("/logout/", data={"csrfmiddlewaretoken": token})
        assert response.status_code < 400, response.text

    name = settings.SESSION_COOKIE_NAME
    headers = {"Cookie": f"{name}={browser_b.cookies[name]}", "Origin": f"http://127.0.0.1:{server_a}"}
    url = f"ws://127.0.0.1:{server_a}" + path.format(thread=thread.pk)
    code, took = asyncio.run(_close_code_after(url, headers, sign_out))
    browser_b.close()

    assert code == 4401
    assert took < WITHIN_SECONDS


def test_a_websocket_while_redis_is_down_is_refused_with_4503_not_an_http_500(db: Any) -> None:
    redis_server = RedisServer()
    redis_server.start()
    port = free_port()
    server = start_server(port, {"REDIS_URL": redis_server.url})
    try:
        redis_server.kill()
        agent = get_or_create_agent(name="code-review")
        thread, _ = storage.create_thread(agent=agent, external_id="no-redis")
        _, key = create_agent_key(agent=agent)
        headers = {"Authorization": f"Bearer {key}", "Origin": f"http://127.0.0.1:{port}"}

        async def attempt() -> int | None:
            url = f"ws://127.0.0.1:{port}/ws/threads/{thread.pk}/"
            async with websockets.connect(url, additional_headers=headers) as socket:
                try:
                    async with asyncio.timeout(10):
                        async for _ in socket:
                            pass
                except websockets.ConnectionClosed:
                    pass
                return socket.close_code

        assert [asyncio.run(attempt()) for _ in range(3)] == [4503, 4503, 4503]
    finally:
        stop(server)
