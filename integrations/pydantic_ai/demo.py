"""A Pydantic AI demo agent on a scripted model (`FunctionModel`: no network, no API key), which
`manage.py seed_demo` starts so a new dashboard shows a Pydantic AI run waiting in the inbox.

The agent looks up fares, then asks to book the cheapest one (a tool that `requires_approval`):
the run ends with `DeferredToolRequests` and waits. Approve (or edit the price, or reject) in the
inbox and the worker resumes it; the model then reports what the booking tool returned.
"""

from __future__ import annotations

from typing import Any

from asgiref.sync import async_to_sync
from pydantic_ai import (
    Agent,
    DeferredToolRequests,
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    Tool,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from checkpoints.models import Thread
from integrations.pydantic_ai.agent import QuicksaveAgent
from integrations.pydantic_ai.runner import register_agent
from quicksave_agents.demo import register_seeder

DEMO = "demo-pydantic-ai-travel"
CONVERSATION = "demo-pydantic-ai-lisbon"
FARES: list[dict[str, Any]] = [
    {"flight": "TP1351", "to": "LIS", "price": 142},
    {"flight": "FR8342", "to": "LIS", "price": 89},
]


def _scripted(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """What a model would say at each turn of this conversation."""
    turn = sum(1 for message in messages if isinstance(message, ModelResponse))
    if turn == 0:
        return ModelResponse(parts=[ToolCallPart("search_fares", {"to": "LIS"}, tool_call_id="search-1")])
    if turn == 1:
        cheapest = min(FARES, key=lambda fare: int(fare["price"]))
        booking = {"flight": cheapest["flight"], "price": cheapest["price"]}
        return ModelResponse(parts=[
            TextPart(f"The cheapest fare is {cheapest['flight']} at {cheapest['price']} EUR; booking it."),
            ToolCallPart("book_fare", booking, tool_call_id="book-1"),
        ])  # fmt: skip
    returned = [part for message in messages if isinstance(message, ModelRequest)
                for part in message.parts if isinstance(part, ToolReturnPart)]  # fmt: skip
    return ModelResponse(parts=[TextPart(f"All done: {returned[-1].model_response_str()}")])


def search_fares(to: str) -> list[dict[str, Any]]:
    """Fares to an airport."""
    return [fare for fare in FARES if fare["to"] == to]


def book_fare(flight: str, price: int) -> str:
    """Book a fare (a person approves it first)."""
    return f"Booked {flight} for {price} EUR, reference QS-{flight}."


@register_agent(DEMO)
def travel() -> Agent[None, str | DeferredToolRequests]:
    tools = [Tool(search_fares), Tool(book_fare, requires_approval=True)]
    return Agent(FunctionModel(_scripted), output_type=[str, DeferredToolRequests], name=DEMO, tools=tools)


@register_seeder
def seed() -> Thread:
    """Run the demo conversation until it waits for approval (once: a second seed leaves it be)."""
    existing = Thread.objects.filter(agent__name=DEMO, external_id=CONVERSATION).first()
    if existing is not None:
        return existing
    agent = QuicksaveAgent(travel(), name=DEMO)
    async_to_sync(agent.run)("Find me the cheapest flight to Lisbon and book it.", conversation_id=CONVERSATION)
    return Thread.objects.get(agent__name=DEMO, external_id=CONVERSATION)
