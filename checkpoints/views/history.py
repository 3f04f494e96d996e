"""A value's history page: every checkpoint, on every branch of a thread, where the value at one
JSON pointer changed, with the value before and after and a link to each diff."""

from __future__ import annotations

from urllib.parse import urlencode
from uuid import UUID

from django.core.exceptions import BadRequest
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from checkpoints import storage
from checkpoints.access import get_checkpoint_for, get_thread_for
from checkpoints.models import Checkpoint, Thread
from checkpoints.presentation import diffview
from checkpoints.views import thread_label, viewer_required

# Changes listed on one page; `cursor` pages on.
PAGE = 50


@viewer_required
def value_history(request: HttpRequest, thread_id: UUID) -> HttpResponse:
    thread = get_thread_for(request.user, thread_id)
    origin = _origin(request, thread)
    path = request.GET.get("path")
    cursor = request.GET.get("cursor") or None
    rows: list[diffview.HistoryRow] = []
    error = failure = ""
    next_query = ""
    status = 200
    if path is not None:
        try:
            after = storage.decode_history_cursor(cursor) if cursor else None
            changes = storage.value_history(thread, path, after=after, limit=PAGE + 1)
        except storage.InvalidPath as exc:
            error, status = exc.message, 400
        except storage.IntegrityFailure as exc:
            failure = exc.message
        else:
            if len(changes) > PAGE:
                changes = changes[:PAGE]
                query = {"path": path, "cursor": storage.encode_history_cursor(changes[-1].position)}
                if origin is not None:
                    query["from"] = str(origin.pk)
                next_query = urlencode(query)
            rows = diffview.history_rows(changes)
    context = {
        "nav": "threads",
        "thread": thread,
        "thread_label": thread_label(thread),
        "origin": origin,
        "path": path,
        "paged": cursor is not None,
        "rows": rows,
        "error": error,
        "failure": failure,
        "next_query": next_query,
        # Each change offers to rewind from the checkpoint that made it, to those who may fork.
        "can_fork": request.user.has_perm("checkpoints.fork_thread"),
    }
    return render(request, "checkpoints/value_history.html", context, status=status)


def _origin(request: HttpRequest, thread: Thread) -> Checkpoint | None:
    """The checkpoint the reader came from (`from`), for the way back."""
    raw = request.GET.get("from", "").strip()
    if not raw:
        return None
    try:
        checkpoint = get_checkpoint_for(request.user, UUID(raw))
    except ValueError:
        raise BadRequest(f"The from parameter must be a checkpoint id (a UUID), not {raw[:80]!r}.") from None
    if checkpoint.thread_id != thread.pk:
        raise BadRequest("The from checkpoint must be in the thread whose value history this is.")
    return checkpoint
