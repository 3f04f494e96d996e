"""The thread list and the thread page."""

from __future__ import annotations

import base64
import json
from datetime import datetime
from typing import Any
from uuid import UUID

from django import forms
from django.core.exceptions import BadRequest
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from agents.models import Agent
from checkpoints import selectors
from checkpoints.access import visible_threads
from checkpoints.models import ThreadStatus
from checkpoints.views import viewer_required

PAGE_SIZE = 50
SORT_CHOICES = [
    ("-updated", "Recently updated"),
    ("updated", "Least recently updated"),
    ("-created", "Newest"),
    ("created", "Oldest"),
]


class ThreadFilterForm(forms.Form):
    agent = forms.CharField(required=False, max_length=64)
    status = forms.ChoiceField(required=False, choices=[("", "Any status"), *ThreadStatus.choices])
    step = forms.IntegerField(required=False, min_value=0, max_value=2**31 - 1)
    since = forms.DateTimeField(required=False, label="Updated since")
    until = forms.DateTimeField(required=False, label="Updated before")
    q = forms.CharField(required=False, max_length=500, label="Metadata")
    sort = forms.ChoiceField(required=False, choices=SORT_CHOICES)
    cursor = forms.CharField(required=False, max_length=200)

    def clean_q(self) -> dict[str, Any] | None:
        raw = self.cleaned_data["q"].strip()
        if not raw:
            return None
        try:
            return selectors.parse_metadata_query(raw)
        except ValueError as exc:
            raise forms.ValidationError(f"Write key:value or a JSON object ({exc}).") from None

    def clean_cursor(self) -> tuple[datetime, str] | None:
        raw = self.cleaned_data["cursor"]
        if not raw:
            return None
        try:
            value, last_id = json.loads(base64.urlsafe_b64decode(raw.encode()).decode())
            return datetime.fromisoformat(value), str(UUID(last_id))
        except (ValueError, TypeError):
            raise forms.ValidationError("This page link is broken; start again from the first page.") from None


def _encode_cursor(position: tuple[datetime, str]) -> str:
    return base64.urlsafe_b64encode(json.dumps([position[0].isoformat(), position[1]]).encode()).decode()


@viewer_required
def thread_list(request: HttpRequest) -> HttpResponse:
    form = ThreadFilterForm(request.GET)
    if not form.is_valid():
        problems = "; ".join(
            f"{form.fields[name].label or name}: {' '.join(errors)}" for name, errors in form.errors.items()
        )
        raise BadRequest(f"Those filters do not work: {problems}")
    data = form.cleaned_data
    visible = visible_threads(request.user)
    filtered = selectors.filter_threads(
        visible, agent=data["agent"] or None, step=data["step"], since=data["since"], until=data["until"],
        metadata=[data["q"]] if data["q"] else None,
    )  # fmt: skip
    counts = selectors.status_counts(filtered)
    if data["status"]:
        filtered = filtered.filter(status=data["status"])
    sort = data["sort"] or "-updated"
    rows, next_position = selectors.thread_page(
        filtered.select_related("agent", "head").defer("head__payload", "head__integrity"),
        sort=sort, after=data["cursor"], size=PAGE_SIZE,
    )  # fmt: skip
    query = request.GET.copy()
    query.pop("cursor", None)
    next_query = None
    if next_position is not None:
        query["cursor"] = _encode_cursor(next_position)
        next_query = query.urlencode()
    filters_active = any(data[name] not in (None, "") for name in ("agent", "status", "step", "since", "until", "q"))
    context = {
        "nav": "threads",
        "form": form,
        "threads": rows,
        "counts": [(value, label, counts.get(value, 0)) for value, label in ThreadStatus.choices],
        "total": sum(counts.values()),
        "agents": Agent.objects.order_by("name").values_list("name", flat=True),
        "statuses": ThreadStatus.choices,
        "sorts": SORT_CHOICES,
        "sort": sort,
        "next_query": next_query,
        "paged": data["cursor"] is not None,
        "filters_active": filters_active,
        "has_any_thread": filters_active or bool(rows) or visible.exists(),
        "status_query": {value: _with(request, status=value) for value, _ in ThreadStatus.choices},
        "all_status_query": _with(request, status=""),
        "first_query": _with(request),
    }
    return render(request, "checkpoints/thread_list.html", context)


def _with(request: HttpRequest, **changes: str) -> str:
    query = request.GET.copy()
    query.pop("cursor", None)
    for key, value in changes.items():
        if value:
            query[key] = value
        else:
            query.pop(key, None)
    return query.urlencode()


@viewer_required
def thread_detail(request: HttpRequest, thread_id: UUID) -> HttpResponse:
    raise NotImplementedError  # built in the next change: timeline, branch tree and chart
