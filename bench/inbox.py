"""Inbox benchmark (issue 26): the approval inbox at volume.

Usage (from /work/main)::

    .venv/bin/python bench/inbox.py
    .venv/bin/python bench/inbox.py --agents 50 --per-agent 20 --repeats 30

The inbox half: 1,000 pending approvals across 50 agents, half of them under a policy that names
a group the reviewer is in (two approvals needed, some with one vote cast already), half under
one naming a group the reviewer is not in. It times the inbox page (first page, "assigned to
me") and the approvals API list (first page, pending), each the median and p95 of `--repeats`
GETs after a warm-up, rendered in-process through Django's test Client, signed in as that
reviewer: the server's time (routing, session, permissions, queries, templates) without a
network or a browser. The data lives in the bench database (``BENCH_DATABASE_NAME``, default
``quicksave_bench``; see bench.quicksave_runs) and is reused when an earlier run left it
complete. The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

# Run as a script, bench/ heads sys.path and bench/langgraph.py would shadow the real
# `langgraph` package: drop that folder and put the project root there instead.
_HERE = Path(__file__).resolve().parent
_ROOT = _HERE.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

from bench.quicksave_runs import setup_django  # noqa: E402

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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--agents", type=int, default=50, help="agents with pending approvals (default 50)")
    parser.add_argument("--per-agent", type=int, default=20, help="pending approvals per agent (default 20)")
    parser.add_argument("--repeats", type=int, default=30, help="timed GETs per request (default 30)")
    args = parser.parse_args(argv)
    setup_django()
    figures = measure_inbox(agents=args.agents, per_agent=args.per_agent, repeats=args.repeats)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
