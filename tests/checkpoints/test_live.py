"""The live publisher skips channel-layer sends to groups nobody is in and batches what queues up."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from channels_redis.core import RedisChannelLayer

from checkpoints import live
from tests.processes import RedisServer
from tests.waiting import wait_until


def test_a_group_without_members_is_skipped_and_one_with_a_member_is_not(redis_server: RedisServer) -> None:
    layer = RedisChannelLayer(hosts=[redis_server.url])
    group = live.thread_group("0193a3c0-0000-7000-8000-000000000001")
    assert not live._may_have_listeners(layer, group)

    async def join() -> None:
        await layer.group_add(group, await layer.new_channel())

    asyncio.run(join())
    assert live._may_have_listeners(layer, group)


def test_when_redis_cannot_be_asked_the_send_goes_ahead(redis_server: RedisServer) -> None:
    layer = RedisChannelLayer(hosts=[redis_server.url])
    redis_server.kill()
    live._redis_client.cache_clear()
    assert live._may_have_listeners(layer, live.thread_group("0193a3c0-0000-7000-8000-000000000002"))


def test_an_in_memory_group_is_sent_to_only_while_it_has_a_member() -> None:
    from channels.layers import InMemoryChannelLayer

    layer = InMemoryChannelLayer()
    group = live.thread_group("0193a3c0-0000-7000-8000-000000000003")
    assert not live._may_have_listeners(layer, group)

    async def join() -> str:
        channel = await layer.new_channel()
        await layer.group_add(group, channel)
        return channel

    channel = asyncio.run(join())
    assert live._may_have_listeners(layer, group)
    asyncio.run(layer.group_discard(group, channel))
    assert not live._may_have_listeners(layer, group)


def test_other_layers_are_always_sent_to() -> None:
    class SomeOtherLayer:
        pass

    assert live._may_have_listeners(SomeOtherLayer(), "thread.anything")


def test_events_queued_during_the_linger_go_out_in_the_same_round(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(live, "LINGER_SECONDS", 0.3)
    publisher = live._Publisher()
    rounds: list[dict[str, list[int]]] = []

    def record(batches: dict[str, list[dict[str, Any]]], own_loop: Any) -> None:
        if batches:
            rounds.append({group: [event["seq"] for event in events] for group, events in batches.items()})

    monkeypatch.setattr(publisher, "_send_all", record)
    publisher.flush()  # the thread is up and waiting
    publisher.send("thread.a", {"seq": 1})
    # Taken off the queue: the publisher woke for it and lingers now, for far longer than this wait.
    wait_until(publisher._queue.empty, what="the publisher to take the first event", every=0.001)
    publisher.send("thread.a", {"seq": 2})
    publisher.send("thread.b", {"seq": 1})
    publisher.flush()

    assert rounds == [{"thread.a": [1, 2], "thread.b": [1]}]
