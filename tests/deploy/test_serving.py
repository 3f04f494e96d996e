"""The uvicorn options of quicksave/serving.py: every launcher passes them, and a server started
with them runs websockets uncompressed (zlib's state would cost each socket ~300 KB)."""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path
from typing import Any

import pytest
import websockets

from checkpoints import storage
from quicksave.serving import UVICORN_OPTIONS
from quicksave_agents.keys import create_agent_key, get_or_create_agent
from tests.processes import ROOT, free_port, start_server, stop

REDIS_URL = os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0"


def uvicorn_commands(path: Path) -> list[str]:
    """The text of each uvicorn command line in `path`, from the app's name to the list's end."""
    return re.findall(r'"quicksave\.asgi:application".*?\]', path.read_text(), flags=re.DOTALL)


@pytest.mark.parametrize("launcher", ["dev.py", "deploy/Dockerfile", "deploy/compose.yaml"])
def test_every_launcher_runs_the_web_server_with_quicksaves_uvicorn_options(launcher: str) -> None:
    options = ", ".join(f'"{option}"' for option in UVICORN_OPTIONS)
    commands = uvicorn_commands(ROOT / launcher)

    assert commands
    assert all(options in command for command in commands), commands


@pytest.mark.django_db(transaction=True)
def test_a_websocket_offering_compression_is_accepted_uncompressed(db: Any) -> None:
    port = free_port()
    server = start_server(port, {"REDIS_URL": REDIS_URL})
    try:
        agent = get_or_create_agent(name="code-review")
        thread, _ = storage.create_thread(agent=agent, external_id="uncompressed")
        _, key = create_agent_key(agent=agent)
        headers = {"Authorization": f"Bearer {key}", "Origin": f"http://127.0.0.1:{port}"}

        async def negotiated() -> tuple[str | None, str | None]:
            url = f"ws://127.0.0.1:{port}/ws/threads/{thread.pk}/"
            # The client offers permessage-deflate, as browsers and `websockets` do by default.
            async with websockets.connect(url, additional_headers=headers, compression="deflate") as socket:
                offered = socket.request.headers.get("Sec-WebSocket-Extensions") if socket.request else None
                return offered, socket.response.headers.get("Sec-WebSocket-Extensions") if socket.response else None

        offered, accepted = asyncio.run(negotiated())
    finally:
        stop(server)

    assert offered is not None and "permessage-deflate" in offered
    assert accepted is None
