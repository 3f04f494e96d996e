"""Tiered-storage benchmark: large-value offload, and latest-state reads from PostgreSQL.

Usage (from /work/main)::

    .venv/bin/python bench/storage.py              # 1,000 steps, a 2 MB attachment every 100
    .venv/bin/python bench/storage.py --steps 300 --rounds 5

One thread of the checkpoint-store workload (one 1,000-character message a step) that
also gains a 2 MB attachment (random, incompressible text) every 100 steps, written
twice into the bench database: with offload (values above QUICKSAVE_OFFLOAD_BYTES go to
blob storage, here a temporary directory) and without (the limit raised above any
value). For each: PostgreSQL bytes (pg_total_relation_size of the store's tables),
blob bytes, write rate. Then the latest-state read of the offloaded thread, median of
21, from a process that has materialised nothing.

Then latest-state reads of threads whose states are about 10 KB, 100 KB and 1 MB (grown one
1,000-character message a step), by 1 and by 4 reader processes at once, each read from a
process that has materialised nothing and opened no data key: medians and p95s of every read,
the readers' batches spread over rounds. docs/hot-path.md compares the same reads served by the
Redis hot cache, which those figures removed. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import base64
import itertools
import json
import multiprocessing
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
_ROOT = _HERE.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

from bench.peers import median_ms, workload  # noqa: E402
from bench.quicksave_runs import TABLES, setup_django  # noqa: E402

ATTACHMENT_BYTES = 2 * 1024 * 1024
ATTACH_EVERY = 100
READS = 21
STATE_SIZES = (10 * 1024, 100 * 1024, 1024 * 1024)
READERS = (1, 4)
ROUNDS = 10
BATCH = 10  # reads each reader makes per batch


def attachment(rng: random.Random) -> str:
    """2 MB of base64 text from random bytes: nothing for compression to squeeze."""
    return base64.b64encode(rng.randbytes(ATTACHMENT_BYTES * 3 // 4)).decode()


def pg_bytes() -> int:
    from django.db import connection

    tables = [*TABLES, "checkpoints_blob"]
    with connection.cursor() as cursor:
        cursor.execute("SELECT sum(pg_total_relation_size(t::regclass)) FROM unnest(%s::text[]) t", [tables])
        row = cursor.fetchone()
    return int(row[0]) if row and row[0] else 0


def dir_bytes(path: Path) -> int:
    return sum(item.stat().st_size for item in path.rglob("*") if item.is_file())


def run(steps: int, *, offload: bool, blob_dir: Path) -> tuple[dict[str, Any], Any]:
    from django.db import connection
    from django.test import override_settings

    from checkpoints import storage
    from quicksave_agents.keys import get_or_create_agent

    overrides: dict[str, Any] = {
        # Ten 2 MB attachments make a 20 MB state: above the default 16 MiB limit on purpose.
        "QUICKSAVE_MAX_STATE_BYTES": 64 * 1024 * 1024,
        "QUICKSAVE_OFFLOAD_BYTES": 256 * 1024 if offload else 1 << 40,
        "STORAGES": {
            "quicksave_blobs": {
                "BACKEND": "django.core.files.storage.FileSystemStorage",
                "OPTIONS": {"location": str(blob_dir), "allow_overwrite": True},
            },
            "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
        },
    }
    with override_settings(**overrides):
        storage.clear_caches()
        with connection.cursor() as cursor:
            cursor.execute(f"TRUNCATE {', '.join(TABLES)}, checkpoints_blob, checkpoints_toolresult CASCADE")
        agent = get_or_create_agent(name="bench-storage")
        thread, _ = storage.create_thread(agent=agent)
        head = storage.append_checkpoint(thread=thread, parent=None, state={"messages": [], "files": {}}, step=0)
        rng = random.Random(7)
        started = time.perf_counter()
        for item in workload(steps):
            ops: list[dict[str, Any]] = [
                {"op": "add", "path": "/messages/-", "value": item.message},
                {"op": "replace", "path": "/facts", "value": item.facts}
                if item.step > 1
                else {"op": "add", "path": "/facts", "value": item.facts},
            ]
            if item.step % ATTACH_EVERY == 0:
                ops.append({"op": "add", "path": f"/files/report-{item.step}.txt", "value": attachment(rng)})
            head = storage.append_checkpoint(thread=thread, parent=head, patch=ops, step=item.step)
        elapsed = time.perf_counter() - started
        figures = {"pg_bytes": pg_bytes(), "blob_bytes": dir_bytes(blob_dir), "cps": steps / elapsed}
        return figures, thread


def reads(thread: Any, blob_dir: Path) -> dict[str, float]:
    from django.test import override_settings

    from checkpoints import storage
    from checkpoints.storage import crypto

    storages = {
        "quicksave_blobs": {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": str(blob_dir), "allow_overwrite": True},
        },
        "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    }

    def latest() -> dict[str, Any]:
        storage.clear_caches()
        crypto.forget_keys()
        return storage.latest_state(thread=thread)[1]

    with override_settings(STORAGES=storages, QUICKSAVE_MAX_STATE_BYTES=64 * 1024 * 1024):
        latest()  # the first read replays and saves the branch's materialised head
        return {"pg_read_ms": median_ms(latest, READS)}


# --------------------------------------------------------------------------- concurrent latest reads


def grow_thread(agent: Any, target_bytes: int) -> tuple[Any, Any]:
    """A thread written one message a step (as in bench.peers) until its state holds `target_bytes`."""
    from checkpoints import storage

    thread, _ = storage.create_thread(agent=agent)
    head = storage.append_checkpoint(thread=thread, parent=None, state={"messages": [], "step": 0}, step=0)
    for item in workload(100_000, seed=target_bytes):
        if head.state_bytes >= target_bytes:
            break
        ops: list[dict[str, Any]] = [
            {"op": "add", "path": "/messages/-", "value": item.message},
            {"op": "replace", "path": "/step", "value": item.step},
            {"op": "replace" if item.step > 1 else "add", "path": "/facts", "value": item.facts},
        ]
        head = storage.append_checkpoint(thread=thread, parent=head, patch=ops, step=item.step)
    return thread, head


def _reader(tasks: Any, results: Any, barrier: Any) -> None:
    """One reader process: Django of its own, reading latest states as each task says."""
    import django

    django.setup()
    from checkpoints import storage
    from checkpoints.storage import crypto

    while (task := tasks.get()) is not None:
        thread_id, head_id, count, together = task
        samples = []
        if together:
            barrier.wait()
        for _ in range(count):
            storage.clear_caches()  # a process that has materialised nothing, knows no branch
            crypto.forget_keys()  # and has opened no data key
            started = time.perf_counter()
            head, _ = storage.latest_state(thread=thread_id)
            samples.append((time.perf_counter() - started) * 1000)
            assert head == head_id
        results.put(samples)


def p95(samples: list[float]) -> float:
    return statistics.quantiles(samples, n=20, method="inclusive")[18]


def concurrent_reads(sizes: Sequence[int], rounds: int, batch: int) -> list[dict[str, Any]]:
    """Cold latest reads by 1 and by 4 reader processes at once, `rounds` batches of `batch` each."""
    from django.db import connections

    from checkpoints import storage
    from quicksave_agents.keys import get_or_create_agent

    agent = get_or_create_agent(name="bench-storage-reads")
    threads = [grow_thread(agent, size) for size in sizes]
    for thread, _ in threads:
        storage.clear_caches()
        storage.latest_state(thread=thread)  # saves the materialised head, as the first reader would
    connections.close_all()

    context = multiprocessing.get_context("spawn")
    most = max(READERS)
    barrier, results = context.Barrier(most), context.Queue()
    queues = [context.Queue() for _ in range(most)]
    readers = [context.Process(target=_reader, args=(queue, results, barrier), daemon=True) for queue in queues]
    for reader in readers:
        reader.start()
    samples: dict[tuple[int, int], list[float]] = {}
    try:
        # Round -1 warms each reader up (imports, connections, prepared statements) and is not counted.
        for index in range(-1, rounds):
            for ((thread, head), size), count in itertools.product(zip(threads, sizes, strict=True), READERS):
                for queue in queues[:count]:
                    queue.put((thread.pk, head.pk, batch, count > 1))
                got = [sample for _ in range(count) for sample in results.get(timeout=600)]
                if index >= 0:
                    samples.setdefault((size, count), []).extend(got)
    finally:
        for queue in queues:
            queue.put(None)
        for reader in readers:
            reader.join(60)
    rows = []
    for (_, head), size in zip(threads, sizes, strict=True):
        for count in READERS:
            taken = samples[(size, count)]
            rows.append({
                "state_bytes": head.state_bytes, "readers": count, "reads": len(taken),
                "chain_length": head.chain_length,
                "pg_p50_ms": round(statistics.median(taken), 3), "pg_p95_ms": round(p95(taken), 3),
            })  # fmt: skip
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="rounds of the concurrent reads")
    parser.add_argument("--batch", type=int, default=BATCH, help="reads each reader makes per batch")
    args = parser.parse_args(argv)
    if args.steps < ATTACH_EVERY:
        parser.error(f"--steps must be at least {ATTACH_EVERY}")
    setup_django()
    root = Path(tempfile.mkdtemp(prefix="quicksave-bench-blobs-"))
    try:
        plain, _ = run(args.steps, offload=False, blob_dir=root / "none")
        offloaded, thread = run(args.steps, offload=True, blob_dir=root / "blobs")
        read = reads(thread, root / "blobs")
        concurrent = concurrent_reads(STATE_SIZES, args.rounds, args.batch)
    finally:
        shutil.rmtree(root, ignore_errors=True)

    mib = 1024 * 1024
    print(f"{args.steps} steps, a {ATTACHMENT_BYTES // mib} MiB attachment every {ATTACH_EVERY}:")
    print(f"  without offload: PostgreSQL {plain['pg_bytes'] / mib:8.1f} MiB, {plain['cps']:6.1f} checkpoints/s")
    print(f"  with offload:    PostgreSQL {offloaded['pg_bytes'] / mib:8.1f} MiB + blobs "
          f"{offloaded['blob_bytes'] / mib:.1f} MiB, {offloaded['cps']:6.1f} checkpoints/s")  # fmt: skip
    print(f"  PostgreSQL bytes: {plain['pg_bytes'] / offloaded['pg_bytes']:.1f}x smaller with offload")
    print(f"  latest-state read from PostgreSQL: {read['pg_read_ms']:.1f} ms (median of {READS}, cold process)")
    print(f"Latest-state reads from cold processes, {args.rounds} rounds of {args.batch} reads per reader (ms):")
    print(f"  {'state':>9} {'readers':>7} {'p50':>7} {'p95':>7}")
    for row in concurrent:
        print(f"  {row['state_bytes'] / 1024:7.0f}KB {row['readers']:7d} "
              f"{row['pg_p50_ms']:7.2f} {row['pg_p95_ms']:7.2f}")  # fmt: skip
    summary = {
        "steps": args.steps,
        "offload_pg_bytes": offloaded["pg_bytes"],
        "no_offload_pg_bytes": plain["pg_bytes"],
        "offload_blob_bytes": offloaded["blob_bytes"],
        "offload_cps": round(offloaded["cps"], 1),
        "no_offload_cps": round(plain["cps"], 1),
        "pg_read_ms": round(read["pg_read_ms"], 3),
        "concurrent_reads": concurrent,
    }
    print(json.dumps(summary, allow_nan=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
