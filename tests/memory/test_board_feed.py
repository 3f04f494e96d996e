"""A blackboard's websocket: who may follow it, replay after `after_seq`, then live changes in order,
with a change lost on the way filled in from the table."""

from __future__ import annotations

from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import AnonymousUser, User
from django.db import transaction

from checkpoints import live
from memory import boards, store
from memory.access import EVERYTHING, Scope
from memory.models import Namespace
from quicksave.roles import grant_role
from quicksave_agents.auth import AgentPrincipal
from quicksave_agents.keys import create_agent_key, find_agent_key, get_or_create_agent
from tests.conftest import handshake

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

BOARD = ("team", "tasks")
PATH = "/ws/memory/boards/team.tasks/"


@pytest.fixture
def application() -> Any:
    from channels.auth import AuthMiddlewareStack
    from channels.routing import URLRouter

    from checkpoints.routing import fallback_routes
    from memory.routing import websocket_urlpatterns as memory_routes
    from quicksave_agents.ws_auth import AgentKeyAuthMiddleware

    return AuthMiddlewareStack(AgentKeyAuthMiddleware(URLRouter([*memory_routes, *fallback_routes])))


def _key_of(agent: str) -> AgentPrincipal:
    _, raw = create_agent_key(agent=get_or_create_agent(name=agent))
    key = find_agent_key(raw)
    assert key is not None
    return AgentPrincipal(key)


def _board_of(principal: AgentPrincipal, writes: int = 0) -> None:
    scope = Scope(principal.agent.pk)
    boards.make_board(namespace=BOARD, scope=scope)
    for n in range(writes):
        store.put_item(namespace=BOARD, key=f"t{n}", value={"n": n}, scope=scope,
                       author=store.Author.agent(principal.agent.pk))  # fmt: skip


def _principal(who: str) -> Any:
    if who == "anonymous":
        return AnonymousUser()
    if who == "stranger":
        return User.objects.create_user("sam")
    if who == "viewer":
        user = User.objects.create_user("vera")
        grant_role(user=user, role="viewer")
        return User.objects.get(pk=user.pk)
    return _key_of(who)


async def connect(application: Any, path: str, user: Any) -> WebsocketCommunicator:
    communicator = WebsocketCommunicator(application, path)
    communicator.scope["user"] = user
    return communicator


@pytest.mark.parametrize(
    ("who", "path", "expected"),
    [
        ("travel", PATH, None),
        ("viewer", PATH, None),
        ("code-review", PATH, 4404),  # another agent's board does not exist for it
        ("stranger", PATH, 4403),
        ("anonymous", PATH, 4401),
        ("travel", "/ws/memory/boards/team.nothing/", 4404),
        ("travel", "/ws/memory/boards/plain/", 4404),
        ("travel", "/ws/memory/boards/team..tasks/", 4404),
        ("travel", PATH + "?after_seq=-1", 4400),
    ],
)
async def test_who_may_follow_a_board(application: Any, who: str, path: str, expected: int | None) -> None:
    owner = await sync_to_async(_key_of)("travel")
    await sync_to_async(_board_of)(owner)
    await sync_to_async(store.put_item)(namespace=("plain",), key="k", value=1, author=store.Author.system("t"),
                                        scope=EVERYTHING)  # fmt: skip
    principal = owner if who == "travel" else await sync_to_async(_principal)(who)
    communicator = await connect(application, path, principal)
    try:
        assert await handshake(communicator) == expected
    finally:
        await communicator.disconnect()


async def test_events_after_after_seq_are_replayed_then_live_ones_follow_in_order(application: Any) -> None:
    owner = await sync_to_async(_key_of)("travel")
    await sync_to_async(_board_of)(owner, writes=3)  # events 1..3
    communicator = await connect(application, PATH + "?after_seq=1", owner)
    connected, _ = await communicator.connect()
    assert connected

    replayed = [await communicator.receive_json_from(timeout=5) for _ in range(2)]
    assert [(e["seq"], e["type"], e["key"], e["board"]) for e in replayed] == [
        (2, "item.written", "t1", "team.tasks"),
        (3, "item.written", "t2", "team.tasks"),
    ]

    def take_lease() -> boards.Lease:
        return boards.acquire_lease(namespace=BOARD, key="t0", holder="w1", ttl_seconds=30, scope=EVERYTHING)

    await sync_to_async(take_lease)()
    event = await communicator.receive_json_from(timeout=5)
    assert (event["seq"], event["type"], event["data"]["holder"]) == (4, "lease.acquired", "w1")
    assert "fencing_token" not in event["data"]
    await communicator.disconnect()


async def test_a_change_lost_on_the_way_is_filled_in_from_the_table(application: Any) -> None:
    owner = await sync_to_async(_key_of)("travel")
    await sync_to_async(_board_of)(owner, writes=1)
    communicator = await connect(application, PATH + "?after_seq=1", owner)
    await communicator.connect()
    assert await communicator.receive_nothing(timeout=0.3)

    def write_two_and_lose_the_first() -> None:
        payload_board_id = Namespace.objects.get(path=list(BOARD)).pk
        sent: list[tuple[str, dict[str, Any]]] = []
        original = live.send_on_commit

        def keep_second(group: str, payload: dict[str, Any]) -> None:
            if group != boards.group(payload_board_id):
                original(group, payload)  # the browser's feed of item changes (memory.changes)
                return
            sent.append((group, payload))
            if len(sent) == 2:
                original(group, payload)

        live.send_on_commit = keep_second
        try:
            for key in ("a", "b"):
                with transaction.atomic():
                    store.put_item(namespace=BOARD, key=key, value=1, author=store.Author.system("t"),
                                   scope=EVERYTHING)  # fmt: skip
        finally:
            live.send_on_commit = original

    await sync_to_async(write_two_and_lose_the_first)()
    events = [await communicator.receive_json_from(timeout=5) for _ in range(2)]
    assert [(e["seq"], e["key"]) for e in events] == [(2, "a"), (3, "b")]
    await communicator.disconnect()


async def test_an_agent_whose_grant_is_revoked_stops_getting_the_boards_events(
    application: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from memory import consumers, sharing

    monkeypatch.setattr(consumers, "ACCESS_RECHECK_SECONDS", 0.0)  # check at every event
    owner = await sync_to_async(_key_of)("travel")
    guest = await sync_to_async(_key_of)("code-review")
    await sync_to_async(_board_of)(owner)

    def grant() -> Any:
        ada = User.objects.create_user("ada")
        return ada, sharing.grant_namespace(prefix=("team",), agent=guest.agent, user=ada, reason="pairing")

    ada, granted = await sync_to_async(grant)()
    communicator = await connect(application, PATH, guest)
    assert await handshake(communicator) is None

    def write(key: str) -> None:
        store.put_item(namespace=BOARD, key=key, value=1, author=store.Author.agent(owner.agent.pk),
                       scope=Scope(owner.agent.pk))  # fmt: skip

    await sync_to_async(write)("seen")
    assert (await communicator.receive_json_from(timeout=5))["key"] == "seen"
    await sync_to_async(sharing.revoke_grant)(grant=granted, user=ada, reason="over")
    await sync_to_async(write)("unseen")

    closed = await communicator.receive_output(timeout=5)
    assert closed == {"type": "websocket.close", "code": 4404}
    await communicator.disconnect()
