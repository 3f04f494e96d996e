"""The ADK demo: a hotel concierge on a scripted model (no network, no API key).

The concierge books a hotel with `book_hotel`, which asks for a confirmation whose payload (the
hotel, city and nights) a person can edit in the inbox; once approved it books what the person
approved and the model says so. `ScriptedLlm` is ADK's public model interface (a BaseLlm whose
turns are a function of the request), which the tests and the benchmark use too.

`seed` (a seeder `manage.py seed_demo` runs) starts one concierge session that waits in the inbox;
the worker finishes it once someone decides. QUICKSAVE_AGENT_MODULES includes this module by
default when ADK is installed, so the worker resumes the concierge and seed_demo finds the seeder.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable
from typing import Any

from google.adk.agents.base_agent import BaseAgent
from google.adk.agents.llm_agent import LlmAgent
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import Runner
from google.adk.tools.function_tool import FunctionTool
from google.adk.tools.tool_context import ToolContext
from google.genai import types

from checkpoints.models import Thread
from integrations.adk.runner import register_adk_agent
from integrations.adk.sessions import QuicksaveSessionService, find_thread
from quicksave_agents.demo import register_seeder

APP = "demo-adk-concierge"
USER = "demo-user"
SESSION = "demo-hotel-rome"

Script = Callable[[LlmRequest], LlmResponse]


class ScriptedLlm(BaseLlm):
    """A model whose every turn is `script(request)`: deterministic, so a run resumed in another
    process (the worker) gets the turn the first one would have."""

    model: str = "scripted"
    script: Script

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        yield self.script(llm_request)


def text(value: str) -> LlmResponse:
    return LlmResponse(content=types.Content(role="model", parts=[types.Part(text=value)]))


def call(name: str, args: dict[str, Any]) -> LlmResponse:
    return LlmResponse(content=types.Content(role="model", parts=[types.Part(
        function_call=types.FunctionCall(name=name, args=args))]))  # fmt: skip


def last_response(request: LlmRequest) -> dict[str, Any] | None:
    """The latest tool result in the conversation the model is shown."""
    for content in reversed(request.contents):
        for part in content.parts or []:
            if part.function_response is not None:
                return dict(part.function_response.response or {})
        if content.role == "user" and any(part.text for part in content.parts or []):
            return None
    return None


def concierge_script(request: LlmRequest) -> LlmResponse:
    result = last_response(request)
    if result is None:
        return call("book_hotel", {"city": "Rome", "nights": 3})
    if result.get("status") == "booked":
        return text(f"Booked {result['hotel']} in {result['city']} for {result['nights']} nights.")
    return text(f"Nothing booked: {result.get('status', 'no answer')}.")


def book_hotel(city: str, nights: int, tool_context: ToolContext) -> dict[str, Any]:
    """Book a hotel; a person confirms (and may change) the hotel, city and nights first."""
    confirmation = tool_context.tool_confirmation
    if confirmation is None:
        tool_context.request_confirmation(
            hint=f"Book a hotel in {city} for {nights} nights?",
            payload={"hotel": "Albergo del Senato", "city": city, "nights": nights},
        )
        # As ADK's own require_confirmation does: the invocation ends here, the model waits too.
        tool_context.actions.skip_summarization = True
        return {"status": "waiting for confirmation"}
    if not confirmation.confirmed:
        return {"status": "rejected"}
    booked = dict(confirmation.payload or {})
    return {"status": "booked", "hotel": booked.get("hotel"), "city": booked.get("city"),
            "nights": booked.get("nights")}  # fmt: skip


@register_adk_agent(APP)
def concierge() -> BaseAgent:
    return LlmAgent(name="concierge", model=ScriptedLlm(script=concierge_script),
                    instruction="Book what the user asks for.", tools=[FunctionTool(book_hotel)])  # fmt: skip


@register_seeder
def seed() -> Thread:
    """Start the demo session (once): it stops at the booking's confirmation, waiting in the inbox."""
    existing = find_thread(APP, USER, SESSION)
    if existing is not None:
        return existing

    async def start() -> None:
        service = QuicksaveSessionService()
        await service.create_session(app_name=APP, user_id=USER, session_id=SESSION)
        runner = Runner(app_name=APP, agent=concierge(), session_service=service)
        message = types.Content(role="user", parts=[types.Part(text="A hotel in Rome for three nights, please.")])
        async for _ in runner.run_async(user_id=USER, session_id=SESSION, new_message=message):
            pass

    asyncio.run(start())
    thread = find_thread(APP, USER, SESSION)
    assert thread is not None
    return thread
