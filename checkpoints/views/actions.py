"""The admin actions of the dashboard: rewind & branch (fork), re-run, cancel and resume.

Every action takes two steps: a form, then a page that says what will happen and asks to
confirm. Only the confirmation writes, through `checkpoints.forks`. Errors come back inline
on the form, with the status the API would answer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse

from approvals.models import ApprovalRequest
from audit.trail import client_address
from checkpoints import forks, selectors, storage
from checkpoints.access import check_can_cancel, check_can_delete, check_can_fork, get_checkpoint_for, get_thread_for
from checkpoints.models import Checkpoint, Thread
from checkpoints.presentation import diffview
from checkpoints.storage.errors import IntegrityFailure
from checkpoints.storage.jsonpatch import PatchError, PatchTooLarge, apply_patch, make_patch
from checkpoints.views import thread_label, viewer_required
from checkpoints.views.forms import ForkForm
from quicksave.errors import DomainError

# A state whose JSON is longer than this is not put in a textarea (a browser crawls editing
# megabytes); the fork can still be made unedited, or with a `patch` through the API.
EDITOR_CHARS = 500_000
# Where a domain error's field is shown on the fork form; the state editor stands for the patch.
_FORM_FIELDS = {"reason": "reason", "branch": "branch", "patch": "state", "carry_approval": "carry_approval"}


@dataclass(frozen=True)
class StateEditor:
    """The fork form's JSON editor: the text it holds (None: the state is too large to edit
    here) and whether it starts open."""

    text: str | None
    open: bool = False


def fork_card(request: HttpRequest, checkpoint: Checkpoint, state: dict[str, Any] | None) -> dict[str, Any]:
    """The checkpoint page's "Rewind & branch" card, for the people who may fork (nobody else sees it)."""
    if state is None or not request.user.has_perm("checkpoints.fork_thread"):
        return {"can_fork": False}
    editor = StateEditor(_editor_text(state, stored_bytes=checkpoint.state_bytes))
    return {"can_fork": True, **_form_context(checkpoint, ForkForm(), editor)}


@viewer_required
def fork_checkpoint(request: HttpRequest, checkpoint_id: UUID) -> HttpResponse:
    """GET: the fork form on a page of its own. POST: review (the confirmation page), edit
    (back to the form from the confirmation) or confirm (fork, then open the new checkpoint)."""
    checkpoint = get_checkpoint_for(request.user, checkpoint_id)
    user = check_can_fork(request.user)
    try:
        source_state = storage.load_node(checkpoint.pk).state
    except IntegrityFailure as exc:
        return _fork_form(request, checkpoint, ForkForm(), StateEditor(None), status=409, failure=exc.message)
    if request.method != "POST":
        editor = StateEditor(_editor_text(source_state, stored_bytes=checkpoint.state_bytes), open=True)
        return _fork_form(request, checkpoint, ForkForm(), editor)

    form = ForkForm(request.POST)
    valid = form.is_valid()
    step = form.cleaned_data.get("step", "review")
    if step in ("confirm", "edit"):
        ops = form.cleaned_data.get("patch")
        if ops is None:
            form.add_error("state", "The reviewed changes did not come through; edit and review them again.")
        # The editor is only made for a form that comes back: a fork that goes through never shows it,
        # and one that is refused is refused by the domain before the page applies the patch again.
        if step == "edit" or not form.is_valid():
            editor = _reviewed_editor(checkpoint, source_state, ops or [])
            return _fork_form(request, checkpoint, form, editor, status=400 if form.errors else 200)
        try:
            created = forks.fork(
                checkpoint=checkpoint, user=user, reason=form.cleaned_data["reason"], patch=ops,
                branch=form.cleaned_data["branch"], resume=form.cleaned_data["resume"],
                carry_approval=form.cleaned_data["carry_approval"], address=client_address(request),
            )  # fmt: skip
        except DomainError as exc:
            editor = _reviewed_editor(checkpoint, source_state, ops or [])
            return _fork_form(request, checkpoint, _with_error(form, exc), editor, status=exc.status)
        if form.cleaned_data["resume"]:
            # The agent goes on from the new checkpoint: watch it on the thread's timeline.
            branch = storage.get_branch_name(created.branch_id)
            messages.success(request, f"Branch {branch} goes on from #{checkpoint.seq}; the agent resumes there.")
            return redirect("dashboard:thread", thread_id=created.thread_id)
        return redirect("dashboard:checkpoint", checkpoint_id=created.pk)

    # Review: turn the edited state into a patch, check everything, show what will happen.
    # The editor stays open when the state was changed (or, by the template, when it has an error).
    edited = form.cleaned_data.get("state")
    ops = make_patch(source_state, edited) if edited is not None else []
    editor = StateEditor(request.POST.get("state"), open=bool(ops))
    if not valid:
        return _fork_form(request, checkpoint, form, editor, status=400)
    try:
        plan = forks.plan_fork(
            checkpoint=checkpoint, reason=form.cleaned_data["reason"], patch=ops, branch=form.cleaned_data["branch"],
            resume=form.cleaned_data["resume"], carry_approval=form.cleaned_data["carry_approval"],
        )  # fmt: skip
    except DomainError as exc:
        return _fork_form(request, checkpoint, _with_error(form, exc), editor, status=exc.status)
    thread = Thread.objects.select_related("agent", "active_branch").get(pk=checkpoint.thread_id)
    context = {
        "nav": "threads",
        "thread": thread,
        "thread_label": thread_label(thread),
        "checkpoint": checkpoint,
        "form": form,
        "plan": plan,
        "patch_json": json.dumps(plan.ops, ensure_ascii=False),
        "patch_pretty": diffview.pretty(plan.ops, limit=100_000),
        "diff": diffview.build_diff(source_state, plan.state, make_patch(source_state, plan.state)),
    }
    return render(request, "checkpoints/fork_confirm.html", context)


@viewer_required
def rerun_checkpoint(request: HttpRequest, checkpoint_id: UUID) -> HttpResponse:
    """Re-run the agent from a checkpoint, unedited, on a new branch: confirm, then open it."""
    checkpoint = get_checkpoint_for(request.user, checkpoint_id)
    user = check_can_fork(request.user)
    thread = Thread.objects.select_related("agent", "active_branch").get(pk=checkpoint.thread_id)
    if request.method == "POST":
        try:
            created = forks.rerun(checkpoint=checkpoint, user=user, reason=request.POST.get("reason", ""),
                                  address=client_address(request))  # fmt: skip
        except DomainError as exc:
            return _confirm(request, "rerun", thread, checkpoint=checkpoint, error=exc)
        return redirect("dashboard:checkpoint", checkpoint_id=created.pk)
    return _confirm(request, "rerun", thread, checkpoint=checkpoint)


@viewer_required
def cancel_thread(request: HttpRequest, thread_id: UUID) -> HttpResponse:
    return _thread_action(request, thread_id, "cancel", forks.cancel)


@viewer_required
def resume_thread(request: HttpRequest, thread_id: UUID) -> HttpResponse:
    return _thread_action(request, thread_id, "resume", forks.resume_failed)


@viewer_required
def delete_thread(request: HttpRequest, thread_id: UUID) -> HttpResponse:
    return _thread_action(request, thread_id, "delete", forks.delete)


def _thread_action(request: HttpRequest, thread_id: UUID, action: str, perform: Any) -> HttpResponse:
    """Cancel, resume or delete: GET asks to confirm, POST (with a reason) does it and goes back."""
    thread = get_thread_for(request.user, thread_id)
    user = check_can_delete(request.user) if action == "delete" else check_can_cancel(request.user)
    if request.method != "POST":
        return _confirm(request, action, thread)
    try:
        perform(thread=thread, user=user, reason=request.POST.get("reason", ""), address=client_address(request))
    except DomainError as exc:
        return _confirm(request, action, thread, error=exc)
    if action == "delete":
        label = thread_label(thread)
        messages.success(request, f"Thread {label} was deleted and its data key destroyed.")
        return redirect("dashboard:threads")
    return redirect("dashboard:thread", thread_id=thread.pk)


# --------------------------------------------------------------------------- helpers


def _fork_form(
    request: HttpRequest,
    checkpoint: Checkpoint,
    form: ForkForm,
    editor: StateEditor,
    *,
    status: int = 200,
    failure: str = "",
) -> HttpResponse:
    thread = Thread.objects.select_related("agent").get(pk=checkpoint.thread_id)
    context = {
        "nav": "threads",
        "failure": failure,
        "thread": thread,
        "thread_label": thread_label(thread),
        "checkpoint": checkpoint,
        "environment": selectors.environment_of(checkpoint),
        "environment_stop": selectors.environment_stop(checkpoint),
        **_form_context(checkpoint, form, editor),
    }
    return render(request, "checkpoints/fork.html", context, status=status)


def _form_context(checkpoint: Checkpoint, form: ForkForm, editor: StateEditor) -> dict[str, Any]:
    approvals: list[ApprovalRequest] = list(forks.carryable_approvals(checkpoint.thread_id)[:50])
    return {
        "fork_form": form,
        "state_editor": editor,
        "carryable": approvals,
        "editor_limit": f"{EDITOR_CHARS:,}",
        # What the branch will be called if the name is left empty (checked again when it is made).
        "branch_placeholder": forks.plan_branch_name(checkpoint.thread_id),
    }


def _confirm(
    request: HttpRequest,
    action: str,
    thread: Thread,
    *,
    checkpoint: Checkpoint | None = None,
    error: DomainError | None = None,
) -> HttpResponse:
    """The confirmation page of a thread action (cancel, resume) or of a re-run."""
    head = None
    if thread.head_id:
        head = Checkpoint.objects.defer("payload").select_related("branch").filter(pk=thread.head_id).first()
    refusals = {"cancel": forks.cancel_refusal, "resume": forks.resume_refusal, "delete": forks.delete_refusal}
    refusal = refusals.get(action, lambda _: None)(thread)
    context = {
        "nav": "threads",
        "action": action,
        "thread": thread,
        "thread_label": thread_label(thread),
        "checkpoint": checkpoint,
        "head": head,
        "refusal": refusal,
        "error": error.message if error else "",
        "error_field": error.detail.get("field", "") if error else "",
        "reason": request.POST.get("reason", "") if request.method == "POST" else "",
        "thread_pending_approvals": thread.approvals.filter(status="pending").count(),
        "queued_runs": thread.runs.filter(status="queued").count(),
        "checkpoint_count": Checkpoint.objects.filter(thread=thread).count() if action == "delete" else 0,
        "branch_placeholder": forks.plan_branch_name(thread.pk) if action == "rerun" else "",
        "back": reverse("dashboard:checkpoint", args=[checkpoint.pk])
        if checkpoint
        else reverse("dashboard:thread", args=[thread.pk]),
    }
    return render(request, "checkpoints/thread_action_confirm.html", context, status=error.status if error else 200)


def _with_error(form: ForkForm, exc: DomainError) -> ForkForm:
    """The form with a domain error shown on its field (or above the form when it names none)."""
    where = _FORM_FIELDS.get(str(exc.detail.get("field", "")))
    message = exc.message
    if where == "state" and exc.detail.get("path") is not None:
        message = f"{message} (op {exc.detail.get('op')}, at {exc.detail['path'] or 'the whole state'})"
    form.add_error(where, message)
    return form


def _editor_text(state: dict[str, Any], *, stored_bytes: int = 0) -> str | None:
    # The stored (compact) size is a lower bound of the indented text: skip encoding what cannot fit.
    if stored_bytes > EDITOR_CHARS:
        return None
    text = json.dumps(state, indent=2, ensure_ascii=False)
    return text if len(text) <= EDITOR_CHARS else None


def _reviewed_editor(checkpoint: Checkpoint, state: dict[str, Any], ops: list[dict[str, Any]]) -> StateEditor:
    """The open editor holding `state` with the reviewed `ops` applied (`state` itself when they do
    not apply: the domain's error says why).

    The patch is applied only as far as the editor could hold its result: one that would grow the
    state past EDITOR_CHARS bytes of JSON (whose indented text is no shorter) stops there, and
    its state is too large to edit here, as if it had been made."""
    try:
        applied = apply_patch(state, ops, limit=EDITOR_CHARS)
    except PatchTooLarge:
        return StateEditor(None, open=True)
    except (PatchError, RecursionError, TypeError, ValueError):
        return StateEditor(_editor_text(state, stored_bytes=checkpoint.state_bytes), open=True)
    if not isinstance(applied.doc, dict):
        return StateEditor(_editor_text(state, stored_bytes=checkpoint.state_bytes), open=True)
    edited_bytes = checkpoint.state_bytes + applied.size_delta
    return StateEditor(_editor_text(applied.doc, stored_bytes=edited_bytes), open=True)
