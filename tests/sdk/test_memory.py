"""The SDK's memory and blackboards against a live Quicksave server process (uvicorn on the test
database, real HTTP), and three agent processes sharing one board's tasks while one is killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from quicksave_sdk import Board, Client, LeaseHeld, LeaseLost, NotFound, VersionConflict

from checkpoints import storage
from memory import selectors
from memory.access import EVERYTHING
from memory.models import BoardEvent
from quicksave_agents.keys import create_agent_key, get_or_create_agent
from tests.processes import ROOT
from tests.waiting import wait_until

live = pytest.mark.django_db(transaction=True)


@pytest.fixture
def api_key(transactional_db: Any) -> str:
    return create_agent_key(agent=get_or_create_agent(name="travel"))[1]


@pytest.fixture
def client(server_url: str, api_key: str) -> Iterator[Client]:
    with Client(server_url, api_key, timeout=15) as sdk:
        yield sdk


def expire(key: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute("UPDATE memory_lease SET expires_at = clock_timestamp() - interval '1 ms' WHERE key = %s", [key])


@live
def test_items_are_put_read_searched_deleted_and_their_history_kept(client: Client) -> None:
    memory = client.memory
    first = memory.put(("users", "alice"), "prefs", {"color": "red"}, index=["color"])
    second = memory.put(("users", "alice"), "prefs", {"color": "blue"}, index=["color"], expected_version=1)
    odd = memory.put(("users", "alice"), "notes/2026? 100%", {"text": "lisbon"})

    assert (first.version, first.created, second.version, second.created) == (1, True, 2, False)
    item = memory.get(("users", "alice"), "prefs")
    assert item is not None and item.value == {"color": "blue"} and item.version == 2
    assert memory.get(("users", "alice"), "prefs", as_of=first.updated_at).value == {"color": "red"}  # type: ignore[union-attr]
    assert memory.get(("users", "alice"), odd.key).value == {"text": "lisbon"}  # type: ignore[union-attr]
    assert [i.key for i in memory.search(("users",), filter={"color": "blue"})] == ["prefs"]
    assert memory.search(query="blue")[0].key == "prefs"
    assert memory.namespaces() == [("users", "alice")]

    deleted = memory.delete(("users", "alice"), "prefs")
    assert deleted is not None and deleted.deleted and deleted.version == 3
    assert memory.get(("users", "alice"), "prefs") is None
    assert memory.delete(("users", "alice"), "prefs") is None
    versions = list(memory.history(("users", "alice"), "prefs", page_size=2))  # three pages' worth, followed
    assert [(v.version, v.deleted, v.value) for v in versions] == [
        (3, True, None), (2, False, {"color": "blue"}), (1, False, {"color": "red"}),
    ]  # fmt: skip
    assert versions[1].writer == "agent" and versions[1].agent == "travel"


@live
def test_a_write_expecting_an_old_version_raises_version_conflict_with_the_current_one(client: Client) -> None:
    client.memory.put(("counters",), "n", 1)
    client.memory.put(("counters",), "n", 2)
    with pytest.raises(VersionConflict) as raised:
        client.memory.put(("counters",), "n", 3, expected_version=1)
    assert raised.value.current_version == 2 and raised.value.status == 409


@live
def test_another_agents_memory_is_invisible_to_this_key(client: Client, server_url: str) -> None:
    client.memory.put(("private",), "k", {"secret": 1})
    other = create_agent_key(agent=get_or_create_agent(name="code-review"))[1]
    with Client(server_url, other) as theirs:
        assert theirs.memory.get(("private",), "k") is None
        assert theirs.memory.namespaces() == []
        assert theirs.memory.search() == []


def test_a_namespace_the_url_cannot_carry_is_refused_before_any_request() -> None:
    with Client("http://127.0.0.1:9", "qs_unused") as sdk:
        with pytest.raises(ValueError, match=r"without '\.' or '/'"):
            sdk.memory.put(("a/b",), "k", 1)
        with pytest.raises(TypeError):
            sdk.memory.get("users.alice", "k")


@live
def test_a_board_lease_fences_a_late_holder_and_the_feed_lists_the_changes(client: Client) -> None:
    board = client.memory.board(("team", "tasks"))
    board.put("t1", {"status": "open"})
    slow = board.acquire("t1", holder="slow", ttl_seconds=30)
    assert slow is not None
    assert board.acquire("t1", holder="fast", ttl_seconds=30) is None
    with pytest.raises(LeaseHeld) as held:
        board.put("t1", {"status": "stolen"})
    assert held.value.holder == "slow"

    expire("t1")  # the slow holder paused past its time-to-live
    fast = board.acquire("t1", holder="fast", ttl_seconds=30)
    assert fast is not None and fast.fencing_token > slow.fencing_token and fast.took_over_from == "slow"
    board.put("t1", {"status": "done", "by": "fast"}, lease=fast, expected_version=1)
    with pytest.raises(LeaseLost):
        board.put("t1", {"status": "done", "by": "slow"}, lease=slow)
    with pytest.raises(LeaseLost):
        slow.renew(30)
    fast.renew(60)
    assert [lease["holder"] for lease in board.leases()] == ["fast"]
    fast.release()

    assert [(e.seq, e.type) for e in board.events()] == [
        (1, "item.written"), (2, "lease.acquired"), (3, "lease.acquired"), (4, "item.written"),
        (5, "lease.released"),
    ]  # fmt: skip
    assert board.get("t1").value == {"status": "done", "by": "fast"}  # type: ignore[union-attr]


@live
def test_an_agent_follows_a_board_over_its_websocket_from_a_seq_then_live(client: Client, server_url: str) -> None:
    board = client.memory.board(("team", "watched"))
    board.put("t1", {"status": "open"})
    board.put("t2", {"status": "open"})
    feed = board.watch(after_seq=1, timeout=10)

    replayed = next(feed)
    board.put("t1", {"status": "done"})
    live_event = next(feed)
    feed.close()

    assert (replayed.seq, replayed.type, replayed.key) == (2, "item.written", "t2")
    assert (live_event.seq, live_event.type, live_event.key, live_event.data["version"]) == (3, "item.written", "t1", 2)
    other = create_agent_key(agent=get_or_create_agent(name="code-review"))[1]
    with Client(server_url, other) as theirs:
        foreign = Board(theirs.memory, ("team", "watched"))
        with pytest.raises(NotFound):
            next(foreign.watch(timeout=10))


@live
def test_keeping_a_lease_renews_it_past_its_time_to_live(client: Client) -> None:
    board = client.memory.board(("team", "renewed"))
    lease = board.acquire("t1", holder="w", ttl_seconds=0.6)
    assert lease is not None
    first_expiry = lease.expires_at
    with lease.keeping(0.6, every=0.1) as lost:
        wait_until(lambda: lease.expires_at > first_expiry, what="a renewal")  # type: ignore[operator]
        assert not lost.is_set()
    board.put("t1", {"still": "mine"}, lease=lease)


def _worker(server_url: str, key: str, holder: str, log: Path, *, hang_after: int = -1) -> subprocess.Popen[bytes]:
    """An agent process using only the SDK (its own Python, the checkout's SDK on its path)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "sdk" / "src"), str(ROOT)])}
    command = [sys.executable, "-m", "tests.sdk.board_worker", server_url, key, holder, "team.work",
               "--hang-after", str(hang_after)]  # fmt: skip
    with log.open("wb") as out:
        return subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)


@live
@pytest.mark.timeout(180)
def test_three_agent_processes_complete_every_task_exactly_once_when_one_is_killed_mid_task(
    client: Client, server_url: str, api_key: str
) -> None:
    board = client.memory.board(("team", "work"))
    tasks = [f"task-{n:02d}" for n in range(12)]
    for task in tasks:
        board.put(task, {"status": "open", "title": task})

    with tempfile.TemporaryDirectory() as folder:
        logs = {name: Path(folder) / f"{name}.log" for name in ("victim", "w1", "w2")}
        # The victim completes two tasks, then stops in the middle of its third, holding its lease.
        victim = _worker(server_url, api_key, "victim", logs["victim"], hang_after=2)
        processes = [victim]
        try:
            held = wait_until(lambda: _line(logs["victim"], "hanging "), what="the victim to hang mid-task",
                              timeout=60)  # fmt: skip
            workers = [_worker(server_url, api_key, name, logs[name]) for name in ("w1", "w2")]
            processes += workers
            wait_until(lambda: _line(logs["w1"], "done ") or _line(logs["w2"], "done "),
                       what="the other workers to complete a task", timeout=60)  # fmt: skip
            victim.send_signal(signal.SIGKILL)  # three processes at work; one dies mid-task
            victim.wait(timeout=10)
            for worker in workers:
                worker.wait(timeout=120)
        finally:
            for process in processes:
                if process.poll() is None:
                    process.kill()
                    process.wait()
        outputs = {name: log.read_text() for name, log in logs.items()}

    assert [w.returncode for w in workers] == [0, 0], outputs
    assert victim.returncode == -signal.SIGKILL
    victims_task = held.split()[1]
    done_lines = [line.split()[1] for output in outputs.values() for line in output.splitlines()
                  if line.startswith("done ")]  # fmt: skip
    assert sorted(done_lines) == tasks, outputs  # every task reported done once
    assert len([line for line in outputs["victim"].splitlines() if line.startswith("done ")]) == 2
    assert victims_task not in [line.split()[1] for line in outputs["victim"].splitlines() if line.startswith("done")]
    for task in tasks:
        history = selectors.item_history(namespace=("team", "work"), key=task, scope=EVERYTHING)
        assert history is not None
        completions = [v for v in history if v.value and v.value.get("status") == "done"]
        assert len(completions) == 1, (task, [(v.version, v.value) for v in history])
        assert history[0].value["status"] == "done"
    takeover = BoardEvent.objects.filter(kind="lease.acquired", key=victims_task, data__took_over_from="victim")
    assert takeover.exists()  # the victim's task went to another worker once its lease ran out


def _line(log: Path, start: str) -> str | None:
    if not log.exists():
        return None
    return next((line for line in log.read_text().splitlines() if line.startswith(start)), None)


@live
def test_a_read_naming_its_thread_is_recorded_in_the_items_history(client: Client) -> None:
    thread, _ = storage.create_thread(agent=get_or_create_agent(name="travel"), external_id="trip-sdk")
    client.memory.put(("users", "alice"), "prefs", {"color": "red"})

    item = client.memory.get(("users", "alice"), "prefs", thread_id=str(thread.pk))

    assert item is not None and item.value == {"color": "red"}

    def recorded() -> bool:
        return [r.thread_id for r in selectors.item_reads(namespace=("users", "alice"), key="prefs",
                                                          scope=EVERYTHING)] == [thread.pk]  # fmt: skip

    wait_until(recorded, what="the server to record the read")
