"""Tiered-storage benchmark: large-value offload and the Redis hot path.

Usage (from /work/main)::

    .venv/bin/python bench/storage.py              # 1,000 steps, a 2 MB attachment every 100
    .venv/bin/python bench/storage.py --steps 300

One thread of the checkpoint-store workload (one 1,000-character message a step) that
also gains a 2 MB attachment (random, incompressible text) every 100 steps, written
twice into the bench database: with offload (values above QUICKSAVE_OFFLOAD_BYTES go to
blob storage, here a temporary directory) and without (the limit raised above any
value). For each: PostgreSQL bytes (pg_total_relation_size of the store's tables),
blob bytes, write rate. Then the latest-state read of the offloaded thread, median of
21, from a process that has materialised nothing: with the head's state in Redis (the
hot path) and from PostgreSQL alone. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import base64
import json
import random
import shutil
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
    from checkpoints.storage import crypto, hotcache

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

    out: dict[str, float] = {}
    with override_settings(STORAGES=storages, QUICKSAVE_MAX_STATE_BYTES=64 * 1024 * 1024):
        with override_settings(QUICKSAVE_HOT_TTL_SECONDS=0):
            expected = latest()
            out["pg_read_ms"] = median_ms(latest, READS)
        if hotcache.enabled():
            assert latest() == expected  # the first read puts the head's state in Redis
            out["hot_read_ms"] = median_ms(latest, READS)
            assert hotcache.status()["status"] == "ok", hotcache.status()
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--steps", type=int, default=1000)
    args = parser.parse_args(argv)
    if args.steps < ATTACH_EVERY:
        parser.error(f"--steps must be at least {ATTACH_EVERY}")
    setup_django()
    root = Path(tempfile.mkdtemp(prefix="quicksave-bench-blobs-"))
    try:
        plain, _ = run(args.steps, offload=False, blob_dir=root / "none")
        offloaded, thread = run(args.steps, offload=True, blob_dir=root / "blobs")
        read = reads(thread, root / "blobs")
    finally:
        shutil.rmtree(root, ignore_errors=True)

    mib = 1024 * 1024
    print(f"{args.steps} steps, a {ATTACHMENT_BYTES // mib} MiB attachment every {ATTACH_EVERY}:")
    print(f"  without offload: PostgreSQL {plain['pg_bytes'] / mib:8.1f} MiB, {plain['cps']:6.1f} checkpoints/s")
    print(f"  with offload:    PostgreSQL {offloaded['pg_bytes'] / mib:8.1f} MiB + blobs "
          f"{offloaded['blob_bytes'] / mib:.1f} MiB, {offloaded['cps']:6.1f} checkpoints/s")  # fmt: skip
    print(f"  PostgreSQL bytes: {plain['pg_bytes'] / offloaded['pg_bytes']:.1f}x smaller with offload")
    print(f"  latest-state read from PostgreSQL: {read['pg_read_ms']:.1f} ms (median of {READS}, cold process)")
    if "hot_read_ms" in read:
        print(f"  latest-state read from the Redis hot path: {read['hot_read_ms']:.1f} ms "
              f"({read['pg_read_ms'] / read['hot_read_ms']:.1f}x faster)")  # fmt: skip
    summary = {
        "steps": args.steps,
        "offload_pg_bytes": offloaded["pg_bytes"],
        "no_offload_pg_bytes": plain["pg_bytes"],
        "offload_blob_bytes": offloaded["blob_bytes"],
        "offload_cps": round(offloaded["cps"], 1),
        "no_offload_cps": round(plain["cps"], 1),
        "hot_read_ms": round(read["hot_read_ms"], 3) if "hot_read_ms" in read else None,
        "pg_read_ms": round(read["pg_read_ms"], 3),
    }
    print(json.dumps(summary, allow_nan=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
