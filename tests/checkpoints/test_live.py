"""The live publisher batches what queues up while a send is on its way, tells the thread list
which threads had events at most once an interval, and sends to a group only while a socket listens."""

from __future__ import annotations

import asyncio
import functools
import os
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from channels.layers import InMemoryChannelLayer, channel_layers, get_channel_layer
from django.test import override_settings

from checkpoints import live, storage
from checkpoints.models import Thread
from tests.waiting import wait_until


def test_events_queued_during_the_linger_go_out_in_the_same_round(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(live, "LINGER_SECONDS", 0.3)
    publisher = live._Publisher()
    rounds: list[dict[str, list[int]]] = []

    def record(batches: dict[str, list[Any]], own_loop: Any, **_: Any) -> None:
        if batches:
            rounds.append({group: [item.payload["seq"] for item in items] for group, items in batches.items()})

    monkeypatch.setattr(publisher, "_send_all", record)
    publisher.flush()  # the thread is up and waiting
    publisher.send("thread.a", {"seq": 1})
    # Taken off the queue: the publisher woke for it and lingers now, for far longer than this wait.
    wait_until(publisher._queue.empty, what="the publisher to take the first event", every=0.001)
    publisher.send("thread.a", {"seq": 2})
    publisher.send("thread.b", {"seq": 1})
    publisher.flush()

    assert rounds == [{"thread.a": [1, 2], "thread.b": [1]}]


def test_a_publisher_that_fell_behind_sends_its_whole_backlog_in_the_next_round(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(live, "LINGER_SECONDS", 0.0)
    publisher = live._Publisher()
    rounds: list[int] = []
    first_round_sending, backlog_queued = threading.Event(), threading.Event()

    def record(batches: dict[str, list[Any]], own_loop: Any, **_: Any) -> None:
        if batches:
            rounds.append(sum(map(len, batches.values())))
            first_round_sending.set()
            backlog_queued.wait(10)  # a slow send: everything below queues up meanwhile

    monkeypatch.setattr(publisher, "_send_all", record)
    publisher.send("thread.0", {"seq": 1})
    assert first_round_sending.wait(10)
    for n in range(1000):  # 1,000 events of 500 threads
        publisher.send(f"thread.{n % 500}", {"seq": 2 + n // 500})
    backlog_queued.set()
    publisher.flush()

    assert rounds == [1, 1000]


def test_a_rounds_sends_to_its_groups_are_all_under_way_at_once() -> None:
    layer = InMemoryChannelLayer()
    groups = [f"thread.{n}" for n in range(20)]
    in_flight, most = 0, 0

    async def slow_send(group: str, message: dict[str, Any]) -> None:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await asyncio.sleep(0)  # a Redis round trip: the loop runs the other sends meanwhile, if they are under way
        in_flight -= 1

    layer.group_send = slow_send
    own_loop = asyncio.new_event_loop()
    try:
        sent = live._Publisher._send(layer, {group: {"type": "live.event", "n": 1} for group in groups}, own_loop)
    finally:
        own_loop.close()

    assert sent == set(groups)
    assert most == len(groups)


class _Recorder:
    """Stands in for the channel layer's sends: what the publisher sent, to which group, in order."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []
        self._lock = threading.Lock()

    def __call__(self, layer: Any, messages: dict[str, dict[str, Any]], own_loop: Any) -> set[str]:
        with self._lock:
            self.sent.extend(messages.items())
        return set(messages)

    def to(self, group: str) -> list[dict[str, Any]]:
        with self._lock:
            return [message for to, message in self.sent if to == group]


def _publisher(monkeypatch: pytest.MonkeyPatch, *, interval: float) -> tuple[live._Publisher, _Recorder]:
    monkeypatch.setattr(live, "LINGER_SECONDS", 0.0)
    monkeypatch.setattr(live, "THREADS_INTERVAL_SECONDS", interval)
    monkeypatch.setattr(live, "get_channel_layer", lambda: object())
    publisher, recorder = live._Publisher(), _Recorder()
    monkeypatch.setattr(publisher, "_send", recorder)
    return publisher, recorder


def _event(thread: str, seq: int) -> dict[str, Any]:
    return live.message(thread_id=thread, seq=seq, type=live.CHECKPOINT_CREATED, data={})


def _publish_in_rounds(publisher: live._Publisher, recorder: _Recorder, thread: str, seqs: range) -> None:
    """One round per event: each is sent before the next is queued."""
    group = live.thread_group(thread)
    for seq in seqs:
        publisher.send(group, _event(thread, seq))
        wait_until(functools.partial(_sent_at_least, recorder, group, seq), what=f"event {seq} sent", every=0.001)


def _sent_at_least(recorder: _Recorder, group: str, count: int) -> bool:
    return len(recorder.to(group)) >= count


def test_a_busy_writer_tells_the_thread_list_once_an_interval_not_every_round(monkeypatch: pytest.MonkeyPatch) -> None:
    publisher, recorder = _publisher(monkeypatch, interval=60.0)

    _publish_in_rounds(publisher, recorder, "t1", range(1, 11))
    publisher.send(live.thread_group("t2"), _event("t2", 1))
    wait_until(lambda: recorder.to(live.thread_group("t2")), what="t2's event sent", every=0.001)

    # Ten rounds, each event sent in order: the list heard of the first round only, so far.
    assert [message["event"]["seq"] for message in recorder.to(live.thread_group("t1"))] == list(range(1, 11))
    assert recorder.to(live.THREADS_GROUP) == [{"type": "live.threads", "threads": ["t1"]}]
    publisher.flush()  # what is due later goes out on a flush, naming every thread since
    assert recorder.to(live.THREADS_GROUP)[1:] == [{"type": "live.threads", "threads": ["t1", "t2"]}]


def test_the_thread_list_hears_of_a_change_when_its_interval_ends_without_another_event(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    publisher, recorder = _publisher(monkeypatch, interval=0.2)

    _publish_in_rounds(publisher, recorder, "t1", range(1, 3))  # the second round falls within the interval

    messages = wait_until(lambda: recorder.to(live.THREADS_GROUP)[1:], what="the list's second message", timeout=10)
    assert messages == [{"type": "live.threads", "threads": ["t1"]}]
    assert recorder.to(live.THREADS_GROUP)[0] == {"type": "live.threads", "threads": ["t1"]}


def test_a_send_the_busy_server_loop_runs_late_is_waited_for_not_logged_as_failed(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(live, "SLOW_SEND_SECONDS", 0.05)
    server_loop = asyncio.new_event_loop()
    server = threading.Thread(target=server_loop.run_forever, daemon=True)
    server.start()
    try:
        layer = InMemoryChannelLayer()
        channel = asyncio.run_coroutine_threadsafe(layer.new_channel(), server_loop).result(timeout=5)
        asyncio.run_coroutine_threadsafe(layer.group_add("thread.x", channel), server_loop).result(timeout=5)
        busy = threading.Event()
        server_loop.call_soon_threadsafe(busy.wait)  # the server's loop runs nothing else until set
        monkeypatch.setattr(live, "_server_loop", server_loop)
        sent: list[set[str]] = []
        own_loop = asyncio.new_event_loop()
        message = {"type": "live.event", "n": 1}
        send = functools.partial(live._Publisher._send, layer, {"thread.x": message}, own_loop)
        publisher = threading.Thread(target=lambda: sent.append(send()))
        publisher.start()
        wait_until(lambda: "waiting for it" in caplog.text, what="the slow send to be noticed")
        busy.set()
        publisher.join(timeout=5)
        received = asyncio.run_coroutine_threadsafe(layer.receive(channel), server_loop).result(timeout=5)
    finally:
        server_loop.call_soon_threadsafe(server_loop.stop)
        server.join(timeout=5)
        server_loop.close()

    assert sent == [{"thread.x"}]
    assert received["n"] == 1
    assert not [record for record in caplog.records if record.exc_info]


@pytest.fixture
def redis_layer() -> Iterator[Any]:
    """The channel layer on channels-redis (REDIS_URL, else a local server), as servers run it."""
    url = os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0"
    try:
        redis.Redis.from_url(url, socket_connect_timeout=1).ping()
    except redis.RedisError as exc:
        pytest.fail(f"Redis is not reachable at {url} ({exc}): start it, or set REDIS_URL", pytrace=False)
    layers = {"default": {"BACKEND": "channels_redis.core.RedisChannelLayer", "CONFIG": {"hosts": [url]}}}
    with override_settings(REDIS_URL=url, CHANNEL_LAYERS=layers):
        channel_layers.backends.clear()
        yield get_channel_layer()
    channel_layers.backends.clear()


@pytest.mark.django_db(transaction=True)
def test_the_publisher_sends_to_a_thread_only_while_a_socket_listens_to_it(redis_layer: Any, thread: Thread) -> None:
    group = live.thread_group(thread.pk)
    sent: list[str] = []
    group_send = redis_layer.group_send

    async def counting(to: str, message: dict[str, Any]) -> None:
        sent.append(to)
        await group_send(to, message)

    redis_layer.group_send = counting
    socket_loop = asyncio.new_event_loop()
    try:
        first = storage.append_checkpoint(thread=thread, parent=None, state={"i": 0})
        live.flush()
        assert group not in sent  # nobody listens: channels-redis is not asked

        channel = socket_loop.run_until_complete(redis_layer.new_channel())
        live.listening([group], channel, layer=redis_layer)
        socket_loop.run_until_complete(redis_layer.group_add(group, channel))
        second = storage.append_checkpoint(thread=thread, parent=first, state={"i": 1})
        live.flush()
        received = socket_loop.run_until_complete(asyncio.wait_for(redis_layer.receive(channel), 5))
        assert sent.count(group) == 1 and received["event"]["data"]["checkpoint"] == str(second.pk)

        socket_loop.run_until_complete(redis_layer.group_discard(group, channel))
        live.not_listening([group], channel, layer=redis_layer)
        storage.append_checkpoint(thread=thread, parent=second, state={"i": 2})
        live.flush()
        assert sent.count(group) == 1
    finally:
        redis_layer.group_send = group_send
        socket_loop.close()


def test_a_group_whose_send_fails_is_not_counted_as_sent_and_the_others_still_go(
    caplog: pytest.LogCaptureFixture,
) -> None:
    layer = InMemoryChannelLayer()
    delivered: list[str] = []

    async def send(group: str, message: dict[str, Any]) -> None:
        if group == "thread.bad":
            raise ValueError("this group's message cannot be sent")
        delivered.append(group)

    layer.group_send = send
    own_loop = asyncio.new_event_loop()
    try:
        sent = live._Publisher._send(layer, {g: {"type": "live.event"} for g in ("thread.a", "thread.bad", "thread.b")},
                                     own_loop)  # fmt: skip
    finally:
        own_loop.close()

    assert sent == {"thread.a", "thread.b"}
    assert sorted(delivered) == ["thread.a", "thread.b"]
    assert "could not publish to thread.bad" in caplog.text
