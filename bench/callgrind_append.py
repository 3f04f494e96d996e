"""Instructions per append of bench/checkpoint_store.py's in-process store writes, by thread, under callgrind.

Usage (from any tree, this one's or an older one's, e.g. a worktree of 8787e87)::

    .venv/bin/python bench/callgrind_append.py --mode plain
    .venv/bin/python bench/callgrind_append.py --tree /tmp/old --mode encrypted --steps 1000

It runs the bench's workload (`bench.peers.workload`, written as `bench.quicksave_runs.run_store`
writes it: a patch a step, the same in a thread with a data key, or the agent's full state) in
`--tree` under `valgrind --tool=callgrind --separate-threads=yes`, and prints instructions per
append: the writer thread's (measured from just after the first append to the last, callgrind
dumping its counts every `--window` appends: a window with a snapshot or a garbage collection shows
as one), the live publisher's (its whole life: one round at setup is in it) with its rounds, and
the process's. Instruction counts are the same at any load, unlike the bench's rates; they leave
out the time the writer waits for PostgreSQL and the server's own work.

The database is `BENCH_DATABASE_NAME` (default `quicksave_bench`; an older tree may ignore it)
on `BENCH_DATABASE_URL` or `DATABASE_URL`, as for the bench; `REDIS_URL` as the environment says.
Each window's dump is in `--out` (callgrind_annotate reads it).
"""

from __future__ import annotations

import argparse
import gc
import importlib
import math
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

# A call of math.lcm() with no arguments marks a window: callgrind dumps the counts so far when
# any thread enters it (--dump-before), and nothing else in the process calls it.
_MARK = "math_lcm"


def write(tree: Path, mode: str, steps: int, window: int) -> None:
    """The workload, run in `tree` (the child under valgrind)."""
    os.chdir(tree)
    # This folder would shadow the real `langgraph` package (bench/langgraph.py): the tree's root instead.
    here = Path(__file__).resolve().parent
    sys.path[:] = [str(tree)] + [p for p in sys.path if Path(p or ".").resolve() != here]
    from bench import quicksave_runs
    from bench.peers import workload

    quicksave_runs.setup_django()
    from django.test import override_settings

    try:
        storage: Any = importlib.import_module("checkpoints.storage")
    except ImportError:  # a tree from before the storage package (8787e87)
        storage = importlib.import_module("checkpoints.store")

    agent = quicksave_runs._reset()
    with override_settings(QUICKSAVE_ENCRYPT=mode == "encrypted"):
        thread, _ = storage.create_thread(agent=agent)
    work = list(workload(steps))
    state: dict[str, Any] = {"messages": [], "step": 0, "facts": {}}
    parent = storage.append_checkpoint(thread=thread, parent=None, state=state, step=0)
    gc.collect()
    math.lcm()
    for done, s in enumerate(work, 1):
        if mode == "full":
            state["messages"].append(s.message)
            state = {"messages": state["messages"], "step": s.step, "facts": s.facts}
            parent = storage.append_checkpoint(thread=thread, parent=parent, state=state, step=s.step)
        else:
            ops: list[dict[str, Any]] = [
                {"op": "add", "path": "/messages/-", "value": s.message},
                {"op": "replace", "path": "/step", "value": s.step},
                {"op": "replace", "path": "/facts", "value": s.facts},
            ]
            parent = storage.append_checkpoint(thread=thread, parent=parent, patch=ops, step=s.step)
        if done % window == 0:
            math.lcm()
    os._exit(0)  # no exit work in the last dump


def _total(path: Path) -> int:
    with path.open() as lines:
        for line in lines:
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
    return 0


def _calls(path: Path, function: str) -> int:
    """How often the thread of a dump called `function`."""
    count, wanted = 0, False
    with path.open() as lines:
        for line in lines:
            if line.startswith("cfn="):
                wanted = line.rstrip().endswith(function)
            elif wanted and line.startswith("calls="):
                count += int(line.split()[0].removeprefix("calls="))
                wanted = False
    return count


def report(out: Path, steps: int) -> list[str]:
    """Instructions per append by thread, from the dumps in `out`."""
    runs: dict[str, dict[tuple[int, int], Path]] = {}
    for path in out.glob("callgrind.out.*"):
        match = re.fullmatch(r"callgrind\.out\.(\d+)(?:\.(\d+))?-(\d+)", path.name)
        if match:
            runs.setdefault(match.group(1), {})[int(match.group(2) or 0), int(match.group(3))] = path
    # The newest run's, should another process have left its dumps there too.
    dumps = max(runs.values(), key=lambda dumped: max(path.stat().st_mtime for path in dumped.values()))
    # Dump 1 of the writer (thread 1) is the setup; 2 onwards the windows; 0 (the exit) is empty.
    windows = [_total(path) for (part, thread), path in sorted(dumps.items()) if thread == 1 and part >= 2]
    writer = sum(windows)
    lines = [f"writer thread: {writer / steps:,.0f} per append (windows of {steps // len(windows)}: "
             + ", ".join(f"{w / (steps // len(windows)) / 1e6:.3f} M" for w in windows) + ")"]  # fmt: skip
    others = 0
    for (part, thread), path in sorted(dumps.items()):
        if part != 0 or thread == 1:
            continue
        total = _total(path)
        others += total
        rounds = _calls(path, "time_sleep")  # the publisher's linger, once a round
        if rounds:
            lines.append(f"live publisher (thread {thread}): {total / steps:,.0f} per append, "
                         f"{rounds} rounds, {total / rounds:,.0f} a round")  # fmt: skip
        elif total:
            lines.append(f"thread {thread}: {total / steps:,.0f} per append")
    lines.append(f"whole process: {(writer + others) / steps:,.0f} per append")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--tree", type=Path, default=Path(__file__).resolve().parent.parent)
    parser.add_argument("--mode", choices=("plain", "encrypted", "full"), default="plain")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--window", type=int, default=100)
    parser.add_argument("--out", type=Path, help="where the dumps go (default: a new temporary folder)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.steps % args.window:
        parser.error("--steps must be a multiple of --window")
    tree = args.tree.resolve()
    if args.child:
        write(tree, args.mode, args.steps, args.window)
    out = args.out or Path(tempfile.mkdtemp(prefix="callgrind-append-"))
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("callgrind.out.*"):
        stale.unlink()
    command = [
        "valgrind", "--tool=callgrind", "--separate-threads=yes", f"--dump-before={_MARK}", "--dump-instr=no",
        "--compress-strings=no", "--compress-pos=no", f"--callgrind-out-file={out}/callgrind.out.%p",
        str(tree / ".venv" / "bin" / "python"), str(Path(__file__).resolve()), "--child", "--tree", str(tree),
        "--mode", args.mode, "--steps", str(args.steps), "--window", str(args.window),
    ]  # fmt: skip
    with (out / "log").open("w") as log:
        subprocess.run(command, check=True, stdout=log, stderr=subprocess.STDOUT)
    print(f"{tree} {args.mode}, {args.steps} appends (dumps in {out}):")
    for line in report(out, args.steps):
        print("  " + line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
