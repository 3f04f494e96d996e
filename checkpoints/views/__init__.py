"""Dashboard pages: thin views over the store and the selectors. Every page needs a signed-in
person with at least the viewer role; a thread the person cannot see is a 404."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse

View = Callable[..., HttpResponse]


def viewer_required(view: View) -> View:
    """Sign-in first (redirect to the login page), then the viewer role (403 without it)."""

    @login_required
    @wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not request.user.has_perm("checkpoints.view_thread"):
            raise PermissionDenied("Your account has no role yet. Ask an admin to run `manage.py grantrole`.")
        return view(request, *args, **kwargs)

    return wrapped
