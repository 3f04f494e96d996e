"""An OpenAI Agents SDK demo agent on the SDK's own scripted model (`agents.testing.ScriptedModel`:
no network, no API key, no trace export), which `manage.py seed_demo` starts so a new dashboard
shows an OpenAI Agents run waiting in the inbox.

The agent asks to book a hotel (a tool with `needs_approval=True`): the run stops with an
interruption and waits. Approve (or edit the nights, or reject) in the inbox and the worker
resumes it; the model then reports what the booking tool returned.
"""

from __future__ import annotations

from typing import Any

from agents import Agent, RunConfig, function_tool
from agents.testing import ModelCall, ModelStep, ScriptedModel, assistant_message, function_call
from asgiref.sync import async_to_sync

from checkpoints.models import Thread
from integrations.openai_agents.runner import register_agent, run_agent
from integrations.openai_agents.session import QuicksaveSession
from quicksave_agents.demo import register_seeder

DEMO = "demo-openai-agents-hotel"
CONVERSATION = "demo-openai-agents-porto"
RUN_CONFIG = RunConfig(tracing_disabled=True)
# Model calls one run of the demo may make (a step is used per call; the worker builds a new agent each run).
MAX_MODEL_CALLS = 8


def respond(call: ModelCall) -> Any:
    """What a model would say next in this conversation: book once per request, then report."""
    items = [item for item in call.input if isinstance(item, dict)] if isinstance(call.input, list) else []
    outputs = [item for item in items if item.get("type") == "function_call_output"]
    asked = [item for item in items if item.get("role") == "user"]
    if outputs and items[-1].get("type") == "function_call_output":
        return [assistant_message(f"Done: {outputs[-1].get('output')}", item_id=f"msg-{len(items)}")]
    booking = {"hotel": "Casa do Rio", "city": "Porto", "nights": 3}
    return [function_call("book_hotel", booking, call_id=f"call-book-{len(asked)}")]


@function_tool(needs_approval=True)
def book_hotel(hotel: str, city: str, nights: int) -> str:
    """Book a hotel room (a person approves it first)."""
    return f"Booked {nights} nights at {hotel}, {city}; reference QS-{city[:3].upper()}{nights}."


@register_agent(DEMO, run_config=RUN_CONFIG)
def hotel() -> Agent[Any]:
    model = ScriptedModel([ModelStep.respond(respond) for _ in range(MAX_MODEL_CALLS)])
    return Agent(name=DEMO, instructions="Book what the traveller asks for.", model=model, tools=[book_hotel])


@register_seeder
def seed() -> Thread:
    """Run the demo conversation until it waits for approval (once: a second seed leaves it be)."""
    existing = Thread.objects.filter(agent__name=DEMO, external_id=CONVERSATION).first()
    if existing is not None:
        return existing
    session = QuicksaveSession(CONVERSATION, agent=DEMO)
    async_to_sync(run_agent)(hotel(), "Book me three nights in Porto.", session=session, run_config=RUN_CONFIG)
    return session.thread
