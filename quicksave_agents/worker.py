"""The worker loop behind `manage.py run_agents`: claim a run, drive its agent, repeat.

Woken by NOTIFY when a run is queued (polling only as a fallback), it keeps each
claimed run's lease alive with heartbeats from a side thread, and expires overdue
approvals as it goes. Killing it at any moment loses nothing acknowledged: its run's
lease runs out and another worker (or this one, restarted) claims the run again. Stopping it
(SIGTERM) is quicker for everyone: the run in hand stops before its next step or tool call and
is handed back to the queue, where another worker claims it at once.
A worker that wakes after losing its lease (frozen, partitioned) stops the run where it
is: the runtime asks `_Heartbeat.held` before each step and tool call, and the database
refuses the attempt's writes anyway (quicksave_agents.fencing). Nothing a run does ends the worker.
"""

from __future__ import annotations

import importlib
import logging
import os
import socket
import threading
import time
from collections.abc import Iterable

import psycopg
from django.conf import settings
from django.db import close_old_connections, connections

from approvals.services import expire_due
from checkpoints import storage
from quicksave import logs, telemetry
from quicksave.listen import Listener
from quicksave_agents import runtime
from quicksave_agents.models import Agent, Run, RunStatus
from quicksave_agents.runs import (
    LeaseLost,
    RunFinished,
    claim_run,
    fence_of,
    finish_run,
    heartbeat,
    release_run,
    run_notifications,
)

log = logging.getLogger(__name__)
# How soon an idle worker notices it was told to stop.
STOP_CHECK_SECONDS = 0.5


def load_agent_modules(modules: Iterable[str] | None = None) -> dict[str, type[runtime.Agent]]:
    """Import the modules that register in-process agents; returns the registry."""
    for module in modules if modules is not None else settings.QUICKSAVE_AGENT_MODULES:
        importlib.import_module(module)
    return runtime.registered()


class _Heartbeat(threading.Thread):
    """Renews a run's lease every third of the lease until stopped, and knows until when it holds it."""

    def __init__(self, run: Run, worker: str, lease_seconds: int) -> None:
        super().__init__(name=f"heartbeat-{run.pk}", daemon=True)
        self.run_ = run
        self.worker = worker
        self.lease_seconds = lease_seconds
        self.stopped = threading.Event()
        self.lost = threading.Event()
        # The lease runs from the claim, made just before this; counted from now it would end late.
        self.deadline = time.monotonic() + lease_seconds * 0.9

    def held(self) -> bool:
        """Whether the lease surely still holds: not lost, and renewed within the lease. A process
        frozen past its lease sees the monotonic clock jump on waking, even before a renewal fails."""
        return not self.lost.is_set() and time.monotonic() < self.deadline

    def run(self) -> None:
        try:
            while not self.stopped.wait(self.lease_seconds / 3):
                sent = time.monotonic()
                try:
                    heartbeat(run=self.run_, worker=self.worker, lease_seconds=self.lease_seconds,
                              fence=fence_of(self.run_))  # fmt: skip
                except LeaseLost:
                    self.lost.set()
                    return
                except Exception:
                    # The database may be back by the next beat; the lease says how long to wait.
                    log.warning("heartbeat of run %s failed", self.run_.pk, exc_info=True)
                    continue
                self.deadline = sent + self.lease_seconds
        finally:
            connections.close_all()


class Worker:
    def __init__(self, *, agent_names: list[str] | None = None, lease_seconds: int | None = None,
                 poll_seconds: float = 5.0, name: str | None = None) -> None:  # fmt: skip
        self.registry = load_agent_modules()
        names = agent_names or sorted(self.registry)
        unknown = sorted(set(names) - set(self.registry))
        if unknown:
            raise ValueError(f"No in-process agent is registered as {', '.join(unknown)}")
        self.agent_names = names
        if lease_seconds is not None and lease_seconds < 1:
            raise ValueError(f"The lease must be at least 1 second; got {lease_seconds}")
        if not 0.01 <= poll_seconds <= 3600:  # also false for NaN, which would wait for ever
            raise ValueError(f"The poll interval must be 0.01 to 3600 seconds; got {poll_seconds}")
        self.lease_seconds = lease_seconds or settings.QUICKSAVE_RUN_LEASE_SECONDS
        self.poll_seconds = poll_seconds
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        self.stopping = threading.Event()

    def agents(self) -> list[Agent]:
        return list(Agent.objects.filter(name__in=self.agent_names))

    def run_forever(self) -> None:
        with run_notifications() as notifications:
            while not self.stopping.is_set():
                try:
                    worked = self.run_once()
                except Exception:
                    # The database went away, say: log it, wait, try again; never end the worker.
                    log.exception("worker %s: looking for work failed", self.name)
                    worked = False
                if not worked:
                    close_old_connections()
                    self._wait(notifications)

    def _wait(self, notifications: Listener) -> None:
        """Wait for a run to be queued, or the poll interval. A LISTEN connection that broke (a
        restart or failover of PostgreSQL, an idle-connection reaper) is opened again next time."""
        log.debug("worker %s: idle, waiting up to %g s for a run", self.name, self.poll_seconds)
        deadline = time.monotonic() + self.poll_seconds
        try:
            # In slices: SIGTERM only sets `stopping`, and a stopping worker should not sit out its poll.
            while not self.stopping.is_set() and (remaining := deadline - time.monotonic()) > 0:
                if notifications.wait(min(remaining, STOP_CHECK_SECONDS)):
                    return
        except psycopg.Error as exc:
            log.warning("worker %s: the LISTEN connection broke (%s); polling until it is back", self.name, exc)
            notifications.close()
            self.stopping.wait(self.poll_seconds)

    def run_once(self) -> bool:
        """Expire overdue approvals, then claim and drive one run; False when there was none."""
        expire_due()
        run = claim_run(agents=self.agents(), worker=self.name, lease_seconds=self.lease_seconds)
        if run is None:
            return False
        # The resume continues the trace of the request that queued the run (a decision, a fork).
        attributes: dict[str, str | int] = {"quicksave.run": str(run.pk), "quicksave.run.reason": run.reason,
                      "quicksave.thread": str(run.thread_id), "quicksave.run.attempt": run.attempts}  # fmt: skip
        with logs.bound(thread=run.thread_id), telemetry.span("quicksave.run.resume", carrier=run.trace_context,
                                                              attributes=attributes):  # fmt: skip
            self._drive(run)
        return True

    def _drive(self, run: Run) -> None:
        beat = _Heartbeat(run, self.name, self.lease_seconds)
        beat.start()

        def go_on() -> bool:
            # Asked before each step and tool call: a stopping worker ends the run there.
            return beat.held() and not self.stopping.is_set()

        try:
            outcome = runtime.execute(run, lease_held=go_on)
        except (Exception, SystemExit) as exc:  # whatever a run raises ends the run, not the worker
            log.exception("run %s crashed", run.pk)
            beat.stopped.set()
            self._finish(run, RunStatus.FAILED, f"{type(exc).__name__}: {exc}")
            return
        finally:
            # The thread's next run may be hours away or on another worker: keep no state of it here.
            storage.release_thread(run.thread_id)
        beat.stopped.set()
        if outcome == "lease_lost" and self.stopping.is_set() and beat.held():
            self._hand_back(run)
            return
        log.info("run %s (%s) of thread %s: %s", run.pk, run.reason, run.thread_id, outcome)
        if outcome == "lease_lost":
            return  # another attempt holds the run; closing it is that attempt's business
        status = {"failed": RunStatus.FAILED, "cancelled": RunStatus.CANCELLED}.get(outcome, RunStatus.COMPLETED)
        self._finish(run, status, "the agent failed" if outcome == "failed" else "")

    def _hand_back(self, run: Run) -> None:
        """The worker is stopping mid-run: give the run back to the queue for another worker."""
        try:
            release_run(run=run, worker=self.name, fence=fence_of(run))
        except LeaseLost:
            log.warning("run %s: lease lost before it could be handed back", run.pk)
            return
        log.info("run %s of thread %s handed back: worker %s is stopping", run.pk, run.thread_id, self.name)

    def _finish(self, run: Run, status: str, error: str) -> None:
        try:
            finish_run(run=run, worker=self.name, status=status, error=error, fence=fence_of(run))
        except LeaseLost:
            log.warning("run %s: lease lost before it finished; another worker owns it now", run.pk)
        except RunFinished as finished:
            log.warning("run %s: another attempt finished it first (%s)", run.pk, finished.detail.get("status"))


def start_background_worker() -> threading.Thread:
    """Run a worker in a daemon thread of this process (the embedded, one-process set-up)."""

    def serve() -> None:
        try:
            Worker(name=f"{socket.gethostname()}:{os.getpid()}:embedded").run_forever()
        except Exception:
            log.exception("the embedded worker stopped")
        finally:
            connections.close_all()

    thread = threading.Thread(target=serve, name="embedded-worker", daemon=True)
    thread.start()
    return thread
