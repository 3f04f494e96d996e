"""Request shapes and response bodies of the approvals API."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import inline_serializer
from rest_framework import serializers

from approvals.models import ApprovalKind, ApprovalRequest, ApprovalStatus, Resolution, Risk
from quicksave.api import FenceField, StrictSerializer
from quicksave_agents.serializers import ToolCallSchemaSerializer, tool_call_data


def approval_data(approval: ApprovalRequest) -> dict[str, Any]:
    """An approval as the API returns it; `decision` is null while it is pending.

    An in-doubt call (`kind: "in_doubt"`) carries its `tool_call`; a request whose sealed values do
    not open carries the reason in `unreadable`, and null `args`. `quorum` says who approved and
    rejected so far, of how many needed. Reads `policy`, `rule` and `votes__user`: a list
    select- and prefetches them (`approvals.api.visible_approvals`).
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
            "rule": {"id": approval.rule.pk, "name": approval.rule.name} if approval.rule else None,
        }
    quorum = approval.quorum
    version = approval.policy
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
        "policy": {"id": version.policy_id, "version": version.version} if version else None,
        "quorum": {
            "approvals_needed": quorum.approvals_needed,
            "rejections_needed": quorum.rejections_needed,
            "approved_by": quorum.approved_by,
            "rejected_by": quorum.rejected_by,
        },
        "escalated_at": approval.escalated_at.isoformat() if approval.escalated_at else None,
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
    rule = inline_serializer(
        "DecidingRule",
        {"id": serializers.IntegerField(), "name": serializers.CharField()},
        allow_null=True,
        help_text="The auto-approve rule that decided, when no person did.",
    )


class PolicyRefSerializer(serializers.Serializer[Any]):
    id = serializers.IntegerField()
    version = serializers.IntegerField()


class QuorumSerializer(serializers.Serializer[Any]):
    approvals_needed = serializers.IntegerField()
    rejections_needed = serializers.IntegerField()
    approved_by = serializers.ListField(child=serializers.CharField(), help_text="Who approved so far, in order.")
    rejected_by = serializers.ListField(child=serializers.CharField())


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
    policy = PolicyRefSerializer(allow_null=True, help_text="The approval policy version it was filed under.")
    quorum = QuorumSerializer()
    escalated_at = serializers.DateTimeField(allow_null=True)


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
    status = serializers.ChoiceField(choices=ApprovalStatus.choices, required=False,
                                     help_text="Only the requests with this status.")  # fmt: skip
    assigned = serializers.ChoiceField(
        choices=["me"], required=False,
        help_text="me: only those the caller may decide and has not voted on (none for an agent key).",
    )  # fmt: skip
    agent = serializers.SlugField(required=False, max_length=64, help_text="Only the requests of this agent's threads.")
    cursor = serializers.CharField(
        required=False, help_text="The `next` URL's cursor: the page after the previous one."
    )
    limit = serializers.IntegerField(
        required=False, min_value=1, max_value=200, help_text="How many results a page holds, 1 to 200 (default 50)."
    )
