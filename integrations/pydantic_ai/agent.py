"""`QuicksaveAgent`: a Pydantic AI agent whose runs are checkpointed on a Quicksave thread.

Like Pydantic AI's own durable-execution wrappers it wraps an agent through the public
`WrapperAgent` interface, and adds one capability to each run:

    agent = Agent("openai:gpt-5.2", output_type=[str, DeferredToolRequests], name="trips")
    trips = QuicksaveAgent(agent)
    result = await trips.run("Book me a flight to Lisbon", conversation_id="trip-7")

The conversation id names the thread (created with `framework: "pydantic-ai"` in its metadata);
a run without `message_history` goes on from the thread's latest checkpoint. The message history
is checkpointed after every model response and after every batch of tool returns, and once more
when the run ends: completed, with its output, or waiting for approval when it ends with
`DeferredToolRequests` (integrations.pydantic_ai.deferred files those in the inbox).

Tool calls are exactly-once the way the runtime's are (quicksave_agents.tool_calls): the intent is recorded
before the tool runs and its result after, keyed by the checkpoint holding the model response the call came in
and its tool call id, so a run that goes on from that checkpoint after a crash gets the recorded result
instead of calling the tool again; a call that may have run without a recorded result goes to a
person (an in-doubt item), unless its tool says `metadata={"idempotent": True}`.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncGenerator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

from asgiref.sync import sync_to_async
from django.db import transaction
from pydantic_ai import (
    ApprovalRequired,
    CallDeferred,
    DeferredToolRequests,
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelRequestNode,
    ModelResponse,
    RunContext,
    ToolCallPart,
    UserError,
)
from pydantic_ai.agent import AbstractAgent, AgentRun, WrapperAgent
from pydantic_ai.capabilities import (
    AbstractCapability,
    AgentCapability,
    AgentNode,
    NodeResult,
    ValidatedToolArgs,
    WrapToolExecuteHandler,
)
from pydantic_ai.tools import AgentDepsT, ToolDefinition
from pydantic_core import to_jsonable_python

from approvals.models import ApprovalRequest
from approvals.services import file_in_doubt
from checkpoints.models import Checkpoint, CheckpointStatus, Thread
from integrations.pydantic_ai import deferred, threads
from quicksave_agents import tool_calls
from quicksave_agents.fencing import Fence
from quicksave_agents.models import ToolCall


class CallInDoubt(Exception):
    """A tool call may have run without a recorded result; a person says whether it did."""

    def __init__(self, call: ToolCall) -> None:
        super().__init__(f"{call.tool} (call {call.key[:12]}) is in doubt; it waits for a person")
        self.call = call


def dump(messages: Sequence[ModelMessage]) -> list[Any]:
    """The message history as JSON, as a checkpoint keeps it."""
    return ModelMessagesTypeAdapter.dump_python(list(messages), mode="json")


def load(stored: list[Any]) -> list[ModelMessage]:
    return ModelMessagesTypeAdapter.validate_python(stored)


class Checkpointing(AbstractCapability[Any]):
    """The capability a QuicksaveAgent adds to each run: checkpoints and exactly-once tool calls."""

    def __init__(self, *, thread: Thread, head: Checkpoint | None, fence: Fence | None,
                 lease_held: Callable[[], bool], carried: ApprovalRequest | None = None) -> None:  # fmt: skip
        self.thread = thread
        self.carried = carried
        self.head = head
        self.state: dict[str, Any] = threads.state_of(head) if head is not None else {"messages": []}
        self.fence = fence
        self.lease_held = lease_held

    # ----------------------------------------------------------------- checkpoints

    def history(self) -> list[ModelMessage]:
        return load(self.state["messages"])

    def save(
        self, after: dict[str, Any], *, label: str, status: str = CheckpointStatus.RUNNING, model: str = ""
    ) -> Checkpoint:
        self.check_lease()
        self.head = threads.append(thread=self.thread, parent=self.head, before=self.state, after=after, label=label,
                                   status=status, model=model, fence=self.fence)  # fmt: skip
        self.state = after
        return self.head

    async def before_node_run(self, ctx: RunContext[Any], *, node: AgentNode[Any]) -> AgentNode[Any]:
        self.check_lease()
        return node

    async def after_node_run(
        self, ctx: RunContext[Any], *, node: AgentNode[Any], result: NodeResult[Any]
    ) -> NodeResult[Any]:
        messages = list(ctx.messages)
        if isinstance(result, ModelRequestNode) and not (messages and messages[-1] == result.request):
            # Tool returns (or the prompt) travel in the next request before it joins the history.
            messages.append(result.request)
        stored = dump(messages)
        if stored != self.state["messages"]:
            last = messages[-1]
            model = (last.model_name or "") if isinstance(last, ModelResponse) else ""
            await sync_to_async(self.save)({"messages": stored}, label=_label(last), model=model)
        return result

    def ended(self, output: Any, messages: Sequence[ModelMessage]) -> None:
        """Checkpoint the end of a run: waiting for approval on its deferred calls, or completed."""
        stored = dump(messages)
        if not isinstance(output, DeferredToolRequests):
            self.save({"messages": stored, "output": to_jsonable_python(output)}, label="done",
                      status=CheckpointStatus.COMPLETED)  # fmt: skip
            return
        described = deferred.describe(output)
        items = deferred.items_of(described)
        tools = ", ".join(dict.fromkeys(item.tool for item in items))
        with transaction.atomic():
            waiting = self.save({"messages": stored, "deferred": described}, label=f"approval: {tools}"[:200],
                                status=CheckpointStatus.WAITING_FOR_APPROVAL)  # fmt: skip
            if self.carried is not None:
                deferred.carry(thread=self.thread, checkpoint=waiting, items=items, approval=self.carried)
            deferred.file_next(thread=self.thread, checkpoint=waiting, items=items, fence=self.fence)

    # ----------------------------------------------------------------- tool calls

    def check_lease(self) -> None:
        if self.fence is not None and not self.lease_held():
            raise self.fence.lost(thread_id=self.thread.pk)

    async def wrap_tool_execute(
        self,
        ctx: RunContext[Any],
        *,
        call: ToolCallPart,
        tool_def: ToolDefinition,
        args: ValidatedToolArgs,
        handler: WrapToolExecuteHandler,
    ) -> Any:
        key = _call_key(self.head, ctx, call)
        idempotent = (tool_def.metadata or {}).get("idempotent") is True
        begun = await sync_to_async(self._begin)(key, call.tool_name, call.args_as_dict(), idempotent)
        if begun.outcome is tool_calls.Outcome.DONE:
            return _replayed(begun.call.result)
        if begun.outcome is tool_calls.Outcome.IN_DOUBT:
            await sync_to_async(self._in_doubt)(begun.call)
            raise CallInDoubt(begun.call)
        try:
            result = await handler(args)
        except (CallDeferred, ApprovalRequired) as deferral:
            # The tool handed the call to a person or another system: what a replay does too.
            await sync_to_async(tool_calls.finish)(thread_id=self.thread.pk, key=key, result=_deferral(deferral),
                                                   fence=self.fence)  # fmt: skip
            raise
        await sync_to_async(tool_calls.finish)(thread_id=self.thread.pk, key=key, result=to_jsonable_python(result),
                                               fence=self.fence)  # fmt: skip
        return result

    def _begin(self, key: str, tool: str, args: Any, idempotent: bool) -> tool_calls.Begun:
        self.check_lease()
        return tool_calls.begin(thread_id=self.thread.pk, key=key, tool=tool, args=args, idempotent=idempotent,
                                fence=self.fence)  # fmt: skip

    def _in_doubt(self, call: ToolCall) -> None:
        if self.head is None:
            raise RuntimeError(f"Call {call.key[:12]} is in doubt before the thread has a checkpoint.")
        file_in_doubt(call=call, checkpoint=self.head, fence=self.fence)


# What the call log records for a tool that deferred its call (CallDeferred, ApprovalRequired).
DEFERRAL = "quicksave:deferral"


def _deferral(deferral: CallDeferred | ApprovalRequired) -> dict[str, Any]:
    kind = deferral.kind if isinstance(deferral, CallDeferred) else "approval"
    return {DEFERRAL: kind, "metadata": to_jsonable_python(deferral.metadata)}


def _replayed(result: Any) -> Any:
    """A recorded result as the tool gave it: a recorded deferral is raised again."""
    if not (isinstance(result, dict) and DEFERRAL in result):
        return result
    if result[DEFERRAL] == "approval":
        raise ApprovalRequired(metadata=result["metadata"])
    raise CallDeferred(metadata=result["metadata"], kind=result[DEFERRAL])


def _call_key(checkpoint: Checkpoint | None, ctx: RunContext[Any], call: ToolCallPart) -> str:
    """The same for a call on every run that goes on from the checkpoint holding its model response
    (a retry after a crash, a decision): that checkpoint and the call's id; a fork's calls run anew.
    An approved call has a key of its own: unapproved, the tool may have run up to `ApprovalRequired`."""
    approved = "approved" if ctx.tool_call_approved else ""
    name = f"pydantic-ai/{checkpoint.pk if checkpoint else 'root'}/{call.tool_call_id}/{approved}"
    return hashlib.sha256(name.encode()).hexdigest()


def _label(message: ModelMessage) -> str:
    if isinstance(message, ModelResponse):
        calls = [part.tool_name for part in message.parts if isinstance(part, ToolCallPart)]
        return f"model: {', '.join(calls)}"[:200] if calls else "model: answer"
    if isinstance(message, ModelRequest):
        returned = [name for part in message.parts if (name := getattr(part, "tool_name", None))]
        return f"tools: {', '.join(returned)}"[:200] if returned else "request"
    return "messages"


class QuicksaveAgent(WrapperAgent[AgentDepsT, Any]):
    """Wrap `wrapped` so its runs checkpoint on the Quicksave thread named by their `conversation_id`.

    `name` is the Quicksave agent the threads belong to (default: the wrapped agent's name).
    `fence`, `lease_held`, `start` and `carried` are the worker's: the run's claim, whether it still
    holds its lease, the checkpoint it goes on from (default: the thread's latest) and a decision a
    dashboard fork carried over to it.
    """

    def __init__(
        self,
        wrapped: AbstractAgent[AgentDepsT, Any],
        *,
        name: str | None = None,
        version: str = "1",
        fence: Fence | None = None,
        lease_held: Callable[[], bool] | None = None,
        start: Checkpoint | None = None,
        carried: ApprovalRequest | None = None,
    ) -> None:
        super().__init__(wrapped)
        agent_name = name or wrapped.name
        if not agent_name:
            raise UserError("A QuicksaveAgent needs a name: give the wrapped agent one, or pass `name=`.")
        self.agent_name = agent_name
        self.version = version
        self.fence = fence
        self.lease_held = lease_held or (lambda: True)
        self.start = start
        self.carried = carried

    def open(self, conversation_id: str) -> Checkpointing:
        """The checkpointing of a run in conversation `conversation_id` (its thread created if new)."""
        thread = threads.open_thread(agent=self.agent_name, version=self.version, conversation_id=conversation_id)
        head = self.start if self.start is not None else threads.head(thread)
        return Checkpointing(thread=thread, head=head, fence=self.fence, lease_held=self.lease_held,
                             carried=self.carried)  # fmt: skip

    @asynccontextmanager
    async def iter(
        self,
        user_prompt: Any = None,
        *,
        conversation_id: str | None = None,
        message_history: Sequence[ModelMessage] | None = None,
        capabilities: Sequence[AgentCapability[AgentDepsT]] | None = None,
        **options: Any,
    ) -> AsyncGenerator[AgentRun[AgentDepsT, Any]]:
        if not conversation_id or conversation_id == "new":
            raise UserError("A QuicksaveAgent run needs the `conversation_id` of its thread.")
        checkpointing = await sync_to_async(self.open)(conversation_id)
        history = list(message_history) if message_history is not None else checkpointing.history()
        async with self.wrapped.iter(
            user_prompt, conversation_id=conversation_id, message_history=history,
            capabilities=[*(capabilities or ()), checkpointing], **options,
        ) as run:  # fmt: skip
            yield run
        if run.result is not None:
            await sync_to_async(checkpointing.ended)(run.result.output, run.result.all_messages())
