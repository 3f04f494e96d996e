"""A webhook receiver on loopback: a real HTTP server in a thread that records what it is sent and
answers with the statuses a test scripts, checking each request's signature the way a receiver
following the README would (its own HMAC, not Quicksave's code)."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float  # time.time() when the request had been read
    status: int  # what the receiver answered

    def json(self) -> Any:
        return json.loads(self.body)

    def signed_by(self, secret: str) -> bool:
        timestamp = self.headers.get("x-quicksave-timestamp", "")
        expected = hmac.new(secret.encode(), f"{timestamp}.".encode() + self.body, hashlib.sha256).hexdigest()
        return hmac.compare_digest(f"sha256={expected}", self.headers.get("x-quicksave-signature", ""))


class Receiver:
    """Answers each request with the next scripted status (200 once the script is used up)."""

    def __init__(self) -> None:
        self.received: list[Received] = []
        self.script: list[int] = []
        self.hold = threading.Event()  # while clear, requests wait (see `holding`)
        self.hold.set()
        self.entered = threading.Event()  # set once a request has been read
        self.arrived = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                at = time.time()
                receiver.entered.set()
                receiver.hold.wait(30)
                with receiver.arrived:
                    status = receiver.script.pop(0) if receiver.script else 200
                    receiver.received.append(Received(self.path, {k.lower(): v for k, v in self.headers.items()},
                                                      body, at, status))  # fmt: skip
                    receiver.arrived.notify_all()
                self.send_response(status)
                self.send_header("Content-Type", "text/plain")
                self.end_headers()
                self.wfile.write(b"ok" if status < 300 else b"try later")

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, name="webhook-receiver", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hooks/quicksave"

    def start(self) -> Receiver:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.hold.set()
        self.server.shutdown()
        self.server.server_close()

    def wait_for(self, count: int, timeout: float = 30) -> list[Received]:
        """The first `count` requests, once that many have arrived; TimeoutError naming what came."""
        deadline = time.monotonic() + timeout
        with self.arrived:
            while len(self.received) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"waited {timeout:g} s for {count} requests; got {len(self.received)}")
                self.arrived.wait(left)
            return list(self.received[:count])


def receiving() -> Iterator[Receiver]:
    receiver = Receiver().start()
    try:
        yield receiver
    finally:
        receiver.stop()
