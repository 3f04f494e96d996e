"""Websockets: who may connect, replay after `after_seq`, then live events in order without duplicates."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import AnonymousUser, User

from checkpoints import live, storage
from checkpoints.models import Checkpoint
from quicksave.roles import grant_role
from quicksave_agents.auth import AgentPrincipal
from quicksave_agents.keys import create_agent_key, find_agent_key, get_or_create_agent
from tests.conftest import handshake, password_hash

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

T = TypeVar("T")


@pytest.fixture(autouse=True)
def fresh_channel_layer() -> Iterator[None]:
    """A channel layer of this test's own: channels-redis binds a layer's receiving to the event
    loop that first received, and each test runs in a loop of its own (a layer shared with an
    earlier test's loop sometimes never delivered a message to this one's sockets)."""
    from channels.layers import channel_layers

    channel_layers.backends.clear()
    yield
    channel_layers.backends.clear()


@pytest.fixture
def application() -> Any:
    from channels.auth import AuthMiddlewareStack
    from channels.routing import URLRouter

    from approvals.routing import websocket_urlpatterns as inbox_routes
    from checkpoints.routing import fallback_routes
    from checkpoints.routing import websocket_urlpatterns as thread_routes
    from quicksave_agents.ws_auth import AgentKeyAuthMiddleware

    return AuthMiddlewareStack(AgentKeyAuthMiddleware(URLRouter([*thread_routes, *inbox_routes, *fallback_routes])))


def _viewer() -> User:
    user = User.objects.create(username="vera", password=password_hash("pw-12345678"))
    grant_role(user=user, role="viewer")
    return User.objects.get(pk=user.pk)


def _thread_with(n: int) -> Any:
    thread, _ = storage.create_thread(agent=get_or_create_agent(name="travel"))
    parent = None
    for i in range(n):
        parent = storage.append_checkpoint(thread=thread, parent=parent, state={"i": i})
    return thread


def _suspended() -> Any:
    """A new thread whose first checkpoint waits for an approval."""
    from approvals.services import request_approval

    thread = _thread_with(1)
    checkpoint = Checkpoint.objects.get(thread=thread, seq=1)
    return request_approval(thread=thread, checkpoint=checkpoint, action="deploy", args={})


def _principal(who: str, *, agent: str) -> Any:
    """Someone a socket may refuse: "anonymous", a "stranger" with no role, or a key of `agent`."""
    if who == "anonymous":
        return AnonymousUser()
    if who == "stranger":
        return User.objects.create(username="sam", password=password_hash("pw-12345678"))
    _, raw = create_agent_key(agent=get_or_create_agent(name=agent))
    key = find_agent_key(raw)
    assert key is not None
    return AgentPrincipal(key)


async def _unpublished(write: Callable[[], T]) -> T:
    """`write` commits, but none of its events reach the channel layer (lost on the way)."""
    sent = live._publisher.send
    live._publisher.send = lambda group, payload, **_: None  # type: ignore[method-assign]
    try:
        return await sync_to_async(write)()
    finally:
        live._publisher.send = sent  # type: ignore[method-assign]


async def _write_two_unpublished(thread: Any, *, last_label: str = "") -> None:
    """Two checkpoints commit on `thread` whose events never reach the channel layer (lost on the way)."""

    def write_two() -> None:
        head, _ = storage.latest_state(thread=thread)
        first = storage.append_checkpoint(thread=thread, parent=head, state={"i": 1})
        storage.append_checkpoint(thread=thread, parent=first, state={"i": 2}, label=last_label)

    await _unpublished(write_two)


async def connect(application: Any, path: str, user: Any) -> WebsocketCommunicator:
    communicator = WebsocketCommunicator(application, path)
    communicator.scope["user"] = user
    return communicator


async def test_a_viewer_gets_every_event_after_after_seq_then_live_ones_in_order(application: Any) -> None:
    viewer = await sync_to_async(_viewer)()
    thread = await sync_to_async(_thread_with)(3)  # events 1 (thread.created) .. 4
    communicator = await connect(application, f"/ws/threads/{thread.pk}/?after_seq=2", viewer)
    connected, _ = await communicator.connect()
    assert connected

    replayed = [await communicator.receive_json_from(timeout=5) for _ in range(2)]
    assert [(event["seq"], event["type"]) for event in replayed] == [
        (3, "checkpoint.created"),
        (4, "checkpoint.created"),
    ]
    assert replayed[0]["thread"] == str(thread.pk)

    head, _ = await sync_to_async(storage.latest_state)(thread=thread)
    await sync_to_async(storage.append_checkpoint)(thread=thread, parent=head, state={"i": 99}, label="live")
    event = await communicator.receive_json_from(timeout=5)
    assert (event["seq"], event["data"]["label"]) == (5, "live")
    await communicator.disconnect()


async def test_a_missed_live_event_is_filled_in_from_the_table(application: Any) -> None:
    viewer = await sync_to_async(_viewer)()
    thread = await sync_to_async(_thread_with)(1)
    communicator = await connect(application, f"/ws/threads/{thread.pk}/?after_seq=2", viewer)
    await communicator.connect()

    # Two events commit, but only the second reaches the group (the first was lost on the way).
    await _write_two_unpublished(thread)
    await communicator.receive_nothing(timeout=0.2)
    from channels.layers import get_channel_layer

    await get_channel_layer().group_send(
        live.thread_group(thread.pk),
        {"type": "live.event", "event": live.message(thread_id=thread.pk, seq=4, type="checkpoint.created", data={})},
    )
    got = [await communicator.receive_json_from(timeout=5) for _ in range(2)]
    assert [event["seq"] for event in got] == [3, 4]  # seq 3 came from the table, no duplicate of 4
    assert await communicator.receive_nothing(timeout=0.3)
    await communicator.disconnect()


async def test_a_burst_of_writes_arrives_in_order_once_each_though_sent_in_batches(application: Any) -> None:
    viewer = await sync_to_async(_viewer)()
    thread = await sync_to_async(_thread_with)(1)
    communicator = await connect(application, f"/ws/threads/{thread.pk}/?after_seq=2", viewer)
    await communicator.connect()
    from channels.layers import get_channel_layer

    layer = get_channel_layer()
    messages: list[str] = []
    group_send = layer.group_send

    released = asyncio.Event()

    async def counting(group: str, message: dict[str, Any]) -> None:
        if group == live.thread_group(thread.pk):  # not the thread list's, if anyone listens there
            messages.append(message["type"])
        await released.wait()  # the first send is slow: the rest of the burst queues up behind it
        await group_send(group, message)

    def burst() -> None:
        head, _ = storage.latest_state(thread=thread)
        for i in range(30):
            head = storage.append_checkpoint(thread=thread, parent=head, state={"i": i}).pk

    layer.group_send = counting
    try:
        await sync_to_async(burst)()
        released.set()
        got = [await communicator.receive_json_from(timeout=5) for _ in range(30)]
    finally:
        layer.group_send = group_send
    assert [event["seq"] for event in got] == list(range(3, 33))
    assert await communicator.receive_nothing(timeout=0.3)
    # Whatever queued up behind the first (held) send went out together with it or after it.
    assert "live.events" in messages and len(messages) <= 2, messages
    await communicator.disconnect()


@pytest.mark.parametrize("who", ["anonymous", "stranger", "foreign-key"])
async def test_people_and_agents_who_cannot_see_the_thread_are_refused(application: Any, who: str) -> None:
    thread = await sync_to_async(_thread_with)(1)

    principal = await sync_to_async(_principal)(who, agent="code-review")
    communicator = await connect(application, f"/ws/threads/{thread.pk}/", principal)
    assert await handshake(communicator) in (4401, 4404)


async def test_an_agent_key_in_the_handshake_reaches_its_own_thread(application: Any) -> None:
    thread = await sync_to_async(_thread_with)(1)
    _, raw = await sync_to_async(create_agent_key)(agent=await sync_to_async(get_or_create_agent)(name="travel"))
    communicator = WebsocketCommunicator(
        application, f"/ws/threads/{thread.pk}/", headers=[(b"authorization", f"Bearer {raw}".encode())]
    )
    communicator.scope["user"] = AnonymousUser()
    connected, _ = await communicator.connect()
    assert connected
    assert (await communicator.receive_json_from(timeout=5))["seq"] == 1
    await communicator.disconnect()


async def test_malformed_after_seq_is_refused(application: Any) -> None:
    viewer = await sync_to_async(_viewer)()
    thread = await sync_to_async(_thread_with)(1)
    communicator = await connect(application, f"/ws/threads/{thread.pk}/?after_seq=abc", viewer)
    assert await handshake(communicator) == 4400


async def test_the_inbox_syncs_pending_approvals_then_streams_decisions(application: Any) -> None:
    from approvals.services import decide

    viewer = await sync_to_async(_viewer)()
    first = await sync_to_async(_suspended)()
    communicator = await connect(application, "/ws/inbox/", viewer)
    assert (await communicator.connect())[0]
    sync = await communicator.receive_json_from(timeout=5)
    assert sync == {"type": "inbox.sync", "seq": 0, "thread": None, "data": {"pending": [str(first.pk)]}}

    second = await sync_to_async(_suspended)()
    requested = await communicator.receive_json_from(timeout=5)
    assert (requested["type"], requested["data"]["approval"]) == ("approval.requested", str(second.pk))

    def decide_first() -> None:
        reviewer = User.objects.create(username="rita", password=password_hash("pw-12345678"))
        grant_role(user=reviewer, role="reviewer")
        decide(approval=first, user=User.objects.get(pk=reviewer.pk), decision="approve")

    await sync_to_async(decide_first)()
    decided = await communicator.receive_json_from(timeout=5)
    assert (decided["type"], decided["data"]["approval"], decided["data"]["status"]) == (
        "approval.decided", str(first.pk), "approved")  # fmt: skip
    await communicator.disconnect()


async def test_the_inbox_does_not_repeat_a_request_its_sync_already_named(application: Any) -> None:
    from channels.layers import get_channel_layer

    viewer = await sync_to_async(_viewer)()
    first = await sync_to_async(_suspended)()
    await sync_to_async(live.flush)()
    communicator = await connect(application, "/ws/inbox/", viewer)
    assert (await communicator.connect())[0]
    assert (await communicator.receive_json_from(timeout=5))["data"]["pending"] == [str(first.pk)]

    # The first request's event, late through the channel layer, then a new request.
    late = live.message(thread_id=first.thread_id, seq=3, type="approval.requested", data={"approval": str(first.pk)})
    await get_channel_layer().group_send(live.INBOX_GROUP, {"type": "live.event", "event": late})
    second = await sync_to_async(_suspended)()
    requested = await communicator.receive_json_from(timeout=5)
    assert (requested["type"], requested["data"]["approval"]) == ("approval.requested", str(second.pk))
    await communicator.disconnect()


async def test_the_inboxs_last_events_lost_on_the_way_arrive_as_a_fresh_sync(application: Any, settings: Any) -> None:
    """The inbox mixes threads, so no gap in seq shows a lost event: the inbox watch finds the
    table's pending approvals other than those the socket told of and syncs the socket again, once."""
    from approvals.services import decide

    settings.QUICKSAVE_LIVE_RECHECK_SECONDS = 0.2
    viewer = await sync_to_async(_viewer)()
    communicator = await connect(application, "/ws/inbox/", viewer)
    assert (await communicator.connect())[0]
    assert (await communicator.receive_json_from(timeout=5))["data"]["pending"] == []

    requested = await _unpublished(_suspended)
    sync = await communicator.receive_json_from(timeout=5)
    assert sync == {"type": "inbox.sync", "seq": 0, "thread": None, "data": {"pending": [str(requested.pk)]}}
    assert await communicator.receive_nothing(timeout=0.5)  # in step again: no repeat at the next rounds

    def decide_it() -> None:
        reviewer = User.objects.create(username="rita", password=password_hash("pw-12345678"))
        grant_role(user=reviewer, role="reviewer")
        decide(approval=requested, user=User.objects.get(pk=reviewer.pk), decision="approve")

    await _unpublished(decide_it)
    assert (await communicator.receive_json_from(timeout=5))["data"] == {"pending": []}
    assert await communicator.receive_nothing(timeout=0.5)
    await communicator.disconnect()


@pytest.mark.parametrize("path", ["/ws/threads/not-a-uuid/", "/ws/nothing/", "/ws/threads/list/"])
async def test_a_path_that_is_no_socket_of_ours_is_refused_with_4404(application: Any, path: str) -> None:
    viewer = await sync_to_async(_viewer)()
    communicator = await connect(application, path, viewer)

    assert await handshake(communicator) == 4404


@pytest.mark.parametrize(
    "frame",
    [{"bytes_data": b"\x00\x01"}, {"text_data": "{not json"}, {"text_data": "[" * 100_000 + "]" * 100_000},
     {"text_data": '{"type": "ping", "pad": "' + "x" * 5000 + '"}'}],
    ids=["binary", "malformed", "nested 100000 deep", "over 4 KiB"],
)  # fmt: skip
async def test_a_frame_a_client_should_not_send_closes_the_socket_with_4400(
    application: Any, frame: dict[str, Any]
) -> None:
    viewer = await sync_to_async(_viewer)()
    thread = await sync_to_async(_thread_with)(1)
    communicator = await connect(application, f"/ws/threads/{thread.pk}/?after_seq=99", viewer)
    assert (await communicator.connect())[0]

    await communicator.send_to(**frame)

    assert await communicator.receive_output(timeout=5) == {"type": "websocket.close", "code": 4400}


async def test_a_ping_still_gets_a_pong(application: Any) -> None:
    viewer = await sync_to_async(_viewer)()
    thread = await sync_to_async(_thread_with)(1)
    communicator = await connect(application, f"/ws/threads/{thread.pk}/?after_seq=99", viewer)
    assert (await communicator.connect())[0]

    await communicator.send_json_to({"type": "ping"})

    assert await communicator.receive_json_from(timeout=5) == {"type": "pong", "seq": 99}
    await communicator.disconnect()


async def test_the_inbox_answers_a_ping_too(application: Any) -> None:
    viewer = await sync_to_async(_viewer)()
    communicator = await connect(application, "/ws/inbox/", viewer)
    assert (await communicator.connect())[0]
    assert (await communicator.receive_json_from(timeout=5))["type"] == "inbox.sync"

    await communicator.send_json_to({"type": "ping"})

    assert await communicator.receive_json_from(timeout=5) == {"type": "pong", "seq": 0}
    await communicator.disconnect()


async def test_the_thread_list_feed_names_the_threads_that_had_events(application: Any) -> None:
    viewer = await sync_to_async(_viewer)()
    quiet = await sync_to_async(_thread_with)(1)
    await sync_to_async(live.flush)()  # its events are out before the list connects
    communicator = await connect(application, "/ws/threads/", viewer)
    connected, _ = await communicator.connect()
    assert connected

    busy = await sync_to_async(_thread_with)(3)  # a new thread, then three checkpoints
    await sync_to_async(live.flush)()

    named: set[str] = set()
    while str(busy.pk) not in named:
        message = await communicator.receive_json_from(timeout=10)
        assert message["type"] == "threads.changed" and message["thread"] is None
        named.update(message["data"]["threads"])
    assert str(quiet.pk) not in named
    await communicator.send_json_to({"type": "ping"})
    assert (await communicator.receive_json_from(timeout=5))["type"] in ("pong", "threads.changed")
    await communicator.disconnect()


@pytest.mark.parametrize(("who", "code"), [("anonymous", 4401), ("stranger", 4403), ("foreign-key", 4403)])
async def test_the_thread_list_feed_is_for_people_who_may_read_every_thread(
    application: Any, who: str, code: int
) -> None:
    principal = await sync_to_async(_principal)(who, agent="travel")
    communicator = await connect(application, "/ws/threads/", principal)
    assert await handshake(communicator) == code


async def test_a_threads_last_events_lost_on_the_way_arrive_from_the_table(application: Any, settings: Any) -> None:
    """Nothing follows the lost events to show a gap: the tail watch finds the thread's counter
    ahead of the socket and the socket replays them, in order, once each."""
    settings.QUICKSAVE_LIVE_RECHECK_SECONDS = 0.2
    viewer = await sync_to_async(_viewer)()
    thread = await sync_to_async(_thread_with)(1)  # events 1 and 2
    communicator = await connect(application, f"/ws/threads/{thread.pk}/?after_seq=2", viewer)
    await communicator.connect()

    await _write_two_unpublished(thread, last_label="last")

    got = [await communicator.receive_json_from(timeout=5) for _ in range(2)]
    assert [(event["seq"], event["data"]["label"]) for event in got] == [(3, ""), (4, "last")]
    assert await communicator.receive_nothing(timeout=0.5)  # caught up: no repeat at the next round
    await communicator.disconnect()


async def test_a_closed_socket_leaves_nothing_in_its_servers_watches(application: Any) -> None:
    """A server holds open sockets in its sign-in, tail and inbox watches: a socket that closes is
    gone from them, so sockets that come and go leave nothing behind in a long-lived process."""
    from approvals import consumers as inbox
    from checkpoints import consumers, sockets

    key = await sync_to_async(_principal)("key", agent="travel")  # a sign-in the sign-in watch follows
    thread = await sync_to_async(_thread_with)(1)
    opened = [await connect(application, path, key) for path in (f"/ws/threads/{thread.pk}/", "/ws/inbox/")]
    for communicator in opened:
        assert (await communicator.connect())[0]
        await communicator.receive_json_from(timeout=5)  # the replay's first event, or the sync
    watched = (sockets._SignInWatch.current().sockets, consumers._TailWatch.current().sockets,
               inbox._InboxWatch.current().sockets)  # fmt: skip
    assert [len(each) for each in watched] == [2, 1, 1]

    for communicator in opened:
        await communicator.disconnect()

    assert [len(each) for each in watched] == [0, 0, 0]
