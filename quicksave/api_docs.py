"""What the API docs (/api/schema/, /api/docs/) say about every operation and parameter.

An operation's description is its view method's docstring (or `extend_schema(description=...)`), a
query parameter's the help_text of its query serializer's field. This drf-spectacular hook gives each
operation a summary (the first sentence of its description) for the docs' collapsed list, and
describes the path parameters, named the same way on every route, and DRF's `format`, once here. tests/test_api_docs.py
fails on an operation or parameter left without a description.
"""

from __future__ import annotations

import re
from typing import Any

PATH_PARAMETERS = {
    "thread_id": "The thread's id (a UUID).",
    "checkpoint_id": "The checkpoint's id (a UUID).",
    "approval_id": "The approval or in-doubt request's id (a UUID).",
    "run_id": "The run's id (a UUID), as `POST /api/v1/runs/claim/` returned it.",
    "key": "The key the agent chose for this tool call or cached result, unique within the thread.",
    "policy_id": "The approval policy's id.",
    "rule_id": "The auto-approve rule's id.",
    "endpoint_id": "The notification endpoint's id (a UUID).",
    "delivery_id": "The notification delivery's id.",
    "grant_id": "The memory namespace grant's id.",
}

# DRF's own query parameter on a view with several renderers (the JSON Lines exports).
QUERY_PARAMETERS = {
    "format": "The response's format, instead of the `Accept` header: `jsonl` for JSON Lines (`application/x-ndjson`) "
    "or `json`; an error is one JSON object either way.",
}


def first_sentence(text: str) -> str:
    """The description's first sentence (up to 120 characters), for the summary line."""
    sentence = re.split(r"(?<=[.!?:])\s", " ".join(text.split()), maxsplit=1)[0].rstrip(".:")
    return sentence if len(sentence) <= 120 else sentence[:119].rstrip() + "…"


def describe(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    """POSTPROCESSING_HOOKS entry: summaries from descriptions, descriptions of the path parameters."""
    for operations in result.get("paths", {}).values():
        for operation in operations.values():
            if not isinstance(operation, dict):
                continue
            description = (operation.get("description") or "").strip()
            if description and not operation.get("summary"):
                operation["summary"] = first_sentence(description)
            for parameter in operation.get("parameters", []):
                names = {"path": PATH_PARAMETERS, "query": QUERY_PARAMETERS}.get(parameter.get("in", ""), {})
                known = names.get(parameter.get("name", ""))
                if known and not parameter.get("description"):
                    parameter["description"] = known
    return result
