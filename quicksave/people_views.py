"""The people pages: admins add people, change roles, deactivate and reactivate them and give them
a new temporary password (each through quicksave/people.py); anyone signed in chooses their own
password, and someone holding a temporary one is sent to do so first (`PasswordToSetMiddleware`)."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any
from urllib.parse import urlencode

from django.conf import settings
from django.contrib import messages
from django.contrib.auth import update_session_auth_hash
from django.contrib.auth.decorators import login_required
from django.contrib.auth.forms import PasswordChangeForm, SetPasswordForm
from django.contrib.auth.models import Group, User
from django.core.exceptions import PermissionDenied
from django.db.models import Prefetch
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods, require_POST, require_safe

from audit.trail import client_address
from quicksave import people
from quicksave.models import PasswordToSet
from quicksave.people_forms import NewPersonForm, ReasonForm, RoleForm
from quicksave.roles import ADMIN, ROLES, role_of

View = Callable[..., HttpResponse]
# Shown on the list at most; a filter by name finds the others.
LIST_SIZE = 200
# The session's note that its person signed in with a temporary password (set by the sign-in view).
PASSWORD_TO_SET = "quicksave.password_to_set"  # noqa: S105 (a session key, not a password)


def admin_required(view: View) -> View:
    """Sign-in first, then the admin role (a 403 without it), as the nav's `can_admin`."""

    @login_required
    @wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if role_of(request.user) != ADMIN:
            raise PermissionDenied("Managing people needs the admin role.")
        return view(request, *args, **kwargs)

    return wrapped


def _actor(request: HttpRequest) -> User:
    user = request.user
    assert isinstance(user, User)
    return user


def _role(user: User) -> str | None:
    """The role shown for a person read with `_people()` (groups prefetched: no query)."""
    if user.is_superuser:
        return ADMIN
    names = {group.name for group in user.groups.all()}
    return next((role for role in reversed(ROLES) if role in names), None)


def _people() -> Any:
    roles = Group.objects.filter(name__in=ROLES)
    return User.objects.prefetch_related(Prefetch("groups", queryset=roles))


@admin_required
@require_safe
def person_list(request: HttpRequest) -> HttpResponse:
    name = request.GET.get("q", "").strip()[:150]
    found = _people().order_by("username")
    if name:
        found = found.filter(username__icontains=name)
    rows = list(found[: LIST_SIZE + 1])
    to_set = set(PasswordToSet.objects.filter(user__in=[user.pk for user in rows]).values_list("user_id", flat=True))
    context = {
        "nav": "people",
        "people": [(user, _role(user), user.pk in to_set) for user in rows[:LIST_SIZE]],
        "more": len(rows) > LIST_SIZE,
        "list_size": LIST_SIZE,
        "q": name,
        "admins": len(people.active_admins()),
    }
    return render(request, "people/list.html", context)


@admin_required
@require_http_methods(["GET", "POST"])
@never_cache  # the answer to a POST holds the temporary password: no cache may keep it
def person_new(request: HttpRequest) -> HttpResponse:
    form = NewPersonForm(request.POST if request.method == "POST" else None)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        try:
            user, password = people.create_person(
                actor=_actor(request), username=data["username"], email=data["email"], role=data["role"],
                password=data["password"], address=client_address(request),
            )  # fmt: skip
        except people.PeopleError as exc:
            form.add_error(exc.field, exc.message)
        else:
            if data["invite"]:
                try:
                    people.send_invitation(actor=_actor(request), user=user, address=client_address(request),
                                           sign_in_url=request.build_absolute_uri(reverse("login")))  # fmt: skip
                    messages.success(request, f"The invitation is on its way to {user.email}.")
                except people.PeopleError as exc:
                    messages.error(request, exc.message)
            context = {"nav": "people", "person": user, "role": data["role"], "password": password, "new": True}
            return render(request, "people/password_once.html", context)
    status = 400 if form.errors else 200
    return render(request, "people/new.html", {"nav": "people", "form": form}, status=status)


@admin_required
@require_safe
def person_detail(request: HttpRequest, user_id: int) -> HttpResponse:
    user = get_object_or_404(_people(), pk=user_id)
    return _detail(request, user, RoleForm(initial={"role": _role(user)}))


def _detail(request: HttpRequest, user: User, form: RoleForm, *, status: int = 200) -> HttpResponse:
    context = {
        "nav": "people",
        "person": user,
        "role": _role(user),
        "form": form,
        "must_set_password": people.must_set_password(user),
        "is_me": user.pk == request.user.pk,
        "audit_query": urlencode({"actor": user.get_username()}),
    }
    return render(request, "people/detail.html", context, status=status)


@admin_required
@require_POST
def person_role(request: HttpRequest, user_id: int) -> HttpResponse:
    user = get_object_or_404(_people(), pk=user_id)
    form = RoleForm(request.POST)
    if form.is_valid():
        try:
            changed = people.change_role(actor=_actor(request), user=user, role=form.cleaned_data["role"],
                                         address=client_address(request))  # fmt: skip
        except people.PeopleError as exc:
            form.add_error("role", exc.message)
            return _detail(request, user, form, status=exc.status)
        name, role = user.get_username(), form.cleaned_data["role"]
        if changed:
            messages.success(request, f"{name} is now {'an' if role == ADMIN else 'a'} {role}.")
        else:
            messages.info(request, f"{name} was {'an' if role == ADMIN else 'a'} {role} already: nothing changed.")
        return redirect("people:detail", user_id=user.pk)
    return _detail(request, user, form, status=400)


@admin_required
@require_http_methods(["GET", "POST"])
def person_deactivate(request: HttpRequest, user_id: int) -> HttpResponse:
    user = get_object_or_404(User, pk=user_id)
    form = ReasonForm(request.POST if request.method == "POST" else None)
    error = ""
    if request.method == "POST" and form.is_valid() and user.is_active:
        try:
            people.deactivate(actor=_actor(request), user=user, reason=form.cleaned_data["reason"],
                              address=client_address(request))  # fmt: skip
        except people.PeopleError as exc:
            error = exc.message
        else:
            messages.success(request, f"{user.get_username()} is deactivated: they can no longer sign in.")
            return redirect("people:detail", user_id=user.pk)
    context = {"nav": "people", "person": user, "form": form, "error": error, "is_me": user.pk == request.user.pk,
               "last_admin": _last_admin(user)}  # fmt: skip
    status = 409 if error else 400 if form.errors else 200
    return render(request, "people/deactivate.html", context, status=status)


def _last_admin(user: User) -> bool:
    admins = people.active_admins()
    return [admin.pk for admin in admins] == [user.pk]


@admin_required
@require_http_methods(["GET", "POST"])
def person_reactivate(request: HttpRequest, user_id: int) -> HttpResponse:
    user = get_object_or_404(User, pk=user_id)
    if request.method == "POST" and not user.is_active:
        people.reactivate(actor=_actor(request), user=user, address=client_address(request))
        messages.success(request, f"{user.get_username()} can sign in again.")
        return redirect("people:detail", user_id=user.pk)
    return render(request, "people/reactivate.html", {"nav": "people", "person": user})


@admin_required
@require_http_methods(["GET", "POST"])
@never_cache  # the answer to a POST holds the temporary password
def person_reset_password(request: HttpRequest, user_id: int) -> HttpResponse:
    user = get_object_or_404(User, pk=user_id)
    if request.method == "POST":
        password = people.reset_password(actor=_actor(request), user=user, address=client_address(request))
        if user.pk == request.user.pk:  # their own: this session verifies against the old hash
            update_session_auth_hash(request, User.objects.get(pk=user.pk))
            request.session[PASSWORD_TO_SET] = True
        context = {"nav": "people", "person": user, "role": role_of(user), "password": password, "new": False}
        return render(request, "people/password_once.html", context)
    context = {"nav": "people", "person": user, "is_me": user.pk == request.user.pk}
    return render(request, "people/reset_password.html", context)


@login_required
@require_http_methods(["GET", "POST"])
def set_password(request: HttpRequest) -> HttpResponse:
    """Choose your own password: after a temporary one without the old one again, else with it."""
    user = _actor(request)
    first = people.must_set_password(user)
    form_class = SetPasswordForm if first else PasswordChangeForm
    form = form_class(user, request.POST if request.method == "POST" else None)
    following = _next(request)
    if request.method == "POST" and form.is_valid():
        people.set_own_password(user=user, password=form.cleaned_data["new_password1"], address=client_address(request))
        update_session_auth_hash(request, user)  # stay signed in with the new password
        request.session.pop(PASSWORD_TO_SET, None)
        messages.success(request, "Your password is set.")
        return redirect(following)
    context = {"form": form, "first": first, "next": following}
    return render(request, "people/set_password.html", context, status=400 if form.errors else 200)


def _next(request: HttpRequest) -> str:
    wanted = (request.POST if request.method == "POST" else request.GET).get("next", "")
    if wanted and url_has_allowed_host_and_scheme(wanted, {request.get_host()}, require_https=request.is_secure()):
        return wanted
    return reverse("dashboard:threads")


def set_password_url(following: str) -> str:
    """The set-password page, coming back to `following` once done."""
    url = reverse("set-password")
    return f"{url}?{urlencode({'next': following})}" if following and following != "/" else url


class PasswordToSetMiddleware:
    """Sends someone who signed in with a temporary password to choose their own before anything
    else: pages redirect to the set-password page, the API answers 403. Only the session is read
    (the sign-in view notes it there), so no request pays a query for it."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        session = getattr(request, "session", None)
        if session is None or not session.get(PASSWORD_TO_SET) or not request.user.is_authenticated:
            return self.get_response(request)
        path = request.path
        if path in (reverse("set-password"), reverse("logout")) or path.startswith(settings.STATIC_URL):
            return self.get_response(request)
        message = "Choose your own password first: you signed in with a temporary one."
        if path.startswith("/api/"):
            error = {"code": "password_not_set", "message": message, "detail": {"url": reverse("set-password")}}
            return JsonResponse({"error": error}, status=403)
        return redirect(set_password_url(request.get_full_path()))
