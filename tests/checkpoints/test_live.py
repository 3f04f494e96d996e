"""The live publisher batches what queues up while a send is on its way."""

from __future__ import annotations

import time
from typing import Any

import pytest

from checkpoints import live


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
    time.sleep(0.05)  # well after the publisher woke for the first event, well within its linger
    publisher.send("thread.a", {"seq": 2})
    publisher.send("thread.b", {"seq": 1})
    publisher.flush()

    assert rounds == [{"thread.a": [1, 2], "thread.b": [1]}]
