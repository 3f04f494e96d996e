"""The engine's process-wide caches (checkpoints.storage.lru): bounded, safe under concurrent
request threads, and never holding what a rolled-back transaction wrote."""

from __future__ import annotations

import ctypes
import gc
import os
import subprocess
import sys
import threading
import tracemalloc
import uuid
from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from checkpoints import live, storage
from checkpoints.models import Branch, Checkpoint
from checkpoints.storage import branches, crypto
from checkpoints.storage.lru import LRU
from checkpoints.storage.nodes import states
from quicksave_agents.models import Agent
from tests.processes import ROOT, database_url


class RolledBack(Exception):
    pass


def test_a_cache_keeps_its_bound_evicting_the_least_recently_used() -> None:
    cache: LRU[int, str] = LRU(3)
    for n in range(3):
        cache.put(n, str(n))
    cache.get(0)  # used: 1 is now the oldest
    cache.put(3, "3")
    assert [cache.find(n)[0] for n in range(4)] == [True, False, True, True]
    assert len(cache) == 3


def test_a_weighted_cache_is_bounded_by_the_total_weight() -> None:
    cache: LRU[str, bytes] = LRU(10, weigh=len)
    cache.put("a", b"12345")
    cache.put("b", b"1234")
    cache.put("c", b"123")  # 12 > 10: "a" goes
    cache.put("huge", b"x" * 11)  # larger than the whole cache: not kept
    assert [cache.find(key)[0] for key in ("a", "b", "c", "huge")] == [False, True, True, False]


def test_an_insert_from_another_thread_waits_for_a_walk_of_the_cache_to_finish() -> None:
    # A thread's deletion walks the branch cache while request threads fill it: with a plain dict
    # an insert landing mid-walk raised "changed size during iteration". The walk below pauses at
    # its first entry until the insert lands or half a second passes: it must pass.
    cache: LRU[int, int] = LRU(100)
    for n in range(10):
        cache.put(n, n)
    walking, inserted = threading.Event(), threading.Event()

    def doomed(key: int, value: int) -> bool:
        if key == 0:
            walking.set()
            inserted.wait(timeout=0.5)  # the window in which the insert must not land
        return key == 1

    def insert() -> None:
        walking.wait(timeout=10)
        cache.put(100, 100)
        inserted.set()

    inserter = threading.Thread(target=insert)
    inserter.start()
    cache.drop_where(doomed)
    inserter.join(timeout=10)

    assert inserted.is_set()
    assert [cache.find(key)[0] for key in (0, 1, 100)] == [True, False, True]


def test_request_threads_filling_the_cache_while_another_forgets_a_thread_never_overflow_it() -> None:
    # Bounded on both sides: each walk holds the lock for the whole cache, so an unbounded walker
    # would starve the writers on a loaded machine.
    writers, rounds, walks = 4, 5_000, 200
    start = threading.Barrier(writers + 1)
    errors: list[BaseException] = []
    done = threading.Event()

    def insert(worker: int) -> None:
        start.wait()
        try:
            for n in range(rounds):
                branches._branches.put((uuid.UUID(int=worker * rounds + n), "main"), (n, None))
        except BaseException as exc:  # reported below
            errors.append(exc)

    def forget() -> None:
        start.wait()
        try:
            for _ in range(walks):
                if done.is_set():
                    break
                branches.forget_thread(uuid.UUID(int=0))
        except BaseException as exc:  # reported below
            errors.append(exc)

    inserters = [threading.Thread(target=insert, args=(worker,)) for worker in range(writers)]
    forgetter = threading.Thread(target=forget)
    for thread in [*inserters, forgetter]:
        thread.start()
    for thread in inserters:
        thread.join()
    done.set()
    forgetter.join()

    assert errors == []
    assert len(branches._branches) <= branches._branches.limit()


@pytest.mark.django_db(transaction=True)
def test_after_a_rolled_back_fork_the_branch_and_its_checkpoint_are_gone_without_clearing_anything(
    agent: Agent,
) -> None:
    thread = storage.create_thread(agent=agent)[0]
    root = storage.append_checkpoint(thread=thread, parent=None, state={"plan": "a"})
    with pytest.raises(RolledBack), transaction.atomic():
        storage.start_branch(thread=thread, at=root, name="retry")
        doomed = storage.append_checkpoint(thread=thread, parent=root, branch="retry", state={"plan": "b"})
        assert storage.latest_state(thread=thread, branch="retry") == (doomed.pk, {"plan": "b"})
        raise RolledBack

    with pytest.raises(storage.NotFound):
        storage.latest_state(thread=thread, branch="retry")
    with pytest.raises(storage.NotFound):
        storage.state_at(doomed.pk)
    # The same name again is a new branch; the first write to it lands at once.
    storage.start_branch(thread=thread, at=root, name="retry")
    again = storage.append_checkpoint(thread=thread, parent=root, branch="retry", state={"plan": "c"})
    assert again.branch_id == Branch.objects.get(thread=thread, name="retry").pk
    assert storage.latest_state(thread=thread, branch="retry") == (again.pk, {"plan": "c"})


@pytest.mark.django_db(transaction=True)
def test_a_committed_write_is_served_from_the_cache(agent: Agent) -> None:
    thread = storage.create_thread(agent=agent)[0]
    with transaction.atomic():
        written = storage.append_checkpoint(thread=thread, parent=None, state={"n": 1})
        assert storage.load_node(written.pk) is not None
    node = storage.load_node(written.pk)
    assert storage.load_node(written.pk) is node  # kept once committed


def test_a_value_put_in_place_of_another_drops_it_even_when_it_is_too_large_to_keep() -> None:
    cache: LRU[str, bytes] = LRU(10, weigh=len)
    cache.put("parent", b"12345")
    cache.put("other", b"1")
    cache.put("child", b"123456", replacing="parent")
    assert [cache.find(key)[0] for key in ("parent", "other", "child")] == [False, True, True]
    cache.put("huge", b"x" * 11, replacing="child")
    assert [cache.find(key)[0] for key in ("other", "child", "huge")] == [True, False, False]


def _nodes_of(thread_id: uuid.UUID) -> set[uuid.UUID]:
    return {checkpoint.pk for checkpoint in Checkpoint.objects.filter(thread_id=thread_id)
            if states.find(checkpoint.pk)[0]}  # fmt: skip


@pytest.mark.django_db(transaction=True)
def test_a_thread_written_step_after_step_keeps_only_its_head_in_the_cache(agent: Agent) -> None:
    # Each append kept its new state beside all the earlier ones: a process writing for many agents
    # grew until the cache's budget was full (+67 MiB a server over bench/load.py's soak).
    thread = storage.create_thread(agent=agent)[0]
    head = storage.append_checkpoint(thread=thread, parent=None, state={"messages": []})
    for n in range(1, 50):
        step = [{"op": "add", "path": "/messages/-", "value": f"step {n}"}]
        head = storage.append_checkpoint(thread=thread, parent=head, patch=step)
    assert _nodes_of(thread.pk) == {head.pk}
    # The next append still starts from the cached head: its one statement is the insert, no replay.
    with CaptureQueriesContext(connection) as queries:
        head = storage.append_checkpoint(thread=thread, parent=head, patch=[{"op": "remove", "path": "/messages/0"}])
    assert len(queries.captured_queries) == 1
    assert _nodes_of(thread.pk) == {head.pk}
    # An older state is replayed when read, and kept for the next reader.
    older = Checkpoint.objects.get(thread=thread, seq=10)
    assert storage.state_at(older.pk) == {"messages": [f"step {n}" for n in range(1, 10)]}
    assert _nodes_of(thread.pk) == {head.pk, older.pk}


# Another process appending to a thread: each line in is a parent's id, each line out its child's.
_OTHER_WRITER = """
import sys, django
django.setup()
from checkpoints import storage
from checkpoints.models import Checkpoint
for line in sys.stdin:
    parent = Checkpoint.objects.select_related("thread").get(pk=line.strip())
    child = storage.append_checkpoint(thread=parent.thread, parent=parent, patch=[
        {"op": "add", "path": "/messages/-", "value": "from the other process"}])
    print(child.pk, flush=True)
"""


@pytest.mark.django_db(transaction=True)
def test_a_process_keeps_one_head_a_branch_while_another_process_writes_every_other_step(agent: Agent) -> None:
    # Two servers sharing an agent's writes round-robin: the parent of what one writes is the other's,
    # so taking the parent's place alone left each server every state it wrote (bench/load.py's soak).
    env = {**os.environ, "DATABASE_URL": database_url(), "DJANGO_SETTINGS_MODULE": "quicksave.settings"}
    other = subprocess.Popen([sys.executable, "-c", _OTHER_WRITER], cwd=ROOT, env=env, text=True,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)  # fmt: skip
    assert other.stdin is not None and other.stdout is not None
    try:
        thread = storage.create_thread(agent=agent)[0]
        head = storage.append_checkpoint(thread=thread, parent=None, state={"messages": []})
        for n in range(4):
            other.stdin.write(f"{head.pk}\n")
            other.stdin.flush()
            theirs = Checkpoint.objects.get(pk=other.stdout.readline().strip())
            head = storage.append_checkpoint(thread=thread, parent=theirs, patch=[
                {"op": "add", "path": "/messages/-", "value": f"from this process, {n}"}])  # fmt: skip
    finally:
        other.stdin.close()
        other.wait(timeout=60)

    assert head.seq == 9  # the first and eight appends, four by each process
    assert _nodes_of(thread.pk) == {head.pk}
    assert storage.latest_state(thread=thread)[1]["messages"][-2:] == ["from the other process", "from this process, 3"]


@pytest.mark.django_db(transaction=True)
def test_a_forks_first_checkpoint_leaves_the_fork_point_cached_as_its_own_branchs_head(agent: Agent) -> None:
    thread = storage.create_thread(agent=agent)[0]
    root = storage.append_checkpoint(thread=thread, parent=None, state={"plan": "a"})
    storage.start_branch(thread=thread, at=root, name="retry")
    fork = storage.append_checkpoint(thread=thread, parent=root, branch="retry", state={"plan": "b"})
    assert _nodes_of(thread.pk) == {root.pk, fork.pk}


@pytest.mark.django_db(transaction=True)
def test_a_rolled_back_append_leaves_its_parent_cached(agent: Agent) -> None:
    thread = storage.create_thread(agent=agent)[0]
    root = storage.append_checkpoint(thread=thread, parent=None, state={"n": 0})
    with pytest.raises(RolledBack), transaction.atomic():
        storage.append_checkpoint(thread=thread, parent=root, state={"n": 1})
        assert _nodes_of(thread.pk) == {root.pk}  # nothing changes before the commit
        raise RolledBack
    assert _nodes_of(thread.pk) == {root.pk}
    with transaction.atomic():
        child = storage.append_checkpoint(thread=thread, parent=root, state={"n": 1})
    assert _nodes_of(thread.pk) == {child.pk}


@pytest.mark.django_db(transaction=True)
def test_an_append_in_a_transaction_is_cached_and_published_together_when_it_commits(
    agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    published: list[int] = []
    publish = live.publish

    def heard(**event: Any) -> None:
        published.append(event["seq"])
        publish(**event)

    thread = storage.create_thread(agent=agent)[0]
    monkeypatch.setattr(live, "publish", heard)
    root = storage.append_checkpoint(thread=thread, parent=None, state={"n": 0})
    assert published == [2] and _nodes_of(thread.pk) == {root.pk}  # in autocommit, at once
    with pytest.raises(RolledBack), transaction.atomic():
        storage.append_checkpoint(thread=thread, parent=root, state={"n": 1})
        raise RolledBack
    assert published == [2] and _nodes_of(thread.pk) == {root.pk}
    with transaction.atomic():
        child = storage.append_checkpoint(thread=thread, parent=root, state={"n": 1})
        assert published == [2] and _nodes_of(thread.pk) == {root.pk}  # nothing before the commit
    assert published == [2, 3] and _nodes_of(thread.pk) == {child.pk}


@pytest.mark.django_db(transaction=True)
def test_the_state_cache_holds_no_more_memory_than_its_budget_however_small_the_states(
    agent: Agent, settings: Any
) -> None:
    # Weighed by their states alone, 300 states of 8 bytes "weighed" 2 KiB and held some 200 KiB.
    settings.QUICKSAVE_STATE_CACHE_BYTES = budget = 64 * 1024
    thread = storage.create_thread(agent=agent)[0]
    written = [storage.append_checkpoint(thread=thread, parent=None, state={"n": 0})]
    for n in range(1, 300):
        written.append(storage.append_checkpoint(thread=thread, parent=written[-1],
                                                 patch=[{"op": "replace", "path": "/n", "value": n}]))  # fmt: skip
    live.flush()  # the publisher thread is done with the events: what is freed below is the cache's
    states.clear()
    gc.collect()
    tracemalloc.start()
    try:
        for checkpoint in written:  # a reader of every state (each replayed from the one before)
            storage.state_at(checkpoint.pk)
        gc.collect()
        filled = tracemalloc.get_traced_memory()[0]
        cached = len(states)
        states.clear()
        gc.collect()
        held = filled - tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert cached > 1
    assert held <= budget


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]  # fmt: skip


def _c_heap_in_use() -> int:
    """Bytes glibc's malloc has handed out and not had back (`mallinfo2`), OpenSSL's among them,
    which tracemalloc does not see."""
    mallinfo2 = ctypes.CDLL(None).mallinfo2
    mallinfo2.restype = _Mallinfo2
    info: _Mallinfo2 = mallinfo2()
    return int(info.uordblks + info.hblkhd)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallinfo2 measures the C heap")
def test_the_data_keys_a_process_keeps_open_hold_no_openssl_memory(agent: Agent) -> None:
    # Each kept key was an opened AESGCM, ~3.2 KB of OpenSSL's heap once used: 500 threads' keys
    # held ~1.6 MB, scattered over the heap for as long as the process kept them.
    threads = [storage.create_thread(agent=agent)[0].pk for _ in range(500)]
    crypto.forget_keys()
    gc.collect()
    before = _c_heap_in_use()
    for thread_id in threads:
        crypto.unseal(thread_id, b"ad", crypto.seal(thread_id, b"ad", b"value"))
    gc.collect()
    grown = _c_heap_in_use() - before

    with CaptureQueriesContext(connection) as queries:  # every key is kept: no read again
        for thread_id in threads:
            crypto.unseal(thread_id, b"ad", crypto.seal(thread_id, b"ad", b"value"))
    assert len(queries) == 0
    assert grown < 256 * 1024
