"""The diff page between any two checkpoints of a thread, on any branches."""

from __future__ import annotations

import re
from urllib.parse import urlencode
from uuid import UUID

from django.core.exceptions import BadRequest
from django.db import connection
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse

from checkpoints import storage
from checkpoints.access import get_checkpoint_for
from checkpoints.models import Checkpoint, Thread
from checkpoints.presentation import diffview
from checkpoints.storage.errors import IntegrityFailure
from checkpoints.storage.jsonpatch import make_patch
from checkpoints.views import thread_label, viewer_required

VIEWS = ("unified", "split")
# Newest checkpoints of each branch offered by the picker (plus the two compared).
PICKER_PER_BRANCH = 200


@viewer_required
def diff_page(request: HttpRequest, checkpoint_id: UUID) -> HttpResponse:
    target = get_checkpoint_for(request.user, checkpoint_id)
    view = request.GET.get("view") or "unified"
    if view not in VIEWS:
        raise BadRequest(f"The view parameter must be {' or '.join(VIEWS)}.")
    base_id = _checkpoint_param(request, "base", target)
    picked = _checkpoint_param(request, "target", target)
    if picked is not None and picked != target.pk:
        # The picker form sends both ends; the target lives in the path, so move there.
        other = _same_thread(request, picked, target, "target")
        query = {"base": str(base_id), "view": view} if base_id else {"view": view}
        return redirect(f"{reverse('dashboard:diff', args=[other.pk])}?{urlencode(query)}")

    if base_id is None:
        base_id = target.parent_id
    base = None
    if base_id is not None:
        base = target if base_id == target.pk else _same_thread(request, base_id, target, "base")

    thread = Thread.objects.select_related("agent").get(pk=target.thread_id)
    picker = _picker_options(thread, [c for c in (base, target) if c is not None])
    diff: diffview.DiffView | None = None
    failure = ""
    if base is not None:
        try:
            base_state = storage.load_node(base.pk).state
            target_state = storage.load_node(target.pk).state
        except IntegrityFailure as exc:
            failure = exc.message
        else:
            diff = diffview.build_diff(base_state, target_state, make_patch(base_state, target_state))
    context = {
        "nav": "threads",
        "thread": thread,
        "thread_label": thread_label(thread),
        "base": base,
        "target": target,
        "diff": diff,
        "failure": failure,
        "view": view,
        "views": VIEWS,
        "options": diffview.picker_groups(picker),
        "picker_per_branch": PICKER_PER_BRANCH,
        "base_text": _option(base.branch.name, base.pk, base.seq, base.label).text if base is not None else "",
        "target_text": _option(target.branch.name, target.pk, target.seq, target.label).text,
        # The view switch keeps the compared pair.
        "base_query": f"base={base.pk}&" if base is not None else "",
    }
    return render(request, "checkpoints/diff.html", context)


# What the pickers offer and a person types: "<branch> #<seq>", then the label if any; "#12" is on
# the compared checkpoint's branch.
_PICKED = re.compile(r"\s*(?:(?P<branch>\S.*?)\s+)?#(?P<seq>\d{1,9})(?:\s.*)?", re.DOTALL)


def _checkpoint_param(request: HttpRequest, name: str, target: Checkpoint) -> UUID | None:
    """The checkpoint a picker names: its id, or its branch and number as the picker shows them."""
    raw = request.GET.get(name, "").strip()
    if not raw:
        return None
    try:
        return UUID(raw)
    except ValueError:
        pass
    picked = _PICKED.fullmatch(raw) if "\x00" not in raw else None
    if picked is None:
        raise BadRequest(
            f"The {name} must be a checkpoint of this thread as the list offers it ('main #12', or '#12' on "
            f"{target.branch.name}) or its id; {raw[:80]!r} is neither."
        )
    branch = picked["branch"] or target.branch.name
    found = (
        Checkpoint.objects.filter(thread_id=target.thread_id, branch__name=branch, seq=int(picked["seq"]))
        .values_list("pk", flat=True)
        .first()
    )
    if found is None:
        raise BadRequest(f"This thread has no checkpoint #{picked['seq']} on a branch named {branch[:100]!r}.")
    return found


def _same_thread(request: HttpRequest, checkpoint_id: UUID, target: Checkpoint, name: str) -> Checkpoint:
    other = get_checkpoint_for(request.user, checkpoint_id)
    if other.thread_id != target.thread_id:
        raise BadRequest(f"The {name} checkpoint must be in the same thread as the checkpoint compared.")
    return other


# The newest checkpoints of every branch in one round trip: one index range per branch.
_PICKER_SQL = """
SELECT b.name, c.id, c.seq, c.label
FROM checkpoints_branch b
CROSS JOIN LATERAL (
    SELECT id, seq, label FROM checkpoints_checkpoint
    WHERE thread_id = b.thread_id AND branch_id = b.id
    ORDER BY seq DESC LIMIT %s
) c
WHERE b.thread_id = %s
ORDER BY b.created_at, b.id, c.seq DESC
"""


def _picker_options(thread: Thread, compared: list[Checkpoint]) -> list[tuple[str, list[diffview.PickerOption]]]:
    """[(branch name, options newest first)] for the two selects; the compared checkpoints always appear."""
    groups: dict[str, list[diffview.PickerOption]] = {}
    with connection.cursor() as cursor:
        cursor.execute(_PICKER_SQL, [PICKER_PER_BRANCH, thread.pk])
        for branch, checkpoint_id, seq, label in cursor.fetchall():
            groups.setdefault(branch, []).append(_option(branch, checkpoint_id, seq, label))
    for checkpoint in compared:
        options = groups.setdefault(checkpoint.branch.name, [])
        if all(option.id != checkpoint.pk for option in options):
            options.append(_option(checkpoint.branch.name, checkpoint.pk, checkpoint.seq, checkpoint.label))
            options.sort(key=lambda option: -option.seq)
    return list(groups.items())


def _option(branch: str, checkpoint_id: UUID, seq: int, label: str) -> diffview.PickerOption:
    return diffview.PickerOption(id=checkpoint_id, seq=seq, text=f"{branch} #{seq} {label}".rstrip())
