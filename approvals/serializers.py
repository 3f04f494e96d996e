"""Request shapes and response bodies of the approvals API."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from approvals.models import ApprovalKind, ApprovalRequest, ApprovalStatus, Resolution, Risk
from quicksave.api import FenceField, StrictSerializer
from quicksave_agents.serializers import ToolCallSchemaSerializer, tool_call_data


def approval_data(approval: ApprovalRequest) -> dict[str, Any]:
    """An approval as the API returns it; `decision` is null while it is pending.

    An in-doubt call (`kind: "in_doubt"`) carries its `tool_call`; a request whose sealed values do
    not open carries the reason in `unreadable`, and null `args`.
    """
    unreadable = approval.unreadable
    decision = None
    if approval.status != ApprovalStatus.PENDING:
        decision = {
            "status": approval.status,
            "resolution": approval.resolution or None,
            "args": None if unreadable else approval.decided_args,
            "args_edited": approval.args_edited,
            "comment": approval.comment,
            "decided_by": approval.decided_by.get_username() if approval.decided_by else None,
            "decided_at": approval.decided_at.isoformat() if approval.decided_at else None,
        }
    return {
        "id": str(approval.pk),
        "kind": approval.kind,
        "thread": str(approval.thread_id),
        "agent": approval.thread.agent.name,
        "checkpoint": str(approval.checkpoint_id),
        "action": approval.action,
        "args": None if unreadable else approval.args,
        "unreadable": unreadable or None,
        "message": approval.message,
        "risk": approval.risk,
        "expires_at": approval.expires_at.isoformat() if approval.expires_at else None,
        "status": approval.status,
        "created_at": approval.created_at.isoformat(),
        "decision": decision,
        "tool_call": tool_call_data(approval.tool_call) if approval.tool_call_id and approval.tool_call else None,
    }


class DecisionSchemaSerializer(serializers.Serializer[Any]):
    status = serializers.ChoiceField(choices=ApprovalStatus.choices)
    resolution = serializers.ChoiceField(choices=Resolution.choices, allow_null=True,
                                         help_text="The answer on an in-doubt call; null for an approval.")  # fmt: skip
    args = serializers.JSONField(allow_null=True, help_text="Approved args (the edited ones when edited).")
    args_edited = serializers.BooleanField()
    comment = serializers.CharField(allow_blank=True)
    decided_by = serializers.CharField(allow_null=True)
    decided_at = serializers.DateTimeField(allow_null=True)


class ApprovalSchemaSerializer(serializers.Serializer[Any]):
    """The schema of `approval_data` for the OpenAPI document (a test keeps the two in step)."""

    id = serializers.UUIDField()
    kind = serializers.ChoiceField(choices=ApprovalKind.choices)
    thread = serializers.UUIDField()
    agent = serializers.CharField()
    checkpoint = serializers.UUIDField()
    action = serializers.CharField()
    args = serializers.JSONField(allow_null=True)
    unreadable = serializers.CharField(allow_null=True, help_text="Why the sealed args do not open, if they do not.")
    message = serializers.CharField(allow_blank=True)
    risk = serializers.ChoiceField(choices=Risk.choices)
    expires_at = serializers.DateTimeField(allow_null=True)
    status = serializers.ChoiceField(choices=ApprovalStatus.choices)
    created_at = serializers.DateTimeField()
    decision = DecisionSchemaSerializer(allow_null=True)
    tool_call = ToolCallSchemaSerializer(allow_null=True)


class ApprovalCreateSerializer(StrictSerializer):
    checkpoint = serializers.UUIDField()
    action = serializers.CharField(max_length=200)
    args = serializers.JSONField(required=False, default=dict)
    message = serializers.CharField(required=False, allow_blank=True, default="", max_length=10_000)
    risk = serializers.ChoiceField(choices=Risk.choices, required=False, default=Risk.HIGH)
    expires_at = serializers.DateTimeField(required=False, allow_null=True, default=None)
    fence = FenceField()


class DecisionSerializer(StrictSerializer):
    decision = serializers.ChoiceField(
        choices=["approve", "reject", *Resolution.values],
        help_text="approve or reject an approval; happened, not_happened or fail an in-doubt call.",
    )
    comment = serializers.CharField(required=False, allow_blank=True, default="", max_length=10_000)
    args = serializers.JSONField(required=False, default=None, help_text="Edited args (approve only).")
    result = serializers.JSONField(required=False, allow_null=True, help_text="The call's result (happened only).")


class ApprovalListQuerySerializer(serializers.Serializer[Any]):
    status = serializers.ChoiceField(choices=ApprovalStatus.choices, required=False)
    agent = serializers.SlugField(required=False, max_length=64)
    cursor = serializers.CharField(required=False)
    limit = serializers.IntegerField(required=False, min_value=1, max_value=200)
