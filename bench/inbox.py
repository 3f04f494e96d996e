"""Inbox benchmark (issue 26): the approval inbox at volume, and how soon a reviewer hears of a request.

Usage (from the repository root, with the project's venv and DATABASE_URL's server)::

    .venv/bin/python bench/inbox.py                          # both sections
    .venv/bin/python bench/inbox.py --only webhook           # one section
    .venv/bin/python bench/inbox.py --agents 50 --per-agent 20 --repeats 30 --webhook-n 200

Set-up, shared by both sections: 1,000 pending approvals across 50 agents, half of them under a
policy that names a group the reviewer is in (two approvals needed, some with one vote cast
already), half under one naming a group the reviewer is not in. The data lives in the bench
database (``BENCH_DATABASE_NAME``, default ``quicksave_bench``; see bench.quicksave_runs) and is
reused when an earlier run left it complete.

``inbox``: the inbox page (first page, "assigned to me") and the approvals API list (first page,
pending), each the median and p95 of `--repeats` GETs after a warm-up, rendered in-process
through Django's test Client, signed in as that reviewer: the server's time (routing, session,
permissions, queries, templates) without a network or a browser. Target: inbox page p95 <= 100 ms.

``webhook``: from an approval request's commit to a webhook receiver on loopback having read it.
A real dispatcher (``manage.py run_notifications``, woken by NOTIFY) runs as its own process; the
receiver is a plain HTTP server in a thread of this one. Requests (by an agent of their own,
beside the 1,000 pending) are made one at a time, each waiting for its delivery before the next,
so every figure is a delivery measured alone; p50 and p95 over --webhook-n (200), after a few
unmeasured ones that warm the dispatcher's connections.

- Start: ``time.time()`` as soon as ``approvals.services.request_approval`` returns, i.e. just
  after its transaction (the request, its event, the trigger's queue row) committed.
- End: ``time.time()`` in the receiver once it has read the request's body. One clock.

For reference, the floor: the same kind of body POSTed straight from this process to the
receiver (no database, no dispatcher), p50 over as many requests. Target: p95 <= 250 ms.

The last line printed is one JSON object with every section's figures.
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
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

# Run as a script, bench/ heads sys.path and bench/langgraph.py would shadow the real
# `langgraph` package: drop that folder and put the project root there instead.
_HERE = Path(__file__).resolve().parent
_ROOT = _HERE.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

from bench.quicksave_runs import bench_database_url, setup_django  # noqa: E402

WARM_UP = 5


def p95(samples: list[float]) -> float:
    """The 95th percentile (nearest rank) of `samples`."""
    ordered = sorted(samples)
    return ordered[max(0, -(-len(ordered) * 95 // 100) - 1)]


# --- The inbox half: the inbox page and the approvals API list ---------------------------------

INBOX_AGENT_PREFIX = "bench-inbox-"
INBOX_PAGE_TARGET_P95_MS = 100.0


def build_inbox(*, agents: int, per_agent: int) -> Any:
    """`agents` agents with `per_agent` pending approvals each, their policies and some votes;
    returns the reviewer the pages are timed for. Reused when complete, else built afresh."""
    from django.contrib.auth.models import Group, User

    from approvals import policies
    from approvals.models import ApprovalRequest, ApprovalStatus
    from approvals.services import decide, request_approval
    from checkpoints import storage
    from checkpoints.models import Thread
    from quicksave.roles import grant_role
    from quicksave_agents.keys import get_or_create_agent

    reviewer, _ = User.objects.get_or_create(username="bench-inbox-reviewer")
    colleague, _ = User.objects.get_or_create(username="bench-inbox-colleague")
    admin, _ = User.objects.get_or_create(username="bench-inbox-admin")
    for user, role in ((reviewer, "reviewer"), (colleague, "reviewer"), (admin, "admin")):
        grant_role(user=user, role=role)
    mine, _ = Group.objects.get_or_create(name="bench-inbox-mine")
    theirs, _ = Group.objects.get_or_create(name="bench-inbox-theirs")
    mine.user_set.add(reviewer, colleague)
    names = [f"{INBOX_AGENT_PREFIX}{index:02d}" for index in range(agents)]
    expected = agents * per_agent
    waiting = ApprovalRequest.objects.filter(
        status=ApprovalStatus.PENDING, thread__agent__name__startswith=INBOX_AGENT_PREFIX
    )
    if waiting.count() == expected and waiting.filter(thread__agent__name__in=names).count() == expected:
        return reviewer
    print(f"Building {expected:,} pending approvals across {agents} agents…", flush=True)
    started = time.perf_counter()
    for thread in Thread.objects.filter(agent__name__startswith=INBOX_AGENT_PREFIX):
        storage.delete_thread(thread)
    for index, name in enumerate(names):
        agent = get_or_create_agent(name=name)
        group = mine if index % 2 == 0 else theirs
        if not agent.approval_policies.filter(retired_at__isnull=True).exists():
            policies.create_policy(agent=agent, action="", actor=admin,
                                   terms=policies.Terms(groups=(group,), approvals_needed=2))  # fmt: skip
        for number in range(per_agent):
            thread, _ = storage.create_thread(agent=agent)
            checkpoint = storage.append_checkpoint(
                thread=thread, parent=None, state={"order": number, "items": list(range(20))}, label="book",
                status="waiting_for_approval",
            )  # fmt: skip
            approval = request_approval(thread=thread, checkpoint=checkpoint, action="book",
                                        args={"order": number, "amount": 10 * number}, risk="medium")  # fmt: skip
            if group is mine and number % 3 == 0:  # a partial quorum: the colleague approved already
                decide(approval=approval, user=colleague, decision="approve")
    print(f"  built in {time.perf_counter() - started:.1f} s", flush=True)
    return reviewer


def timed_gets(client: Any, urls: list[str], repeats: int) -> list[list[float]]:
    """The server time of `repeats` GETs of each URL after a warm-up, the URLs taking turns within
    each round so a burst of load on the machine slows all of them alike."""
    samples: list[list[float]] = [[] for _ in urls]
    for round_ in range(WARM_UP + repeats):
        for position, url in enumerate(urls):
            started = time.perf_counter()
            response = client.get(url)
            elapsed = (time.perf_counter() - started) * 1000
            if response.status_code != 200:
                raise RuntimeError(f"GET {url} answered {response.status_code}")
            if round_ >= WARM_UP:
                samples[position].append(elapsed)
    return samples


def measure_inbox(*, agents: int, per_agent: int, repeats: int) -> dict[str, Any]:
    """The inbox half's figures: `inbox_page_*_ms` and `approvals_api_*_ms`."""
    from django.test import Client

    reviewer = build_inbox(agents=agents, per_agent=per_agent)
    client = Client()
    client.force_login(reviewer)
    page, api = timed_gets(client, ["/inbox/?view=mine", "/api/v1/approvals/?status=pending"], repeats)
    shown = client.get("/inbox/?view=mine").content.decode().count("<tr data-approval=")
    figures = {
        "inbox_page_p50_ms": round(statistics.median(page), 2),
        "inbox_page_p95_ms": round(p95(page), 2),
        "approvals_api_p50_ms": round(statistics.median(api), 2),
        "approvals_api_p95_ms": round(p95(api), 2),
    }
    print()
    print(f"{'request':<44} {'p50 ms':>8} {'p95 ms':>8}  target")
    print("-" * 78)
    print(f"{'inbox page, assigned to me (' + str(shown) + ' rows)':<44} {figures['inbox_page_p50_ms']:>8.1f} "
          f"{figures['inbox_page_p95_ms']:>8.1f}  p95 ≤ {INBOX_PAGE_TARGET_P95_MS:g} ms")  # fmt: skip
    print(f"{'approvals API, pending (first page)':<44} {figures['approvals_api_p50_ms']:>8.1f} "
          f"{figures['approvals_api_p95_ms']:>8.1f}")  # fmt: skip
    print(f"({agents * per_agent:,} pending across {agents} agents; {repeats} GETs each after {WARM_UP} warm-up GETs, "
          "Django test Client, signed-in reviewer)")  # fmt: skip
    return figures


# --- end of the inbox half ---------------------------------------------------------------------


# --- The webhook half: from an approval request's commit to a receiver on loopback -------------

WEBHOOK_TARGET_P95_MS = 250.0
WEBHOOK_AGENT = "bench-webhook"
WEBHOOK_ENDPOINT = "bench webhook"
TIMEOUT = 30.0


class Receiver:
    """A webhook receiver on loopback: notes when each approval's notice has been read."""

    def __init__(self) -> None:
        self.arrivals: dict[str, float] = {}
        self.arrived = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as a real receiver behind a proxy would

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                at = time.time()
                self.send_response(204)
                self.send_header("Content-Length", "0")
                self.end_headers()
                approval = (json.loads(body).get("approval") or {}).get("id") or "floor"
                with receiver.arrived:
                    receiver.arrivals[approval] = at
                    receiver.arrived.notify_all()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/quicksave"

    def wait(self, approval: str, dispatcher: subprocess.Popen[bytes]) -> float:
        deadline = time.monotonic() + TIMEOUT
        with self.arrived:
            while approval not in self.arrivals:
                if dispatcher.poll() is not None:
                    raise RuntimeError(f"the dispatcher exited with {dispatcher.returncode}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"timed out after {TIMEOUT:.0f} s waiting for approval {approval}'s webhook")
                self.arrived.wait(0.5)
            return self.arrivals[approval]

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def start_dispatcher(log_path: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "DATABASE_URL": bench_database_url()}
    with open(log_path, "wb") as log:
        return subprocess.Popen(
            [sys.executable, "manage.py", "run_notifications", "--poll", "1"],
            cwd=_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip


def stop_dispatcher(dispatcher: subprocess.Popen[bytes]) -> None:
    if dispatcher.poll() is None:
        dispatcher.send_signal(signal.SIGTERM)  # it stops after its current wait
        try:
            dispatcher.wait(timeout=15)
        except subprocess.TimeoutExpired:
            dispatcher.kill()
            dispatcher.wait(timeout=15)


def floor_ms(url: str, n: int) -> list[float]:
    """A webhook-sized JSON body POSTed straight to the receiver: the HTTP hop alone."""
    import httpx

    body = json.dumps({"type": "approval.requested", "approval": {"id": "floor", "args": {"n": 1}}}).encode()
    figures = []
    with httpx.Client() as client:
        for _ in range(n):
            started = time.time()
            client.post(url, content=body, headers={"Content-Type": "application/json"})
            figures.append((time.time() - started) * 1000)
    return figures


def measure_webhook(*, n: int) -> dict[str, Any]:
    from django.contrib.auth.models import User

    from approvals.services import request_approval
    from checkpoints import storage
    from checkpoints.models import Thread
    from notifications.endpoints import SubscriptionSpec, create_endpoint
    from notifications.models import Endpoint
    from quicksave_agents.keys import get_or_create_agent

    receiver = Receiver()
    admin, _ = User.objects.get_or_create(username="bench-admin")
    # A channel and an agent of this section's own: the inbox's 1,000 stay as they are.
    Endpoint.objects.filter(name=WEBHOOK_ENDPOINT).delete()
    endpoint, _ = create_endpoint(name=WEBHOOK_ENDPOINT, kind="webhook", url=receiver.url, actor=admin,
                                  subscriptions=[SubscriptionSpec(events=["approval.requested"])])  # fmt: skip
    agent = get_or_create_agent(name=WEBHOOK_AGENT)
    for old in Thread.objects.filter(agent=agent):
        storage.delete_thread(old)
    figures: list[float] = []
    with tempfile.TemporaryDirectory(prefix="quicksave-bench-inbox-") as scratch:
        log_path = Path(scratch) / "dispatcher.log"
        dispatcher = start_dispatcher(log_path)
        try:
            for number in range(WARM_UP + n):
                thread = storage.create_thread(agent=agent, external_id=f"webhook-{number}")[0]
                head = storage.append_checkpoint(thread=thread, parent=None, state={"n": number},
                                                 status="waiting_for_approval")  # fmt: skip
                approval = request_approval(thread=thread, checkpoint=head, action="book_flight",
                                            args={"flight": "SK123", "n": number}, risk="high")  # fmt: skip
                committed = time.time()
                received = receiver.wait(str(approval.pk), dispatcher)
                if number >= WARM_UP:
                    figures.append((received - committed) * 1000)
        except BaseException:
            print(f"--- dispatcher log\n{log_path.read_text(errors='replace')}", file=sys.stderr)
            raise
        finally:
            stop_dispatcher(dispatcher)
            endpoint.delete()  # so nothing queues notifications for the next run's set-up
    floor = floor_ms(receiver.url, n)
    receiver.stop()
    p50, slow = statistics.median(figures), p95(figures)
    print(
        f"approval request committed -> webhook read on loopback, {n} requests one at a time beside the pending "
        f"ones: p50 {p50:.1f} ms, p95 {slow:.1f} ms, max {max(figures):.1f} ms (target p95 <= "
        f"{WEBHOOK_TARGET_P95_MS:.0f} ms: {slow / WEBHOOK_TARGET_P95_MS:.2f}x the target, "
        f"{'met' if slow <= WEBHOOK_TARGET_P95_MS else 'MISSED'}); floor, a POST straight to the receiver: "
        f"p50 {statistics.median(floor):.2f} ms ({p50 / statistics.median(floor):.0f}x)",
        flush=True,
    )
    return {
        "webhook_n": n,
        "request_to_webhook_p50_ms": round(p50, 2),
        "request_to_webhook_p95_ms": round(slow, 2),
        "request_to_webhook_max_ms": round(max(figures), 2),
        "request_to_webhook_target_p95_ms": WEBHOOK_TARGET_P95_MS,
        "webhook_floor_p50_ms": round(statistics.median(floor), 3),
    }


# --- end of the webhook half ------------------------------------------------------------------


SECTIONS: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    "inbox": lambda args: measure_inbox(agents=args.agents, per_agent=args.per_agent, repeats=args.repeats),
    "webhook": lambda args: measure_webhook(n=args.webhook_n),
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--agents", type=int, default=50, help="agents with pending approvals (default 50)")
    parser.add_argument("--per-agent", type=int, default=20, help="pending approvals per agent (default 20)")
    parser.add_argument("--repeats", type=int, default=30, help="timed GETs per request (default 30)")
    parser.add_argument("--webhook-n", type=int, default=200, help="webhook deliveries measured (default 200)")
    parser.add_argument("--only", default=",".join(SECTIONS), help=f"sections to run, of {', '.join(SECTIONS)}")
    args = parser.parse_args(argv)
    chosen = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = sorted(set(chosen) - set(SECTIONS))
    if unknown:
        parser.error(f"no section {', '.join(unknown)}; the sections are {', '.join(SECTIONS)}")
    if args.webhook_n < 2:
        parser.error("--webhook-n must be at least 2")
    setup_django()
    # Both sections run among the 1,000 pending approvals; the inbox section's set-up makes them.
    build_inbox(agents=args.agents, per_agent=args.per_agent)
    figures: dict[str, Any] = {}
    for name in chosen:
        figures.update(SECTIONS[name](args))
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
