"""Response bodies of the agents app's API shared with the approvals API: a logged tool call."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from quicksave_agents.models import ToolCall, ToolCallState


def tool_call_data(call: ToolCall) -> dict[str, Any]:
    """A logged call as the API returns it, alone or inside an in-doubt approval: `result` once done;
    `unreadable` says why its sealed values do not open, if they do not."""
    unreadable = call.unreadable
    return {
        "key": call.key,
        "tool": call.tool,
        "state": call.state,
        "idempotent": call.idempotent,
        "run": str(call.run_id) if call.run_id else None,
        "attempt": call.attempt,
        "starts": call.starts,
        "started_at": call.started_at.isoformat(),
        "finished_at": call.finished_at.isoformat() if call.finished_at else None,
        "result": call.result if call.state == ToolCallState.DONE and not unreadable else None,
        "unreadable": unreadable or None,
    }


class ToolCallSchemaSerializer(serializers.Serializer[Any]):
    """The schema of `tool_call_data` for the OpenAPI document."""

    key = serializers.CharField(help_text="The call's idempotency key.")
    tool = serializers.CharField()
    state = serializers.ChoiceField(choices=ToolCallState.choices)
    idempotent = serializers.BooleanField()
    run = serializers.UUIDField(allow_null=True, help_text="The run whose attempt last started the call.")
    attempt = serializers.IntegerField(allow_null=True, help_text="That attempt (the one that died, when in doubt).")
    starts = serializers.IntegerField(help_text="How many times the call was started.")
    started_at = serializers.DateTimeField()
    finished_at = serializers.DateTimeField(allow_null=True)
    result = serializers.JSONField(allow_null=True)
    unreadable = serializers.CharField(allow_null=True, help_text="Why the sealed args or result do not open.")
