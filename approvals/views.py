"""The approval inbox (with its triage: decide from the row, bulk-approve low-risk items after one
confirmation, what is assigned to me, who is blocked) and the decision page."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from django import forms
from django.contrib import messages
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.db.models import F, Q, QuerySet
from django.db.models.functions import Coalesce
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.template.defaultfilters import pluralize
from django.urls import reverse
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_http_methods

from approvals import policies, selectors, services
from approvals.inbox_page import blocked_chips, inbox_rows
from approvals.models import ApprovalKind, ApprovalRequest, ApprovalStatus, Risk
from audit.trail import client_address
from checkpoints import storage
from checkpoints.access import of_visible_threads, visible_threads
from checkpoints.models import Checkpoint
from checkpoints.presentation import conversation, diffview
from checkpoints.storage.errors import IntegrityFailure
from checkpoints.storage.jsonpatch import make_patch
from checkpoints.views import viewer_required
from quicksave.errors import DomainError
from quicksave.forms import PageLinkField, invalid_filters, page_queries
from quicksave.jsontext import loads_strict
from quicksave_agents.models import Run
from quicksave_agents.runs import unclaimed_runs

INBOX_SIZE = 50  # a screenful or two; the pager follows on without skipping


BULK_MAX = INBOX_SIZE


class InboxFilterForm(forms.Form):
    agent = forms.SlugField(required=False, max_length=64, label="Agent")
    status = forms.ChoiceField(required=False, choices=[("", "Pending"), *ApprovalStatus.choices], label="Status")
    view = forms.ChoiceField(required=False, choices=[("", "Everyone's"), ("mine", "Assigned to me")], label="Show")
    sort = forms.ChoiceField(required=False, choices=[("", "Waiting longest"), ("newest", "Newest")], label="Order")
    after = PageLinkField(id_type=UUID)


def _approvals(user: Any) -> Any:
    return (
        ApprovalRequest.objects.filter(thread__in=visible_threads(user))
        .select_related(
            "thread__agent",
            "checkpoint",
            "decided_by",
            "tool_call",
            "policy__escalate_to",
            "policy__policy__agent",
            "rule",
        )
        .prefetch_related("votes__user", "policy__groups", "policy__users")
    )


def _inbox_rows() -> Any:
    """What an inbox row shows, and no more (the approval page reads the rest: `_approvals`)."""
    return selectors.with_voters(
        ApprovalRequest.objects.select_related("thread__agent", "decided_by", "policy__escalate_to", "rule")
    )


@viewer_required
def inbox(request: HttpRequest) -> HttpResponse:
    form = InboxFilterForm(request.GET)
    if not form.is_valid():
        raise invalid_filters(form)
    status = form.cleaned_data["status"] or ApprovalStatus.PENDING
    mine = form.cleaned_data["view"] == "mine"
    readable = of_visible_threads(ApprovalRequest.objects.all(), request.user)
    approvals = readable.filter(status=status)
    if form.cleaned_data["agent"]:
        approvals = approvals.filter(thread__agent__name=form.cleaned_data["agent"])
    if mine and isinstance(request.user, User):
        approvals = selectors.assigned_to(approvals, request.user)
    pending = status == ApprovalStatus.PENDING
    after = form.cleaned_data["after"]
    shown, following = _page(approvals, pending=pending, newest=form.cleaned_data["sort"] == "newest", after=after)
    first_query, next_query = page_queries(request, "after", following)
    # Every agent with approvals here, not only those shown (the filter suggests the others), who
    # is blocked on a person, and the nav's count of what is pending, all in one query.
    waiting = selectors.waiting_by_agent(readable)
    now = timezone.now()
    context = {
        "nav": "inbox",
        "pending_approvals": waiting.pending,
        "approvals": inbox_rows(shown, now=now),
        "paged": after is not None,
        "first_query": first_query,
        "next_query": next_query,
        "page_size": INBOX_SIZE,
        "status": status,
        "status_label": ApprovalStatus(status).label,
        "statuses": ApprovalStatus.choices,
        "agent": form.cleaned_data["agent"],
        "mine": mine,
        "newest": form.cleaned_data["sort"] == "newest",
        "blocked": blocked_chips(waiting.blocked, now=now) if pending else [],
        "unclaimed": unclaimed_runs(threads=visible_threads(request.user)),
        # Where a decision taken from a row comes back to: this very list.
        "here": request.get_full_path(),
        "triage": pending and request.user.has_perm("checkpoints.decide_approval"),
        "agents": waiting.agents,
        "now": now,
    }
    return render(request, "approvals/inbox.html", context)


def _page(
    approvals: QuerySet[ApprovalRequest], *, pending: bool, newest: bool, after: tuple[datetime, UUID] | None
) -> tuple[list[ApprovalRequest], str | None]:
    """One page of `approvals` with what their rows show, and the link to the page after (None on
    the last). Pending work oldest first (it has waited longest) unless asked newest first; decided
    work newest first. Pages follow on from the (time, id) of the last one shown, so a decision
    meanwhile skips or repeats nothing."""
    at: F | Coalesce = F("created_at") if pending else Coalesce("decided_at", "created_at")
    newest = newest or not pending
    order = ("-at", "-id") if newest else ("at", "id")
    ordered = approvals.annotate(at=at).order_by(*order)
    if after is not None:
        earlier = Q(at__lt=after[0]) | Q(at=after[0], id__lt=after[1])
        later = Q(at__gt=after[0]) | Q(at=after[0], id__gt=after[1])
        ordered = ordered.filter(earlier if newest else later)
    # One query: the page's ids (a narrow subquery the index can stop early for), then their rows
    # with everything a row shows: sorting hundreds of wide joined rows to keep fifty cost more.
    page = _inbox_rows().filter(pk__in=ordered.values("pk")[: INBOX_SIZE + 1]).annotate(at=at).order_by(*order)
    if not pending:
        page = selectors.with_next_checkpoint(page)
    read = list(page)
    if len(read) <= INBOX_SIZE:
        return read, None
    last = read[INBOX_SIZE - 1]
    return read[:INBOX_SIZE], PageLinkField.link(getattr(last, "at"), last.pk)  # noqa: B009 (annotated, not a field)


@viewer_required
def approval_detail(request: HttpRequest, approval_id: UUID) -> HttpResponse:
    approval = _approvals(request.user).filter(pk=approval_id).first()
    if approval is None:
        raise Http404(f"Approval {approval_id} does not exist.")
    in_doubt = approval.kind == ApprovalKind.IN_DOUBT
    errors: dict[str, Any] = {}
    args_json = "" if approval.unreadable else _pretty(approval.args)
    edited_text = request.POST.get("result" if in_doubt else "args", "") if request.method == "POST" else args_json
    if request.method == "POST":
        user = request.user
        if not isinstance(user, User) or not user.has_perm("checkpoints.decide_approval"):
            raise PermissionDenied("Deciding approvals needs the reviewer or admin role.")
        try:
            if in_doubt:
                _answer_in_doubt(request, approval, user, errors)
            else:
                _decide(request, approval, user, errors)
            if not errors:
                return _after_decision(request, approval)
        except services.InvalidApproval as exc:
            field = exc.detail.get("field", "decision")
            errors[field] = exc.detail.get("errors") or [{"path": "", "message": exc.message}]
        except DomainError as exc:  # already decided, expired, the thread cancelled...
            errors["decision"] = [{"path": "", "message": exc.message}]
        if back := _back_to(request):  # decided from the inbox row: say why not there
            messages.error(request, f"{approval.action}: {_first_error(errors)}")
            return redirect(back)
        # Read again, not refresh_from_db(): that would open sealed values that may not open.
        approval = _approvals(request.user).get(pk=approval.pk)
    escalated = approval.escalated_at is not None
    user = request.user
    context = {
        "nav": "inbox",
        "approval": approval,
        "thread": approval.thread,
        "deciders": policies.who_may_decide(approval.policy, escalated=escalated) if approval.policy else None,
        "policy_name": f"{approval.policy.policy} v{approval.policy.version}" if approval.policy else None,
        "eligibility": policies.eligibility(approval=approval, user=user) if isinstance(user, User) else None,
        "in_doubt": in_doubt,
        "call": approval.tool_call if in_doubt else None,
        "errors": errors,
        "edited_text": edited_text,
        "args_json": args_json,
        "decided_args_json": "" if approval.unreadable else _pretty(approval.decided_args),
        "comment": request.POST.get("comment", "") if request.method == "POST" else "",
        "editing": request.GET.get("edit") == "1",
        "next_step": _next_step(approval),
        **_state_and_diff(approval),
    }
    return render(request, "approvals/approval_detail.html", context, status=400 if errors else 200)


def _back_to(request: HttpRequest) -> str | None:
    """The inbox page a row's decision was taken from (`next`), when it is one of ours."""
    back = (request.POST if request.method == "POST" else request.GET).get("next", "")
    if back.startswith(reverse("inbox:list")) and url_has_allowed_host_and_scheme(
        back, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return back
    return None


def _first_error(errors: dict[str, Any]) -> str:
    return next((str(problem["message"]) for problems in errors.values() for problem in problems), "")


def _after_decision(request: HttpRequest, approval: ApprovalRequest) -> HttpResponse:
    """Back to the inbox row it was taken from, on to the next request (approve-and-next), or
    the approval's own page, which shows the decision and what the agent did next."""
    decided = ApprovalRequest.objects.filter(pk=approval.pk).values_list("status", flat=True).first()
    said = "Your vote is in" if decided in (None, ApprovalStatus.PENDING) else ApprovalStatus(str(decided)).label
    if back := _back_to(request):
        messages.success(request, f"{said}: {approval.action} of {approval.thread.agent.name}.")
        return redirect(back)
    if request.POST.get("then") == "next":
        user = request.user
        assert isinstance(user, User)
        following = (
            selectors.assigned_to(_approvals(user).filter(status=ApprovalStatus.PENDING), user)
            .exclude(pk=approval.pk)
            .order_by("created_at", "id")
            .values_list("pk", flat=True)
            .first()
        )
        messages.success(request, f"{said}: {approval.action} of {approval.thread.agent.name}.")
        if following is None:
            return redirect("inbox:list")
        return redirect("inbox:approval", approval_id=following)
    return redirect("inbox:approval", approval_id=approval.pk)


@dataclass(frozen=True)
class NextStep:
    """What the agent did after a decision: its resume run, and the checkpoint it wrote next."""

    run: Run | None
    checkpoint: Checkpoint | None


def _next_step(approval: ApprovalRequest) -> NextStep | None:
    if approval.status == ApprovalStatus.PENDING:
        return None
    run = Run.objects.filter(approval=approval).order_by("-created_at").first()
    return NextStep(run=run, checkpoint=selectors.next_checkpoint(approval))


@viewer_required
@require_http_methods(["GET", "POST"])
def bulk_approve(request: HttpRequest) -> HttpResponse:
    """Approve several low-risk requests at once: GET lists what would be approved (the one
    confirmation), POST approves each through `services.decide` and says how it went."""
    user = request.user
    if not isinstance(user, User) or not user.has_perm("checkpoints.decide_approval"):
        raise PermissionDenied("Deciding approvals needs the reviewer or admin role.")
    asked = (request.POST if request.method == "POST" else request.GET).getlist("approval")[:BULK_MAX]
    ids = [value for value in asked if _is_uuid(value)]
    found = list(_approvals(user).filter(pk__in=ids, status=ApprovalStatus.PENDING).order_by("created_at", "id"))
    chosen = [item for item in found if item.risk == Risk.LOW and item.kind == ApprovalKind.APPROVAL]
    left_out = [item for item in found if item not in chosen]
    if request.method == "POST" and chosen:
        approved, refused = [], []
        for item in chosen:
            try:
                services.decide(approval=item, user=user, decision=services.APPROVE, address=client_address(request))
                approved.append(item)
            except DomainError as exc:
                refused.append(f"{item.action} of {item.thread.agent.name}: {exc.message}")
        if approved:
            messages.success(request, f"Approved {len(approved)} low-risk request{pluralize(len(approved))}.")
        for refusal in refused:
            messages.error(request, refusal)
        return redirect(_back_to(request) or reverse("inbox:list"))
    context = {"nav": "inbox", "chosen": chosen, "left_out": left_out, "missing": len(asked) - len(found),
               "back": _back_to(request) or reverse("inbox:list")}  # fmt: skip
    return render(request, "approvals/bulk_confirm.html", context, status=200 if chosen else 400)


def _is_uuid(value: str) -> bool:
    try:
        UUID(value)
    except ValueError:
        return False
    return True


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False)


def _json_field(request: HttpRequest, name: str, errors: dict[str, Any]) -> Any:
    """The JSON in a form field, or None with the error recorded under its name."""
    try:
        return loads_strict(request.POST.get(name, ""))
    except ValueError as exc:
        errors[name] = [{"path": "", "message": f"This is not valid JSON: {exc}"}]
        return None


def _decide(request: HttpRequest, approval: ApprovalRequest, user: User, errors: dict[str, Any]) -> None:
    decision = request.POST.get("decision", "")
    args: Any = None
    if decision == "edit":
        args = _json_field(request, "args", errors)
        if args is None and not errors:  # decide() reads None as "not edited": it would approve the original
            errors["args"] = [{"path": "", "message": "Edited arguments cannot be null; to approve the "
                               "arguments as they are, choose Approve."}]  # fmt: skip
        decision = "approve"
    if not errors:
        services.decide(approval=approval, user=user, decision=decision, comment=request.POST.get("comment", ""),
                        args=args, address=client_address(request))  # fmt: skip


def _answer_in_doubt(request: HttpRequest, approval: ApprovalRequest, user: User, errors: dict[str, Any]) -> None:
    resolution = request.POST.get("decision", "")
    extra: dict[str, Any] = {}
    if resolution == services.HAPPENED:
        extra["result"] = _json_field(request, "result", errors)
    if not errors:
        services.resolve_in_doubt(approval=approval, user=user, resolution=resolution,
                                  comment=request.POST.get("comment", ""), address=client_address(request),
                                  **extra)  # fmt: skip


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
        target = storage.load_node(approval.checkpoint_id).state
        base = storage.load_node(base_id).state if base_id else {}
    except IntegrityFailure as exc:
        return {"integrity_error": exc.message}
    return {
        "state_tree": diffview.state_tree(target),
        # What the agent and the person said before the step waiting here, as a conversation.
        "conversations": conversation.conversations(target),
        "state_json": json.dumps(target, indent=2, ensure_ascii=False)[:200_000],
        "diff": diffview.build_diff(base, target, make_patch(base, target)),
        "diff_base": base_id,
        "diff_base_is_approval": previous is not None,
    }
