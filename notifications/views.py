"""The notifications pages: admins configure channels and read their delivery logs; anyone signed
in who may decide uses a decision link from a message."""

from __future__ import annotations

import json
from typing import Any
from uuid import UUID

from django.contrib import messages
from django.contrib.auth.models import User
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods, require_POST, require_safe

from approvals.models import ApprovalRequest, ApprovalStatus, Risk
from approvals.services import REJECT
from audit.trail import client_address
from checkpoints.views import permission_required
from notifications import dispatch, endpoints, links, selectors
from notifications.access import manager_required
from notifications.forms import EndpointSettingsForm, NewEndpointForm, SubscriptionForm
from notifications.models import Delivery, Endpoint, Kind, Notice, Subscription
from quicksave.errors import DomainError

# Sign-in first (the sign-in page sends the person back to the link), then the reviewer role.
decider_required = permission_required(
    "checkpoints.decide_approval", "Deciding approvals needs the reviewer or admin role."
)


def _user(request: HttpRequest) -> User:
    assert isinstance(request.user, User)
    return request.user


def _list(request: HttpRequest, form: NewEndpointForm, *, status: int = 200) -> HttpResponse:
    context = {"nav": "notifications", "rows": selectors.endpoint_rows(), "form": form, "kinds": Kind.choices,
               "notices": Notice.choices, "risks": Risk.choices}  # fmt: skip
    return render(request, "notifications/endpoint_list.html", context, status=status)


@manager_required
@require_safe
def endpoint_list(request: HttpRequest) -> HttpResponse:
    return _list(request, NewEndpointForm(initial={"kind": Kind.WEBHOOK, "events": [Notice.APPROVAL_REQUESTED]}))


@manager_required
@require_POST
@never_cache  # the answer may hold a webhook's secret
def endpoint_create(request: HttpRequest) -> HttpResponse:
    form = NewEndpointForm(request.POST)
    if not form.is_valid():
        return _list(request, form, status=400)
    data = form.cleaned_data
    try:
        endpoint, secret = endpoints.create_endpoint(
            name=data["name"], kind=data["kind"], url=data["url"], recipients=data["recipients"],
            decision_links=data["decision_links"], subscriptions=[form.spec()], actor=_user(request),
            address=client_address(request),
        )  # fmt: skip
    except endpoints.InvalidEndpoint as exc:
        form.add_error(exc.detail.get("field") if exc.detail.get("field") in form.fields else None, exc.message)
        return _list(request, form, status=400)
    if secret is None:
        messages.success(request, f"Channel {endpoint.name} added.")
        return redirect("notifications:endpoint", endpoint_id=endpoint.pk)
    return _secret_page(request, endpoint, secret, created=True)


def _secret_page(request: HttpRequest, endpoint: Endpoint, secret: str, *, created: bool) -> HttpResponse:
    context = {"nav": "notifications", "endpoint": endpoint, "secret": secret, "created": created}
    return render(request, "notifications/secret.html", context)


def _endpoint(endpoint_id: UUID) -> Endpoint:
    return get_object_or_404(Endpoint.objects.prefetch_related("subscriptions"), pk=endpoint_id)


def _detail(
    request: HttpRequest, endpoint: Endpoint, *, settings_form: EndpointSettingsForm | None = None,
    subscription_form: SubscriptionForm | None = None, status: int = 200,
) -> HttpResponse:  # fmt: skip
    before = request.GET.get("before", "")
    log, older = selectors.delivery_log(endpoint, before=int(before) if before.isdigit() and len(before) < 19 else None)
    initial = {"name": endpoint.name, "enabled": endpoint.enabled, "decision_links": endpoint.decision_links,
               "recipients": ", ".join(endpoint.recipients)}  # fmt: skip
    context = {
        "nav": "notifications",
        "endpoint": endpoint,
        "settings_form": settings_form or EndpointSettingsForm(initial=initial, kind=endpoint.kind),
        "subscription_form": subscription_form or SubscriptionForm(initial={"events": [Notice.APPROVAL_REQUESTED]}),
        "subscriptions": [
            (subscription, [Notice(event).label for event in subscription.events])
            for subscription in endpoint.subscriptions.order_by("id")
        ],
        "notices": Notice.choices,
        "risks": Risk.choices,
        "log": log,
        "older": older,
        "paged": before != "",
    }
    return render(request, "notifications/endpoint_detail.html", context, status=status)


@manager_required
@require_http_methods(["GET", "POST"])
def endpoint_detail(request: HttpRequest, endpoint_id: UUID) -> HttpResponse:
    endpoint = _endpoint(endpoint_id)
    if request.method != "POST":
        return _detail(request, endpoint)
    form = EndpointSettingsForm(request.POST, kind=endpoint.kind)
    if form.is_valid():
        try:
            endpoints.update_endpoint(endpoint=endpoint, actor=_user(request), address=client_address(request),
                                      **form.changes())  # fmt: skip
        except endpoints.InvalidEndpoint as exc:
            form.add_error(exc.detail.get("field") if exc.detail.get("field") in form.fields else None, exc.message)
        else:
            messages.success(request, "Settings saved.")
            return redirect("notifications:endpoint", endpoint_id=endpoint.pk)
    return _detail(request, endpoint, settings_form=form, status=400)


@manager_required
@require_POST
def subscription_add(request: HttpRequest, endpoint_id: UUID) -> HttpResponse:
    endpoint = _endpoint(endpoint_id)
    form = SubscriptionForm(request.POST)
    if form.is_valid():
        try:
            endpoints.add_subscription(endpoint=endpoint, spec=form.spec(), actor=_user(request),
                                       address=client_address(request))  # fmt: skip
        except endpoints.InvalidEndpoint as exc:
            form.add_error(None, exc.message)
        else:
            messages.success(request, "Subscription added.")
            return redirect("notifications:endpoint", endpoint_id=endpoint.pk)
    return _detail(request, endpoint, subscription_form=form, status=400)


@manager_required
@require_POST
def subscription_remove(request: HttpRequest, endpoint_id: UUID, subscription_id: int) -> HttpResponse:
    subscription = get_object_or_404(Subscription, pk=subscription_id, endpoint_id=endpoint_id)
    endpoints.remove_subscription(subscription=subscription, actor=_user(request), address=client_address(request))
    messages.success(request, "Subscription removed.")
    return redirect("notifications:endpoint", endpoint_id=endpoint_id)


@manager_required
@require_http_methods(["GET", "POST"])
@never_cache
def secret_rotate(request: HttpRequest, endpoint_id: UUID) -> HttpResponse:
    endpoint = _endpoint(endpoint_id)
    if endpoint.kind not in endpoints.SIGNED_KINDS:
        raise Http404(f"A {endpoint.kind} channel has no signing secret.")
    if request.method == "POST":
        secret = endpoints.rotate_secret(endpoint=endpoint, actor=_user(request), address=client_address(request))
        return _secret_page(request, endpoint, secret, created=False)
    return render(request, "notifications/confirm.html", {"nav": "notifications", "endpoint": endpoint,
                                                          "action": "rotate"})  # fmt: skip


@manager_required
@require_http_methods(["GET", "POST"])
def endpoint_delete(request: HttpRequest, endpoint_id: UUID) -> HttpResponse:
    endpoint = _endpoint(endpoint_id)
    if request.method == "POST":
        endpoints.delete_endpoint(endpoint=endpoint, actor=_user(request), address=client_address(request))
        messages.success(request, f"Channel {endpoint.name} deleted, with its delivery log.")
        return redirect("notifications:list")
    pending = endpoint.deliveries.filter(status="pending").count()
    return render(request, "notifications/confirm.html", {"nav": "notifications", "endpoint": endpoint,
                                                          "action": "delete", "pending": pending})  # fmt: skip


def _delivery(delivery_id: int) -> Delivery:
    found = None
    if delivery_id < 2**63:  # the path takes any digits; PostgreSQL's bigint does not
        found = Delivery.objects.select_related("endpoint", "resend_of", "requested_by").filter(pk=delivery_id).first()
    if found is None:
        raise Http404(f"Delivery {delivery_id} does not exist.")
    return found


@manager_required
@require_safe
def delivery_detail(request: HttpRequest, delivery_id: int) -> HttpResponse:
    """A delivery's attempts, and the "send again" confirmation."""
    delivery = _delivery(delivery_id)
    context = {"nav": "notifications", "delivery": delivery, "endpoint": delivery.endpoint,
               "attempts": list(delivery.attempt_log.all()), "notice_label": Notice(delivery.notice).label}  # fmt: skip
    return render(request, "notifications/delivery_detail.html", context)


@manager_required
@require_POST
def delivery_resend(request: HttpRequest, delivery_id: int) -> HttpResponse:
    try:
        again = dispatch.resend(delivery=_delivery(delivery_id), actor=_user(request), address=client_address(request))
    except DomainError as exc:
        messages.error(request, exc.message)
        return redirect("notifications:delivery", delivery_id=delivery_id)
    messages.success(request, f"Sending it again as delivery {again.pk}.")
    return redirect("notifications:delivery", delivery_id=again.pk)


def _outcome(approval: ApprovalRequest, decision: str) -> str:
    """What a person's decision through a link did: decided the request, or counted as a vote."""
    what = f"{approval.action} for {approval.thread.agent.name}"
    rejected = decision == REJECT
    if approval.status == ApprovalStatus.PENDING:
        quorum = approval.quorum
        more = (quorum.rejections_needed - len(quorum.rejected_by) if rejected
                else quorum.approvals_needed - len(quorum.approved_by))  # fmt: skip
        vote = "rejection" if rejected else "approval"
        return f"Your {vote} of {what} is counted; it takes {more} more {vote}{'s' if more != 1 else ''}."
    return f"{'Rejected' if rejected else 'Approved'}: {what}."


@decider_required
@require_http_methods(["GET", "POST"])
@never_cache
def decide(request: HttpRequest, token: str) -> HttpResponse:
    """A decision link from a message: shows what it decides, and decides it when confirmed."""
    link = links.find(token)
    if link is None:
        raise Http404("This decision link is not one Quicksave made.")
    approval = link.approval
    error: str = ""
    status = 200
    comment = ""
    if request.method == "POST":
        comment = request.POST.get("comment", "")[:10_000]
        try:
            decided = links.decide_with(token=token, user=_user(request), comment=comment,
                                        address=client_address(request))  # fmt: skip
        except DomainError as exc:
            error, status = exc.message, exc.status
            link = links.find(token) or link
            approval = link.approval
        else:
            messages.success(request, _outcome(decided, link.decision))
            return redirect("inbox:approval", approval_id=approval.pk)
    context: dict[str, Any] = {
        "nav": "inbox",
        "link": link,
        "approval": approval,
        "unusable": links.why_unusable(link),
        "args_json": "" if approval.unreadable else json.dumps(approval.args, indent=2, ensure_ascii=False),
        "error": error,
        "comment": comment,
        "reject": link.decision == REJECT,
    }
    return render(request, "notifications/decide.html", context, status=status)
