"""Shared fixtures: named principals (an owner agent key, a foreign key, people by role) and API clients."""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.hashers import make_password
from django.contrib.auth.models import Permission, User
from django.test import Client
from rest_framework.test import APIClient

from checkpoints import storage
from checkpoints.models import Thread
from checkpoints.storage import lent_connection
from memory import caches as memory_caches
from quicksave.roles import grant_role
from quicksave_agents.keys import create_agent_key, get_or_create_agent
from quicksave_agents.models import Agent


@pytest.fixture(autouse=True)
def _fresh_store_caches() -> Iterator[None]:
    # Ids are never reused, but a test that edits rows behind the store's back
    # must see the database, not a state cached by an earlier test.
    storage.clear_caches()
    memory_caches.clear()
    yield
    storage.clear_caches()
    memory_caches.clear()


PGVECTOR_RAN_ELSEWHERE = "QUICKSAVE_PGVECTOR_TESTS_RAN"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`dev.py test` runs the tests marked `pgvector` in a pass of their own on the embedded
    PostgreSQL, which has the extension, when DATABASE_URL names a server that may not; it then
    sets QUICKSAVE_PGVECTOR_TESTS_RAN for the main pass, which leaves them out (deselected and
    counted, never skipped)."""
    if os.environ.get(PGVECTOR_RAN_ELSEWHERE) != "1":
        return
    kept = [item for item in items if item.get_closest_marker("pgvector") is None]
    if len(kept) != len(items):
        config.hook.pytest_deselected(items=[item for item in items if item not in kept])
        items[:] = kept


@pytest.fixture(autouse=True)
def _pgvector_or_fail(request: pytest.FixtureRequest) -> None:
    """A test marked `pgvector` fails, not skips, on a PostgreSQL without the extension: a missing
    service is a red run (`dev.py test` runs these on the embedded server, which has it)."""
    if request.node.get_closest_marker("pgvector") is None:
        return
    request.getfixturevalue("django_db_setup")
    from memory import vectors

    with request.getfixturevalue("django_db_blocker").unblock():
        if not vectors.available():
            pytest.fail(
                "needs the pgvector extension, which this PostgreSQL lacks: run it on the embedded "
                "server (DATABASE_URL unset), as `python3 dev.py test` does"
            )


@pytest.fixture(autouse=True)
def _fresh_channel_layer() -> Iterator[None]:
    # pytest-asyncio gives each test its own event loop, and a channels-redis layer keeps
    # asyncio locks and connection pools bound to the loop that first used them: each test
    # gets a layer of its own, as each server process does.
    from channels.layers import channel_layers

    channel_layers.backends = {}
    yield
    channel_layers.backends = {}


@pytest.fixture
def agent(db: Any) -> Agent:
    return get_or_create_agent(name="travel")


@pytest.fixture
def other_agent(db: Any) -> Agent:
    return get_or_create_agent(name="code-review")


@pytest.fixture
def agent_key(agent: Agent) -> str:
    return create_agent_key(agent=agent, label="tests")[1]


@pytest.fixture
def foreign_key(other_agent: Agent) -> str:
    return create_agent_key(agent=other_agent, label="tests")[1]


def _client(key: str | None = None) -> APIClient:
    client = APIClient()
    if key:
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    return client


@pytest.fixture
def owner_client(agent_key: str) -> APIClient:
    """Calls made with the key of the agent that owns the thread."""
    return _client(agent_key)


@pytest.fixture
def foreign_client(foreign_key: str) -> APIClient:
    """Calls made with another agent's key."""
    return _client(foreign_key)


@pytest.fixture
def anonymous_client() -> APIClient:
    return _client()


@pytest.fixture
def viewer(db: Any) -> User:
    user = User.objects.create(username="vera", password=password_hash("vera-password-1"))
    user.user_permissions.add(Permission.objects.get(codename="view_thread"))
    return user


@pytest.fixture
def viewer_client(viewer: User) -> APIClient:
    client = APIClient()
    client.force_authenticate(viewer)
    return client


@pytest.fixture
def stranger_client(db: Any) -> APIClient:
    """A signed-in person with no role at all."""
    client = APIClient()
    client.force_authenticate(User.objects.create(username="sam", password=password_hash("sam-password-1")))
    return client


@pytest.fixture
def thread(agent: Agent) -> Thread:
    return storage.create_thread(agent=agent, external_id="trip-1")[0]


def password_hash(password: str) -> str:
    """The hash of a test person's password, made by the configured hasher once per run and password.

    Hashing costs about a second on a loaded machine and the suite names hundreds of people with a
    handful of passwords; each still gets a real hash (with a salt shared by those of one password)
    that sign-in checks in full.
    """
    return _hashed(password, settings.PASSWORD_HASHERS[0])


@functools.cache
def _hashed(password: str, hasher: str) -> str:
    return make_password(password)


def person(name: str, role: str | None) -> User:
    """A named person with one role (or none): `person("vera", "viewer")`, password `vera-password-1`."""
    user = User.objects.create(username=name, password=password_hash(f"{name}-password-1"))
    if role:
        grant_role(user=user, role=role)
    return User.objects.get(pk=user.pk)  # permissions are cached per instance


def signed_in(user: User) -> Client:
    """A browser-like test client with `user` signed in."""
    client = Client()
    client.force_login(user)
    return client


def message(i: int) -> dict[str, str]:
    return {"role": "assistant", "content": f"message {i} " + "lorem ipsum " * 20}


@pytest.fixture(scope="session")
def server_url(django_db_setup: Any) -> Iterator[str]:
    """One uvicorn process for the whole run; tests commit their data (transaction=True) so it sees it."""
    from tests.processes import free_port, start_server, stop

    port = free_port()
    process = start_server(port, {})
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(process)


@pytest.fixture(autouse=True)
def _lent_connections_closed() -> Iterator[None]:
    # The connections LangGraph's executor threads borrow (checkpoints.storage.lent_connection) stay
    # open between calls: each test starts without them, as a new process does, and none is
    # left open when the test database is dropped.
    yield
    lent_connection.close()


async def handshake(communicator: Any, *, timeout: float = 5) -> int | None:
    """Open a test websocket: the code it was refused with, or None when it stays open.

    A refused socket is accepted and then closed with its code (a close during the handshake
    would reach a browser as a bare HTTP 403), so this reads what the consumer sends first.
    """

    connected, code = await communicator.connect(timeout=timeout)
    assert connected, f"closed during the handshake ({code}): the browser would see no code"
    # Not receive_output(timeout=...): when it times out, it cancels the application.
    if await communicator.receive_nothing(timeout=0.5):
        return None  # open, with nothing to say yet
    first = await communicator.receive_output()
    if first["type"] == "websocket.close":
        return int(first["code"])
    communicator.output_queue.put_nowait(first)  # not a refusal: leave it for the test to read
    return None
