"""Websockets last as long as their sign-in: a revoked agent key or a signed-out session closes its
sockets with 4401. A channel layer that cannot be reached refuses sockets with 4503, logged once."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client

from checkpoints import live, sockets, storage
from checkpoints.models import Thread
from quicksave_agents.auth import AgentPrincipal
from quicksave_agents.keys import create_agent_key, find_agent_key, get_or_create_agent, revoke_agent_key
from quicksave_agents.models import AgentKey
from tests.conftest import handshake, person, signed_in
from tests.processes import RedisServer

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

# The promise: a socket is closed within this long of the revoke or sign-out.
WITHIN_SECONDS = 2.0


@pytest.fixture
def application() -> Any:
    from channels.auth import AuthMiddlewareStack
    from channels.routing import URLRouter

    from approvals.routing import websocket_urlpatterns as inbox_routes
    from checkpoints.routing import fallback_routes
    from checkpoints.routing import websocket_urlpatterns as thread_routes
    from quicksave_agents.ws_auth import AgentKeyAuthMiddleware

    return AuthMiddlewareStack(AgentKeyAuthMiddleware(URLRouter([*thread_routes, *inbox_routes, *fallback_routes])))


@pytest.fixture
def close_messages_lost() -> Iterator[None]:
    """Nothing the publisher sends arrives: as when Redis was down at the moment of the revoke."""
    sent = live._publisher.send
    live._publisher.send = lambda group, payload, **_: None  # type: ignore[method-assign]
    yield
    live._publisher.send = sent  # type: ignore[method-assign]


@pytest.fixture
def no_recheck(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the close message can close a socket in time."""
    monkeypatch.setattr(sockets, "RECHECK_SECONDS", 60.0)


def _thread() -> Thread:
    thread, _ = storage.create_thread(agent=get_or_create_agent(name="travel"))
    storage.append_checkpoint(thread=thread, parent=None, state={"i": 0})
    return thread


def _key() -> tuple[AgentKey, str]:
    return create_agent_key(agent=get_or_create_agent(name="travel"), label="socket")


def _agent(raw: str) -> AgentPrincipal:
    key = find_agent_key(raw)
    assert key is not None
    return AgentPrincipal(key)


def _append(thread: Thread) -> None:
    head, _ = storage.latest_state(thread=thread)
    storage.append_checkpoint(thread=thread, parent=head, state={"i": 1})


def _session_cookie(browser: Client) -> list[tuple[bytes, bytes]]:
    name = settings.SESSION_COOKIE_NAME
    return [(b"cookie", f"{name}={browser.cookies[name].value}".encode())]


async def closed_with(communicator: WebsocketCommunicator, *, within: float = WITHIN_SECONDS) -> int:
    """The code the socket closes with, reading past whatever it sends first; fails after `within`."""
    async with asyncio.timeout(within):
        while True:
            output = await communicator.receive_output(timeout=within)
            if output["type"] == "websocket.close":
                return int(output["code"])


def _path(socket: str, thread: Thread) -> str:
    return {"thread": f"/ws/threads/{thread.pk}/", "inbox": "/ws/inbox/", "thread list": "/ws/threads/"}[socket]


@pytest.mark.parametrize("socket", ["thread", "inbox"])
async def test_revoking_an_agent_key_closes_its_open_sockets_with_4401(
    application: Any, socket: str, no_recheck: None
) -> None:
    thread = await sync_to_async(_thread)()
    key, raw = await sync_to_async(_key)()
    communicator = WebsocketCommunicator(application, _path(socket, thread))
    communicator.scope["user"] = await sync_to_async(_agent)(raw)
    assert await handshake(communicator) is None

    await sync_to_async(revoke_agent_key)(key=key)

    assert await closed_with(communicator) == 4401


async def test_a_revoked_keys_socket_closes_even_when_the_close_message_is_lost(
    application: Any, close_messages_lost: None
) -> None:
    thread = await sync_to_async(_thread)()
    key, raw = await sync_to_async(_key)()
    communicator = WebsocketCommunicator(application, f"/ws/threads/{thread.pk}/")
    communicator.scope["user"] = await sync_to_async(_agent)(raw)
    assert await handshake(communicator) is None

    await sync_to_async(revoke_agent_key)(key=key)

    assert await closed_with(communicator) == 4401


async def test_a_revoked_keys_socket_gets_no_more_checkpoints(application: Any, close_messages_lost: None) -> None:
    thread = await sync_to_async(_thread)()
    key, raw = await sync_to_async(_key)()
    communicator = WebsocketCommunicator(application, f"/ws/threads/{thread.pk}/?after_seq=2")
    communicator.scope["user"] = await sync_to_async(_agent)(raw)
    assert await handshake(communicator) is None

    await sync_to_async(revoke_agent_key)(key=key)
    assert await closed_with(communicator) == 4401
    await sync_to_async(_append)(thread)
    await sync_to_async(live.flush)()

    assert await communicator.receive_nothing(timeout=0.3)


@pytest.mark.parametrize("socket", ["thread", "inbox", "thread list"])
async def test_signing_out_closes_the_sessions_open_sockets_with_4401(
    application: Any, socket: str, no_recheck: None
) -> None:
    thread = await sync_to_async(_thread)()
    browser = await sync_to_async(signed_in)(await sync_to_async(person)("vera", "viewer"))
    communicator = WebsocketCommunicator(application, _path(socket, thread), headers=_session_cookie(browser))
    assert await handshake(communicator) is None

    response = await sync_to_async(browser.post)("/logout/")
    assert response.status_code < 400

    assert await closed_with(communicator) == 4401


async def test_a_signed_out_sessions_socket_closes_even_when_the_close_message_is_lost(
    application: Any, close_messages_lost: None
) -> None:
    thread = await sync_to_async(_thread)()
    browser = await sync_to_async(signed_in)(await sync_to_async(person)("vera", "viewer"))
    communicator = WebsocketCommunicator(application, f"/ws/threads/{thread.pk}/", headers=_session_cookie(browser))
    assert await handshake(communicator) is None

    await sync_to_async(browser.post)("/logout/")

    assert await closed_with(communicator) == 4401


async def test_signing_out_one_browser_leaves_the_same_persons_other_browser_connected(application: Any) -> None:
    thread = await sync_to_async(_thread)()
    vera = await sync_to_async(person)("vera", "viewer")
    leaving, staying = await sync_to_async(signed_in)(vera), await sync_to_async(signed_in)(vera)
    path = f"/ws/threads/{thread.pk}/?after_seq=2"
    closing = WebsocketCommunicator(application, path, headers=_session_cookie(leaving))
    staying_open = WebsocketCommunicator(application, path, headers=_session_cookie(staying))
    assert await handshake(closing) is None
    assert await handshake(staying_open) is None

    await sync_to_async(leaving.post)("/logout/")
    assert await closed_with(closing) == 4401
    await sync_to_async(_append)(thread)

    event = await staying_open.receive_json_from(timeout=5)
    assert (event["seq"], event["type"]) == (3, "checkpoint.created")
    await staying_open.disconnect()


async def test_deactivating_a_person_closes_their_sockets_with_4401(application: Any) -> None:
    thread = await sync_to_async(_thread)()
    browser = await sync_to_async(signed_in)(await sync_to_async(person)("vera", "viewer"))
    communicator = WebsocketCommunicator(application, f"/ws/threads/{thread.pk}/", headers=_session_cookie(browser))
    assert await handshake(communicator) is None

    await sync_to_async(User.objects.filter(username="vera").update)(is_active=False)

    assert await closed_with(communicator) == 4401


@pytest.fixture
def private_channel_layer(settings: Any) -> Iterator[RedisServer]:
    """The channel layer on a private redis-server, which the test may kill and start again."""
    server = RedisServer()
    server.start()
    settings.CHANNEL_LAYERS = {
        "default": {"BACKEND": "channels_redis.core.RedisChannelLayer", "CONFIG": {"hosts": [server.url]}}
    }
    yield server
    if server.process is not None and server.process.poll() is None:
        server.kill()


def _viewer() -> User:
    return person("vera", "viewer")


def _logged(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [record for record in caplog.records if record.levelno >= logging.WARNING]


async def _viewer_socket(application: Any, path: str, viewer: User) -> WebsocketCommunicator:
    communicator = WebsocketCommunicator(application, path)
    communicator.scope["user"] = viewer
    return communicator


async def test_a_handshake_while_redis_is_down_is_refused_with_4503_and_logged_once(
    application: Any, private_channel_layer: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    thread = await sync_to_async(_thread)()
    viewer = await sync_to_async(_viewer)()
    before = await _viewer_socket(application, f"/ws/threads/{thread.pk}/", viewer)
    assert await handshake(before) is None
    await before.disconnect()
    caplog.clear()
    caplog.set_level(logging.DEBUG, logger="checkpoints.live")

    private_channel_layer.kill()
    for path in [f"/ws/threads/{thread.pk}/", f"/ws/threads/{thread.pk}/", "/ws/inbox/", "/ws/threads/"]:
        communicator = await _viewer_socket(application, path, viewer)
        assert await handshake(communicator) == 4503
        await communicator.wait()

    assert len(_logged(caplog)) == 1, [record.getMessage() for record in _logged(caplog)]
    assert _logged(caplog)[0].exc_info is None  # one line, not a traceback

    private_channel_layer.start()  # Redis is back: sockets open again, and that is logged once too
    communicator = await _viewer_socket(application, f"/ws/threads/{thread.pk}/", viewer)
    assert await handshake(communicator) is None
    await communicator.disconnect()
    assert len(_logged(caplog)) == 2
    assert "again" in _logged(caplog)[1].getMessage()


async def test_an_open_socket_is_closed_with_4503_when_redis_goes_down(
    application: Any, private_channel_layer: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    thread = await sync_to_async(_thread)()
    viewer = await sync_to_async(_viewer)()
    communicator = await _viewer_socket(application, f"/ws/threads/{thread.pk}/", viewer)
    assert await handshake(communicator) is None
    caplog.clear()

    private_channel_layer.kill()

    assert await closed_with(communicator, within=10) == 4503
    await communicator.wait()
    assert [record.exc_info for record in _logged(caplog)] == [None]
