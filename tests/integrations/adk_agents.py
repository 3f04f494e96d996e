"""ADK agents for the confirmation and tool-call tests, beside the demo concierge: a transfer tool
declared with `require_confirmation` (ADK shows its arguments; a person cannot edit them), and a
room booker whose model asks for two rooms in one turn, each room confirmed with an editable
payload. And how the tests drive them: a session started as an application would, the worker
run until it has nothing to do, the session's last words."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any
from uuid import uuid4

from google.adk.agents.base_agent import BaseAgent
from google.adk.agents.llm_agent import LlmAgent
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import Runner
from google.adk.tools.function_tool import FunctionTool
from google.adk.tools.tool_context import ToolContext
from google.genai import types

from checkpoints.models import Thread
from integrations.adk.demo import ScriptedLlm, call, last_response, text
from integrations.adk.runner import register_adk_agent
from integrations.adk.sessions import QuicksaveSessionService, find_thread
from quicksave_agents.models import Run
from quicksave_agents.worker import Worker

TRANSFER = "adk-transfer"
IDEMPOTENT_TRANSFER = "adk-idempotent-transfer"
ROOMS = "adk-rooms"
DONE: list[dict[str, Any]] = []  # every transfer that really ran
DURING_TRANSFER: list[Callable[[], None]] = []  # what happens while a transfer runs
BOOKED: list[dict[str, Any]] = []  # every room booking that really ran


def transfer(to: str, amount: int) -> dict[str, Any]:
    DONE.append({"to": to, "amount": amount})
    for happening in DURING_TRANSFER:
        happening()
    return {"status": "sent", "to": to, "amount": amount}


def transfer_script(request: LlmRequest) -> LlmResponse:
    result = last_response(request)
    if result is None:
        return call("transfer", {"to": "ana", "amount": 40})
    return text(f"Transfer: {result.get('status') or result.get('error')}")


@register_adk_agent(TRANSFER)
def banker() -> BaseAgent:
    return LlmAgent(name="banker", model=ScriptedLlm(script=transfer_script),
                    tools=[FunctionTool(transfer, require_confirmation=True)])  # fmt: skip


@register_adk_agent(IDEMPOTENT_TRANSFER)
def idempotent_banker() -> BaseAgent:
    """The banker whose transfer tool says it is idempotent (a repeated order is made once)."""
    tool = FunctionTool(transfer, require_confirmation=True)
    tool.custom_metadata = {"idempotent": True}
    return LlmAgent(name="banker", model=ScriptedLlm(script=transfer_script), tools=[tool])


def book_room(city: str, tool_context: ToolContext) -> dict[str, Any]:
    """Book a room; a person confirms (and may change) the city and nights first."""
    confirmation = tool_context.tool_confirmation
    if confirmation is None:
        tool_context.request_confirmation(hint=f"Book a room in {city} for 2 nights?",
                                          payload={"city": city, "nights": 2})  # fmt: skip
        tool_context.actions.skip_summarization = True
        return {"status": "waiting for confirmation"}
    if not confirmation.confirmed:
        return {"city": city, "status": "rejected"}
    booked = dict(confirmation.payload or {})
    BOOKED.append(booked)
    return {"city": booked["city"], "status": f"booked for {booked['nights']} nights"}


def rooms_script(request: LlmRequest) -> LlmResponse:
    """Two rooms in one turn; once both are answered, one sentence on each."""
    last = request.contents[-1] if request.contents else None
    answers = [part.function_response.response or {} for part in (last.parts or []) if part.function_response] if (
        last is not None and last.role == "user") else []  # fmt: skip
    if not answers:
        calls = [types.Part(function_call=types.FunctionCall(name="book_room", args={"city": city}))
                 for city in ("Rome", "Milan")]  # fmt: skip
        return LlmResponse(content=types.Content(role="model", parts=calls))
    return text("; ".join(f"{answer.get('city')}: {answer.get('status')}" for answer in answers))


@register_adk_agent(ROOMS)
def rooms() -> BaseAgent:
    return LlmAgent(name="rooms", model=ScriptedLlm(script=rooms_script), tools=[FunctionTool(book_room)])


def start(app: str, factory: Callable[[], BaseAgent], words: str) -> Thread:
    """Create a session and run the agent on one user message, as an application would."""
    session_id = uuid4().hex

    async def run() -> None:
        service = QuicksaveSessionService()
        await service.create_session(app_name=app, user_id="ana", session_id=session_id)
        runner = Runner(app_name=app, agent=factory(), session_service=service)
        message = types.Content(role="user", parts=[types.Part(text=words)])
        async for _ in runner.run_async(user_id="ana", session_id=session_id, new_message=message):
            pass

    asyncio.run(run())
    thread = find_thread(app, "ana", session_id)
    assert thread is not None
    return Thread.objects.get(pk=thread.pk)


def drive(app: str) -> list[Run]:
    """Run the worker until no run of `app` is left; returns the app's runs, oldest first."""
    worker = Worker(agent_names=[app], name="adk-test")
    while worker.run_once():
        pass
    return list(Run.objects.filter(agent__name=app).order_by("created_at"))


def final_text(thread: Thread) -> str:
    """The text of the session's last event, as ADK reads it back."""
    info = thread.metadata["adk"]
    session = asyncio.run(QuicksaveSessionService().get_session(app_name=info["app_name"], user_id=info["user_id"],
                                                                session_id=info["session_id"]))  # fmt: skip
    assert session is not None and session.events[-1].content is not None and session.events[-1].content.parts
    return f"{session.events[-1].author}: {session.events[-1].content.parts[0].text}"
