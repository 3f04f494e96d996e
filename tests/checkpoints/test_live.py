"""The live publisher batches what queues up while a send is on its way."""

from __future__ import annotations

from typing import Any

import pytest

from checkpoints import live
from tests.waiting import wait_until


def test_events_queued_during_the_linger_go_out_in_the_same_round(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(live, "LINGER_SECONDS", 0.3)
    publisher = live._Publisher()
    rounds: list[dict[str, list[int]]] = []

    def record(batches: dict[str, list[Any]], own_loop: Any) -> None:
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
