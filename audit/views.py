"""The audit page: admins read who did what, newest first, filtered by actor, action, thread and time."""

from __future__ import annotations

import json
from typing import Any
from uuid import UUID

from django import forms
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.db.models import Q
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_safe

from audit import trail
from audit.models import AuditEntry
from quicksave.forms import DateTimeInRangeField, PageLinkField, invalid_filters, page_queries
from quicksave.roles import ADMIN, role_of

PAGE_SIZE = 100
SUMMARY_CHARS = 160
# Which dashboard page shows a target, by the target_type that trail.record wrote.
TARGET_PAGES = {"thread": "dashboard:thread", "checkpoint": "dashboard:checkpoint", "approval": "inbox:approval"}
TARGET_ARGS = {"thread": "thread_id", "checkpoint": "checkpoint_id", "approval": "approval_id"}


class AuditFilterForm(forms.Form):
    # Labelled as on the page, so a 400 names the filter the reader typed into.
    actor = forms.CharField(required=False, max_length=150, label="Actor")
    action = forms.ChoiceField(required=False, label="Action")
    thread = forms.UUIDField(required=False, label="Thread id")
    since = DateTimeInRangeField(required=False, label="Since")
    until = DateTimeInRangeField(required=False, label="Before")
    older = PageLinkField(id_type=int)

    def __init__(self, *args: Any, actions: list[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        action = self.fields["action"]
        assert isinstance(action, forms.ChoiceField)
        action.choices = [("", "Any action"), *((name, name) for name in actions)]


def admin_required(request: HttpRequest) -> None:
    """The audit trail is for admins only (the same test as the nav's `can_admin`)."""
    if role_of(request.user) != ADMIN:
        raise PermissionDenied("The audit trail is for admins.")


def _summary(before: dict[str, Any], after: dict[str, Any]) -> str:
    def compact(value: dict[str, Any]) -> str:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str, sort_keys=True)

    text = f"{compact(before)} → {compact(after)}"
    return text if len(text) <= SUMMARY_CHARS else text[: SUMMARY_CHARS - 1] + "…"


def _target_url(entry: AuditEntry) -> str | None:
    page = TARGET_PAGES.get(entry.target_type)
    if page is None:
        return None
    try:
        target = UUID(entry.target_id)
    except ValueError:
        return None
    return reverse(page, kwargs={TARGET_ARGS[entry.target_type]: target})


@login_required
@require_safe
def audit_list(request: HttpRequest) -> HttpResponse:
    admin_required(request)
    actions = list(AuditEntry.objects.order_by("action").values_list("action", flat=True).distinct())
    form = AuditFilterForm(request.GET, actions=actions)
    if not form.is_valid():
        raise invalid_filters(form)
    data = form.cleaned_data
    entries = AuditEntry.objects.all()
    if data["actor"]:
        entries = entries.filter(actor_name=data["actor"])
    if data["action"]:
        entries = entries.filter(action=data["action"])
    if data["thread"]:
        entries = entries.filter(thread_id=data["thread"])
    if data["since"]:
        entries = entries.filter(created_at__gte=data["since"])
    if data["until"]:
        entries = entries.filter(created_at__lt=data["until"])
    if data["older"]:
        created_at, entry_id = data["older"]
        entries = entries.filter(Q(created_at__lt=created_at) | Q(created_at=created_at, pk__lt=entry_id))
    rows = list(entries.order_by("-created_at", "-pk")[: PAGE_SIZE + 1])
    shown = rows[:PAGE_SIZE]
    following = PageLinkField.link(shown[-1].created_at, shown[-1].pk) if len(rows) > PAGE_SIZE else None
    newest_query, older_query = page_queries(request, "older", following)
    filters_active = any(data[name] not in (None, "") for name in ("actor", "action", "thread", "since", "until"))
    context = {
        "nav": "audit",
        "form": form,
        "actions": actions,
        "entries": [(entry, _target_url(entry), _summary(*trail.opened(entry))) for entry in shown],
        "older_query": older_query,
        "newest_query": newest_query,
        "paged": data["older"] is not None,
        "filters_active": filters_active,
    }
    return render(request, "audit/list.html", context)
