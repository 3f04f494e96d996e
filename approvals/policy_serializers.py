"""Request shapes and response bodies of the policies API: approval policies and auto-approve rules."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import Group, User
from rest_framework import serializers

from approvals import policies, rules
from approvals.models import ApprovalPolicy, AtDeadline, AutoApproveRule, DeciderRole, PolicyVersion, Risk
from quicksave.api import StrictSerializer
from quicksave_agents.models import Agent


def _names(model: Any, field: str, names: list[str], what: str) -> list[Any]:
    found = {getattr(row, field): row for row in model.objects.filter(**{f"{field}__in": names})}
    missing = [name for name in names if name not in found]
    if missing:
        raise serializers.ValidationError(f"No {what} is named {', '.join(repr(name) for name in missing)}.")
    return [found[name] for name in dict.fromkeys(names)]


def agent_named(name: str | None) -> Agent | None:
    if name is None:
        return None
    agent = Agent.objects.filter(name=name).first()
    if agent is None:
        raise serializers.ValidationError(f"No agent is named '{name}'.")
    return agent


class TermsSerializer(StrictSerializer):
    """What a policy says (`policies.Terms`); names of groups and people are resolved here."""

    role = serializers.ChoiceField(
        choices=DeciderRole.choices, allow_null=True, allow_blank=True, required=False, default=None,
        help_text="Who may decide by role; null: only the groups and people named (any reviewer if none is).",
    )  # fmt: skip
    groups = serializers.ListField(child=serializers.CharField(max_length=150), required=False, default=list,
                                   max_length=50, help_text="Names of groups whose members may decide.")  # fmt: skip
    users = serializers.ListField(child=serializers.CharField(max_length=150), required=False, default=list,
                                  max_length=50, help_text="User names of people who may decide.")  # fmt: skip
    approvals_needed = serializers.IntegerField(min_value=1, max_value=policies.MAX_QUORUM, required=False, default=1)
    rejections_needed = serializers.IntegerField(
        min_value=1, max_value=policies.MAX_QUORUM, required=False, default=1,
        help_text="1: any rejection rejects. More: a rejection counts once this many people rejected.",
    )  # fmt: skip
    starter_may_approve = serializers.BooleanField(required=False, default=False)
    deadline_minutes = serializers.IntegerField(min_value=1, max_value=policies.MAX_MINUTES, allow_null=True,
                                                required=False, default=None)  # fmt: skip
    at_deadline = serializers.ChoiceField(choices=AtDeadline.choices, required=False, default=AtDeadline.REJECT)
    escalate_to = serializers.CharField(
        max_length=150, allow_null=True, required=False, default=None,
        help_text="The group a request escalates to (at_deadline: escalate).",
    )  # fmt: skip
    escalation_minutes = serializers.IntegerField(
        min_value=1, max_value=policies.MAX_MINUTES, allow_null=True, required=False, default=None,
        help_text="How long the escalation group has before the request is rejected; null: no limit.",
    )  # fmt: skip

    def validate_groups(self, names: list[str]) -> list[Group]:
        return _names(Group, "name", names, "group")

    def validate_users(self, names: list[str]) -> list[User]:
        return _names(User, "username", names, "user")

    def validate_escalate_to(self, name: str | None) -> Group | None:
        return None if name is None else _names(Group, "name", [name], "group")[0]

    def terms(self) -> policies.Terms:
        data = self.validated_data
        return policies.Terms(
            role=data["role"] or "", groups=tuple(data["groups"]), users=tuple(data["users"]),
            approvals_needed=data["approvals_needed"], rejections_needed=data["rejections_needed"],
            starter_may_approve=data["starter_may_approve"], deadline_minutes=data["deadline_minutes"],
            at_deadline=data["at_deadline"], escalate_to=data["escalate_to"],
            escalation_minutes=data["escalation_minutes"],
        )  # fmt: skip


class PolicyCreateSerializer(TermsSerializer):
    agent = serializers.SlugField(max_length=64, allow_null=True, required=False, default=None,
                                  help_text="The agent whose requests it governs; null: every agent's.")  # fmt: skip
    action = serializers.CharField(max_length=200, allow_blank=True, required=False, default="",
                                   help_text="The action it governs; empty: any action.")  # fmt: skip

    def validate_agent(self, name: str | None) -> Agent | None:
        return agent_named(name)


class RetireSerializer(StrictSerializer):
    reason = serializers.CharField(required=False, allow_blank=True, default="", max_length=2000)


class VersionSchemaSerializer(serializers.Serializer[Any]):
    version = serializers.IntegerField()
    role = serializers.ChoiceField(choices=DeciderRole.choices, allow_null=True)
    groups = serializers.ListField(child=serializers.CharField())
    users = serializers.ListField(child=serializers.CharField())
    approvals_needed = serializers.IntegerField()
    rejections_needed = serializers.IntegerField()
    starter_may_approve = serializers.BooleanField()
    deadline_minutes = serializers.IntegerField(allow_null=True)
    at_deadline = serializers.ChoiceField(choices=AtDeadline.choices)
    escalate_to = serializers.CharField(allow_null=True)
    escalation_minutes = serializers.IntegerField(allow_null=True)
    changed_by = serializers.CharField(allow_null=True)
    changed_at = serializers.DateTimeField()


class PolicySchemaSerializer(VersionSchemaSerializer):
    """The schema of `policy_data` (a test keeps the two in step)."""

    id = serializers.IntegerField()
    agent = serializers.CharField(allow_null=True)
    action = serializers.CharField(allow_blank=True)
    retired_at = serializers.DateTimeField(allow_null=True)


class PolicyDetailSchemaSerializer(PolicySchemaSerializer):
    versions = VersionSchemaSerializer(many=True, help_text="Every version, newest first.")


def version_data(version: PolicyVersion) -> dict[str, Any]:
    described = policies.describe(version)
    del described["agent"], described["action"]
    return {
        **described,
        "changed_by": version.created_by.get_username() if version.created_by else None,
        "changed_at": version.created_at.isoformat(),
    }


def policy_data(
    policy: ApprovalPolicy, version: PolicyVersion, *, versions: list[PolicyVersion] | None = None
) -> dict[str, Any]:
    data = {
        "id": policy.pk,
        "agent": policy.agent.name if policy.agent else None,
        "action": policy.action,
        "retired_at": policy.retired_at.isoformat() if policy.retired_at else None,
        **version_data(version),
    }
    if versions is not None:
        data["versions"] = [version_data(each) for each in versions]
    return data


class ConditionSerializer(serializers.Serializer[Any]):
    path = serializers.CharField(allow_blank=True, help_text='A JSON Pointer into the args ("" is the whole args).')
    op = serializers.ChoiceField(choices=list(rules.OPS))
    value = serializers.JSONField()


class RuleCreateSerializer(StrictSerializer):
    name = serializers.CharField(max_length=100)
    agent = serializers.SlugField(max_length=64, allow_null=True, required=False, default=None,
                                  help_text="The agent whose requests it approves; null: any agent's.")  # fmt: skip
    action = serializers.CharField(max_length=200)
    conditions = serializers.ListField(child=serializers.JSONField(), required=False, default=list, max_length=50,
                                       help_text="[{path, op, value}], all of which must hold; op is one of "
                                                 + ", ".join(rules.OPS) + ".")  # fmt: skip
    args_schema = serializers.JSONField(required=False, default=None, allow_null=True,
                                        help_text="A JSON Schema (draft 2020-12) the args must satisfy.")  # fmt: skip
    max_risk = serializers.ChoiceField(choices=Risk.choices, required=False, default=Risk.LOW,
                                       help_text="The highest risk the rule approves.")  # fmt: skip
    expires_at = serializers.DateTimeField(required=False, allow_null=True, default=None)

    def validate_agent(self, name: str | None) -> Agent | None:
        return agent_named(name)


class RevokeSerializer(StrictSerializer):
    reason = serializers.CharField(required=False, allow_blank=True, default="", max_length=2000)


class SuggestQuerySerializer(serializers.Serializer[Any]):
    agent = serializers.SlugField(max_length=64, help_text="The agent whose decisions to look at.")
    action = serializers.CharField(max_length=200, help_text="The action whose decisions to look at.")
    last = serializers.IntegerField(min_value=2, max_value=rules.MAX_SUGGEST_LOOKBACK, required=False, default=5,
                                    help_text="How many of the latest human decisions must agree.")  # fmt: skip

    def validate_agent(self, name: str) -> Agent:
        agent = agent_named(name)
        assert agent is not None
        return agent


class RuleSchemaSerializer(serializers.Serializer[Any]):
    """The schema of `rule_data` (a test keeps the two in step)."""

    id = serializers.IntegerField()
    name = serializers.CharField()
    agent = serializers.CharField(allow_null=True)
    action = serializers.CharField()
    conditions = ConditionSerializer(many=True)
    args_schema = serializers.JSONField(allow_null=True)
    max_risk = serializers.ChoiceField(choices=Risk.choices)
    expires_at = serializers.DateTimeField(allow_null=True)
    live = serializers.BooleanField(help_text="Neither revoked nor expired: it approves matching requests.")
    approved = serializers.IntegerField(help_text="How many requests it approved.")
    created_by = serializers.CharField()
    created_at = serializers.DateTimeField()
    revoked_at = serializers.DateTimeField(allow_null=True)
    revoked_by = serializers.CharField(allow_null=True)
    revoke_reason = serializers.CharField(allow_blank=True)


class SuggestionSchemaSerializer(serializers.Serializer[Any]):
    agent = serializers.CharField()
    action = serializers.CharField()
    conditions = ConditionSerializer(many=True)
    max_risk = serializers.ChoiceField(choices=Risk.choices)
    based_on = serializers.ListField(child=serializers.UUIDField(), help_text="The approvals it is based on.")
    reason = serializers.CharField(allow_null=True, help_text="Why no rule is suggested; null when one is.")


def rule_data(rule: AutoApproveRule, *, approved: int) -> dict[str, Any]:
    return {
        "id": rule.pk,
        "name": rule.name,
        "agent": rule.agent.name if rule.agent else None,
        "action": rule.action,
        "conditions": rule.conditions,
        "args_schema": rule.args_schema,
        "max_risk": rule.max_risk,
        "expires_at": rule.expires_at.isoformat() if rule.expires_at else None,
        "live": rule.is_live(),
        "approved": approved,
        "created_by": rule.created_by.get_username(),
        "created_at": rule.created_at.isoformat(),
        "revoked_at": rule.revoked_at.isoformat() if rule.revoked_at else None,
        "revoked_by": rule.revoked_by.get_username() if rule.revoked_by else None,
        "revoke_reason": rule.revoke_reason,
    }


def suggestion_data(suggestion: rules.Suggestion) -> dict[str, Any]:
    return {
        "agent": suggestion.agent,
        "action": suggestion.action,
        "conditions": suggestion.conditions,
        "max_risk": suggestion.max_risk,
        "based_on": suggestion.based_on,
        "reason": suggestion.reason or None,
    }
