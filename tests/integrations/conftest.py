"""A worker running in a thread of the test process, for tests that resume graphs through runs."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connections

from checkpoints.models import Thread
from quicksave_agents.models import Run, RunStatus
from tests.waiting import wait_until


class WorkerThread:
    """`quicksave_agents.worker.Worker.run_forever` in a daemon thread, woken by NOTIFY like in production."""

    def __init__(self, agent_names: list[str]) -> None:
        from quicksave_agents.worker import Worker

        self.worker = Worker(agent_names=agent_names, poll_seconds=0.5, name="test-worker")
        self.thread = threading.Thread(target=self._serve, name="test-worker", daemon=True)

    def _serve(self) -> None:
        try:
            self.worker.run_forever()
        finally:
            connections.close_all()

    def wait_for_runs(self, thread: Thread, *, timeout: float = 30) -> list[Run]:
        """Wait until `thread` has a run and none queued or running; returns its runs, oldest first."""

        def finished() -> list[Run] | None:
            runs = list(Run.objects.filter(thread=thread).order_by("created_at"))
            done = runs and all(run.status not in (RunStatus.QUEUED, RunStatus.RUNNING) for run in runs)
            return runs if done else None

        return wait_until(finished, what=f"the runs of thread {thread.pk} to finish", timeout=timeout)


@pytest.fixture
def worker(transactional_db: Any) -> Iterator[WorkerThread]:
    from tests.integrations import graphs

    running = WorkerThread(
        [graphs.BOOKING, graphs.ASK, graphs.ASK_TWICE, graphs.NESTED, graphs.ASK_BOTH, graphs.COUNTER]
    )
    running.thread.start()
    yield running
    running.worker.stopping.set()
    running.thread.join(timeout=10)
