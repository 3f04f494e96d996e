"""The training-export page: an admin picks the filter and the format, sees how many threads and
approvals it covers, and downloads the file from the API (checkpoints/trajectories_api.py)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django import forms
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse

from checkpoints import trajectories
from checkpoints.access import visible_threads
from checkpoints.models import ThreadStatus
from checkpoints.views import viewer_required
from quicksave.roles import ADMIN, role_of
from quicksave_agents.models import Agent

FORMATS = [("fine-tuning", "Fine-tuning JSONL (chat)"), ("preferences", "Preference pairs (DPO)")]


class ExportForm(forms.Form):
    format = forms.ChoiceField(choices=FORMATS, initial="fine-tuning")
    agent = forms.ChoiceField(required=False)
    since = forms.DateTimeField(required=False, help_text="Threads started at or after")
    until = forms.DateTimeField(required=False, help_text="Threads started before")
    outcome = forms.ChoiceField(required=False, choices=[("", "Any"), *ThreadStatus.choices])
    rejections = forms.ChoiceField(
        required=False, initial="skip",
        choices=[("skip", "Leave rejections out"), ("comment", "A rejection's comment is the preferred turn")],
    )  # fmt: skip

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        names = Agent.objects.order_by("name").values_list("name", flat=True)
        agent = self.fields["agent"]
        assert isinstance(agent, forms.ChoiceField)
        agent.choices = [("", "Any agent"), *((name, name) for name in names)]


@viewer_required
def training_export(request: HttpRequest) -> HttpResponse:
    if role_of(request.user) != ADMIN:
        raise PermissionDenied("Training exports are for admins.")
    form = ExportForm(request.GET or None)
    context: dict[str, Any] = {"form": form, "nav": "training"}
    if form.is_bound and form.is_valid():
        data = form.cleaned_data
        chosen = trajectories.Filter(
            agent=data["agent"] or None, since=data["since"], until=data["until"], outcome=data["outcome"] or None
        )
        threads = chosen.apply(visible_threads(request.user))
        candidates = trajectories.pair_candidates(threads)
        query = {key: value for key, value in request.GET.items() if key in form.fields and key != "format" and value}
        context.update(
            threads=trajectories.fine_tuning_candidates(threads).count(),
            edited=candidates.filter(args_edited=True).count(),
            rejected=candidates.exclude(comment="").filter(args_edited=False).count(),
            download=reverse(f"api-export-{data['format']}") + ("?" + urlencode(query) if query else ""),
            format=data["format"],
        )  # fmt: skip
    return render(request, "checkpoints/training_export.html", context)
