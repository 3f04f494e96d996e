"""Environment references: a checkpoint records the world it ran in (a git commit, an image
digest...), its pages list them, and a fork resumed from it checks them first: the in-process
runtime through `Agent.verify_environment`, an SDK agent through `serve(verify_environment=...)`;
a mismatch stops the resume with a message the checkpoint and fork pages show."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
from django.contrib.auth.models import User
from quicksave_sdk import Client, Run
from quicksave_sdk import environment as sdk_environment
from rest_framework.test import APIClient

from checkpoints import forks, storage
from checkpoints.models import Checkpoint, CheckpointStatus, Thread, ThreadStatus
from checkpoints.storage.errors import InvalidState
from quicksave_agents import runtime
from quicksave_agents.keys import create_agent_key, get_or_create_agent
from quicksave_agents.runtime import Agent, Context, Continue, Done, StepResult, start_thread
from quicksave_agents.worker import Worker
from tests.conftest import password_hash, person, signed_in

COMMIT_A = "a" * 40
COMMIT_B = "b" * 40


def drain() -> None:
    worker = Worker(name="test-worker")
    while worker.run_once():
        pass


class _Deployer(Agent):
    """Records the commit it deploys, then finishes; `world` is the commit the machine is on now."""

    name = "deployer-test"
    world: ClassVar[str] = COMMIT_A
    resumed: ClassVar[list[str]] = []

    def initial_state(self, **inputs: Any) -> dict[str, Any]:
        return {"deployed": None}

    def step(self, ctx: Context) -> StepResult:
        self.resumed.append(str(ctx.head))
        if ctx.state["deployed"] is None:
            ctx.environment = [{"kind": "git", "locator": "/srv/app", "digest": self.world}]
            ctx.state["deployed"] = self.world
            return Continue("deployed")
        return Done()

    def verify_environment(self, references: list[dict[str, str]]) -> list[str]:
        return [
            f"git {r['locator']} is at {self.world[:12]}, not {r['digest'][:12]}"
            for r in references
            if r["kind"] == "git" and r["digest"] != self.world
        ]


@pytest.fixture
def deployer(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[_Deployer]]:
    monkeypatch.setitem(runtime._registry, _Deployer.name, _Deployer)
    monkeypatch.setattr(_Deployer, "world", COMMIT_A)
    monkeypatch.setattr(_Deployer, "resumed", [])
    yield _Deployer


@pytest.fixture
def admin(db: Any) -> User:
    return person("ada", "admin")


def deployed(thread: Thread) -> Checkpoint:
    return Checkpoint.objects.get(thread=thread, label="deployed")


@pytest.mark.django_db
def test_a_checkpoint_records_the_environment_and_its_page_lists_it(deployer: type[_Deployer], admin: User) -> None:
    thread = start_thread(agent_class=deployer, external_id="deploy-1")
    drain()

    recorded = deployed(thread)
    assert recorded.metadata["environment"] == [{"kind": "git", "locator": "/srv/app", "digest": COMMIT_A}]
    page = signed_in(admin).get(f"/checkpoints/{recorded.pk}/").content.decode()
    assert 'id="environment"' in page and "/srv/app" in page and COMMIT_A in page


@pytest.mark.django_db
def test_a_fork_resumes_when_the_environment_still_matches(deployer: type[_Deployer], admin: User) -> None:
    thread = start_thread(agent_class=deployer, external_id="deploy-2")
    drain()

    fork = forks.fork(checkpoint=deployed(thread), user=admin, reason="again", resume=True)
    drain()

    thread.refresh_from_db()
    assert thread.status == ThreadStatus.COMPLETED
    assert fork.metadata["environment"] == deployed(thread).metadata["environment"]
    assert str(fork.pk) in deployer.resumed


@pytest.mark.django_db
def test_a_fork_does_not_resume_on_a_changed_world_and_the_fork_page_says_why(
    deployer: type[_Deployer], admin: User
) -> None:
    thread = start_thread(agent_class=deployer, external_id="deploy-3")
    drain()
    source = deployed(thread)
    deployer.world = COMMIT_B  # someone deployed another commit meanwhile

    fork = forks.fork(checkpoint=source, user=admin, reason="redo the deploy", resume=True)
    drain()

    thread.refresh_from_db()
    assert thread.status == ThreadStatus.FAILED
    assert str(fork.pk) not in deployer.resumed  # the agent's step never ran on the changed world
    stopped = Checkpoint.objects.get(thread=thread, parent=fork)
    assert stopped.status == CheckpointStatus.FAILED
    assert stopped.metadata["environment_mismatch"] == [f"git /srv/app is at {COMMIT_B[:12]}, not {COMMIT_A[:12]}"]
    assert "The environment changed since checkpoint" in stopped.metadata["error"]
    fork_page = signed_in(admin).get(f"/checkpoints/{source.pk}/fork/").content.decode()
    assert "the environment had changed" in fork_page and f"is at {COMMIT_B[:12]}" in fork_page


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("environment", "field"),
    [
        ("a string", "metadata.environment"),
        ([{"kind": "git", "locator": "/srv/app"}], "metadata.environment[0]"),
        ([{"kind": "ftp", "locator": "x", "digest": "y"}], "metadata.environment[0].kind"),
        ([{"kind": "git", "locator": "", "digest": "y"}], "metadata.environment[0].locator"),
        ([{"kind": "image", "locator": "app", "digest": "d" * 201}], "metadata.environment[0].digest"),
        ([{"kind": "file", "locator": "x", "digest": "y"}] * 51, "metadata.environment"),
    ],
)
def test_a_malformed_environment_is_refused_naming_the_field(agent: Any, environment: Any, field: str) -> None:
    thread = storage.create_thread(agent=agent)[0]

    with pytest.raises(InvalidState) as refused:
        storage.append_checkpoint(thread=thread, parent=None, state={}, metadata={"environment": environment})

    assert refused.value.detail["field"] == field
    assert not Checkpoint.objects.filter(thread=thread).exists()


@pytest.mark.django_db
def test_the_api_answers_a_malformed_environment_with_a_422_naming_the_field_and_the_limit(agent: Any) -> None:
    key = create_agent_key(agent=agent)[1]
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    thread = api.post("/api/v1/threads/", {}, format="json").json()
    reference = {"kind": "image", "locator": "registry/app", "digest": "sha256:" + "f" * 300}

    body = {"parent": None, "state": {}, "metadata": {"environment": [reference]}}
    answer = api.post(f"/api/v1/threads/{thread['id']}/checkpoints/", body, format="json")

    assert answer.status_code == 422, answer.json()
    error = answer.json()["error"]
    assert error["code"] == "invalid_state" and error["detail"]["field"] == "metadata.environment[0].digest"
    assert "at most 200 characters" in error["message"]


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True)
    return done.stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    path = tmp_path / "app"
    path.mkdir()
    _git(path, "init", "-q")
    _git(path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "one")
    return path


@pytest.mark.django_db(transaction=True)
def test_an_sdk_agent_does_not_resume_a_fork_once_its_checkout_moved(
    server_url: str, repo: Path, tmp_path: Path
) -> None:
    agent = get_or_create_agent(name="sdk-deployer")
    admin = User.objects.create(username="ada", password=password_hash("pw-12345678"), is_superuser=True)
    config = tmp_path / "settings.toml"
    config.write_text("replicas = 2\n")
    with Client(server_url, create_agent_key(agent=agent)[1], timeout=15) as client:
        thread = client.thread(external_id="sdk-deploy")
        recorded = thread.checkpoint(
            {"deployed": _git(repo, "rev-parse", "HEAD")},
            metadata={"environment": [sdk_environment.git(repo), sdk_environment.file(config)]},
        )
        source = Checkpoint.objects.get(pk=recorded.id)
        handled: list[Run] = []

        forks.fork(checkpoint=source, user=admin, reason="unchanged", resume=True)
        assert client.serve(handled.append, wait=0, max_runs=1, verify_environment=sdk_environment.check_local) == 1
        assert len(handled) == 1  # the world matched: the handler ran

        _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "two")
        config.write_text("replicas = 3\n")
        forks.fork(checkpoint=source, user=admin, reason="changed", resume=True)
        assert client.serve(handled.append, wait=0, max_runs=1, verify_environment=sdk_environment.check_local) == 1

    assert len(handled) == 1  # not handed the second run
    row = Thread.objects.get(pk=thread.id)
    assert row.status == ThreadStatus.FAILED
    stopped = Checkpoint.objects.get(thread=row, parent__metadata__reason="changed")
    changes = stopped.metadata["environment_mismatch"]
    assert changes[0].startswith(f"git {repo} is at ") and changes[1].startswith(f"file {config} has sha256:")
    assert "Not resuming on a changed world" in stopped.metadata["error"]
