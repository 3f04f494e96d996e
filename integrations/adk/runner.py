"""ADK agents as in-process agents: the worker resumes an ADK invocation when a person decides on
one of its tool confirmations.

Register a factory that builds the root agent, in a module listed in QUICKSAVE_AGENT_MODULES,
and run it with a QuicksaveSessionService under the same app name:

    @register_adk_agent("travel")
    def travel() -> BaseAgent:
        return LlmAgent(name="travel", model=..., tools=[FunctionTool(book, require_confirmation=True)])

    runner = Runner(app_name="travel", agent=travel(), session_service=QuicksaveSessionService())

The worker answers the confirmation with the decision (integrations.adk.confirmations) through
ADK's own Runner on a QuicksaveSessionService carrying the run's fence, so the tool runs (or is
refused) and the agent goes on. A run for any other reason (a dashboard fork, a manual resume)
has nothing to run: an ADK invocation starts from a user message, and the session goes on from
the fork (integrations.adk.forks) with its application's next one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from google.adk.agents.base_agent import BaseAgent
from google.adk.events.event import Event
from google.adk.runners import Runner
from google.genai import types

from approvals.models import ApprovalRequest, ApprovalStatus
from checkpoints import storage
from checkpoints.models import Checkpoint, Thread, ThreadStatus
from integrations.adk import confirmations
from integrations.adk.reads import event_of
from integrations.adk.sessions import QuicksaveSessionService
from quicksave_agents import runtime
from quicksave_agents.fencing import Fence
from quicksave_agents.models import Run, RunReason

AgentFactory = Callable[[], BaseAgent]
log = logging.getLogger(__name__)


class AdkAgent(runtime.LoopAgent):
    """An ADK root agent driven by the worker; made by `register_adk_agent`."""

    def build(self) -> BaseAgent:
        raise NotImplementedError

    def drive(self, run: Run, thread: Thread, *, lease_held: Callable[[], bool]) -> str:
        info = thread.metadata.get("adk") or {}
        if "session_id" not in info:
            raise RuntimeError(f"Thread {thread.pk} is not an ADK session (an app or user state scope?).")
        if run.reason != RunReason.APPROVAL or run.approval_id is None:
            # A fork or a manual resume: an ADK invocation starts from a user message, so the
            # session goes on from here when its application sends the next one.
            log.info("run %s (%s): ADK session %s goes on with its next message", run.pk, run.reason, thread.pk)
            storage.set_thread_status(thread=thread, status=ThreadStatus.COMPLETED)
            return "done"
        approval = ApprovalRequest.objects.select_related("decided_by").get(pk=run.approval_id)
        message = bound_response(approval, thread)
        service = QuicksaveSessionService(fence=Fence(run.pk, run.attempts), lease_held=lease_held)
        runner = Runner(app_name=self.name, agent=self.build(), session_service=service)

        async def answer() -> None:
            async for _ in runner.run_async(user_id=info["user_id"], session_id=info["session_id"],
                                            new_message=message):  # fmt: skip
                pass

        asyncio.run(answer())
        if ApprovalRequest.objects.filter(thread_id=thread.pk, status=ApprovalStatus.PENDING).exists():
            return "suspended"
        storage.set_thread_status(thread=thread, status=ThreadStatus.COMPLETED)
        return "done"


def bound_response(approval: ApprovalRequest, thread: Thread) -> types.Content:
    """The confirmation response for `approval`, if it still answers the session: its checkpoint on
    the path to the head, its call there unanswered since. Anything else fails closed."""
    head_id = Thread.objects.values_list("head_id", flat=True).get(pk=thread.pk)
    head = Checkpoint.objects.only("branch_id", "seq").get(pk=head_id)
    asked_at = Checkpoint.objects.get(pk=approval.checkpoint_id)
    if asked_at.thread_id != thread.pk or asked_at.branch_id != head.branch_id or asked_at.seq > head.seq:
        raise runtime.ApprovalMismatch(
            f"The decision was made at checkpoint {asked_at.pk}, which is not on the path to the session's head "
            f"{head_id}; not acting on it."
        )
    message = confirmations.response_for(approval, confirmations.requests_in(event_of(asked_at) or {}))
    call_id = message.parts[0].function_response.id if message.parts and message.parts[0].function_response else None
    since = Checkpoint.objects.filter(thread_id=thread.pk, branch_id=head.branch_id, seq__gt=asked_at.seq,
                                      seq__lte=head.seq, metadata__has_key="adk_event")  # fmt: skip
    for row in since.iterator():
        if any(response.id == call_id for response in Event.model_validate(event_of(row)).get_function_responses()):
            raise runtime.ApprovalMismatch(f"Confirmation {call_id} was answered already; not answering it again.")
    return message


def register_adk_agent(name: str, *, version: str = "adk") -> Callable[[AgentFactory], AgentFactory]:
    """Decorator: make the worker resume the ADK app `name`, whose root agent this factory builds."""

    def register(factory: AgentFactory) -> AgentFactory:
        agent_class = type(
            f"AdkAgent[{name}]",
            (AdkAgent,),
            {"name": name, "version": version, "build": staticmethod(factory), "__module__": factory.__module__},
        )
        runtime.register(agent_class)
        return factory

    return register
