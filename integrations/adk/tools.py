"""ADK tool calls through Quicksave's tool-call log (quicksave_agents.tool_calls), as an ADK plugin.

`ToolCallLog(service)` in an App's plugins makes every tool call of the invocation exactly-once:
the intent is committed before the tool runs (ADK's before-tool callback) and its result after
(the after-tool callback), keyed by the session's thread, the invocation, the model's function
call id and whether the call runs with a person's confirmation. A call ADK runs again under the
same key (the worker resending a confirmation after an attempt died) is answered from the log:

- its result recorded: the tool is not called; the recorded result and what the tool did to its
  context's actions (state delta, a confirmation it asked for, skip_summarization) are its answer;
- started by another attempt with no result recorded: the call is in doubt, since that attempt
  may have died before the effect or after it. The invocation stops (`CallInDoubt`) and the
  runner puts the call before a person (approvals.services.file_in_doubt); their answer is what
  the call returns next time. A tool whose `custom_metadata` says `{"idempotent": True}` runs
  again instead: it makes its effect once by itself, e.g. keyed by `tool_context.invocation_id`
  and `tool_context.function_call_id`, which are the same whenever ADK runs the call again.

Every write carries the service's fence, and the lease is checked before each call starts. The
worker's runner installs the plugin (integrations.adk.runner); an application's own Runner adds
it with `App(name=..., root_agent=..., plugins=[ToolCallLog(service)])`.
"""

from __future__ import annotations

import hashlib
from typing import Any
from uuid import UUID

from channels.db import database_sync_to_async
from google.adk.events.event_actions import EventActions
from google.adk.plugins.base_plugin import BasePlugin
from google.adk.tools.base_tool import BaseTool
from google.adk.tools.tool_context import ToolContext
from pydantic_core import to_jsonable_python

from integrations.adk.sessions import QuicksaveSessionService
from quicksave_agents import tool_calls
from quicksave_agents.models import ToolCall

# What the log records of a call: the tool's result and what it did to its context's actions.
RECORD = "quicksave:adk-tool"


class CallInDoubt(Exception):
    """A tool call may have run without a recorded result; a person says whether it did."""

    def __init__(self, call: ToolCall) -> None:
        super().__init__(f"{call.tool} (call {call.key[:12]}) is in doubt; it waits for a person")
        self.call = call


def call_key(*, thread_id: UUID, invocation_id: str, call_id: str | None, confirmed: bool) -> str:
    """The log key of a model's function call: the same whenever ADK runs that call again in that
    invocation (a resent confirmation), another for the confirmed run of a call than for the run
    that asked for the confirmation."""
    parts = ("adk", str(thread_id), invocation_id, call_id or "", "confirmed" if confirmed else "")
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()


class ToolCallLog(BasePlugin):
    """The ADK plugin that logs each tool call of a QuicksaveSessionService session (see the module docstring)."""

    def __init__(self, service: QuicksaveSessionService) -> None:
        super().__init__(name="quicksave_tool_calls")
        self.service = service
        self._answered: set[str] = set()  # keys answered from the log, whose after-callback records nothing

    def _key(self, tool_context: ToolContext) -> tuple[UUID, str]:
        thread_id = self.service.thread_of(tool_context.session).pk
        return thread_id, call_key(thread_id=thread_id, invocation_id=tool_context.invocation_id,
                                   call_id=tool_context.function_call_id,
                                   confirmed=tool_context.tool_confirmation is not None)  # fmt: skip

    async def before_tool_callback(
        self, *, tool: BaseTool, tool_args: dict[str, Any], tool_context: ToolContext
    ) -> dict[str, Any] | None:
        begun = await database_sync_to_async(self._begin)(tool, tool_args, tool_context)
        if begun.outcome is tool_calls.Outcome.IN_DOUBT:
            raise CallInDoubt(begun.call)
        if begun.outcome is tool_calls.Outcome.RUN:
            return None
        self._answered.add(begun.call.key)
        return replayed(begun.call.result, tool_context)

    async def after_tool_callback(
        self, *, tool: BaseTool, tool_args: dict[str, Any], tool_context: ToolContext, result: Any
    ) -> dict[str, Any] | None:
        await database_sync_to_async(self._finish)(tool_context, result)
        return None  # the result stands as the tool gave it

    def _begin(self, tool: BaseTool, args: dict[str, Any], tool_context: ToolContext) -> tool_calls.Begun:
        thread_id, key = self._key(tool_context)
        service = self.service
        if service.fence is not None and not service.lease_held():
            raise service.fence.lost(thread_id=thread_id)
        idempotent = (tool.custom_metadata or {}).get("idempotent") is True
        return tool_calls.begin(thread_id=thread_id, key=key, tool=tool.name,
                                args=to_jsonable_python(args, fallback=str), idempotent=idempotent,
                                fence=service.fence)  # fmt: skip

    def _finish(self, tool_context: ToolContext, result: Any) -> None:
        thread_id, key = self._key(tool_context)
        if key in self._answered:
            self._answered.discard(key)
            return
        record = {RECORD: 1, "result": to_jsonable_python(result, fallback=str),
                  "actions": tool_context.actions.model_dump(mode="json", exclude_none=True)}  # fmt: skip
        tool_calls.finish(thread_id=thread_id, key=key, result=record, fence=self.service.fence)


def replayed(recorded: Any, tool_context: ToolContext) -> dict[str, Any]:
    """A recorded call as ADK takes a tool's answer: its result, and its actions restored onto the
    call's context. A result a person gave for a call in doubt is the result alone."""
    if isinstance(recorded, dict) and recorded.get(RECORD) == 1:
        restored = EventActions.model_validate(recorded["actions"])
        for name in restored.model_fields_set:
            now, then = getattr(tool_context.actions, name), getattr(restored, name)
            if isinstance(now, dict) and isinstance(then, dict):
                now.update(then)  # in place: the context's state view writes to this very state_delta
            else:
                setattr(tool_context.actions, name, then)
        recorded = recorded["result"]
    # ADK reads None as "no answer, run the tool", and shows the model a non-dict result as this.
    return recorded if isinstance(recorded, dict) else {"result": recorded}
