"""The agents page: admins see every agent with its keys, issue a key (shown once) and revoke one."""

from __future__ import annotations

from dataclasses import dataclass

from django import forms
from django.conf import settings
from django.contrib import messages
from django.contrib.auth.models import User
from django.db.models import Count, F, Prefetch
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods, require_safe

from audit.trail import client_address
from checkpoints.models import Thread
from checkpoints.views import permission_required
from quicksave_agents.keys import LABEL_MAX_CHARS, agent_name_problem, issue_key, label_problem, revoke_agent_key
from quicksave_agents.models import Agent, AgentKey
from quicksave_agents.runs import unclaimed_runs

key_manager_required = permission_required(
    "agents.add_agentkey", "Managing agents and their keys needs the admin role."
)


class NewKeyForm(forms.Form):
    agent = forms.CharField(max_length=64, label="Agent")
    label = forms.CharField(required=False, max_length=LABEL_MAX_CHARS, label="Label")

    def clean_agent(self) -> str:
        name: str = self.cleaned_data["agent"].strip()
        if problem := agent_name_problem(name):
            raise forms.ValidationError(problem)
        return name

    def clean_label(self) -> str:
        label: str = self.cleaned_data["label"].strip()
        if problem := label_problem(label):
            raise forms.ValidationError(problem)
        return label


@dataclass(frozen=True)
class AgentRow:
    agent: Agent
    keys: list[AgentKey]  # active first, newest first
    threads: int

    @property
    def active_keys(self) -> int:
        return sum(key.is_active for key in self.keys)


def _agents() -> list[AgentRow]:
    """Every agent with its keys and how many threads it has: three queries however many there are."""
    keys = AgentKey.objects.order_by(F("revoked_at").desc(nulls_first=True), "-created_at")
    agents = Agent.objects.order_by("name").prefetch_related(Prefetch("keys", queryset=keys))
    threads = dict(
        Thread.objects.order_by().values_list("agent_id").annotate(n=Count("id")).values_list("agent_id", "n")
    )
    return [AgentRow(agent=agent, keys=list(agent.keys.all()), threads=threads.get(agent.pk, 0)) for agent in agents]


@key_manager_required
@require_safe
def agent_list(request: HttpRequest) -> HttpResponse:
    initial = {"agent": request.GET.get("agent", "")[:64]}
    return _list(request, NewKeyForm(initial=initial))


def _list(request: HttpRequest, form: NewKeyForm, *, status: int = 200) -> HttpResponse:
    context = {"nav": "agents", "agents": _agents(), "form": form, "label_max": LABEL_MAX_CHARS,
               "unclaimed": unclaimed_runs()}  # fmt: skip
    return render(request, "agents/agent_list.html", context, status=status)


@key_manager_required
@require_http_methods(["POST"])
@never_cache  # the page holds the plaintext key: no cache may keep it
def key_create(request: HttpRequest) -> HttpResponse:
    form = NewKeyForm(request.POST)
    if not form.is_valid():
        return _list(request, form, status=400)
    user = request.user
    assert isinstance(user, User)
    key, plaintext = issue_key(
        agent_name=form.cleaned_data["agent"], label=form.cleaned_data["label"], actor=user,
        address=client_address(request),
    )  # fmt: skip
    return render(request, "agents/key_created.html", {"nav": "agents", "key": key, "plaintext": plaintext})


@key_manager_required
@require_http_methods(["GET", "POST"])
def key_revoke(request: HttpRequest, prefix: str) -> HttpResponse:
    key = get_object_or_404(AgentKey.objects.select_related("agent"), prefix=prefix)
    if request.method == "POST" and key.is_active:
        user = request.user
        assert isinstance(user, User)
        revoke_agent_key(key=key, actor=user, address=client_address(request))
        messages.success(request, f"Key {key.prefix} of {key.agent.name} is revoked: calls made with it now get 401.")
        return redirect("agents:list")
    others = key.agent.keys.filter(revoked_at__isnull=True).exclude(pk=key.pk).count()
    context = {
        "nav": "agents", "key": key, "other_active_keys": others,
        "key_cache_seconds": settings.QUICKSAVE_KEY_CACHE_SECONDS,
    }  # fmt: skip
    return render(request, "agents/key_revoke.html", context)
