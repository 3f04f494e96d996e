"""The forms of the policy pages: an approval policy's terms, and an auto-approve rule."""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.contrib.auth.models import Group, User

from approvals import policies, rules
from approvals.models import AtDeadline, DeciderRole, Risk
from quicksave.jsontext import loads_strict
from quicksave_agents.models import Agent


class TermsForm(forms.Form):
    role = forms.ChoiceField(
        required=False, label="Role",
        choices=[("", "— no role: only the groups and people below —"), *DeciderRole.choices],
        help_text="With no role, group or person chosen, anyone with the reviewer role decides.",
    )  # fmt: skip
    groups = forms.ModelMultipleChoiceField(
        required=False, queryset=Group.objects.order_by("name"), widget=forms.CheckboxSelectMultiple,
        label="Groups whose members may decide",
    )  # fmt: skip
    users = forms.ModelMultipleChoiceField(
        required=False, queryset=User.objects.filter(is_active=True).order_by("username"),
        label="People who may decide",
        help_text="Deciding also needs the reviewer role.",
    )  # fmt: skip
    approvals_needed = forms.IntegerField(min_value=1, max_value=policies.MAX_QUORUM, initial=1,
                                          label="Approvals needed (from different people)")  # fmt: skip
    rejections_needed = forms.IntegerField(min_value=1, max_value=policies.MAX_QUORUM, initial=1,
                                           label="Rejections that reject it",
                                           help_text="1: any rejection rejects the request.")  # fmt: skip
    starter_may_approve = forms.BooleanField(required=False, label="The person who started the thread may approve it")
    deadline_minutes = forms.IntegerField(
        required=False, min_value=1, max_value=policies.MAX_MINUTES, label="Deadline (minutes after the request)",
        help_text="Empty: only the agent's own deadline, if it sets one.",
    )  # fmt: skip
    at_deadline = forms.ChoiceField(choices=AtDeadline.choices, initial=AtDeadline.REJECT, label="At the deadline")
    escalate_to = forms.ModelChoiceField(required=False, queryset=Group.objects.order_by("name"),
                                         label="Escalate to")  # fmt: skip
    escalation_minutes = forms.IntegerField(
        required=False, min_value=1, max_value=policies.MAX_MINUTES, label="Minutes the escalation group has",
        help_text="After them the request is rejected. Empty: no limit.",
    )  # fmt: skip

    def terms(self) -> policies.Terms:
        data = self.cleaned_data
        return policies.Terms(
            role=data["role"], groups=tuple(data["groups"]), users=tuple(data["users"]),
            approvals_needed=data["approvals_needed"], rejections_needed=data["rejections_needed"],
            starter_may_approve=data["starter_may_approve"], deadline_minutes=data["deadline_minutes"],
            at_deadline=data["at_deadline"], escalate_to=data["escalate_to"],
            escalation_minutes=data["escalation_minutes"],
        )  # fmt: skip

    @staticmethod
    def initial_from(terms: policies.Terms) -> dict[str, Any]:
        return {
            "role": terms.role, "groups": list(terms.groups), "users": list(terms.users),
            "approvals_needed": terms.approvals_needed, "rejections_needed": terms.rejections_needed,
            "starter_may_approve": terms.starter_may_approve, "deadline_minutes": terms.deadline_minutes,
            "at_deadline": terms.at_deadline, "escalate_to": terms.escalate_to,
            "escalation_minutes": terms.escalation_minutes,
        }  # fmt: skip


class PolicyForm(TermsForm):
    agent = forms.ModelChoiceField(required=False, queryset=Agent.objects.order_by("name"), empty_label="Any agent",
                                   label="Agent")  # fmt: skip
    action = forms.CharField(required=False, max_length=200, label="Action",
                             help_text="Empty: every action of the agent.")  # fmt: skip
    field_order = ["agent", "action"]


class ReasonForm(forms.Form):
    reason = forms.CharField(required=False, max_length=2000, widget=forms.Textarea(attrs={"rows": 2}),
                             label="Reason (kept in the audit trail)")  # fmt: skip


class JSONTextField(forms.CharField):
    """A JSON value typed into a text area (strict: no NaN, no duplicate keys)."""

    widget = forms.Textarea(attrs={"rows": 5, "spellcheck": "false", "class": "mono"})

    def to_python(self, value: Any) -> Any:
        text = super().to_python(value)
        if not text:
            return None
        try:
            return loads_strict(text)
        except ValueError as exc:
            raise forms.ValidationError(f"This is not valid JSON: {exc}") from None

    def prepare_value(self, value: Any) -> Any:
        return value if isinstance(value, str) or value is None else json.dumps(value, indent=2, ensure_ascii=False)


class RuleForm(forms.Form):
    name = forms.CharField(max_length=100, label="Name", help_text="What the rule approves, in a few words.")
    agent = forms.ModelChoiceField(required=False, queryset=Agent.objects.order_by("name"), empty_label="Any agent",
                                   label="Agent")  # fmt: skip
    action = forms.CharField(max_length=200, label="Action")
    conditions = JSONTextField(
        required=False, label="Conditions on the args (JSON)",
        help_text='A list of {"path": "/price", "op": "lt", "value": 500}, all of which must hold; op is one of '
                  + ", ".join(rules.OPS) + '. The path is a JSON Pointer ("" is the whole args).',
    )  # fmt: skip
    args_schema = JSONTextField(required=False, label="JSON Schema the args must satisfy (optional)")
    max_risk = forms.ChoiceField(choices=Risk.choices, initial=Risk.LOW, label="Highest risk it approves")
    expires_at = forms.DateTimeField(
        required=False, label="Expires at", widget=forms.DateTimeInput(attrs={"type": "datetime-local"}),
        help_text="Empty: until revoked.",
    )  # fmt: skip

    def clean_conditions(self) -> list[Any]:
        value = self.cleaned_data["conditions"]
        return [] if value is None else value
