"""Approval-to-resume benchmark: how soon after a decision commits does the agent checkpoint again?

Usage (from /work/main)::

    .venv/bin/python bench/approvals.py            # 50 approvals
    .venv/bin/python bench/approvals.py --n 200

A real worker (`manage.py run_agents --agent demo-travel`, woken by NOTIFY) runs as a
separate process against the `quicksave_bench` database. The bench starts N travel
threads, waits until each waits on its `book_flight` approval, then approves them one
at a time as a reviewer, through `approvals.services.decide`, and lets each thread
finish before the next decision, so every figure is a resume measured alone.

One figure per approval: from the decision's commit to the commit of the agent's
next checkpoint after the approval checkpoint.

- Start: `time.time()` taken as soon as `decide()` returns, i.e. just after its
  transaction committed. Not `approval.decided_at`: that is stamped inside the
  transaction, before the resume run is queued and before COMMIT, so it would count
  part of the decision's own write as resume latency (it is printed too, for reference).
- End: the checkpoint's `created_at`, stamped by the worker right before the single
  statement that inserts and commits it. The bench polls only to learn that the
  checkpoint exists, so its polling interval does not enter the figure.

Both clocks are this machine's wall clock. The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

# Run as a script, bench/ heads sys.path and bench/langgraph.py would shadow the real
# `langgraph` package: drop that folder and put the project root there instead.
_HERE = Path(__file__).resolve().parent
_ROOT = _HERE.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

from bench.quicksave_runs import bench_database_url, setup_django  # noqa: E402

if TYPE_CHECKING:
    from django.db.models import QuerySet

TARGET_P95_MS = 300.0
TIMEOUT = 120.0


def wait_for(what: str, ready: Callable[[], bool], worker: subprocess.Popen[bytes], interval: float = 0.005) -> None:
    """Poll until `ready()` is true; fail loudly if the worker dies or it takes longer than TIMEOUT."""
    deadline = time.monotonic() + TIMEOUT
    while not ready():
        if worker.poll() is not None:
            raise RuntimeError(f"the worker exited with {worker.returncode} while waiting for {what}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {TIMEOUT:.0f} s waiting for {what}")
        time.sleep(interval)


def absent(rows: QuerySet[Any]) -> Callable[[], bool]:
    return lambda: not rows.exists()


def percentile(values: list[float], q: int) -> float:
    """The q-th percentile (inclusive method, so p95 of 50 values interpolates inside the sample)."""
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def start_worker(log_path: Path) -> subprocess.Popen[bytes]:
    from quicksave_agents.demo import TravelAgent

    env = {**os.environ, "DATABASE_URL": bench_database_url()}
    env.pop("QUICKSAVE_DEMO_CRASH", None)
    with open(log_path, "wb") as log:
        return subprocess.Popen(
            [sys.executable, "manage.py", "run_agents", "--agent", TravelAgent.name],
            cwd=_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip


def stop_worker(worker: subprocess.Popen[bytes]) -> None:
    if worker.poll() is None:
        worker.send_signal(signal.SIGTERM)  # run_agents stops after its current wait
        try:
            worker.wait(timeout=15)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait(timeout=15)


def measure(n: int, worker: subprocess.Popen[bytes]) -> tuple[list[float], list[float]]:
    """Approve n travel threads one at a time; returns (from commit, from decided_at) in ms per approval."""
    from django.contrib.auth.models import User

    from approvals.models import ApprovalRequest, ApprovalStatus
    from approvals.services import decide
    from checkpoints.models import Checkpoint, Thread, ThreadStatus
    from quicksave.roles import grant_role
    from quicksave_agents.demo import TravelAgent
    from quicksave_agents.models import Run, RunStatus
    from quicksave_agents.runtime import start_thread

    reviewer, _ = User.objects.get_or_create(username="bench-reviewer")
    grant_role(user=reviewer, role="reviewer")

    tag = uuid.uuid4().hex[:8]
    threads = [start_thread(agent_class=TravelAgent, external_id=f"bench-approvals-{tag}-{i}") for i in range(n)]
    pending = ApprovalRequest.objects.filter(thread__in=threads, status=ApprovalStatus.PENDING)
    wait_for(f"{n} pending approvals", lambda: pending.count() == n, worker, interval=0.1)

    from_commit: list[float] = []
    from_decided_at: list[float] = []
    for thread in threads:
        approval = ApprovalRequest.objects.select_related("checkpoint").get(
            thread=thread, status=ApprovalStatus.PENDING
        )
        after = approval.checkpoint
        approval = decide(approval=approval, user=reviewer, decision="approve")
        committed = time.time()
        assert approval.decided_at is not None

        following = Checkpoint.objects.filter(thread=thread, branch_id=after.branch_id, seq=after.seq + 1)
        wait_for(f"the checkpoint after approval {approval.pk}", following.exists, worker)
        resumed = following.values_list("created_at", flat=True).get()
        from_commit.append((resumed.timestamp() - committed) * 1000)
        from_decided_at.append((resumed - approval.decided_at).total_seconds() * 1000)

        # Let the resumed run finish (re-check the price, book) before the next decision.
        open_runs = Run.objects.filter(thread=thread, status__in=[RunStatus.QUEUED, RunStatus.RUNNING])
        wait_for(f"thread {thread.pk} to finish", absent(open_runs), worker)
        status = Thread.objects.values_list("status", flat=True).get(pk=thread.pk)
        assert status == ThreadStatus.COMPLETED, f"thread {thread.pk} ended {status}"
    return from_commit, from_decided_at


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=50, help="approvals to measure (default 50)")
    args = parser.parse_args(argv)
    if args.n < 2:
        parser.error("--n must be at least 2")

    setup_django()  # migrates the bench database before the worker starts
    with tempfile.TemporaryDirectory(prefix="quicksave-bench-approvals-") as scratch:
        log_path = Path(scratch) / "worker.log"
        worker = start_worker(log_path)
        try:
            from_commit, from_decided_at = measure(args.n, worker)
        except BaseException:
            print(f"--- worker log\n{log_path.read_text(errors='replace')}", file=sys.stderr)
            raise
        finally:
            stop_worker(worker)

    p50, p95 = statistics.median(from_commit), percentile(from_commit, 95)
    print(
        f"decision committed -> next checkpoint committed, {args.n} approvals one at a time: "
        f"p50 {p50:.1f} ms, p95 {p95:.1f} ms, max {max(from_commit):.1f} ms "
        f"(target p95 <= {TARGET_P95_MS:.0f} ms: {p95 / TARGET_P95_MS:.2f}x the target, "
        f"{'met' if p95 <= TARGET_P95_MS else 'MISSED'})"
    )
    print(
        f"for reference, from approval.decided_at (stamped before the decision commits): "
        f"p50 {statistics.median(from_decided_at):.1f} ms, p95 {percentile(from_decided_at, 95):.1f} ms"
    )
    print(
        json.dumps({
            "n": args.n,
            "decision_to_resume_p50_ms": round(p50, 2),
            "decision_to_resume_p95_ms": round(p95, 2),
            "decision_to_resume_max_ms": round(max(from_commit), 2),
            "decided_at_to_resume_p95_ms": round(percentile(from_decided_at, 95), 2),
            "target_p95_ms": TARGET_P95_MS,
        })
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
