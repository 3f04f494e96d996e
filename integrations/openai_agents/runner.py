"""OpenAI Agents SDK agents driven by Quicksave: `run_agent` for your own process, the worker for
the rest (a decision on a paused run resumes it; a fork or a manual resume runs it on).

Register a factory that builds the agent, in a module listed in QUICKSAVE_AGENT_MODULES, and run
it with a `QuicksaveSession` under the same name:

    @register_agent("travel")
    def travel() -> Agent:
        return Agent(name="travel", model=..., tools=[book_flight])  # book_flight: needs_approval=True

    await run_agent(travel(), "Book me a flight", session=QuicksaveSession("trip-7", agent="travel"))

The worker builds the agent in its own process for every run it claims. A run queued by a
decision resumes the paused `RunState` at the thread's head (which must be the checkpoint the
decision was made at, see integrations.openai_agents.approvals) with `Runner.run(agent, state,
session=...)`; a run that paused on several calls first files the next one. Any other run (a
fork, a manual resume) goes on from the run's checkpoint: a paused run there is filed for a
decision again, anything else runs the agent on the conversation so far with no new input.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from agents import Agent, RunConfig, Runner, RunResult, RunState
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async

from approvals.models import ApprovalKind, ApprovalRequest, ApprovalStatus
from approvals.services import ThreadCancelled, file_in_doubt
from checkpoints import storage
from checkpoints.models import Checkpoint, CheckpointStatus, Thread, ThreadStatus
from checkpoints.storage import StaleParent
from integrations.openai_agents.approvals import apply_decision, pause, paused_run
from integrations.openai_agents.session import QuicksaveSession
from integrations.openai_agents.tools import CallInDoubt, guarded
from quicksave.errors import found_in_chain
from quicksave_agents import runtime
from quicksave_agents.fencing import Fence, LeaseLost
from quicksave_agents.models import Run, RunReason, ToolCall

AgentFactory = Callable[[], Agent[Any]]
DECIDED = (ApprovalStatus.APPROVED, ApprovalStatus.REJECTED, ApprovalStatus.EXPIRED)
log = logging.getLogger(__name__)


async def run_agent(
    agent: Agent[Any], input: Any, *, session: QuicksaveSession, run_config: RunConfig | None = None, **kwargs: Any
) -> RunResult:
    """`Runner.run(agent, input, session=session)`, then: a run that stopped on tool approvals is
    paused on the thread with its first call in the inbox; a finished one completes the thread."""
    result = await Runner.run(agent, input, session=session, run_config=run_config, **kwargs)
    await database_sync_to_async(_settle)(session, result)
    return result


def _settle(session: QuicksaveSession, result: RunResult) -> str:
    if result.interruptions:
        pause(session, result.to_state())
        return "suspended"
    storage.set_thread_status(thread=session.thread, status=ThreadStatus.COMPLETED)
    return "done"


class OpenAIAgent(runtime.LoopAgent):
    """An OpenAI Agents SDK agent driven by the worker; made by `register_agent`."""

    run_config: RunConfig | None = None

    def build(self) -> Agent[Any]:
        """The agent to run (register_agent sets the factory)."""
        raise NotImplementedError

    def drive(self, run: Run, thread: Thread, *, lease_held: Callable[[], bool]) -> str:
        fence = Fence(run.pk, run.attempts)
        start, mismatch = _start(run, thread)
        session = QuicksaveSession.for_checkpoint(start, fence=fence)
        if not lease_held():
            raise fence.lost(thread_id=thread.pk)
        if mismatch:
            return _fail(session, reason=mismatch)
        try:
            return async_to_sync(self._go_on)(run, start, session)
        except runtime.ApprovalMismatch as mismatch:
            return _fail(session, reason=str(mismatch))
        except ThreadCancelled:
            return "cancelled"
        except (LeaseLost, StaleParent):
            raise
        except Exception as exc:
            if lost := found_in_chain(exc, LeaseLost):
                raise lost from exc  # the runtime stops the attempt, however the SDK wrapped it
            if doubt := found_in_chain(exc, CallInDoubt):
                return _in_doubt(session, doubt.call, start)
            log.exception("agent %s failed in thread %s", self.name, thread.pk)
            return _fail(session, reason=f"{type(exc).__name__}: {exc}")

    async def _go_on(self, run: Run, start: Checkpoint, session: QuicksaveSession) -> str:
        state_now = await database_sync_to_async(storage.state_at)(start, hot=True)
        paused = paused_run(start, state_now)
        agent = guarded(self.build(), thread_id=start.thread_id, start=start.pk, fence=session.fence,
                        edits=paused.edits if paused else {})  # fmt: skip
        if paused is None:
            if start.status in (CheckpointStatus.COMPLETED, CheckpointStatus.FAILED) and run.attempts > 1:
                return "done" if start.status == CheckpointStatus.COMPLETED else "failed"
            result = await Runner.run(agent, [], session=session, run_config=self.run_config)
            return await database_sync_to_async(_settle)(session, result)
        state = await RunState.from_json(agent, paused.state)
        approval = await database_sync_to_async(_decision_for)(run, start)
        if approval is not None:
            apply_decision(state, approval=approval, decision=runtime.decision_for(approval), paused=paused)
        if await database_sync_to_async(pause)(session, state, paused=paused) is not None:
            return "suspended"  # the next call of this pause waits for its own decision
        result = await Runner.run(agent, state, session=session, run_config=self.run_config)
        return await database_sync_to_async(_settle)(session, result)


def _in_doubt(session: QuicksaveSession, call: ToolCall, start: Checkpoint) -> str:
    """Put a call in doubt before a person, at the checkpoint the run went on from (the answer's
    run goes on from there again, so the call keeps its key)."""
    try:
        file_in_doubt(call=call, checkpoint=start, fence=session.fence)
    except ThreadCancelled:
        return "cancelled"
    log.warning("thread %s: call %s (%s) is in doubt", call.thread_id, call.key[:12], call.tool)
    return "suspended"


def _start(run: Run, thread: Thread) -> tuple[Checkpoint, str | None]:
    """The checkpoint the run goes on from (a decision's: the thread's head; a retry's: its
    branch's latest; any other run's: its own), and why not to go on from it, if so."""
    if run.reason == RunReason.APPROVAL and run.approval_id is not None:
        approval = ApprovalRequest.objects.get(pk=run.approval_id)
        if approval.kind == ApprovalKind.IN_DOUBT:
            # An answer on a call in doubt: the run goes on from where that call's run did.
            return Checkpoint.objects.defer("payload").get(pk=approval.checkpoint_id), None
        head = Checkpoint.objects.defer("payload").get(pk=Thread.objects.values_list("head_id", flat=True)
                                                       .get(pk=thread.pk))  # fmt: skip
        if approval.kind == ApprovalKind.APPROVAL and head.pk != approval.checkpoint_id:
            # The run resumes the thread's latest checkpoint: the decision is for that one only.
            return head, (f"Run {run.pk} would resume the agent at checkpoint {head.pk}, but its decision was "
                          f"made at checkpoint {approval.checkpoint_id}; not acting on it.")  # fmt: skip
        return head, None
    checkpoint = Checkpoint.objects.defer("payload").get(pk=run.checkpoint_id)
    if run.attempts > 1:
        latest = (
            Checkpoint.objects.defer("payload")
            .filter(thread_id=thread.pk, branch_id=checkpoint.branch_id, seq__gt=checkpoint.seq)
            .order_by("-seq")
            .first()
        )
        return latest or checkpoint, None
    return checkpoint, None


def _decision_for(run: Run, start: Checkpoint) -> ApprovalRequest | None:
    """The decision this run acts on at `start`: the one it was queued for or a fork carried, or,
    for a run that answers an in-doubt call or retries a dead attempt, the one made at `start`."""
    approval = ApprovalRequest.objects.select_related("decided_by").get(pk=run.approval_id) if run.approval_id else None
    if approval is None or approval.kind != ApprovalKind.APPROVAL:
        return (
            ApprovalRequest.objects.select_related("decided_by")
            .filter(checkpoint=start, kind=ApprovalKind.APPROVAL, status__in=DECIDED)
            .order_by("-decided_at")
            .first()
        )
    if run.reason == RunReason.APPROVAL and approval.checkpoint_id != start.pk:
        raise runtime.ApprovalMismatch(f"Run {run.pk}'s decision was made at checkpoint {approval.checkpoint_id}, "
                                       f"not at {start.pk}; not acting on it.")  # fmt: skip
    return approval


def _fail(session: QuicksaveSession, *, reason: str) -> str:
    """Fail the thread at the session's head with `reason`: an admin sees why, and may fork or resume."""
    try:
        session.write([], turns=0, label="failed", status=CheckpointStatus.FAILED,
                      meta={"error": reason[:2000]})  # fmt: skip
    except StaleParent:
        return "stale"
    return "failed"


def register_agent(
    name: str, *, version: str = "1", run_config: RunConfig | None = None
) -> Callable[[AgentFactory], AgentFactory]:
    """Decorator: make the worker run the agent this factory builds as Quicksave agent `name`
    (with `run_config` on every run it drives)."""

    def register(factory: AgentFactory) -> AgentFactory:
        agent_class = type(
            f"OpenAIAgent[{name}]",
            (OpenAIAgent,),
            {"name": name, "version": version, "build": staticmethod(factory), "run_config": run_config,
             "__module__": factory.__module__},
        )  # fmt: skip
        runtime.register(agent_class)
        return factory

    return register
