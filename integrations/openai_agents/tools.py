"""An agent's function tools as the worker runs them: each call goes through Quicksave's tool-call
log (quicksave_agents.tool_calls), and a call a reviewer edited gets the edited arguments.

The log makes a resumed run's calls exactly-once: the intent is committed before the tool runs
and the result after, keyed by the checkpoint the run went on from and the model's call id. A
retried run gets the recorded result instead of calling again, and a call that another attempt
started without recording a result stops the run (`CallInDoubt`) and goes to a person as an
in-doubt call (approvals.services.file_in_doubt); their answer is what the tool returns next time.
Every write carries the run's fence.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any
from uuid import UUID

from agents import Agent, FunctionTool
from agents.tool_context import ToolContext
from channels.db import database_sync_to_async

from quicksave_agents import tool_calls
from quicksave_agents.fencing import Fence
from quicksave_agents.models import ToolCall


class CallInDoubt(Exception):
    """A call another attempt started and recorded no result for: a person says whether it happened."""

    def __init__(self, call: ToolCall) -> None:
        super().__init__(f"{call.tool} is in doubt")
        self.call = call


def call_key(*, thread_id: UUID, start: UUID, call_id: str) -> str:
    """The log key of a model's call in a run that went on from checkpoint `start`."""
    return hashlib.sha256("\x00".join(("openai-agents", str(thread_id), str(start), call_id)).encode()).hexdigest()


def guarded(
    agent: Agent[Any], *, thread_id: UUID, start: UUID, fence: Fence | None, edits: dict[str, Any]
) -> Agent[Any]:
    """`agent` whose function tools log each call and run an edited call with its edited arguments.

    `edits` (edited arguments by call id) is read when a tool runs, so decisions recorded after
    this call count: build the agent first, then hand it to `RunState.from_json`, which binds the
    run to that very agent."""

    def logged(tool: FunctionTool) -> FunctionTool:
        invoke = tool.on_invoke_tool

        async def on_invoke_tool(ctx: ToolContext[Any], arguments: str) -> Any:
            if ctx.tool_call_id in edits:
                arguments = json.dumps(edits[ctx.tool_call_id])
            try:
                args = json.loads(arguments) if arguments else {}
            except ValueError:
                args = arguments
            key = call_key(thread_id=thread_id, start=start, call_id=ctx.tool_call_id)
            begun = await database_sync_to_async(tool_calls.begin)(thread_id=thread_id, key=key, tool=tool.name,
                                                                   args=args, fence=fence)  # fmt: skip
            if begun.outcome is tool_calls.Outcome.DONE:
                return begun.call.result
            if begun.outcome is tool_calls.Outcome.IN_DOUBT:
                raise CallInDoubt(begun.call)
            result = await invoke(ctx, arguments)
            return await database_sync_to_async(tool_calls.finish)(thread_id=thread_id, key=key, result=result,
                                                                   fence=fence)  # fmt: skip

        return dataclasses.replace(tool, on_invoke_tool=on_invoke_tool)

    return agent.clone(tools=[logged(tool) if isinstance(tool, FunctionTool) else tool for tool in agent.tools])
