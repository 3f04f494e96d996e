"""The demo agents never take over an agent that is not theirs.

The worker drives every thread of an agent registered in this process. A demo agent named like
an agent of yours would run the demo's code on your threads: the README's own "Connecting an
agent" example used `travel`, the demo's name, and approving a step of such a thread failed it
with the demo's `KeyError: 'phase'`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from django.conf import settings
from rest_framework.test import APIClient

from checkpoints.models import Thread, ThreadStatus
from quicksave_agents.keys import create_agent_key, get_or_create_agent
from quicksave_agents.models import Run, RunStatus
from quicksave_agents.worker import Worker, load_agent_modules
from tests.conftest import person

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_agent_name() -> str:
    """The agent name of the README's "Connecting an agent" example (the key and the thread agree)."""
    text = README.read_text()
    section = text[text.index("## Connecting an agent") :]
    section = section[: section.index("\n## ", 1)]
    keyed = re.findall(r"createagentkey ([\w-]+)", section)
    posted = re.findall(r'"agent": "([\w-]+)"', section)
    assert keyed and posted, "the README's example no longer creates a key and a thread"
    assert set(keyed) == set(posted), f"the example's key is for {keyed}, its thread for {posted}"
    return keyed[0]


def post(client: APIClient, url: str, body: Any) -> Any:
    return client.post(url, data=json.dumps(body), content_type="application/json")


def test_every_agent_the_demo_registers_has_a_demo_name(db: Any) -> None:
    # The agents the configured modules register (tests register agents of their own beside them).
    modules = set(settings.QUICKSAVE_AGENT_MODULES)
    registered = [name for name, cls in load_agent_modules().items() if cls.__module__ in modules]

    assert registered
    assert [name for name in registered if not name.startswith("demo-")] == []


def test_the_readme_example_agent_is_not_one_of_the_demo_agents(db: Any) -> None:
    assert readme_agent_name() not in load_agent_modules()


def test_approving_a_step_of_the_readme_agent_leaves_its_run_to_that_agent(db: Any) -> None:
    name = readme_agent_name()
    _, key = create_agent_key(agent=get_or_create_agent(name=name))
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    thread = post(api, "/api/v1/threads/", {"agent": name, "external_id": "trip-42"}).json()
    first = post(api, f"/api/v1/threads/{thread['id']}/checkpoints/", {"parent": None, "state": {"messages": []}})
    request = {"checkpoint": first.json()["id"], "action": "book_flight", "args": {"flight": "SK401"}}
    approval = post(api, f"/api/v1/threads/{thread['id']}/approvals/", request)
    assert approval.status_code == 201, approval.content
    reviewer = APIClient()
    reviewer.force_login(person("rita", "reviewer"))
    decided = post(reviewer, f"/api/v1/approvals/{approval.json()['id']}/decide/", {"decision": "approve"})
    assert decided.status_code == 200, decided.content

    worker = Worker(name="embedded")  # every agent this process registers, as the embedded worker runs
    while worker.run_once():
        pass

    run = Run.objects.get(thread_id=thread["id"])
    assert run.status == RunStatus.QUEUED, f"the demo worker took the run: {run.status} {run.error!r}"
    assert Thread.objects.get(pk=thread["id"]).status != ThreadStatus.FAILED
    claimed = post(api, "/api/v1/runs/claim/", {"agent": name})
    assert claimed.status_code == 200 and claimed.json()["run"]["id"] == str(run.pk)
