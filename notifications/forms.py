"""The notifications pages' forms. Their rules are `notifications.endpoints`' own, so a form, the
API and the domain functions refuse the same things with the same words."""

from __future__ import annotations

import re
from typing import Any

from django import forms

from approvals.models import Risk
from notifications.endpoints import (
    MAX_RECIPIENTS,
    NAME_MAX,
    URL_MAX,
    SubscriptionSpec,
    name_problem,
    recipients_problem,
    subscription_problems,
    target_problems,
    url_problem,
)
from notifications.models import Kind, Notice

_SEPARATORS = re.compile(r"[,\s]+")


def split_list(text: str) -> list[str]:
    """A comma- or whitespace-separated list as typed in a field, without blanks or repeats."""
    return list(dict.fromkeys(item for item in _SEPARATORS.split(text.strip()) if item))


class SubscriptionForm(forms.Form):
    events = forms.MultipleChoiceField(
        choices=Notice.choices, widget=forms.CheckboxSelectMultiple, label="Events",
        error_messages={"required": "Choose at least one event."},
    )  # fmt: skip
    agents = forms.CharField(required=False, max_length=2000, label="Agents")
    actions = forms.CharField(required=False, max_length=4000, label="Actions")
    risks = forms.MultipleChoiceField(required=False, choices=Risk.choices, widget=forms.CheckboxSelectMultiple,
                                      label="Risks")  # fmt: skip

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if "events" not in data:
            return data
        spec = self.spec()
        for field, problem in subscription_problems(spec).items():
            self.add_error(field if field in self.fields else None, problem)
        return data

    def spec(self) -> SubscriptionSpec:
        data = self.cleaned_data
        return SubscriptionSpec(events=data["events"], agents=split_list(data.get("agents") or ""),
                                actions=[action.strip() for action in (data.get("actions") or "").split(",")
                                         if action.strip()],
                                risks=data.get("risks") or [])  # fmt: skip


class EndpointSettingsForm(forms.Form):
    """What a channel's page changes: everything but its kind (the URL is left as it is when blank)."""

    name = forms.CharField(max_length=NAME_MAX, label="Name")
    url = forms.CharField(required=False, max_length=URL_MAX, strip=True, label="URL")
    recipients = forms.CharField(required=False, max_length=MAX_RECIPIENTS * 260, label="Recipients")
    enabled = forms.BooleanField(required=False, label="Enabled")
    decision_links = forms.BooleanField(required=False, label="Decision links")

    def __init__(self, *args: Any, kind: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.kind = kind

    def clean_name(self) -> str:
        name: str = self.cleaned_data["name"]
        if problem := name_problem(name):
            raise forms.ValidationError(problem)
        return name

    def clean_recipients(self) -> list[str]:
        return split_list(self.cleaned_data.get("recipients") or "")

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if self.kind == Kind.EMAIL:
            if "recipients" in data and (problem := recipients_problem(data["recipients"])):
                self.add_error("recipients", problem)
        elif data.get("url") and (problem := url_problem(data["url"])):
            self.add_error("url", problem)
        return data

    def changes(self) -> dict[str, Any]:
        data = self.cleaned_data
        changes = {"name": data["name"], "enabled": data["enabled"], "decision_links": data["decision_links"]}
        if self.kind == Kind.EMAIL:
            changes["recipients"] = data["recipients"]
        elif data["url"]:
            changes["url"] = data["url"]
        return changes


class NewEndpointForm(SubscriptionForm):
    """A new channel with its first subscription."""

    name = forms.CharField(max_length=NAME_MAX, label="Name")
    kind = forms.ChoiceField(choices=Kind.choices, label="Kind")
    url = forms.CharField(required=False, max_length=URL_MAX, strip=True, label="URL")
    recipients = forms.CharField(required=False, max_length=MAX_RECIPIENTS * 260, label="Recipients")
    decision_links = forms.BooleanField(required=False, label="Decision links")

    def clean_name(self) -> str:
        name: str = self.cleaned_data["name"]
        if problem := name_problem(name):
            raise forms.ValidationError(problem)
        return name

    def clean_recipients(self) -> list[str]:
        return split_list(self.cleaned_data.get("recipients") or "")

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        if "kind" in data and "recipients" in data and "url" in data:
            for field, problem in target_problems(kind=data["kind"], url=data["url"],
                                                  recipients=data["recipients"]).items():  # fmt: skip
                self.add_error(field, problem)
        return data
