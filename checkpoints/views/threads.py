"""The thread list and the thread page."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode
from uuid import UUID

from django import forms
from django.core.exceptions import BadRequest
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render

from approvals.selectors import outcome_of, with_outcome
from checkpoints import selectors
from checkpoints.access import get_thread_for, visible_threads
from checkpoints.models import Thread, ThreadStatus
from checkpoints.presentation import drawings, story, timeline
from checkpoints.views import viewer_required
from quicksave.forms import DateTimeInRangeField, PageLinkField, invalid_filters, page_queries
from quicksave_agents.models import Agent
from quicksave_agents.runs import unclaimed_runs

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
    since = DateTimeInRangeField(required=False, label="Updated since")
    until = DateTimeInRangeField(required=False, label="Updated before")
    q = forms.CharField(required=False, max_length=500, label="Metadata")
    sort = forms.ChoiceField(required=False, choices=SORT_CHOICES)
    cursor = PageLinkField(id_type=UUID)

    def clean_q(self) -> dict[str, Any] | None:
        raw = self.cleaned_data["q"].strip()
        if not raw:
            return None
        try:
            return selectors.parse_metadata_query(raw)
        except ValueError as exc:
            raise forms.ValidationError(f"Write key:value or a JSON object ({exc}).") from None


@viewer_required
def thread_list(request: HttpRequest) -> HttpResponse:
    form = ThreadFilterForm(request.GET)
    if not form.is_valid():
        raise invalid_filters(form)
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
        with_outcome(filtered.select_related("agent", "head").defer("head__payload", "head__integrity")),
        sort=sort, after=data["cursor"], size=PAGE_SIZE,
    )  # fmt: skip
    first_query, next_query = page_queries(request, "cursor", next_position and PageLinkField.link(*next_position))
    filters_active = any(data[name] not in (None, "") for name in ("agent", "status", "step", "since", "until", "q"))
    context = {
        "nav": "threads",
        "form": form,
        # (thread, what it waits on or how its latest approval ended), read with the page's own query.
        "threads": [(thread, outcome_of(thread)) for thread in rows],
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
        "first_query": first_query,
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


class ThreadPageForm(forms.Form):
    """The thread page's query: which branch, which kind of rows, a keyset cursor into the
    checkpoints (`before_seq`, `after_seq`) or into one kind of events (`before_event`,
    `after_event`), and whether to draw the branch tree and chart."""

    branch = forms.CharField(required=False, max_length=100)
    kind = forms.ChoiceField(required=False, choices=story.KINDS)
    before_seq = forms.IntegerField(required=False, min_value=0, max_value=timeline.MAX_SEQ)
    after_seq = forms.IntegerField(required=False, min_value=0, max_value=timeline.MAX_SEQ)
    before_event = forms.IntegerField(required=False, min_value=0, max_value=2**63 - 1)
    after_event = forms.IntegerField(required=False, min_value=0, max_value=2**63 - 1)
    drawings = forms.BooleanField(required=False)

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("before_seq") is not None and data.get("after_seq") is not None:
            raise forms.ValidationError("give before_seq or after_seq, not both.")
        if data.get("before_event") is not None and data.get("after_event") is not None:
            raise forms.ValidationError("give before_event or after_event, not both.")
        kind = data.get("kind") or ""
        events_only = kind in story.EVENT_KINDS
        if events_only and (data.get("before_seq") is not None or data.get("after_seq") is not None):
            raise forms.ValidationError(f"kind={kind} lists events, which page with before_event or after_event, "
                                        "not before_seq or after_seq.")  # fmt: skip
        if not events_only and (data.get("before_event") is not None or data.get("after_event") is not None):
            raise forms.ValidationError("before_event and after_event page one kind of events: add kind=approvals, "
                                        "kind=runs or kind=changes.")  # fmt: skip
        return data


# Another kind of rows starts from its newest page.
_NO_CURSOR = {"before_seq": "", "after_seq": "", "before_event": "", "after_event": ""}


@viewer_required
def thread_detail(request: HttpRequest, thread_id: UUID) -> HttpResponse:
    form = ThreadPageForm(request.GET)
    if not form.is_valid():
        problems = "; ".join(
            " ".join(map(str, errors)) if name == "__all__" else f"{name}: {' '.join(map(str, errors))}"
            for name, errors in form.errors.items()
        )
        raise BadRequest(f"This thread link does not work ({problems}). Open the thread from the list instead.")
    data = form.cleaned_data
    kind = data["kind"] or ""
    thread = get_thread_for(request.user, thread_id)
    branches = timeline.branch_summaries(thread)
    selectors.correct_head(thread, {b.id: (b.head_id, b.head_seq) for b in branches if b.head_id is not None})
    selected = timeline.pick_branch(thread, branches, data["branch"] or None)
    if selected is None:
        raise Http404(f"Thread {thread.external_id or thread.pk} has no branch named '{data['branch']}'.")
    can_fork = request.user.has_perm("checkpoints.fork_thread")
    shown = story.story_page(thread=thread, branch=selected, kind=kind, can_fork=can_fork,
                             before_seq=data["before_seq"], after_seq=data["after_seq"],
                             before_event=data["before_event"], after_event=data["after_event"])  # fmt: skip
    page = shown.checkpoints
    head_seq = next((branch.head_seq for branch in branches if branch.head_id == thread.head_id), None)
    head_label = next((entry.label for entry in page.rows if entry.id == thread.head_id), "")
    metadata, more_metadata = timeline.compact_metadata(thread.metadata)
    context = {
        "nav": "threads",
        "thread": thread,
        "branches": branches,
        "selected": selected,
        "page": page,
        "rows": shown.rows,
        "kind": kind,
        "kinds": [(value, label, _with(request, kind=value, **_NO_CURSOR)) for value, label in story.KINDS],
        "events_only": shown.events is not None,
        "event_cursor": data["before_event"] is not None or data["after_event"] is not None,
        "more_events": shown.more_events,
        "can_fork": can_fork,
        "head": {"seq": head_seq, "label": head_label} if head_seq is not None else None,
        "has_checkpoints": any(not branch.is_empty for branch in branches),
        "metadata": metadata,
        "more_metadata": more_metadata,
        "attention": selectors.attention(thread),
        "unclaimed": unclaimed_runs(thread=thread),
        "on_thread": True,
        "drawings_query": _with(request, drawings="1"),
        "show_drawings": data["drawings"],
        **_page_links(thread, selected, page, kind=kind),
        **_event_links(request, shown.events),
    }
    if data["drawings"]:
        # Drawn only when asked for (the folded section's link, or thread.js when it is opened).
        tree = timeline.branch_tree(thread=thread, branches=branches, selected=selected, page=page)
        series = timeline.chart_series(thread=thread, branch=selected)
        context["tree"] = drawings.branch_tree(tree)
        context["chart"] = drawings.state_chart(series, branch_name=selected.name, length=selected.length, page=page)
    return render(request, "checkpoints/thread_detail.html", context)


def _page_links(
    thread: Thread, branch: timeline.BranchSummary, page: timeline.TimelinePage, *, kind: str = ""
) -> dict[str, str | None]:
    """Query strings of the newest, newer and older pages; the active branch needs no `branch`."""
    base = {} if branch.id == thread.active_branch_id else {"branch": branch.name}
    if kind:
        base["kind"] = kind
    newer, older = page.newer_after_seq, page.older_before_seq
    return {
        "newest_query": urlencode(base),
        "newer_query": urlencode({**base, "after_seq": newer}) if newer is not None else None,
        "older_query": urlencode({**base, "before_seq": older}) if older is not None else None,
    }


def _event_links(request: HttpRequest, page: story.EventPage | None) -> dict[str, str | None]:
    """The event list's newest, newer and older pages, for a list of one kind of events."""
    if page is None:
        return {}
    newer, older = page.newer_after, page.older_before
    return {
        "newest_query": _with(request, before_event="", after_event=""),
        "newer_query": _with(request, before_event="", after_event=str(newer)) if newer is not None else None,
        "older_query": _with(request, after_event="", before_event=str(older)) if older is not None else None,
    }
