"""bench/load.py runs end to end at a tiny size (one server, one worker, ten seconds of load) against the
test database and a Redis of its own, so the benchmark cannot rot: its last line has every figure,
nothing failed and no socket lost an event."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from approvals.models import ApprovalRequest, ApprovalStatus
from bench import load
from checkpoints.models import Checkpoint
from tests.processes import ROOT, RedisServer, database_url, server_environment

KEYS = {"load_cps_1", "load_cps_2", "load_cps_4", "load_p99_ms_2", "load_errors", "ws_lost", "soak_rss_growth",
        "soak_rss_growth_second_half"}  # fmt: skip


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(300)
def test_the_load_bench_runs_at_a_tiny_size_without_errors_or_lost_events() -> None:
    redis_server = RedisServer()
    redis_server.start()
    # A session of its own, so that a bench that overruns is stopped with every process it started.
    bench = subprocess.Popen(
        [sys.executable, "bench/load.py", "--agents", "2", "--reviewers", "1", "--sockets", "2",
         "--minutes", "0.17", "--processes", "1", "--workers", "1", "--soak-minutes", "0", "--think", "0.2",
         "--review-think", "0.3", "--database-url", database_url()],
        cwd=ROOT, env={**server_environment(), "REDIS_URL": redis_server.url}, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        output, errors = bench.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        bench.terminate()  # the bench stops its servers and workers on SIGTERM
        try:
            output, errors = bench.communicate(timeout=40)
        except subprocess.TimeoutExpired:
            os.killpg(bench.pid, signal.SIGKILL)
            output, errors = bench.communicate()
        pytest.fail(f"bench/load.py overran:\n{output}\n{errors}")
    finally:
        redis_server.kill()
    assert bench.returncode == 0, output + errors
    figures = json.loads(output.strip().splitlines()[-1])

    assert figures.keys() >= KEYS
    assert figures["load_errors"] == 0, output
    assert figures["ws_lost"] == 0, output
    assert figures["load_cps_1"] > 0
    assert figures["load_cps_2"] is None and figures["soak_rss_growth"] is None  # not run at this size
    # The agents wrote over HTTP, the reviewer decided, and a worker resumed what was decided.
    assert Checkpoint.objects.filter(thread__agent__name__startswith="load-").count() > 2
    decided = ApprovalRequest.objects.filter(status=ApprovalStatus.APPROVED)
    assert decided.exists(), output
    assert figures["decision_to_resume_p95_ms"] is not None


def watched(seqs: list[int], *, last: int) -> load.Watcher:
    phase = load.Phase("test", [0], 1.0)
    watcher = load.Watcher(0, "thread", "key", phase)
    for seq in seqs:
        watcher._note({"type": "checkpoint.created", "seq": seq})
    watcher.expect(last)
    return watcher


def test_a_socket_that_gets_every_event_in_order_has_lost_nothing() -> None:
    watcher = watched([1, 2, 3, 4], last=4)

    assert watcher.phase.ws_lost == 0 and watcher.missing() == 0 and watcher.caught_up.is_set()


def test_gaps_repeats_steps_back_and_events_that_never_came_count_as_lost() -> None:
    watcher = watched([1, 3, 3, 2, 4], last=6)  # 2 missing in a gap, 3 repeated, 2 back, 5 and 6 never came

    assert (watcher.phase.ws_gaps, watcher.phase.ws_disorder, watcher.missing()) == (1, 2, 2)
    assert not watcher.caught_up.is_set()


def test_memory_that_fills_a_bound_then_holds_grows_over_the_soak_but_not_over_its_second_half() -> None:
    phase = load.Phase("soak", [0], 1.0)
    phase.rss = {"server :1": [100, 120, 130, 130, 130], "worker 1": [200, 201, 202, 202, 202]}

    assert load.rss_growth(phase) == pytest.approx(0.3)
    assert load.rss_growth(phase, second_half=True) == 0


def test_memory_that_keeps_growing_grows_over_the_second_half_too() -> None:
    phase = load.Phase("soak", [0], 1.0)
    phase.rss = {"server :1": [100, 110, 120, 130, 140]}

    assert load.rss_growth(phase, second_half=True) == pytest.approx(140 / 120 - 1)
