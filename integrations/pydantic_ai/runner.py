"""Pydantic AI agents driven by the worker: a decision on a paused run resumes it, and a fork or a
manual resume runs it on from a checkpoint.

Register a factory that builds the agent, in a module listed in QUICKSAVE_AGENT_MODULES, and run
it through `QuicksaveAgent` under the same name:

    @register_agent("trips")
    def trips() -> Agent[None, str | DeferredToolRequests]:
        return Agent(model, output_type=[str, DeferredToolRequests], tools=[...])

    await QuicksaveAgent(trips(), name="trips").run("Book me a flight", conversation_id="trip-7")

The worker builds the agent in its own process for every run it claims and goes on from the
run's checkpoint (a retried run: from the latest checkpoint on that branch; a decision: from the
thread's head, which must be the checkpoint the decision was made at) with the stored message
history. A checkpoint waiting on deferred calls resumes once each of them is decided, with the
decisions as `DeferredToolResults` (integrations.pydantic_ai.deferred); until then the run files
the next undecided call and stops. A fork that carries a decision over runs the agent from the
fork, and when the agent defers that very call again, resumes it with the decision at once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from asgiref.sync import async_to_sync
from pydantic_ai.agent import AbstractAgent

from approvals.models import ApprovalKind, ApprovalRequest
from approvals.services import ThreadCancelled
from checkpoints.models import Checkpoint, CheckpointStatus, Thread
from checkpoints.storage import StaleParent
from integrations.pydantic_ai import deferred, threads
from integrations.pydantic_ai.agent import CallInDoubt, QuicksaveAgent, load
from quicksave.errors import found_in_chain
from quicksave_agents import runtime
from quicksave_agents.fencing import Fence, LeaseLost
from quicksave_agents.models import Run, RunReason

AgentFactory = Callable[[], AbstractAgent[Any, Any]]
log = logging.getLogger(__name__)


class PydanticAIAgent(runtime.LoopAgent):
    """A Pydantic AI agent driven by the worker; made by `register_agent`."""

    def build(self) -> AbstractAgent[Any, Any]:
        """The agent to run (register_agent sets the factory)."""
        raise NotImplementedError

    def drive(self, run: Run, thread: Thread, *, lease_held: Callable[[], bool]) -> str:
        fence = Fence(run.pk, run.attempts)
        start = _start(run, thread)
        carried = _carried(run)
        outcome = self.run_from(start, thread, fence=fence, lease_held=lease_held, carried=carried)
        latest = threads.latest_on_branch(start)
        if outcome == "suspended" and carried is not None and latest.pk != start.pk:
            # The agent deferred the call the fork carried a decision for: go on with that decision now.
            outcome = self.run_from(latest, thread, fence=fence, lease_held=lease_held, carried=None)
        return outcome

    def run_from(
        self, start: Checkpoint, thread: Thread, *, fence: Fence, lease_held: Callable[[], bool],
        carried: ApprovalRequest | None,
    ) -> str:  # fmt: skip
        """Run the agent on from `start`: with the decisions on its deferred calls, once all are made."""
        state = threads.state_of(start)
        if "output" in state:
            return "done"
        try:
            results = None
            if "deferred" in state:
                items = deferred.items_of(state["deferred"])
                decided = deferred.decisions(thread=thread, checkpoint=start, items=items)
                if decided is None:
                    deferred.file_next(thread=thread, checkpoint=start, items=items, fence=fence)
                    return "suspended"
                results = deferred.results(items, decided)
        except runtime.ApprovalMismatch as mismatch:
            return _fail(thread, start, reason=str(mismatch), fence=fence)
        except ThreadCancelled:
            return "cancelled"
        agent = QuicksaveAgent(self.build(), name=self.name, version=self.version, fence=fence, lease_held=lease_held,
                               start=start, carried=carried)  # fmt: skip
        try:
            async_to_sync(agent.run)(None, conversation_id=thread.external_id, message_history=load(state["messages"]),
                                     deferred_tool_results=results)  # fmt: skip
        except Exception as exc:
            if lost := found_in_chain(exc, LeaseLost):
                raise lost from exc  # the runtime stops the attempt, whatever Pydantic AI wrapped it in
            if found_in_chain(exc, CallInDoubt):
                return "suspended"
            if found_in_chain(exc, ThreadCancelled):
                return "cancelled"
            log.exception("agent %s failed in thread %s", self.name, thread.pk)
            return _fail(thread, threads.latest_on_branch(start), reason=f"{type(exc).__name__}: {exc}", fence=fence)
        head = threads.head(thread)
        return "suspended" if head is not None and head.status == CheckpointStatus.WAITING_FOR_APPROVAL else "done"


def _fail(thread: Thread, at: Checkpoint, *, reason: str, fence: Fence) -> str:
    """Fail the thread at `at` (the run's latest checkpoint) with `reason`, its state as it was: an
    admin sees why, and may resume the agent from there or fork."""
    state = threads.state_of(at)
    try:
        threads.append(thread=thread, parent=at, before=state, after=state, label="failed",
                       status=CheckpointStatus.FAILED, error=reason, fence=fence)  # fmt: skip
    except StaleParent:
        return "stale"  # someone moved the branch on meanwhile: this run is obsolete
    return "failed"


def _start(run: Run, thread: Thread) -> Checkpoint:
    """The checkpoint the run goes on from (see the module docstring)."""
    if not thread.external_id:
        raise RuntimeError(f"Thread {thread.pk} has no conversation id; QuicksaveAgent did not write it.")
    if run.reason == RunReason.APPROVAL and run.approval_id is not None:
        approval = ApprovalRequest.objects.get(pk=run.approval_id)
        head = threads.head(thread)
        if head is None:
            raise RuntimeError(f"Thread {thread.pk} has no checkpoint to resume.")
        if approval.kind == ApprovalKind.APPROVAL and head.pk != approval.checkpoint_id:
            # The run resumes the thread's latest checkpoint: the decision is for that one only.
            raise runtime.ApprovalMismatch(
                f"Run {run.pk} would resume the agent at checkpoint {head.pk}, but its decision was made at "
                f"checkpoint {approval.checkpoint_id}; not acting on it."
            )
        return head
    checkpoint = Checkpoint.objects.defer("payload").get(pk=run.checkpoint_id)
    return threads.latest_on_branch(checkpoint) if run.attempts > 1 else checkpoint


def _carried(run: Run) -> ApprovalRequest | None:
    """The decision a dashboard fork carried over to this run, if it did."""
    if run.reason != RunReason.FORK or run.approval_id is None:
        return None
    return ApprovalRequest.objects.select_related("decided_by").get(pk=run.approval_id)


def register_agent(name: str, *, version: str = "1") -> Callable[[AgentFactory], AgentFactory]:
    """Decorator: make the worker run the agent this factory builds as Quicksave agent `name`."""

    def register(factory: AgentFactory) -> AgentFactory:
        agent_class = type(
            f"PydanticAIAgent[{name}]",
            (PydanticAIAgent,),
            {"name": name, "version": version, "build": staticmethod(factory), "__module__": factory.__module__},
        )
        runtime.register(agent_class)
        return factory

    return register
