"""The checkpoint page: the materialised state, its fields, tool results and integrity."""

from __future__ import annotations

import json
import re
import unicodedata
from typing import Any
from urllib.parse import quote
from uuid import UUID

from django.db.models import Q, Subquery
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse

from checkpoints import selectors, storage
from checkpoints.access import get_checkpoint_for, get_thread_for
from checkpoints.models import Blob, Checkpoint, PayloadKind, Thread, ToolResult
from checkpoints.presentation import conversation, diffview
from checkpoints.storage import blobs
from checkpoints.storage.errors import IntegrityFailure
from checkpoints.views import actions, thread_label, viewer_required

# Newest tool results listed; the page says how many there are in all.
TOOL_RESULTS_SHOWN = 50
# Raw JSON beyond this many characters is cut; the API link serves the whole state.
RAW_CHARS = 1_000_000
# What the tool-results table reads, without the linked checkpoint's payload.
_TOOL_RESULT_FIELDS = ("thread", "key", "tool", "result", "created_at", "checkpoint__seq", "checkpoint__label")


@viewer_required
def checkpoint_detail(request: HttpRequest, checkpoint_id: UUID) -> HttpResponse:
    checkpoint = get_checkpoint_for(request.user, checkpoint_id)
    thread = Thread.objects.select_related("agent").get(pk=checkpoint.thread_id)
    state: dict[str, Any] | None = None
    failure = ""
    try:
        state = storage.load_node(checkpoint.pk).state
    except IntegrityFailure as exc:
        # An altered row is a finding to show, not a server error: the page says so
        # and shows no state, since nothing read past that row can be trusted.
        failure = exc.message
    previous, following, head = _neighbours(checkpoint)
    tool_results, tool_total = _tool_results(checkpoint)
    # Values kept in blob storage are shown by a placeholder, a preview and a download link.
    shown, large = blobs.large_values(thread.pk, state) if state is not None else (None, [])
    tree = diffview.state_tree(shown) if shown is not None else None
    context = {
        "nav": "threads",
        "thread": thread,
        "thread_label": thread_label(thread),
        "checkpoint": checkpoint,
        "storage": PayloadKind(checkpoint.kind).label,
        "failure": failure,
        "tree": tree,
        "conversations": conversation.conversations(shown) if shown is not None else [],
        "tree_nodes": f"{diffview.TREE_NODES:,}",
        # Each tree node links here with its JSON pointer appended.
        "history_url": f"{reverse('dashboard:value-history', args=[thread.pk])}?from={checkpoint.pk}&path=",
        "raw": diffview.pretty(shown, limit=RAW_CHARS) if shown is not None else None,
        "large_values": large,
        "offload_limit": blobs.limit(),
        "metadata": [(key, diffview.short(value)) for key, value in checkpoint.metadata.items()],
        "model": [(name, value) for name, value in checkpoint.model.items() if value is not None],
        "previous": previous,
        "next": following,
        # The branch's newest checkpoint when it is past `next`: the live notice offers both.
        "branch_head": head,
        "tool_results": [
            (result, diffview.short(result.result, limit=90), diffview.pretty(result.result)) for result in tool_results
        ],
        "tool_total": tool_total,
        # Only what waits on a person: why the thread failed is the thread page's (and this step's metadata).
        "attention": selectors.attention(thread, failure=False),
        "environment": selectors.environment_of(checkpoint),
        "environment_stop": selectors.environment_stop(checkpoint),
        **actions.fork_card(request, checkpoint, state),
    }
    return render(request, "checkpoints/checkpoint_detail.html", context)


def _neighbours(checkpoint: Checkpoint) -> tuple[Checkpoint | None, Checkpoint | None, Checkpoint | None]:
    """(previous, next, head): the parent, the child that continues the same branch, and the
    branch's newest checkpoint when that is later still (else None)."""
    # The next and the newest seq on the branch (seqs have gaps where compaction removed checkpoints).
    later = Checkpoint.objects.filter(thread_id=checkpoint.thread_id, branch_id=checkpoint.branch_id,
                                      seq__gt=checkpoint.seq).values("pk")  # fmt: skip
    wanted = Q(pk=Subquery(later.order_by("seq")[:1])) | Q(pk=Subquery(later.order_by("-seq")[:1]))
    if checkpoint.parent_id is not None:
        wanted |= Q(pk=checkpoint.parent_id)
    previous = following = head = None
    # One query for all three: the parent may sit on another branch (the fork point).
    rows = Checkpoint.objects.filter(wanted).select_related("branch").only("seq", "label", "branch__name")
    for row in rows.order_by("seq"):
        if row.pk == checkpoint.parent_id:
            previous = row
        elif following is None:
            following = row
        else:
            head = row
    return previous, following, head


def _tool_results(checkpoint: Checkpoint) -> tuple[list[ToolResult], int]:
    """Tool results the thread had cached when this checkpoint was written, newest first.

    Results written with the checkpoint itself land a moment after its timestamp
    (the same transaction), hence "or linked to it".
    """
    cached = ToolResult.objects.filter(
        Q(created_at__lte=checkpoint.created_at) | Q(checkpoint_id=checkpoint.pk), thread_id=checkpoint.thread_id
    )
    rows = list(
        cached.select_related("checkpoint")
        .only(*_TOOL_RESULT_FIELDS)
        .order_by("-created_at", "-id")[: TOOL_RESULTS_SHOWN + 1]
    )
    # Count only when the list is cut: usually one query, not two.
    total = cached.count() if len(rows) > TOOL_RESULTS_SHOWN else len(rows)
    return rows[:TOOL_RESULTS_SHOWN], total


_SHA256 = re.compile("[0-9a-f]{64}")  # how a large value is named (blobs.sha256 of its bytes)


@viewer_required
def blob_download(request: HttpRequest, thread_id: UUID, sha256: str) -> HttpResponse:
    """A large value of a thread's state, as a file (anyone who may read the thread may read it)."""
    thread = get_thread_for(request.user, thread_id)
    if not _SHA256.fullmatch(sha256) or not Blob.objects.filter(thread=thread, sha256=sha256).exists():
        raise Http404("This thread has no such large value.")
    value = blobs.read(thread.pk, sha256)
    value = blobs.restore(thread.pk, value)
    if isinstance(value, str):
        response = HttpResponse(value, content_type="text/plain; charset=utf-8")
        extension = "txt"
    else:
        response = HttpResponse(json.dumps(value, ensure_ascii=False, indent=2), content_type="application/json")
        extension = "json"
    response["Content-Disposition"] = _attachment_disposition(f"{thread_label(thread)[:100]}-{sha256[:12]}.{extension}")
    # Always a download, never rendered: the value is the agent's, and so is the thread's name.
    response["X-Content-Type-Options"] = "nosniff"
    return response


# Characters no file name keeps: quotes, separators and those Windows refuses.
_UNSAFE_IN_FILE_NAME = set('"\\/:*?<>|;')


def _attachment_disposition(name: str) -> str:
    """An RFC 6266 `attachment` header for a file name taken from agent input: an ASCII fallback
    for old clients, and the UTF-8 name percent-encoded, so no character can end the header."""
    cleaned = "".join(
        "_" if char in _UNSAFE_IN_FILE_NAME or unicodedata.category(char).startswith("C") else char for char in name
    )
    fallback = re.sub(r"[^A-Za-z0-9._-]", "_", cleaned)
    return f"attachment; filename=\"{fallback}\"; filename*=UTF-8''{quote(cleaned, safe='')}"
