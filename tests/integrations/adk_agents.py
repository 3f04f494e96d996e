"""An ADK agent for the confirmation tests, beside the demo concierge: a transfer tool declared
with `require_confirmation` (ADK shows its arguments; a person cannot edit them)."""

from __future__ import annotations

from typing import Any

from google.adk.agents.base_agent import BaseAgent
from google.adk.agents.llm_agent import LlmAgent
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.tools.function_tool import FunctionTool

from integrations.adk.demo import ScriptedLlm, call, last_response, text
from integrations.adk.runner import register_adk_agent

TRANSFER = "adk-transfer"
DONE: list[dict[str, Any]] = []


def transfer(to: str, amount: int) -> dict[str, Any]:
    DONE.append({"to": to, "amount": amount})
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
