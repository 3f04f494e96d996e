"""The Django admin site, for staff accounts only (users, groups, the audit trail)."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar, cast

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponseBase

NOT_STAFF = (
    "The Django admin is for staff accounts (manage.py ensureadmin creates one). "
    "Quicksave roles, admin included, do not open it: everything they allow is on the dashboard."
)

View = TypeVar("View", bound=Callable[..., HttpResponseBase])


class QuicksaveAdminSite(admin.AdminSite):
    """Django's admin, answering a signed-in person without staff status with a 403 page: Django's
    own sends them to the sign-in page, which sends a signed-in person straight back, for ever."""

    def admin_view(self, view: View, cacheable: bool = False) -> View:
        inner = super().admin_view(view, cacheable)

        @wraps(view)
        def staff_only(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
            if request.user.is_authenticated and not self.has_permission(request):
                raise PermissionDenied(NOT_STAFF)
            return inner(request, *args, **kwargs)

        return cast(View, staff_only)
