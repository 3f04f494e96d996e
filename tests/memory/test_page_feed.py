"""The memory browser's socket: who may follow it, the writes and deletions of the items a page
shows (and no others), and a write the page missed between its render and the socket's opening."""

from __future__ import annotations

from datetime import timedelta
from typing import Any
from urllib.parse import urlencode

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import AnonymousUser, User
from django.utils import timezone

from checkpoints import live
from memory import changes, store
from memory.access import EVERYTHING
from quicksave.roles import grant_role
from quicksave_agents.auth import AgentPrincipal
from quicksave_agents.keys import create_agent_key, find_agent_key, get_or_create_agent
from tests.conftest import handshake

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

NS = ("users", "alice")


@pytest.fixture
def application() -> Any:
    from channels.auth import AuthMiddlewareStack
    from channels.routing import URLRouter

    from checkpoints.routing import fallback_routes
    from memory.routing import websocket_urlpatterns as memory_routes
    from quicksave_agents.ws_auth import AgentKeyAuthMiddleware

    return AuthMiddlewareStack(AgentKeyAuthMiddleware(URLRouter([*memory_routes, *fallback_routes])))


def path(labels: tuple[str, ...] = NS, *, key: str | None = None, since: Any = "now") -> str:
    query: list[tuple[str, str]] = [("ns", label) for label in labels]
    if key is not None:
        query.append(("key", key))
    if since is not None:
        query.append(("since", (timezone.now() if since == "now" else since).isoformat()))
    return f"/ws/memory/?{urlencode(query)}"


def _principal(who: str) -> Any:
    if who == "anonymous":
        return AnonymousUser()
    if who == "agent":
        _, raw = create_agent_key(agent=get_or_create_agent(name="travel"))
        key = find_agent_key(raw)
        assert key is not None
        return AgentPrincipal(key)
    user, made = User.objects.get_or_create(username=who)
    if made and who == "vera":
        grant_role(user=user, role="viewer")
    return User.objects.get(pk=user.pk)


async def follow(application: Any, url: str, who: str = "vera") -> WebsocketCommunicator:
    communicator = WebsocketCommunicator(application, url)
    communicator.scope["user"] = await sync_to_async(_principal)(who)
    return communicator


def write(labels: tuple[str, ...], key: str, value: Any = None) -> None:
    author = store.Author.system("tests")
    if value is None:
        store.delete_item(namespace=labels, key=key, author=author, scope=EVERYTHING)
    else:
        store.put_item(namespace=labels, key=key, value=value, author=author, scope=EVERYTHING)


def sent() -> None:
    """Every change written so far is on its way to the sockets (none arrives after this)."""
    changes.flush()
    live.flush()


@pytest.mark.parametrize(
    ("who", "url", "expected"),
    [
        ("vera", path(), None),
        ("vera", path(key="prefs"), None),
        ("vera", path(()), None),  # every namespace: the browser's first page
        ("agent", path(), 4403),  # agents follow boards; pages are people's
        ("sam", path(), 4403),  # signed in, without the viewer role
        ("anonymous", path(), 4401),
        ("vera", path(since=None), 4400),
        ("vera", "/ws/memory/?ns=users&since=yesterday", 4400),
        ("vera", "/ws/memory/?ns=users&since=2026-11-26T10:00:00", 4400),  # a time without its offset
        ("vera", path(key=""), 4400),
    ],
)
async def test_who_may_follow_the_browsers_pages(application: Any, who: str, url: str, expected: int | None) -> None:
    communicator = await follow(application, url, who)
    try:
        assert await handshake(communicator) == expected
    finally:
        await communicator.disconnect()


async def test_a_namespace_page_hears_of_writes_and_deletions_under_it_only(application: Any) -> None:
    await sync_to_async(write)(NS, "prefs", {"seat": "aisle"})
    await sync_to_async(sent)()
    # Rendered after that write (by more than the margin a write's clock is allowed).
    communicator = await follow(application, path(("users",), since=timezone.now() + changes.MARGIN))
    assert await handshake(communicator) is None
    assert await communicator.receive_nothing(timeout=0.2)

    await sync_to_async(write)(("teams", "ops"), "runbook", {"step": 1})  # not under users
    await sync_to_async(write)(NS, "prefs", {"seat": "window"})
    await sync_to_async(write)(NS, "prefs")

    written = await communicator.receive_json_from(timeout=5)
    deleted = await communicator.receive_json_from(timeout=5)
    assert (written["type"], written["namespace"], written["key"], written["data"]["version"]) == (
        changes.ITEM_WRITTEN, list(NS), "prefs", 2,
    )  # fmt: skip
    assert (deleted["type"], deleted["data"]["version"], deleted["data"]["writer"]) == (
        changes.ITEM_DELETED, 3, "system",
    )  # fmt: skip
    assert "seat" not in str(written)  # values stay sealed
    assert await communicator.receive_nothing(timeout=0.2)
    await communicator.disconnect()


async def test_an_item_page_hears_of_its_own_item_only(application: Any) -> None:
    communicator = await follow(application, path(key="prefs"))
    assert await handshake(communicator) is None

    await sync_to_async(write)(NS, "other", {"n": 1})
    await sync_to_async(write)(NS, "prefs", {"n": 1})

    event = await communicator.receive_json_from(timeout=5)
    assert (event["key"], event["data"]["version"]) == ("prefs", 1)
    assert await communicator.receive_nothing(timeout=0.2)
    await communicator.disconnect()


async def test_a_write_between_the_render_and_the_socket_is_announced_on_connect(application: Any) -> None:
    rendered = timezone.now() - timedelta(minutes=1)
    await sync_to_async(write)(NS, "prefs", {"seat": "aisle"})
    await sync_to_async(sent)()

    missed = await follow(application, path(key="prefs", since=rendered))
    assert await handshake(missed) is None
    event = await missed.receive_json_from(timeout=5)
    assert (event["type"], event["key"]) == (changes.CHANGED, "prefs")
    await missed.disconnect()

    up_to_date = await follow(application, path(key="prefs", since=timezone.now() + changes.MARGIN))
    assert await handshake(up_to_date) is None
    assert await up_to_date.receive_nothing(timeout=0.3)
    await up_to_date.disconnect()
