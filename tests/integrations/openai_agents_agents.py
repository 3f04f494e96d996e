"""OpenAI Agents SDK agents for the integration's tests, on the SDK's scripted model
(`agents.testing.ScriptedModel`): no network, no API key, no trace export. The worker (a thread
of the test process) builds them by name, so the calls their tools make are seen here."""

from __future__ import annotations

from typing import Any

from agents import Agent, RunConfig, function_tool
from agents.testing import ModelCall, ModelStep, ScriptedModel, assistant_message, function_call

from integrations.openai_agents.runner import register_agent

TRANSFER = "oai-transfer"
TWO_CALLS = "oai-two-calls"
CHAT = "oai-chat"
RUN_CONFIG = RunConfig(tracing_disabled=True)
PAYMENT = {"to": "ACME Ltd", "amount": 120}
# What the tools were called with, in order (the worker runs in this process).
calls: list[tuple[str, dict[str, Any]]] = []


def _items(call: ModelCall) -> list[dict[str, Any]]:
    return [item for item in call.input if isinstance(item, dict)] if isinstance(call.input, list) else []


def transfer_respond(call: ModelCall) -> Any:
    """Ask to pay once per user message; after the tool answers, repeat what it said."""
    items = _items(call)
    if items and items[-1].get("type") == "function_call_output":
        return [assistant_message(f"Result: {items[-1].get('output')}", item_id=f"msg-{len(items)}")]
    users = sum(1 for item in items if item.get("role") == "user")
    return [function_call("pay", PAYMENT, call_id=f"call-pay-{users}")]


def two_calls_respond(call: ModelCall) -> Any:
    """Two calls needing approval in one response, then a summary."""
    items = _items(call)
    if items and items[-1].get("type") == "function_call_output":
        outputs = [str(item.get("output")) for item in items if item.get("type") == "function_call_output"]
        return [assistant_message(" | ".join(outputs), item_id=f"msg-{len(items)}")]
    return [function_call("pay", PAYMENT, call_id="call-a"),
            function_call("pay", {"to": "Globex", "amount": 75}, call_id="call-b")]  # fmt: skip


def chat_respond(call: ModelCall) -> Any:
    """Answer with how many items the model was shown (so a test sees what history it got)."""
    return [assistant_message(f"seen {len(_items(call))}", item_id=f"msg-{len(_items(call))}")]


@function_tool(needs_approval=True)
def pay(to: str, amount: int) -> str:
    """Pay a supplier (a person approves it first)."""
    calls.append(("pay", {"to": to, "amount": amount}))
    return f"paid {amount} to {to}"


def _agent(name: str, respond: Any) -> Agent[Any]:
    model = ScriptedModel([ModelStep.respond(respond) for _ in range(8)])
    return Agent(name=name, model=model, tools=[pay])


@register_agent(TRANSFER, run_config=RUN_CONFIG)
def transfer() -> Agent[Any]:
    return _agent(TRANSFER, transfer_respond)


@register_agent(TWO_CALLS, run_config=RUN_CONFIG)
def two_calls() -> Agent[Any]:
    return _agent(TWO_CALLS, two_calls_respond)


@register_agent(CHAT, run_config=RUN_CONFIG)
def chat() -> Agent[Any]:
    return _agent(CHAT, chat_respond)
