"""ADK agents as in-process agents: the worker resumes an ADK invocation once a person has decided
on its tool confirmations.

Register a factory that builds the root agent, in a module listed in QUICKSAVE_AGENT_MODULES,
and run it with a QuicksaveSessionService under the same app name:

    @register_adk_agent("travel")
    def travel() -> BaseAgent:
        return LlmAgent(name="travel", model=..., tools=[FunctionTool(book, require_confirmation=True)])

    runner = Runner(app_name="travel", agent=travel(), session_service=QuicksaveSessionService())

A run queued by a decision on a confirmation files the event's next confirmation, if it asked
several; once every one is decided, it answers them all in one message (integrations.adk.confirmations)
through ADK's own Runner on a QuicksaveSessionService carrying the run's fence, with the tool-call
log as a plugin (integrations.adk.tools), so the confirmed tools run (or are refused) once and the
agent goes on. A retry of the run after its attempt died resends the same answers if the tools'
results are not in the session yet: ADK runs those calls again and the log answers any that ran
already. A call the log finds in doubt goes to a person at the confirmations' checkpoint, and
their answer's run resends the answers again. A run for any other reason (a dashboard fork, a
manual resume) has nothing to run: an ADK invocation starts from a user message, and the session
goes on from the fork (integrations.adk.forks) with its application's next one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from google.adk.agents.base_agent import BaseAgent
from google.adk.apps.app import App, validate_app_name
from google.adk.events.event import Event
from google.adk.runners import Runner

from approvals.models import ApprovalKind, ApprovalRequest, ApprovalStatus
from approvals.services import ThreadCancelled, file_in_doubt
from checkpoints import storage
from checkpoints.models import Checkpoint, Thread, ThreadStatus
from integrations.adk import confirmations
from integrations.adk.confirmations import ConfirmationRequest
from integrations.adk.reads import event_of
from integrations.adk.sessions import QuicksaveSessionService
from integrations.adk.tools import CallInDoubt, ToolCallLog
from quicksave.errors import found_in_chain
from quicksave_agents import runtime
from quicksave_agents.fencing import Fence, LeaseLost
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
        fence = Fence(run.pk, run.attempts)
        approval = ApprovalRequest.objects.get(pk=run.approval_id)
        asked_at = confirmations_checkpoint(approval, thread)
        asked = confirmations.requests_in(event_of(asked_at) or {})
        decided = confirmations.decisions(thread=thread, checkpoint=asked_at, requests=asked)
        if decided is None:
            # Another confirmation of the event waits: filed now, if it was not yet.
            if not lease_held():
                raise fence.lost(thread_id=thread.pk)
            confirmations.file_next(thread=thread, checkpoint=asked_at, requests=asked, fence=fence)
            return "suspended"
        message = confirmations.response(asked, decided)
        check_unanswered(asked_at, asked)
        service = QuicksaveSessionService(fence=fence, lease_held=lease_held)
        app = App(name=self.name, root_agent=self.build(), plugins=[ToolCallLog(service)])
        runner = Runner(app=app, session_service=service)

        async def answer() -> None:
            async for _ in runner.run_async(user_id=info["user_id"], session_id=info["session_id"],
                                            new_message=message):  # fmt: skip
                pass

        try:
            asyncio.run(answer())
        except Exception as exc:
            if lost := found_in_chain(exc, LeaseLost):
                raise lost from exc  # the runtime stops the attempt, however ADK wrapped it
            if doubt := found_in_chain(exc, CallInDoubt):
                # At the confirmations' checkpoint: the answer's run resends the same answers.
                try:
                    file_in_doubt(call=doubt.call, checkpoint=asked_at, fence=fence)
                except ThreadCancelled:
                    return "cancelled"
                log.warning("thread %s: call %s (%s) is in doubt", thread.pk, doubt.call.key[:12], doubt.call.tool)
                return "suspended"
            raise
        if ApprovalRequest.objects.filter(thread_id=thread.pk, status=ApprovalStatus.PENDING).exists():
            return "suspended"
        storage.set_thread_status(thread=thread, status=ThreadStatus.COMPLETED)
        return "done"


def confirmations_checkpoint(approval: ApprovalRequest, thread: Thread) -> Checkpoint:
    """The checkpoint whose confirmations the run answers: the decided approval's (or, for an
    answer on a call in doubt, the one that call went to a person at), if it is on the path to the
    session's head. Anything else fails closed."""
    head_id = Thread.objects.values_list("head_id", flat=True).get(pk=thread.pk)
    head = Checkpoint.objects.only("branch_id", "seq").get(pk=head_id)
    asked_at = Checkpoint.objects.get(pk=approval.checkpoint_id)
    if asked_at.thread_id != thread.pk or asked_at.branch_id != head.branch_id or asked_at.seq > head.seq:
        raise runtime.ApprovalMismatch(
            f"The decision was made at checkpoint {asked_at.pk}, which is not on the path to the session's head "
            f"{head_id}; not acting on it."
        )
    if approval.kind == ApprovalKind.APPROVAL and not confirmations.requests_in(event_of(asked_at) or {}):
        raise runtime.ApprovalMismatch(f"Checkpoint {asked_at.pk} asks no confirmation; not acting on the decision.")
    return asked_at


def check_unanswered(asked_at: Checkpoint, asked: list[ConfirmationRequest]) -> None:
    """Refuse to answer confirmations whose tools have run on the answers already (a decision
    delivered again). Answers sent with no tool result after them (their attempt died first) are
    sent again: ADK runs those calls again, and the tool-call log answers any that ran."""
    answered: set[str] = set()
    ran: set[str] = set()
    since = Checkpoint.objects.filter(thread_id=asked_at.thread_id, branch_id=asked_at.branch_id,
                                      seq__gt=asked_at.seq, metadata__has_key="adk_event").order_by("seq")  # fmt: skip
    originals = {ask.original_id: ask.call_id for ask in asked if ask.original_id}
    for row in since.iterator():
        event = Event.model_validate(event_of(row))
        for reply in event.get_function_responses():
            if event.author == "user" and reply.id in {ask.call_id for ask in asked}:
                answered.add(reply.id)
            elif event.author != "user" and originals.get(reply.id or "") in answered:
                ran.add(originals[reply.id or ""])
    if ran and ran == answered == {ask.call_id for ask in asked}:
        raise runtime.ApprovalMismatch(
            f"The confirmations at checkpoint {asked_at.pk} were answered already; not answering them again."
        )


def register_adk_agent(name: str, *, version: str = "adk") -> Callable[[AgentFactory], AgentFactory]:
    """Decorator: make the worker resume the ADK app `name`, whose root agent this factory builds.
    The worker runs it as an ADK `App` of that name, so the name must be one ADK's App takes
    (ValueError here, not at the first resume)."""
    validate_app_name(name)

    def register(factory: AgentFactory) -> AgentFactory:
        agent_class = type(
            f"AdkAgent[{name}]",
            (AdkAgent,),
            {"name": name, "version": version, "build": staticmethod(factory), "__module__": factory.__module__},
        )
        runtime.register(agent_class)
        return factory

    return register
