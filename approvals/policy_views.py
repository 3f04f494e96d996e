"""The policy pages (admins only): approval policies with their versions, and auto-approve rules,
each created, changed, retired or revoked through approvals.policies and approvals.rules."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.auth.models import User
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods, require_safe

from approvals import policies, rules, selectors
from approvals.models import ApprovalPolicy, AutoApproveRule
from approvals.policy_forms import PolicyForm, ReasonForm, RuleForm, TermsForm
from audit.trail import client_address
from checkpoints.views import permission_required
from quicksave.errors import DomainError
from quicksave_agents.models import Agent

policy_manager_required = permission_required(
    "approvals.manage_policies", "Approval policies and auto-approve rules need the admin role."
)


def _actor(request: HttpRequest) -> User:
    user = request.user
    assert isinstance(user, User)  # permission_required signed them in
    return user


def _form_errors(form: forms.Form, error: DomainError) -> None:
    """Show a domain error under the fields it names (`detail.fields`), else above the form."""
    fields = error.detail.get("fields") or {}
    for name, problems in fields.items():
        for problem in problems:
            form.add_error(name if name in form.fields else None, problem)
    if not fields:
        form.add_error(None, error.message)


def _policy(policy_id: int) -> ApprovalPolicy:
    policy = selectors.policies_listed().filter(pk=policy_id).first()
    if policy is None:
        raise Http404(f"Policy {policy_id} does not exist.")
    return policy


def _rule(rule_id: int) -> AutoApproveRule:
    rule = selectors.rules_listed().filter(pk=rule_id).first()
    if rule is None:
        raise Http404(f"Rule {rule_id} does not exist.")
    return rule


@policy_manager_required
@require_safe
def policy_list(request: HttpRequest) -> HttpResponse:
    listed = list(selectors.policies_listed())
    context = {
        "nav": "policies",
        "policies": [(policy, selectors.current_version(policy)) for policy in listed if policy.retired_at is None],
        "retired": [(policy, selectors.current_version(policy)) for policy in listed if policy.retired_at is not None],
        "rules": list(selectors.rules_listed().order_by("revoked_at", "-created_at")),
        "agents": list(Agent.objects.order_by("name").values_list("name", flat=True)),
    }
    return render(request, "approvals/policy_list.html", context)


@policy_manager_required
@require_http_methods(["GET", "POST"])
def policy_create(request: HttpRequest) -> HttpResponse:
    form = PolicyForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            version = policies.create_policy(agent=form.cleaned_data["agent"], action=form.cleaned_data["action"],
                                             terms=form.terms(), actor=_actor(request),
                                             address=client_address(request))  # fmt: skip
        except DomainError as exc:
            _form_errors(form, exc)
        else:
            messages.success(request, f"Policy {version.policy} is in force for requests filed from now on.")
            return redirect("policies:policy", policy_id=version.policy_id)
    status = 400 if request.method == "POST" else 200
    return render(request, "approvals/policy_form.html", {"nav": "policies", "form": form}, status=status)


@policy_manager_required
@require_http_methods(["GET", "POST"])
def policy_detail(request: HttpRequest, policy_id: int) -> HttpResponse:
    policy = _policy(policy_id)
    versions = list(policy.versions.all())
    initial = TermsForm.initial_from(policies.Terms.of(versions[0]))
    form = TermsForm(request.POST or None, initial=initial)
    if request.method == "POST" and form.is_valid():
        try:
            version = policies.change_policy(policy=policy, terms=form.terms(), actor=_actor(request),
                                             address=client_address(request))  # fmt: skip
        except DomainError as exc:
            _form_errors(form, exc)
        else:
            messages.success(request, f"Version {version.version} is in force for requests filed from now on; "
                                      "requests already waiting keep the version they were filed under.")  # fmt: skip
            return redirect("policies:policy", policy_id=policy.pk)
    context = {
        "nav": "policies", "policy": policy, "version": versions[0], "versions": versions, "form": form,
        "deciders": policies.who_may_decide(versions[0]),
    }  # fmt: skip
    return render(request, "approvals/policy_form.html", context, status=400 if form.errors else 200)


@policy_manager_required
@require_http_methods(["GET", "POST"])
def policy_retire(request: HttpRequest, policy_id: int) -> HttpResponse:
    policy = _policy(policy_id)
    form = ReasonForm(request.POST or None)
    if request.method == "POST" and policy.retired_at is None and form.is_valid():
        try:
            policies.retire_policy(policy=policy, actor=_actor(request), reason=form.cleaned_data["reason"],
                                   address=client_address(request))  # fmt: skip
        except DomainError as exc:
            _form_errors(form, exc)
        else:
            messages.success(request, f"Policy {policy} is retired: it governs no new request.")
            return redirect("policies:list")
    return render(request, "approvals/policy_retire.html", {"nav": "policies", "policy": policy, "form": form})


@policy_manager_required
@require_http_methods(["GET", "POST"])
def rule_create(request: HttpRequest) -> HttpResponse:
    suggestion = None
    if request.method == "POST":
        form = RuleForm(request.POST)
        if form.is_valid():
            data = form.cleaned_data
            try:
                rule = rules.create_rule(
                    name=data["name"], agent=data["agent"], action=data["action"], conditions=data["conditions"],
                    args_schema=data["args_schema"], max_risk=data["max_risk"], expires_at=data["expires_at"],
                    actor=_actor(request), address=client_address(request),
                )  # fmt: skip
            except DomainError as exc:
                _form_errors(form, exc)
            else:
                messages.success(request, f"Rule “{rule.name}” approves matching requests from now on.")
                return redirect("policies:rule", rule_id=rule.pk)
    else:
        form, suggestion = _suggested_form(request)
    context = {"nav": "policies", "form": form, "suggestion": suggestion}
    return render(request, "approvals/rule_form.html", context, status=400 if form.errors else 200)


class SuggestForm(forms.Form):
    agent = forms.ModelChoiceField(queryset=Agent.objects.all(), to_field_name="name")
    action = forms.CharField(max_length=200)
    last = forms.IntegerField(min_value=2, max_value=rules.MAX_SUGGEST_LOOKBACK, initial=5)


def _suggested_form(request: HttpRequest) -> tuple[RuleForm, rules.Suggestion | None]:
    """The new-rule form, filled in from the last identical approvals when the page was asked to
    suggest a rule (`?agent=…&action=…&last=…`)."""
    if "suggest" not in request.GET:
        return RuleForm(), None
    asked = SuggestForm(request.GET)
    if not asked.is_valid():
        form = RuleForm()
        form.add_error(None, "To suggest a rule, name an existing agent, an action and how many approvals "
                             f"to look back over (2 to {rules.MAX_SUGGEST_LOOKBACK}).")  # fmt: skip
        return form, None
    agent, action = asked.cleaned_data["agent"], asked.cleaned_data["action"]
    suggestion = rules.suggest_rule(agent=agent, action=action, last=asked.cleaned_data["last"])
    initial: dict[str, Any] = {"agent": agent, "action": action}
    if not suggestion.reason:
        initial |= {"name": f"{action} as approved {len(suggestion.based_on)} times", "max_risk": suggestion.max_risk,
                    "conditions": suggestion.conditions}  # fmt: skip
    return RuleForm(initial=initial), suggestion


@policy_manager_required
@require_safe
def rule_detail(request: HttpRequest, rule_id: int) -> HttpResponse:
    rule = _rule(rule_id)
    recent = list(rule.approvals.select_related("thread__agent").order_by("-decided_at")[:20])
    context = {"nav": "policies", "rule": rule, "approved": selectors.approved_count(rule), "recent": recent,
               "live": rule.is_live()}  # fmt: skip
    return render(request, "approvals/rule_detail.html", context)


@policy_manager_required
@require_http_methods(["GET", "POST"])
def rule_revoke(request: HttpRequest, rule_id: int) -> HttpResponse:
    rule = _rule(rule_id)
    form = ReasonForm(request.POST or None)
    if request.method == "POST" and rule.revoked_at is None and form.is_valid():
        try:
            rules.revoke_rule(rule=rule, actor=_actor(request), reason=form.cleaned_data["reason"],
                              address=client_address(request))  # fmt: skip
        except DomainError as exc:
            _form_errors(form, exc)
        else:
            messages.success(request, f"Rule “{rule.name}” is revoked: it approves no request from now on.")
            return redirect("policies:rule", rule_id=rule.pk)
    context = {"nav": "policies", "rule": rule, "form": form, "approved": selectors.approved_count(rule)}
    return render(request, "approvals/rule_revoke.html", context)
