"""The thread's story beside its checkpoints: approvals asked and decided, in-doubt calls, runs
queued, claimed, lost, finished and failed, forks, cancels and resumes, read from the `Event`
table and told as timeline rows (templates/checkpoints/_timeline_rows.html draws them).

Checkpoint events are not read here (the timeline's checkpoint rows say more); every other event
is found through the partial index `event_story` (thread, created_at, seq), so a thread of 10,000
checkpoints costs what a thread of 10 does.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from django.db.models import Q, QuerySet, Subquery
from django.utils import timezone

from checkpoints.models import Event, Thread
from checkpoints.presentation import timeline
from checkpoints.presentation.timeline import BranchSummary, TimelinePage, url_maker

CHECKPOINT_EVENT = "checkpoint.created"
# How many events one page of checkpoints shows between them; beyond it the page says so and the
# kind filter pages through every one.
EVENTS_PER_PAGE = 100
EVENT_PAGE_SIZE = 50

# The timeline's kind filter: value, label, the event types it shows (None: every story event).
KINDS: list[tuple[str, str]] = [
    ("", "Everything"),
    ("checkpoints", "Checkpoints"),
    ("approvals", "Approvals and in-doubt calls"),
    ("runs", "Runs"),
    ("changes", "Forks, cancels and resumes"),
]
EVENT_KINDS = ("approvals", "runs", "changes")
_PREFIXES = {"approvals": ("approval.",), "runs": ("run.",), "changes": ("branch.", "thread.")}


def _of_kind(events: QuerySet[Event], kind: str) -> QuerySet[Event]:
    condition = Q()
    for prefix in _PREFIXES[kind]:
        condition |= Q(type__startswith=prefix)
    return events.filter(condition)


def _story(thread_id: UUID) -> QuerySet[Event]:
    # `type <> 'checkpoint.created'` is the index's predicate: written the same way, the planner uses it.
    return Event.objects.filter(thread_id=thread_id).exclude(type=CHECKPOINT_EVENT).order_by()


@dataclass(frozen=True, slots=True)
class StoryEvent:
    seq: int
    type: str
    data: dict[str, Any]
    created_at: datetime


_FIELDS = ("seq", "type", "data", "created_at")


def events_between(
    *, thread_id: UUID, since: datetime | None, until: datetime | None, limit: int = EVENTS_PER_PAGE
) -> tuple[list[StoryEvent], bool]:
    """The story events at or after `since` and before `until` (None: no bound), newest first, at
    most `limit`, and whether there were more. One index range scan."""
    events = _story(thread_id)
    if since is not None:
        events = events.filter(created_at__gte=since)
    if until is not None:
        events = events.filter(created_at__lt=until)
    rows = [StoryEvent(*row) for row in events.order_by("-created_at", "-seq").values_list(*_FIELDS)[: limit + 1]]
    return rows[:limit], len(rows) > limit


@dataclass(frozen=True, slots=True)
class EventPage:
    """One page of a thread's events of one kind, newest first, and the cursors of its neighbours
    (the event seq of its last and first row)."""

    rows: list[StoryEvent]
    older_before: int | None
    newer_after: int | None


def event_page(
    *, thread_id: UUID, kind: str, before: int | None = None, after: int | None = None, size: int = EVENT_PAGE_SIZE
) -> EventPage:
    """The newest `size` events of `kind`, or those just older than the event numbered `before`, or
    just newer than `after`: a keyset range on (created_at, seq), so page 100 costs what page 1 does.
    A cursor naming no event of this thread gives an empty page."""
    events = _of_kind(_story(thread_id), kind)
    cursor = before if before is not None else after
    if cursor is not None:
        # One statement: the cursor's time is a subquery on the (thread, seq) unique index.
        at = Subquery(Event.objects.filter(thread_id=thread_id, seq=cursor).order_by().values("created_at")[:1])
        if before is not None:
            events = events.filter(Q(created_at__lt=at) | Q(created_at=at, seq__lt=cursor))
        else:
            events = events.filter(Q(created_at__gt=at) | Q(created_at=at, seq__gt=cursor))
    ordering = ("created_at", "seq") if after is not None else ("-created_at", "-seq")
    found = [StoryEvent(*row) for row in events.order_by(*ordering).values_list(*_FIELDS)[: size + 1]]
    more = len(found) > size
    rows = found[:size]
    if after is not None:
        rows.reverse()
        newer = rows[0].seq if rows and more else None
        older = rows[-1].seq if rows else None
    else:
        older = rows[-1].seq if rows and more else None
        newer = rows[0].seq if rows and cursor is not None else None
    return EventPage(rows=rows, older_before=older, newer_after=newer)


# --------------------------------------------------------------------------- how each event reads


def approval_ids(events: list[StoryEvent]) -> list[str]:
    return [str(event.data["approval"]) for event in events if isinstance(event.data.get("approval"), str)]


def _text(value: Any, width: int = 200) -> str:
    text = "" if value is None else str(value)
    return text if len(text) <= width else text[: width - 1] + "…"


def _approval(event: StoryEvent, comments: dict[str, str]) -> dict[str, str]:
    data = event.data
    action = _text(data.get("action"), 80) or "an action"
    in_doubt = data.get("kind") == "in_doubt"
    noun = "In-doubt tool call" if in_doubt else "Approval"
    status = _text(data.get("status"), 40)
    if event.type == "approval.requested":
        return {"title": f"{noun} asked: {action}", "tone": "waiting_for_approval", "who": _text(data.get("agent"), 64)}
    if event.type == "approval.voted":
        tally = ", ".join(f"{key} {data[key]}" for key in ("approvals", "rejections") if key in data)
        return {"title": f"Vote on {action}", "tone": "running", "detail": tally}
    if event.type == "approval.escalated":
        return {"title": f"{noun} for {action} escalated at its deadline", "tone": "waiting_for_approval"}
    # approval.decided: by a person, a rule, or the deadline.
    if data.get("rule"):
        who = f"rule “{_text(data['rule'], 60)}”"
    elif data.get("decided_by"):
        who = _text(data["decided_by"], 64)
    else:
        who = "the deadline" if status in ("expired", "rejected", "approved") else ""
    tone = {"approved": "completed", "rejected": "failed", "expired": "cancelled"}.get(status, "running")
    return {"title": f"{noun} {status or 'decided'}: {action}", "tone": tone, "who": who,
            "why": comments.get(str(data.get("approval")), "")}  # fmt: skip


def _run(event: StoryEvent) -> dict[str, str]:
    data = event.data
    if event.type == "run.queued":
        reason = _text(data.get("reason"), 40)
        return {"title": "Run queued" + (f" ({reason})" if reason else ""), "tone": "running"}
    if event.type == "run.claimed":
        attempt = data.get("attempt")
        if data.get("recovered"):
            return {"title": f"Run lost its worker; claimed again (attempt {attempt})", "tone": "failed",
                    "who": _text(data.get("worker"), 64)}  # fmt: skip
        return {"title": "Run claimed" + (f" (attempt {attempt})" if attempt and attempt != 1 else ""),
                "tone": "running", "who": _text(data.get("worker"), 64)}  # fmt: skip
    if event.type == "run.released":
        return {"title": "Run handed back to the queue", "tone": "paused", "who": _text(data.get("worker"), 64)}
    if event.type == "run.completed":
        return {"title": "Run completed", "tone": "completed"}
    if event.type == "run.failed":
        return {"title": "Run failed", "tone": "failed", "why": _text(data.get("error"), 500)}
    if event.type == "run.cancelled":
        return {"title": "Run cancelled", "tone": "cancelled", "why": _text(data.get("reason"), 500)}
    return {"title": event.type, "tone": "running"}


def _change(event: StoryEvent) -> dict[str, str]:
    data = event.data
    who, why = _text(data.get("by"), 64), _text(data.get("reason"), 500)
    if event.type == "branch.forked":
        title = f"Rewound and branched {_text(data.get('branch'), 100)} from {_text(data.get('from_branch'), 100)}"
        return {"title": title, "tone": "running", "who": who, "why": why}
    if event.type == "branch.created":
        return {"title": f"Branch {_text(data.get('branch'), 100)} started", "tone": "running"}
    if event.type == "thread.resumed":
        return {"title": "Thread resumed", "tone": "running", "who": who, "why": why}
    if event.type == "thread.cancelled":
        return {"title": "Thread cancelled", "tone": "cancelled", "who": who, "why": why}
    if event.type == "thread.created":
        return {"title": "Thread started", "tone": "running", "who": _text(data.get("agent"), 64)}
    if event.type == "thread.updated":
        status = _text(data.get("status"), 40)
        return {"title": f"Thread marked {status.replace('_', ' ')}", "tone": status}
    if event.type == "thread.imported":
        return {"title": "Thread imported", "tone": "running"}
    if event.type == "thread.compacted":
        return {"title": "Old checkpoints compacted", "tone": "paused"}
    return {"title": event.type, "tone": "running"}


def event_rows(
    events: list[StoryEvent], *, comments: dict[str, str] | None = None, can_fork: bool = False
) -> list[dict[str, Any]]:
    """What each event's timeline row shows, as plain text: a title, who (a person, a worker, a
    rule), why (a decision's comment, a fork's reason, a run's error), where it leads, and (for
    those who may fork) a rewind from the checkpoint it happened at, when it names one."""
    comments = comments or {}
    approval_url, checkpoint_url = url_maker("inbox:approval"), url_maker("dashboard:checkpoint")
    fork_url = url_maker("dashboard:fork")
    zone = timezone.get_current_timezone()
    rows = []
    for event in events:
        if event.type.startswith("approval."):
            told = _approval(event, comments)
            group, noun = "approvals", "In-doubt" if event.data.get("kind") == "in_doubt" else "Approval"
        elif event.type.startswith("run."):
            told, group, noun = _run(event), "runs", "Run"
        else:
            told, group, noun = _change(event), "changes", "Thread"
        link = ""
        if isinstance(event.data.get("approval"), str):
            link = _safe_url(approval_url, event.data["approval"])
        elif isinstance(event.data.get("checkpoint"), str):
            link = _safe_url(checkpoint_url, event.data["checkpoint"])
        rewind = ""
        if can_fork and isinstance(event.data.get("checkpoint"), str):
            rewind = _safe_url(fork_url, event.data["checkpoint"])
        created = event.created_at.astimezone(zone)
        rows.append({
            "event": event.seq, "type": event.type, "group": group, "noun": noun, "title": told["title"],
            "tone": told.get("tone", "running"), "who": told.get("who", ""), "why": told.get("why", ""),
            "detail": told.get("detail", ""), "url": link, "rewind_url": rewind, "at": created,
            "created_iso": created.isoformat(), "created_exact": created.strftime("%Y-%m-%d %H:%M:%S.%f %Z"),
            "created": created.strftime("%Y-%m-%d %H:%M:%S"),
        })  # fmt: skip
    return rows


def _safe_url(make: Any, raw: str) -> str:
    # Event data is JSON a past release wrote: a link is made only from a well-formed id.
    try:
        return str(make(UUID(raw)))
    except ValueError:
        return ""


def merge(
    checkpoint_rows: list[dict[str, Any]], entries: TimelinePage, events: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Checkpoint rows and event rows in one list, newest first; an event at the same instant as a
    checkpoint comes after it (above it, newest first)."""
    if not events:
        return checkpoint_rows
    keyed: list[tuple[datetime, int, int, dict[str, Any]]] = []
    for index, (row, entry) in enumerate(zip(checkpoint_rows, entries.rows, strict=True)):
        keyed.append((entry.created_at, 0, -index, row))
    for index, row in enumerate(events):
        keyed.append((row["at"], 1, -index, row))
    keyed.sort(key=lambda item: item[:3], reverse=True)
    return [row for *_, row in keyed]


@dataclass(frozen=True, slots=True)
class StoryPage:
    """What the thread page's timeline shows: its rows (checkpoints and events, newest first), the
    page of checkpoints they come from (empty when one kind of events is listed), the page of
    events (only then) and whether more events happened among these checkpoints than are shown."""

    rows: list[dict[str, Any]]
    checkpoints: TimelinePage
    events: EventPage | None
    more_events: bool


def story_page(
    *,
    thread: Thread,
    branch: BranchSummary,
    kind: str,
    can_fork: bool,
    before_seq: int | None = None,
    after_seq: int | None = None,
    before_event: int | None = None,
    after_event: int | None = None,
) -> StoryPage:
    """One page of the thread's timeline: with `kind` "" a page of the branch's checkpoints and the
    events between them, with "checkpoints" the checkpoints alone, with an event kind a page of the
    thread's events of that kind. Three queries: the checkpoints, the events, their approvals."""
    events_page: EventPage | None = None
    more = False
    events: list[StoryEvent] = []
    if kind in EVENT_KINDS:
        page = TimelinePage(rows=[], older_before_seq=None, newer_after_seq=None, is_newest=True)
        events_page = event_page(thread_id=thread.pk, kind=kind, before=before_event, after=after_event)
        events = events_page.rows
    else:
        page = timeline.timeline_page(thread=thread, branch=branch, before_seq=before_seq, after_seq=after_seq)
        if kind == "" and page.rows:
            # From the page's oldest checkpoint (from the thread's start on main's first checkpoint)
            # up to the branch's next newer checkpoint, open-ended on the newest page.
            from_start = page.rows[-1].seq == 1 and branch.parent_id is None
            events, more = events_between(thread_id=thread.pk, since=None if from_start else page.rows[-1].created_at,
                                          until=page.newer_created_at)  # fmt: skip
    marks, comments = timeline.approval_facts(page, approval_ids=approval_ids(events))
    checkpoint_rows = timeline.timeline_rows(page, head_id=thread.head_id, approvals=marks, can_fork=can_fork)
    rows = merge(checkpoint_rows, page, event_rows(events, comments=comments, can_fork=can_fork))
    return StoryPage(rows=rows, checkpoints=page, events=events_page, more_events=more)
