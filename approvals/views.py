"""The approval inbox and the decision page."""

from __future__ import annotations

import json
from typing import Any
from uuid import UUID

from django import forms
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.db.models import F, Q
from django.db.models.functions import Coalesce
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone

from approvals import services
from approvals.audit import client_address
from approvals.models import ApprovalRequest, ApprovalStatus
from checkpoints import diffview, store
from checkpoints.access import visible_threads
from checkpoints.errors import IntegrityFailure
from checkpoints.jsonpatch import make_patch
from checkpoints.models import Checkpoint
from checkpoints.views import viewer_required
from quicksave.errors import DomainError
from quicksave.forms import PageLinkField, invalid_filters, page_queries
from quicksave.jsontext import loads_strict

INBOX_SIZE = 100


class InboxFilterForm(forms.Form):
    agent = forms.SlugField(required=False, max_length=64, label="Agent")
    status = forms.ChoiceField(required=False, choices=[("", "Pending"), *ApprovalStatus.choices], label="Status")
    after = PageLinkField(id_type=UUID)


def _approvals(user: Any) -> Any:
    return ApprovalRequest.objects.filter(thread__in=visible_threads(user)).select_related(
        "thread__agent", "checkpoint", "decided_by"
    )


@viewer_required
def inbox(request: HttpRequest) -> HttpResponse:
    form = InboxFilterForm(request.GET)
    if not form.is_valid():
        raise invalid_filters(form)
    status = form.cleaned_data["status"] or ApprovalStatus.PENDING
    approvals = _approvals(request.user).filter(status=status).defer("checkpoint__payload")
    if form.cleaned_data["agent"]:
        approvals = approvals.filter(thread__agent__name=form.cleaned_data["agent"])
    # Pending work oldest first (it has waited longest); decided ones newest first. Pages follow
    # on from the (time, id) of the last one shown, so a decision meanwhile skips or repeats nothing.
    after = form.cleaned_data["after"]
    if status == ApprovalStatus.PENDING:
        ordered = approvals.annotate(at=F("created_at")).order_by("at", "id")
        if after is not None:
            ordered = ordered.filter(Q(at__gt=after[0]) | Q(at=after[0], id__gt=after[1]))
    else:
        ordered = approvals.annotate(at=Coalesce("decided_at", "created_at")).order_by("-at", "-id")
        if after is not None:
            ordered = ordered.filter(Q(at__lt=after[0]) | Q(at=after[0], id__lt=after[1]))
    rows = list(ordered[: INBOX_SIZE + 1])
    shown = rows[:INBOX_SIZE]
    following = PageLinkField.link(shown[-1].at, shown[-1].pk) if len(rows) > INBOX_SIZE else None  # `at`: annotated
    first_query, next_query = page_queries(request, "after", following)
    context = {
        "nav": "inbox",
        "approvals": shown,
        "paged": after is not None,
        "first_query": first_query,
        "next_query": next_query,
        "page_size": INBOX_SIZE,
        "status": status,
        "status_label": ApprovalStatus(status).label,
        "statuses": ApprovalStatus.choices,
        "agent": form.cleaned_data["agent"],
        # Every agent with approvals here, not only those shown: the filter suggests the others.
        "agents": list(
            _approvals(request.user)
            .order_by("thread__agent__name")
            .values_list("thread__agent__name", flat=True)
            .distinct()
        ),
        "now": timezone.now(),
    }
    return render(request, "approvals/inbox.html", context)


@viewer_required
def approval_detail(request: HttpRequest, approval_id: UUID) -> HttpResponse:
    approval = _approvals(request.user).filter(pk=approval_id).first()
    if approval is None:
        raise Http404(f"Approval {approval_id} does not exist.")
    errors: dict[str, Any] = {}
    edited_text = json.dumps(approval.args, indent=2, ensure_ascii=False)
    if request.method == "POST":
        user = request.user
        if not isinstance(user, User) or not user.has_perm("checkpoints.decide_approval"):
            raise PermissionDenied("Deciding approvals needs the reviewer or admin role.")
        decision = request.POST.get("decision", "")
        args: Any = None
        if decision == "edit":
            edited_text = request.POST.get("args", "")
            try:
                args = loads_strict(edited_text)
            except ValueError as exc:
                errors["args"] = [{"path": "", "message": f"This is not valid JSON: {exc}"}]
            else:
                if args is None:  # decide() reads None as "not edited": it would approve the original
                    errors["args"] = [{"path": "", "message": "Edited arguments cannot be null; to approve the "
                                       "arguments as they are, choose Approve."}]  # fmt: skip
            decision = "approve"
        if not errors:
            try:
                services.decide(
                    approval=approval, user=user, decision=decision, comment=request.POST.get("comment", ""),
                    args=args, address=client_address(request),
                )  # fmt: skip
                return redirect("inbox:approval", approval_id=approval.pk)
            except services.InvalidApproval as exc:
                field = exc.detail.get("field", "decision")
                errors[field] = exc.detail.get("errors") or [{"path": "", "message": exc.message}]
            except (services.AlreadyDecided, services.ApprovalExpired) as exc:
                errors["decision"] = [{"path": "", "message": exc.message}]
            except DomainError as exc:
                errors["decision"] = [{"path": "", "message": exc.message}]
            approval.refresh_from_db()
    context = {
        "nav": "inbox",
        "approval": approval,
        "thread": approval.thread,
        "errors": errors,
        "edited_text": edited_text,
        "args_json": json.dumps(approval.args, indent=2, ensure_ascii=False),
        "decided_args_json": json.dumps(approval.decided_args, indent=2, ensure_ascii=False),
        "comment": request.POST.get("comment", "") if request.method == "POST" else "",
        **_state_and_diff(approval),
    }
    return render(request, "approvals/approval_detail.html", context, status=400 if errors else 200)


def _state_and_diff(approval: ApprovalRequest) -> dict[str, Any]:
    """The state at the approval's checkpoint, and what changed since the thread's previous approval."""
    previous = (
        ApprovalRequest.objects.filter(thread_id=approval.thread_id, created_at__lt=approval.created_at)
        .order_by("-created_at")
        .values_list("checkpoint_id", flat=True)
        .first()
    )
    base_id = previous or (
        Checkpoint.objects.filter(thread_id=approval.thread_id, branch_id=approval.checkpoint.branch_id)
        .order_by("seq")
        .values_list("id", flat=True)
        .first()
    )
    try:
        target = store.load_node(approval.checkpoint_id).state
        base = store.load_node(base_id).state if base_id else {}
    except IntegrityFailure as exc:
        return {"integrity_error": exc.message}
    return {
        "state_tree": diffview.render_tree(target),
        "state_json": json.dumps(target, indent=2, ensure_ascii=False)[:200_000],
        "diff": diffview.build_diff(base, target, make_patch(base, target)),
        "diff_base": base_id,
        "diff_base_is_approval": previous is not None,
    }
