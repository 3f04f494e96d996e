"""Small Pydantic AI agents on a scripted model (`FunctionModel`: no network, no API key) for the
approval, exactly-once and fork tests, registered for the worker (the browser test's server loads
this module through QUICKSAVE_AGENT_MODULES)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from pydantic_ai import (
    Agent,
    CallDeferred,
    DeferredToolRequests,
    ModelMessage,
    ModelResponse,
    TextPart,
    Tool,
    ToolCallPart,
)
from pydantic_ai.messages import ModelRequest, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from integrations.pydantic_ai.runner import register_agent

TRIPS = "pai-trips"
PAIR = "pai-pair"
QUOTE = "pai-quote"
# How many times each tool ran, by tool: what the exactly-once tests count.
calls: Counter[str] = Counter()
# What a test has the booking tool do while it runs (after it counted itself).
during_booking: list[Callable[[], None]] = []


def _returns(messages: list[ModelMessage]) -> list[ToolReturnPart]:
    return [part for message in messages if isinstance(message, ModelRequest)
            for part in message.parts if isinstance(part, ToolReturnPart)]  # fmt: skip


def _responses(messages: list[ModelMessage]) -> int:
    return sum(1 for message in messages if isinstance(message, ModelResponse))


# Set to make the trips model fail once it has the booking's result (an outage of the model's API).
model_outage: list[str] = []


def _trips_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Find flights, then ask to book the first one, then say how it went."""
    turn = _responses(messages)
    if turn >= 2 and model_outage:
        raise RuntimeError(model_outage[0])
    if turn == 0:
        return ModelResponse(parts=[ToolCallPart("find_flights", {"to": "Lisbon"}, tool_call_id="find-1")])
    if turn == 1:
        return ModelResponse(parts=[ToolCallPart("book_flight", {"flight": "TP1350", "price": 129},
                                                 tool_call_id="book-1")])  # fmt: skip
    return ModelResponse(parts=[TextPart(f"Done: {_returns(messages)[-1].model_response_str()}")])


def _find_flights(to: str) -> list[dict[str, Any]]:
    calls["find_flights"] += 1
    return [{"flight": "TP1350", "to": to, "price": 129}]


def _book_flight(flight: str, price: int) -> str:
    calls["book_flight"] += 1
    for hook in during_booking:
        hook()
    return f"booked {flight} for {price} EUR"


@register_agent(TRIPS)
def trips() -> Agent[None, str | DeferredToolRequests]:
    tools = [Tool(_find_flights, name="find_flights"), Tool(_book_flight, name="book_flight", requires_approval=True)]
    return Agent(FunctionModel(_trips_model), output_type=[str, DeferredToolRequests], name=TRIPS, tools=tools)


def _pair_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Ask to book two flights at once, then list what came back."""
    if _responses(messages) == 0:
        return ModelResponse(parts=[
            ToolCallPart("book_flight", {"flight": "TP1350", "price": 129}, tool_call_id="book-out"),
            ToolCallPart("book_flight", {"flight": "TP1351", "price": 99}, tool_call_id="book-back"),
        ])  # fmt: skip
    return ModelResponse(parts=[TextPart(" | ".join(part.model_response_str() for part in _returns(messages)))])


@register_agent(PAIR)
def pair() -> Agent[None, str | DeferredToolRequests]:
    tools = [Tool(_book_flight, name="book_flight", requires_approval=True)]
    return Agent(FunctionModel(_pair_model), output_type=[str, DeferredToolRequests], name=PAIR, tools=tools)


def _quote_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Ask the finance team (a call that runs outside the agent) for a quote, then repeat it."""
    if _responses(messages) == 0:
        return ModelResponse(parts=[ToolCallPart("ask_finance", {"item": "laptop"}, tool_call_id="finance-1")])
    return ModelResponse(parts=[TextPart(f"Finance says: {_returns(messages)[-1].model_response_str()}")])


def _ask_finance(item: str) -> str:
    raise CallDeferred(metadata={"message": f"What does a {item} cost us?", "risk": "low"})


@register_agent(QUOTE)
def quote() -> Agent[None, str | DeferredToolRequests]:
    tools = [Tool(_ask_finance, name="ask_finance")]
    return Agent(FunctionModel(_quote_model), output_type=[str, DeferredToolRequests], name=QUOTE, tools=tools)
