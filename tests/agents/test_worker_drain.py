"""A worker told to stop (SIGTERM) finishes the step in hand and hands its run back to the queue,
where the next worker goes on from that step's checkpoint: no step is lost or run twice."""

from __future__ import annotations

import threading
from typing import Any

from checkpoints.models import Checkpoint, ThreadStatus
from quicksave_agents.models import Run, RunStatus
from quicksave_agents.runtime import Agent, Context, Continue, Done, StepResult, register, start_thread
from quicksave_agents.worker import Worker


@register
class FourSteps(Agent):
    name = "drain-four-steps"
    # The `stopping` of the worker that step 2 stops, as SIGTERM would (run_agents sets it).
    stopping = threading.Event()

    def initial_state(self, **inputs: Any) -> dict[str, Any]:
        return {"done": 0}

    def step(self, ctx: Context) -> StepResult:
        ctx.state["done"] += 1
        if ctx.state["done"] == 2:
            self.stopping.set()  # the operator stops the worker during step 2
        return Done("step 4") if ctx.state["done"] == 4 else Continue(f"step {ctx.state['done']}")


def labels(thread_id: Any) -> list[str]:
    return list(Checkpoint.objects.filter(thread_id=thread_id).order_by("seq").values_list("label", flat=True))


def test_a_stopping_worker_finishes_its_step_and_hands_the_run_back_to_the_next(db: Any) -> None:
    thread = start_thread(agent_class=FourSteps)
    first = Worker(agent_names=[FourSteps.name], name="first")
    FourSteps.stopping = first.stopping

    assert first.run_once()

    run = Run.objects.get(thread=thread)
    assert (run.status, run.claimed_by, run.lease_expires_at, run.attempts) == (RunStatus.QUEUED, "", None, 1)
    assert labels(thread.pk) == ["start", "step 1", "step 2"]  # step 2 was finished, step 3 not begun

    assert Worker(agent_names=[FourSteps.name], name="second").run_once()

    run.refresh_from_db()
    thread.refresh_from_db()
    assert (run.status, run.claimed_by, run.attempts) == (RunStatus.COMPLETED, "second", 2)
    assert labels(thread.pk) == ["start", "step 1", "step 2", "step 3", "step 4"]
    assert thread.status == ThreadStatus.COMPLETED
