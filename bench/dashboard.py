"""Dashboard benchmark: server time to render the thread page of a 10,000-checkpoint thread
against a 10-checkpoint one (and of a 10,000-checkpoint thread with 5,000 events of its story
interleaved: approvals asked and decided, runs queued, claimed and completed), the diff page
between two checkpoints 500 steps apart on a thread whose state is about 500 KB, and a value's
history (the API) on a thread of 10,000 checkpoints on three branches.

Usage (from /work/main)::

    .venv/bin/python bench/dashboard.py
    .venv/bin/python bench/dashboard.py --repeats 50 --long 20000

Pages are rendered in-process through Django's test Client, signed in as a viewer, so the
figure is the server's time (URL routing, session, permissions, queries, templates) without
a network or a browser. Each figure is the median of `--repeats` GETs after a warm-up. The
data lives in the dedicated ``quicksave_bench`` database (see bench.quicksave_runs); threads
built by an earlier run are reused when complete. The last line printed is one JSON object.
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

AGENT = "bench-dashboard"
WARM_UP = 5
THREAD_PAGE_TARGET_MS = 50.0
THREAD_PAGE_RATIO_TARGET = 1.5
DIFF_PAGE_TARGET_MS = 100.0
DIFF_STEPS = 1000  # the diff thread: 1,000 appends of ~500 bytes, compared at #500 and #1000
DIFF_MESSAGE_BYTES = 500


def _thread_head_seq(thread: Any) -> int:
    from checkpoints import selectors

    heads = selectors.branch_heads(thread)
    return heads.get(thread.active_branch_id, (None, 0))[1]


def _drop_thread(thread_id: Any) -> None:
    """Remove a half-built thread left by an interrupted run (raw SQL: the checkpoints' parent
    and fork-point references would make the ORM walk every row)."""
    from django.db import connection, transaction

    from checkpoints.models import Thread

    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("UPDATE checkpoints_thread SET active_branch_id = NULL, head_id = NULL WHERE id = %s",
                       [thread_id])  # fmt: skip
        cursor.execute("UPDATE checkpoints_branch SET fork_point_id = NULL WHERE thread_id = %s", [thread_id])
        cursor.execute("DELETE FROM checkpoints_event WHERE thread_id = %s", [thread_id])
        cursor.execute("DELETE FROM checkpoints_checkpoint WHERE thread_id = %s", [thread_id])
        Thread.objects.filter(pk=thread_id).delete()


# The story events a thread with events gets, in turn, one after every `steps // events` checkpoints.
STORY_EVENTS: list[tuple[str, dict[str, Any]]] = [
    ("approval.requested", {"action": "migrate_table", "kind": "approval", "status": "pending", "agent": AGENT}),
    ("approval.decided", {"action": "migrate_table", "kind": "approval", "status": "approved", "decided_by": "ada"}),
    ("run.queued", {"reason": "approval"}),
    ("run.claimed", {"worker": "bench-worker", "attempt": 1, "recovered": False}),
    ("run.completed", {"error": ""}),
]


def _story_events(thread: Any) -> int:
    from checkpoints.models import Event

    return Event.objects.filter(thread=thread).exclude(type="checkpoint.created").count()


def build_thread(
    external_id: str, steps: int, *, message_bytes: int, fork_at: int | None, fork_steps: int, events: int = 0
) -> Any:
    """A thread whose main branch has `steps` checkpoints, each appending one message of about
    `message_bytes` to the state, and optionally a fork of `fork_steps` from main's #`fork_at`;
    with `events`, that many story events (approvals, runs) interleaved with the checkpoints."""
    import uuid

    from checkpoints import storage
    from checkpoints.models import Checkpoint, Thread
    from quicksave_agents.keys import get_or_create_agent

    agent = get_or_create_agent(name=AGENT)
    existing = Thread.objects.filter(agent=agent, external_id=external_id).first()
    if existing is not None:
        # thread.created and the fork's branch.created are story events too.
        if _thread_head_seq(existing) == steps and (not events or _story_events(existing) >= events):
            return existing
        _drop_thread(existing.pk)
    every = max(1, steps // events) if events else 0
    written = 0
    thread, _ = storage.create_thread(agent=agent, external_id=external_id, metadata={"bench": "dashboard"})
    started = time.perf_counter()
    labels = ("plan", "search", "call_tool", "summarise")
    filler = "x" * message_bytes
    parent = storage.append_checkpoint(thread=thread, parent=None, state={"messages": [], "step": 0},
                                     step=0, label="start", model={"name": "bench-model", "version": "1"})  # fmt: skip
    fork_point: Checkpoint | None = parent if fork_at == 1 else None
    for i in range(1, steps):
        parent = storage.append_checkpoint(
            thread=thread, parent=parent, step=i, label=labels[i % len(labels)],
            model={"name": "bench-model", "version": "1"},
            patch=[{"op": "add", "path": "/messages/-", "value": {"role": "assistant", "content": f"{i} {filler}"}},
                   {"op": "replace", "path": "/step", "value": i}],
        )  # fmt: skip
        if parent.seq == fork_at:
            fork_point = parent
        if every and i % every == 0 and written < events:
            kind, data = STORY_EVENTS[written % len(STORY_EVENTS)]
            storage.record_event(thread=thread, type=kind, data={**data, "approval": str(uuid.uuid4())}
                                 if kind.startswith("approval.") else {**data, "run": str(uuid.uuid4())})  # fmt: skip
            written += 1
        if steps >= 2000 and i % 2000 == 0:
            print(f"  {external_id}: {i:,} of {steps:,} checkpoints", flush=True)
    if fork_point is not None and fork_steps:
        storage.start_branch(thread=thread, at=fork_point, name="retry")
        forked = fork_point
        for i in range(fork_steps):
            forked = storage.append_checkpoint(thread=thread, parent=forked, branch="retry", label="retry",
                                             patch=[{"op": "replace", "path": "/step", "value": -i}])  # fmt: skip
    print(f"  built {external_id}: {steps:,} checkpoints in {time.perf_counter() - started:.1f} s", flush=True)
    thread.refresh_from_db()
    return thread


HISTORY_TARGET_MS = 100.0
HISTORY_CHECKPOINTS = 10_000  # the history thread: main and two forks, 10,000 checkpoints in all
HISTORY_CHANGES = 500  # /config/batch_size is set by the first checkpoint and changed 499 times more


def build_history_thread() -> Any:
    """A thread of 10,000 checkpoints on three branches (main, `retry` forked from main #2000 and
    `tune` from main #4000), each appending a message and bumping /step; /config/batch_size changes at
    every 20th checkpoint (500 changes counting the first checkpoint's), /config/model once."""
    from checkpoints import storage
    from checkpoints.models import Checkpoint, Thread
    from quicksave_agents.keys import get_or_create_agent

    agent = get_or_create_agent(name=AGENT)
    external_id = "value-history-10k"
    existing = Thread.objects.filter(agent=agent, external_id=external_id).first()
    if existing is not None:
        if Checkpoint.objects.filter(thread=existing).count() == HISTORY_CHECKPOINTS:
            return existing
        _drop_thread(existing.pk)
    thread, _ = storage.create_thread(agent=agent, external_id=external_id, metadata={"bench": "value-history"})
    started = time.perf_counter()
    written = [0]

    def step(parent: Any, branch: str, i: int) -> Any:
        written[0] += 1
        message = {"role": "assistant", "content": f"{branch} {i} " + "x" * 60}
        patch: list[dict[str, Any]] = [
            {"op": "add", "path": "/messages/-", "value": message},
            {"op": "replace", "path": "/step", "value": i},
        ]
        if written[0] % 20 == 0 and written[0] < HISTORY_CHECKPOINTS:
            patch.append({"op": "replace", "path": "/config/batch_size", "value": written[0]})
        if branch == "main" and i == 3000:
            patch.append({"op": "add", "path": "/config/model", "value": "bench-model-2"})
        return storage.append_checkpoint(thread=thread, parent=parent, branch=branch, step=i, label="step", patch=patch)

    written[0] = 1
    parent = storage.append_checkpoint(
        thread=thread, parent=None, step=0, label="start",
        state={"messages": [], "step": 0, "config": {"batch_size": 1, "lr": 0.001}},
    )  # fmt: skip
    fork_points: dict[int, Any] = {}
    for i in range(1, 6000):
        parent = step(parent, "main", i)
        if i in (2000, 4000):
            fork_points[i] = parent
    for name, at in (("retry", 2000), ("tune", 4000)):
        storage.start_branch(thread=thread, at=fork_points[at], name=name)
        forked = fork_points[at]
        for i in range(2000):
            forked = step(forked, name, at + 1 + i)
    print(f"  built {external_id}: {written[0]:,} checkpoints in {time.perf_counter() - started:.1f} s", flush=True)
    return thread


def value_history_figures(client: Any, repeats: int, *, reference_url: str) -> dict[str, Any]:
    """Median time of GET /api/v1/threads/{id}/history/ for a path changed 500 times and one changed
    once, on the 10,000-checkpoint thread, taking turns with `reference_url` (the 10-checkpoint
    thread page, whose ratio to them holds on a busy machine), and the one-off cost of indexing."""
    from django.db import connection

    from checkpoints.storage.history import value_history

    thread = build_history_thread()
    with connection.cursor() as cursor:  # the index is derived: drop it to time the first read
        cursor.execute("DELETE FROM checkpoints_changedpath WHERE thread_id = %s", [thread.pk])
        cursor.execute("DELETE FROM checkpoints_changedpathmark WHERE thread_id = %s", [thread.pk])
    started = time.perf_counter()
    changes = value_history(thread, "/config/batch_size")
    first_read_ms = (time.perf_counter() - started) * 1000
    once = value_history(thread, "/config/model")
    if len(changes) != HISTORY_CHANGES or len(once) != 1:
        raise RuntimeError(f"the history thread has {len(changes)} and {len(once)} changes, not {HISTORY_CHANGES}, 1")
    base = f"/api/v1/threads/{thread.pk}/history/?path="
    urls = [f"{base}/config/batch_size", f"{base}/config/model", reference_url]
    many_ms, once_ms, reference_ms = median_get_ms(client, urls, repeats)
    print()
    print(f"{'value history (API)':<26} {'data':<32} {'median ms':>10}  target")
    print("-" * 86)
    target = f"≤ {HISTORY_TARGET_MS:g} ms"
    print(f"{'path changed 500 times':<26} {'10,000 checkpoints, 3 branches':<32} {many_ms:>10.1f}  {target}")
    print(f"{'path changed once':<26} {'same thread':<32} {once_ms:>10.1f}  {target}")
    print(f"{'thread page (reference)':<26} {'10 checkpoints, same rounds':<32} {reference_ms:>10.1f}  "
          f"history 500 / it: {many_ms / reference_ms:.2f}")  # fmt: skip
    print(f"{'first read (indexes)':<26} {'same thread, once':<32} {first_read_ms:>10.1f}  (one-off)")
    print("(each request computes the whole history, all 500 changes, and returns its first page of 50)")
    return {
        "value_history_ms_500": round(many_ms, 2),
        "value_history_ms_1": round(once_ms, 2),
        "value_history_first_read_ms": round(first_read_ms, 1),
        "value_history_500_over_thread_page_10": round(many_ms / reference_ms, 3),
    }


def median_get_ms(client: Any, urls: list[str], repeats: int, *, before_each: Any = None) -> list[float]:
    """Median server time of GET for each of `urls` over `repeats` rounds, after a warm-up.

    The URLs take turns within each round, so a burst of load on the machine slows all of
    them alike and their ratio stays fair.
    """
    samples: dict[str, list[float]] = {url: [] for url in urls}
    for round_ in range(WARM_UP + repeats):
        for url in urls:
            if before_each:
                before_each()
            started = time.perf_counter()
            response = client.get(url)
            elapsed = (time.perf_counter() - started) * 1000
            if response.status_code != 200:
                raise RuntimeError(f"GET {url} answered {response.status_code}")
            if round_ >= WARM_UP:
                samples[url].append(elapsed)
    return [statistics.median(samples[url]) for url in urls]


def viewer_client() -> Any:
    from django.contrib.auth.models import User
    from django.test import Client

    from quicksave.roles import grant_role

    user, _ = User.objects.get_or_create(username="bench-viewer")
    grant_role(user=user, role="viewer")
    client = Client()
    client.force_login(user)
    return client


def run(*, repeats: int, long: int) -> dict[str, Any]:
    setup_django()
    from checkpoints import storage
    from checkpoints.models import Checkpoint

    print("Building threads in the bench database (reused when an earlier run left them complete)…", flush=True)
    short_thread = build_thread("thread-10", 10, message_bytes=60, fork_at=5, fork_steps=3)
    long_thread = build_thread(f"thread-{long}", long, message_bytes=60, fork_at=long // 2, fork_steps=3)
    events = long // 2
    story_thread = build_thread(f"thread-{long}-events", long, message_bytes=60, fork_at=long // 2, fork_steps=3,
                                events=events)  # fmt: skip
    diff_thread = build_thread("diff-500kb", DIFF_STEPS, message_bytes=DIFF_MESSAGE_BYTES, fork_at=None, fork_steps=0)
    client = viewer_client()

    # The deep page checks that an older page of the long branch costs what the newest costs (keyset, no OFFSET).
    long_url = f"/threads/{long_thread.pk}/"
    story_url = f"/threads/{story_thread.pk}/"
    urls = [f"/threads/{short_thread.pk}/", long_url, f"{long_url}?before_seq={long // 3}", story_url,
            f"{story_url}?before_seq={long // 3}"]  # fmt: skip
    short_ms, long_ms, deep_ms, story_ms, story_deep_ms = median_get_ms(client, urls, repeats)

    main = diff_thread.active_branch_id
    base, target = (
        Checkpoint.objects.filter(thread=diff_thread, branch_id=main, seq__in=[DIFF_STEPS // 2, DIFF_STEPS])
        .order_by("seq")
        .values_list("id", flat=True)
    )
    state_kb = Checkpoint.objects.filter(pk=target).values_list("state_bytes", flat=True).get() / 1024
    diff_url = f"/checkpoints/{target}/diff/?base={base}"
    # Cold: a process that has not read these states yet materialises both from storage.
    (diff_cold,) = median_get_ms(client, [diff_url], repeats, before_each=storage.clear_caches)
    (diff_warm,) = median_get_ms(client, [diff_url], repeats)

    history = value_history_figures(client, repeats, reference_url=urls[0])

    ratio = long_ms / short_ms
    story_ratio = story_ms / short_ms
    rows = [
        ("thread page", "10 checkpoints", short_ms, ""),
        ("thread page", f"{long:,} checkpoints", long_ms, f"≤ {THREAD_PAGE_TARGET_MS:g} ms"),
        ("thread page, older page", f"{long:,}, before_seq={long // 3:,}", deep_ms, ""),
        ("ratio", f"{long:,} / 10", None, f"{ratio:.2f} (≤ {THREAD_PAGE_RATIO_TARGET:g})"),
        ("thread page with events", f"{long:,} + {events:,} events", story_ms, f"≤ {THREAD_PAGE_TARGET_MS:g} ms"),
        ("  older page", f"before_seq={long // 3:,}", story_deep_ms, ""),
        ("ratio", "with events / 10", None, f"{story_ratio:.2f} (≤ {THREAD_PAGE_RATIO_TARGET:g})"),
        ("diff page, cold cache", f"#{DIFF_STEPS // 2} → #{DIFF_STEPS}, {state_kb:,.0f} KB", diff_cold,
         f"≤ {DIFF_PAGE_TARGET_MS:g} ms"),
        ("diff page, warm cache", "same pair", diff_warm, ""),
    ]  # fmt: skip
    print()
    print(f"{'page':<26} {'data':<32} {'median ms':>10}  target / ratio")
    print("-" * 86)
    for page, data, ms, note in rows:
        figure = "n/a" if ms is None and page != "ratio" else ("" if ms is None else f"{ms:.1f}")
        print(f"{page:<26} {data:<32} {figure:>10}  {note}")
    print(f"(median of {repeats} GETs after {WARM_UP} warm-up GETs, Django test Client, signed-in viewer)")
    return {
        f"thread_page_ms_{long // 1000}k" if long % 1000 == 0 else f"thread_page_ms_{long}": round(long_ms, 2),
        "thread_page_ms_10": round(short_ms, 2),
        "thread_page_ms_deep": round(deep_ms, 2),
        f"thread_page_ratio_{long // 1000}k_over_10" if long % 1000 == 0 else f"thread_page_ratio_{long}_over_10":
            round(ratio, 3),
        f"thread_page_events_ms_{long // 1000}k" if long % 1000 == 0 else f"thread_page_events_ms_{long}":
            round(story_ms, 2),
        "thread_page_events_ms_deep": round(story_deep_ms, 2),
        "thread_page_events_ratio_over_10": round(story_ratio, 3),
        "diff_page_ms": round(diff_cold, 2),
        "diff_page_ms_warm": round(diff_warm, 2),
        "diff_state_kb": round(state_kb, 1),
        **history,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=30, help="timed GETs per page (default 30)")
    parser.add_argument("--long", type=int, default=10_000, help="checkpoints in the long thread (default 10000)")
    args = parser.parse_args(argv)
    print(json.dumps(run(repeats=args.repeats, long=args.long)))


if __name__ == "__main__":
    main()
