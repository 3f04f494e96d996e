"""Prometheus metrics every process records: what an operator scrapes from `/metrics` (quicksave.scrape).

Counters and histograms only, bumped in memory where the thing happens (a request, a commit, a
claim, a socket); nothing here queries the database, so a checkpoint write costs a few counter
increments more. Gauges that describe the database (approvals waiting and their age, the run
queue, in-doubt calls) are computed when scraped (quicksave.scrape.DatabaseCollector).

Names follow Prometheus' conventions: the unit in the name, `_total` on counters, and labels of
few values (a route's pattern, never its path; a reason or a code, never an id). With
PROMETHEUS_MULTIPROC_DIR set, prometheus-client keeps each process's values in that directory and
the scrape adds them up, so one scrape of any web process covers every process on the host.
"""

from __future__ import annotations

import atexit
import os

from prometheus_client import Counter, Gauge, Histogram, multiprocess

# Request latencies: a checkpoint write takes a few milliseconds, a runs/claim long-poll up to 30 s.
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
# Waits people and queues cause: from under a second to a day.
_WAIT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 14400.0, 86400.0)
_LAG_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)

http_request_duration_seconds = Histogram(
    "quicksave_http_request_duration_seconds",
    "Time from a request reaching Django's middleware to its response, by route pattern.",
    ["method", "route"],
    buckets=_LATENCY_BUCKETS,
)
http_responses_total = Counter(
    "quicksave_http_responses_total", "HTTP responses by route pattern and status code.", ["method", "route", "status"]
)
checkpoint_writes_total = Counter(
    "quicksave_checkpoint_writes_total",
    "Checkpoints committed, by every writer (the API, in-process agents, framework adapters, forks, imports).",
)
checkpoint_payload_bytes_total = Counter(
    "quicksave_checkpoint_payload_bytes_total",
    "Bytes of the stored payloads (sealed deltas and snapshots) of checkpoints written through the API.",
)
conflicts_total = Counter(
    "quicksave_conflicts_total",
    "Requests refused with 409, by error code (stale_parent: another write moved the branch head first).",
    ["code"],
)
runs_queued_total = Counter("quicksave_runs_queued_total", "Runs (resume jobs) queued, by reason.", ["reason"])
runs_claimed_total = Counter(
    "quicksave_runs_claimed_total", "Claims of runs by workers and external agents, by reason.", ["reason"]
)
runs_lost_total = Counter(
    "quicksave_runs_lost_total", "Runs claimed again after their lease ran out: their holder died, froze or lost touch."
)
run_queue_wait_seconds = Histogram(
    "quicksave_run_queue_wait_seconds", "From a run being queued to its first claim, by reason.", ["reason"],
    buckets=_WAIT_BUCKETS,
)  # fmt: skip
decision_to_resume_seconds = Histogram(
    "quicksave_decision_to_resume_seconds",
    "From a person's decision on an approval to a worker or agent claiming the run that resumes the thread.",
    buckets=_WAIT_BUCKETS,
)
websocket_connections = Gauge(
    "quicksave_websocket_connections",
    "Open websockets, by feed (thread, threads, inbox).",
    ["feed"],
    multiprocess_mode="livesum",
)
live_publish_lag_seconds = Histogram(
    "quicksave_live_publish_lag_seconds",
    "From an event's commit until the channel layer took it for its websocket group.",
    buckets=_LAG_BUCKETS,
)
live_publish_failures_total = Counter(
    "quicksave_live_publish_failures_total",
    "Sends to the channel layer that failed (clients catch up from the event table when it is back).",
)

if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
    # The live gauges of a process that has exited must stop counting toward the sum.
    atexit.register(lambda: multiprocess.mark_process_dead(os.getpid()))  # type: ignore[no-untyped-call]
