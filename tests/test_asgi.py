"""Responses through the real ASGI server arrive whole: buffered ones in one piece, streamed ones part by part."""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path
from typing import Any

import httpx
import pytest

from checkpoints import storage
from quicksave_agents.keys import create_agent_key, get_or_create_agent

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
    thread, _ = storage.create_thread(agent=get_or_create_agent(name="asgi"))
    parent = None
    for i in range(30):
        parent = storage.append_checkpoint(thread=thread, parent=parent, state={"i": i, "text": "y" * 2000})

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


def test_a_body_declared_past_the_limit_is_refused_before_a_byte_of_it_is_read(server_url: str) -> None:
    """The body is read before the app runs: a declared 10 GB upload is answered at once instead of
    after 10 GB, which the sender here never sends."""
    host, port = server_url.removeprefix("http://").split(":")
    head = (
        b"POST /api/v1/threads/ HTTP/1.1\r\nHost: " + host.encode() + b"\r\nContent-Type: application/json\r\n"
        b"Content-Length: 10000000000\r\n\r\n{}"
    )
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(head)
        answer = b""
        while chunk := sock.recv(65536):  # the server closes the connection after answering
            answer += chunk

    status_line, _, rest = answer.partition(b"\r\n")
    assert status_line == b"HTTP/1.1 413 Request Entity Too Large"
    error = json.loads(rest.partition(b"\r\n\r\n")[2])["error"]
    assert error["code"] == "payload_too_large"
    assert error["detail"] == {"limit": 32 * 1024 * 1024}


def test_a_chunked_body_past_the_limit_is_refused_once_it_crosses_it(settings: Any) -> None:
    """A chunked body declares no length: reading stops at the first chunk past the limit."""
    from quicksave.asgi import http_app

    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 4096
    chunks = [b"x" * 1024] * 10
    read: list[int] = []
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        read.append(len(read))
        return {"type": "http.request", "body": chunks[len(read) - 1], "more_body": len(read) < len(chunks)}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http", "method": "POST", "path": "/api/v1/threads/", "raw_path": b"/api/v1/threads/",
        "query_string": b"", "headers": [(b"content-type", b"application/json"), (b"transfer-encoding", b"chunked")],
        "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 50000), "scheme": "http", "http_version": "1.1",
        "asgi": {"version": "3.0"},
    }  # fmt: skip
    asyncio.run(http_app(scope, receive, send))

    assert len(read) == 5  # 5 KiB read, 4 KiB allowed: the other five chunks stay unread
    assert sent[0]["status"] == 413
    error = json.loads(sent[1]["body"])["error"]
    assert error == {
        "code": "payload_too_large",
        "message": "The request body is larger than 4096 bytes (QUICKSAVE_MAX_REQUEST_BYTES).",
        "detail": {"limit": 4096},
    }


def _scope(path: str = "/api/v1/threads/", **extra: Any) -> dict[str, Any]:
    return {
        "type": "http", "method": "POST", "path": path, "raw_path": path.encode(), "query_string": b"",
        "headers": [(b"content-type", b"application/json")], "server": ("127.0.0.1", 8000),
        "client": ("127.0.0.1", 50000), "scheme": "http", "http_version": "1.1", "asgi": {"version": "3.0"}, **extra,
    }  # fmt: skip


def _call(app: Any, scope: dict[str, Any], body: bytes = b"") -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    return sent


def test_a_buffered_response_goes_to_the_loop_whole_once_the_app_has_closed_it() -> None:
    """One hop to the request thread and one back: the request thread never waits on the event loop
    for a response that is not streamed, and the response is closed (Django's request ended, its
    database connection given back) before the loop sends a byte of it."""
    from quicksave.http_app import http_application

    events: list[str] = []

    class Parts(list[bytes]):
        def close(self) -> None:
            events.append("closed")

    def wsgi_app(environ: dict[str, Any], start_response: Any) -> Parts:
        start_response("201 Created", [("Content-Type", "application/json"), ("Content-Length", "4")])
        return Parts([b'{"a"', b":1}"])

    async def send_recording(message: dict[str, Any]) -> None:
        events.append(message["type"])
        sent.append(message)

    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    asyncio.run(http_application(wsgi_app)(_scope(), receive, send_recording))

    assert events == ["closed", "http.response.start", "http.response.body"]
    assert sent[0] == {
        "type": "http.response.start", "status": 201,
        "headers": [(b"content-type", b"application/json"), (b"content-length", b"4")],
    }  # fmt: skip
    assert sent[1] == {"type": "http.response.body", "body": b'{"a":1}'}


def test_the_request_reaches_the_app_as_a_pep_3333_environ() -> None:
    from quicksave.http_app import http_application

    seen: dict[str, Any] = {}

    def wsgi_app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        seen.update(environ, body=environ["wsgi.input"].read())
        start_response("200 OK", [])
        return [b""]

    scope = _scope(
        "/quicksave/api/v1/threads/é/", root_path="/quicksave", query_string=b"q=a%20b",
        headers=[(b"content-type", b"application/json"), (b"content-length", b"2"), (b"x-request-id", b"abc"),
                 (b"accept", b"text/html"), (b"accept", b"application/json")],
    )  # fmt: skip
    sent = _call(http_application(wsgi_app), scope, body=b"{}")

    assert sent[0]["status"] == 200
    assert seen["body"] == b"{}"
    assert seen["REQUEST_METHOD"] == "POST"
    assert seen["SCRIPT_NAME"] == "/quicksave"
    assert seen["PATH_INFO"] == "/api/v1/threads/é/".encode().decode("latin1")  # PEP 3333's bytes-as-latin-1
    assert seen["QUERY_STRING"] == "q=a%20b"
    assert (seen["CONTENT_TYPE"], seen["CONTENT_LENGTH"]) == ("application/json", "2")
    assert seen["HTTP_X_REQUEST_ID"] == "abc"
    assert seen["HTTP_ACCEPT"] == "text/html,application/json"
    assert (seen["SERVER_NAME"], seen["SERVER_PORT"], seen["SERVER_PROTOCOL"]) == ("127.0.0.1", "8000", "HTTP/1.1")
    assert (seen["REMOTE_ADDR"], seen["REMOTE_PORT"]) == ("127.0.0.1", "50000")
    assert seen["wsgi.url_scheme"] == "http"
    assert "HTTP_CONTENT_TYPE" not in seen and "HTTP_CONTENT_LENGTH" not in seen
