"""Dashboard pages: thin views over the store and the selectors. Every page needs a signed-in
person with at least the viewer role; a thread the person cannot see is a 404."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse

from checkpoints.models import Thread

View = Callable[..., HttpResponse]


def permission_required(permission: str, refusal: str) -> Callable[[View], View]:
    """A view decorator: sign-in first (redirect to the login page), then `permission` (a 403
    saying `refusal` without it)."""

    def decorate(view: View) -> View:
        @login_required
        @wraps(view)
        def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            if not request.user.has_perm(permission):
                raise PermissionDenied(refusal)
            return view(request, *args, **kwargs)

        return wrapped

    return decorate


# Every dashboard page: the viewer role (which every role includes).
viewer_required = permission_required(
    "checkpoints.view_thread", "Your account has no role yet. Ask an admin to run `manage.py grantrole`."
)


def thread_label(thread: Thread) -> str:
    """How breadcrumbs and titles name a thread: its external id, else the start of its id."""
    return thread.external_id or str(thread.pk)[:8]
