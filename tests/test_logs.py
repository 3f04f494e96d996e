"""Log lines: JSON objects in production and plain text in development, each naming the request it
was written for and the thread that request's URL names; X-Request-ID in and out."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from rest_framework.test import APIClient

from checkpoints.models import Thread
from quicksave import logs
from quicksave.logs import ContextFilter, JsonFormatter, logging_config
from quicksave_agents.models import Agent
from quicksave_agents.worker import Worker
from tests.processes import ROOT


@pytest.fixture
def json_lines() -> Iterator[io.StringIO]:
    """What the root logger writes, through the production handler's filter and formatter."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(ContextFilter())
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield stream
    finally:
        root.removeHandler(handler)


def lines(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_a_requests_log_lines_name_its_id_and_its_thread(
    json_lines: io.StringIO, owner_client: APIClient, thread: Thread
) -> None:
    # An unknown parent is a 404, which Django logs (django.request) once the middleware has returned.
    response = owner_client.post(f"/api/v1/threads/{thread.pk}/checkpoints/",
                                 data=json.dumps({"parent": "01a2160c-e1c1-7df2-9a7b-456525754b64",
                                                  "state": {}}),
                                 content_type="application/json", headers={"X-Request-ID": "req-42"})  # fmt: skip
    assert response.status_code == 404
    assert response["X-Request-ID"] == "req-42"

    (line,) = [line for line in lines(json_lines) if line["logger"] == "django.request"]
    assert (line["request_id"], line["thread_id"], line["level"]) == ("req-42", str(thread.pk), "WARNING")
    assert line["message"].startswith("Not Found")


def test_a_request_without_a_usable_id_gets_a_new_one(owner_client: APIClient, thread: Thread) -> None:
    response = owner_client.get(f"/api/v1/threads/{thread.pk}/", headers={"X-Request-ID": "bad id\n"})
    assert response.status_code == 200
    assert len(response["X-Request-ID"]) == 32 and response["X-Request-ID"] != "bad id\n"


def test_the_worker_names_the_thread_of_the_run_it_drives(
    json_lines: io.StringIO, agent: Agent, thread: Thread, monkeypatch: pytest.MonkeyPatch
) -> None:
    from checkpoints import storage
    from quicksave_agents import runtime
    from quicksave_agents.runs import RunReason, enqueue_run

    checkpoint = storage.append_checkpoint(thread=thread, parent=None, state={"a": 1})
    enqueue_run(thread=thread, checkpoint=checkpoint, reason=RunReason.MANUAL)

    def execute(run: Any, *, lease_held: Any) -> str:
        logging.getLogger("agent").warning("thinking")
        return "completed"

    monkeypatch.setattr(runtime, "execute", execute)
    monkeypatch.setattr(runtime, "registered", lambda: {"travel": runtime.Agent})
    before = logs.thread_id.get()
    assert Worker(agent_names=["travel"]).run_once()

    (line,) = [line for line in lines(json_lines) if line["logger"] == "agent"]
    assert line["thread_id"] == str(thread.pk)
    assert logs.thread_id.get() == before  # bound for the run only


def test_a_line_outside_any_request_has_empty_ids_and_keeps_its_extra_fields(json_lines: io.StringIO) -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        logging.getLogger("quicksave.test").exception("failed", extra={"run": "r-1"})
    (line,) = lines(json_lines)
    assert (line["request_id"], line["thread_id"], line["run"]) == (None, None, "r-1")
    assert "ValueError: boom" in line["exception"]


def test_production_logs_json_and_development_plain_text() -> None:
    assert logging_config(json_lines=True, level="INFO")["handlers"]["console"]["formatter"] == "json"
    script = "import logging, django; django.setup(); logging.getLogger('quicksave').warning('hello')"
    environments = {"json": {"QUICKSAVE_LOG_FORMAT": "json"}, "text": {"QUICKSAVE_LOG_FORMAT": "text"}}
    written = {}
    for name, extra in environments.items():
        env = {**os.environ, "DJANGO_SETTINGS_MODULE": "quicksave.settings", **extra}
        result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                                timeout=60, check=True)  # fmt: skip
        written[name] = result.stderr.strip().splitlines()[-1]
    line = json.loads(written["json"])
    assert (line["message"], line["level"], line["request_id"], line["thread_id"]) == ("hello", "WARNING", None, None)
    assert written["text"].endswith("WARNING quicksave [request=None thread=None] hello")
