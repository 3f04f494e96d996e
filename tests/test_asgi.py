"""Responses through the real ASGI server arrive whole: buffered ones in one piece, streamed ones part by part."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from agents.keys import create_agent_key, get_or_create_agent
from checkpoints import store

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def api(server_url: str) -> Any:
    _, key = create_agent_key(agent=get_or_create_agent(name="asgi"))
    with httpx.Client(base_url=server_url, headers={"Authorization": f"Bearer {key}"}, timeout=30) as client:
        yield client


def test_a_json_response_arrives_whole_with_its_length(api: httpx.Client) -> None:
    thread = api.post("/api/v1/threads/", json={"agent": "asgi"}).json()
    messages = [{"role": "assistant", "content": "x" * 1000} for _ in range(200)]  # a body well past one TCP segment
    created = api.post(f"/api/v1/threads/{thread['id']}/checkpoints/", json={"parent": None, "state": {"m": messages}})
    assert created.status_code == 201, created.text

    response = api.get(f"/api/v1/checkpoints/{created.json()['id']}/")
    assert response.status_code == 200
    assert int(response.headers["content-length"]) == len(response.content)
    assert response.json()["state"] == {"m": messages}


def test_an_error_keeps_its_status_and_body(api: httpx.Client) -> None:
    response = api.post("/api/v1/threads/", content=b"{not json", headers={"Content-Type": "application/json"})
    assert response.status_code == 400
    assert response.json()["error"]["code"]


def test_a_streamed_export_arrives_line_by_line_and_complete(api: httpx.Client) -> None:
    thread, _ = store.create_thread(agent=get_or_create_agent(name="asgi"))
    parent = None
    for i in range(30):
        parent = store.append_checkpoint(thread=thread, parent=parent, state={"i": i, "text": "y" * 2000})

    with api.stream("GET", f"/api/v1/threads/{thread.pk}/export/") as response:
        assert response.status_code == 200
        assert "content-length" not in response.headers  # streamed, not buffered
        lines = [json.loads(line) for line in response.iter_lines() if line]
    assert len(lines) > 30


def test_a_static_file_arrives_byte_for_byte(server_url: str) -> None:
    response = httpx.get(f"{server_url}/static/js/thread.js", timeout=30)
    assert response.status_code == 200
    assert response.content == (ROOT / "static" / "js" / "thread.js").read_bytes()


def test_request_threads_give_their_database_connection_back_after_each_request(agent_key: str) -> None:
    """More request threads than pooled connections: a thread holds a connection only while it
    serves a request (the WSGI response is closed, which ends Django's request), so concurrent
    requests queue for the pool briefly instead of timing out behind idle threads."""
    from concurrent.futures import ThreadPoolExecutor

    from tests.processes import free_port, start_server, stop

    port = free_port()
    server = start_server(port, {"DATABASE_POOL_SIZE": "2", "QUICKSAVE_HTTP_THREADS": "8"})
    try:
        with httpx.Client(
            base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {agent_key}"}, timeout=30
        ) as client:

            def list_threads(_: int) -> tuple[int, float]:
                response = client.get("/api/v1/threads/")
                return response.status_code, response.elapsed.total_seconds()

            with ThreadPoolExecutor(max_workers=8) as pool:
                for _ in range(3):
                    answers = list(pool.map(list_threads, range(8)))
                    assert [status for status, _ in answers] == [200] * 8, answers
                    # The pool waits up to 10 s for a connection: no request came near that.
                    assert max(elapsed for _, elapsed in answers) < 5, answers
    finally:
        stop(server)
