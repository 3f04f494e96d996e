"""Pooled objects: reused by whichever thread comes next, never by two threads at once."""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

from checkpoints.storage import codec
from checkpoints.storage.pool import Pool


def test_threads_that_come_one_after_another_reuse_one_object() -> None:
    made: list[object] = []

    def make() -> object:
        made.append(object())
        return made[-1]

    pool: Pool[object] = Pool(make)
    used: list[object] = []

    def use() -> None:
        item = pool.take()
        used.append(item)
        pool.give_back(item)

    for _ in range(5):  # a new thread each time, as LangGraph's executors start them
        thread = threading.Thread(target=use)
        thread.start()
        thread.join()

    assert len(made) == 1
    assert used == [made[0]] * 5


def test_users_at_the_same_time_get_objects_of_their_own() -> None:
    pool: Pool[object] = Pool(object)
    inside = threading.Barrier(3)
    held: list[object] = []

    def hold() -> None:
        item = pool.take()
        held.append(item)
        inside.wait(timeout=10)  # all three hold one at once
        pool.give_back(item)

    threads = [threading.Thread(target=hold) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert len({id(item) for item in held}) == 3
    taken = [pool.take() for _ in range(4)]
    assert {id(item) for item in taken[:3]} == {id(item) for item in held}  # all given back
    assert id(taken[3]) not in {id(item) for item in held}


def test_frames_compressed_and_read_on_many_threads_at_once_come_back_intact() -> None:
    # zstd contexts are not thread-safe: one shared by two threads at once would mix their frames.
    payloads = [os.urandom(64) + (b"checkpoint %d " % n) * 200 for n in range(8)]

    def round_trips(payload: bytes) -> bool:
        return all(codec.unframe(codec.encode(payload)) == payload for _ in range(200))

    with ThreadPoolExecutor(max_workers=8) as executor:
        assert all(executor.map(round_trips, payloads))
    assert all(codec.encode(payload).startswith(codec.ZSTD_DICT) for payload in payloads)
