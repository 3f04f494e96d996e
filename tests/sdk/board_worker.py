"""An agent process that works through the tasks on a blackboard with the SDK (HTTP only, no
Django): take a task's lease, mark it working, do it, mark it done under the lease (fenced and
compare-and-set), release. Started by tests/sdk/test_memory.py, three at a time, one of them
killed mid-task.

    python -m tests.sdk.board_worker URL KEY HOLDER BOARD [--hang-after N]

Each line it prints says what it did: `working <task>`, `done <task> v<version>`, `lost <task>`.
With --hang-after N it completes N tasks, then stops for good in the middle of the next one
(`hanging <task>`), its lease still renewed by its side thread as a live process's is, to be killed.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time

from quicksave_sdk import Client, LeaseLost, VersionConflict

TTL_SECONDS = 2.0
WORK_SECONDS = 0.1


def work(url: str, key: str, holder: str, board_name: str, hang_after: int) -> int:
    completed = 0
    with Client(url, key, timeout=30) as qs:
        board = qs.memory.board(board_name.split("."))
        while True:
            pending = [item for item in board.items() if item.value.get("status") != "done"]
            if not pending:
                return 0
            took_one = False
            for task in pending:
                lease = board.acquire(task.key, holder=holder, ttl_seconds=TTL_SECONDS)
                if lease is None:
                    continue  # someone else has it
                took_one = True
                with lease.keeping(TTL_SECONDS) as lost:
                    current = board.get(task.key)
                    if current is None or current.value.get("status") == "done":
                        lease.release()
                        continue
                    try:
                        started = board.put(task.key, {**current.value, "status": "working", "by": holder},
                                            lease=lease, expected_version=current.version)  # fmt: skip
                        print(f"working {task.key}", flush=True)
                        if completed == hang_after:
                            print(f"hanging {task.key}", flush=True)
                            time.sleep(3600)  # mid-task, lease held: the test kills this process here
                        time.sleep(WORK_SECONDS)
                        if lost.is_set():
                            raise LeaseLost("lease_lost", "the lease was not renewed in time")
                        done = board.put(task.key, {**current.value, "status": "done", "by": holder},
                                         lease=lease, expected_version=started.version)  # fmt: skip
                    except (LeaseLost, VersionConflict) as refused:
                        print(f"lost {task.key} {refused.code}", flush=True)
                        continue
                    print(f"done {task.key} v{done.version}", flush=True)
                    completed += 1
                with contextlib.suppress(LeaseLost):  # it ran out meanwhile: the task is done anyway
                    lease.release()
            if not took_one:
                time.sleep(0.1)  # every pending task is held by another worker: look again shortly


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("key")
    parser.add_argument("holder")
    parser.add_argument("board")
    parser.add_argument("--hang-after", type=int, default=-1)
    args = parser.parse_args()
    return work(args.url, args.key, args.holder, args.board, args.hang_after)


if __name__ == "__main__":
    sys.exit(main())
