"""The Redis hot path, against a real redis-server this module starts, stops and restarts."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from checkpoints import storage
from checkpoints.models import Checkpoint, Thread
from checkpoints.storage import crypto, hotcache
from quicksave_agents.models import Agent
from tests.conftest import person, signed_in
from tests.processes import RedisServer
from tests.waiting import wait_until

SECRET = "sk-live-hot-0123456789abcdef"
pytestmark = pytest.mark.django_db(transaction=True)


def grow(thread: Thread, steps: int) -> Checkpoint:
    head = storage.append_checkpoint(thread=thread, parent=None, state={"messages": [], "key": SECRET})
    for step in range(1, steps):
        head = storage.append_checkpoint(
            thread=thread, parent=head, patch=[{"op": "add", "path": "/messages/-", "value": f"message {step}"}]
        )
    return head


def a_fresh_process() -> None:
    """Forget what this process materialised, as another server process would never have known it."""
    storage.clear_caches()
    crypto.forget_keys()


def replays(queries: CaptureQueriesContext) -> list[str]:
    return [query["sql"] for query in queries.captured_queries if "payload" in query["sql"]]


def test_a_heads_state_is_read_from_redis_without_replaying_deltas(agent: Agent, redis_server: RedisServer) -> None:
    thread, _ = storage.create_thread(agent=agent)
    head = grow(thread, 40)
    a_fresh_process()
    assert storage.latest_state(thread=thread)[1]["messages"][-1] == "message 39"  # replays, then fills Redis

    stored = redis_server.entry(head.pk)
    assert stored is not None and SECRET.encode() not in stored and b"message 39" not in stored
    a_fresh_process()
    with CaptureQueriesContext(connection) as queries:
        head_id, state = storage.latest_state(thread=thread)
    assert head_id == head.pk and len(state["messages"]) == 39 and state["key"] == SECRET
    assert replays(queries) == []  # only the head lookup; no payload read


def test_a_reader_never_sees_a_state_older_than_an_acknowledged_write(agent: Agent, redis_server: RedisServer) -> None:
    thread, _ = storage.create_thread(agent=agent)
    head = grow(thread, 5)
    a_fresh_process()
    storage.latest_state(thread=thread)  # the old head is now in Redis
    newer = storage.append_checkpoint(thread=thread, parent=head, patch=[{"op": "replace", "path": "/key", "value": 1}])
    a_fresh_process()
    head_id, state = storage.latest_state(thread=thread)
    assert head_id == newer.pk and state["key"] == 1


def test_an_entry_moved_to_another_checkpoint_is_refused(agent: Agent, redis_server: RedisServer) -> None:
    thread, _ = storage.create_thread(agent=agent)
    head = grow(thread, 3)
    other_thread, _ = storage.create_thread(agent=agent)
    other = storage.append_checkpoint(thread=other_thread, parent=None, state={"mine": True})
    a_fresh_process()
    storage.latest_state(thread=thread)
    client = redis_server.client()
    moved = redis_server.entry(head.pk)
    assert moved is not None
    client.set(f"{hotcache.PREFIX}{other.pk}", moved)
    a_fresh_process()
    assert storage.latest_state(thread=other_thread)[1] == {"mine": True}


def test_with_redis_killed_everything_works_from_postgres_and_the_cache_recovers(
    agent: Agent, redis_server: RedisServer
) -> None:
    thread, _ = storage.create_thread(agent=agent)
    head = grow(thread, 10)
    a_fresh_process()
    storage.latest_state(thread=thread)
    viewer: Client = signed_in(person("vera", "viewer"))
    assert Client().get("/healthz").json()["cache"]["status"] == "ok"

    redis_server.kill()
    a_fresh_process()
    head = storage.append_checkpoint(thread=thread, parent=head, patch=[{"op": "add", "path": "/after", "value": 1}])
    head_id, state = storage.latest_state(thread=thread)
    assert head_id == head.pk and state["after"] == 1 and len(state["messages"]) == 9
    health = Client().get("/healthz")
    assert health.status_code == 200
    assert health.json()["status"] == "degraded" and health.json()["cache"]["status"] == "degraded"
    # Pages probe Redis at most every 2 s: the banner shows from the first probe after the kill.
    page = wait_until(lambda: degraded_page(viewer, thread), what="the thread page to show the cache-degraded banner")
    assert "Everything still works from PostgreSQL" in page

    redis_server.start()
    a_fresh_process()
    assert storage.latest_state(thread=thread)[0] == head.pk
    assert redis_server.client().exists(f"{hotcache.PREFIX}{head.pk}")
    assert Client().get("/healthz").json()["cache"]["status"] == "ok"
    wait_until(lambda: not degraded_page(viewer, thread), what="the cache-degraded banner to go")


def degraded_page(viewer: Client, thread: Thread) -> str | None:
    """The thread page when it shows the cache-degraded banner, else None."""
    page = viewer.get(f"/threads/{thread.pk}/").content.decode()
    return page if 'id="cache-degraded"' in page else None
