"""Request limits checked before any view runs (an over-long query string is a 414, not work, and
a NUL in a Django admin filter is a 400 rather than the database's error), and the
Content-Security-Policy every response carries."""

from __future__ import annotations

from collections.abc import Callable

from csp.middleware import CSPMiddleware, PolicyParts
from django.conf import settings
from django.core.exceptions import DisallowedHost
from django.http import HttpRequest, HttpResponse, HttpResponseBase, JsonResponse
from django.shortcuts import render

ADMIN_PREFIX = "/admin/"


class QueryStringLimitMiddleware:
    """Refuses a query string longer than QUICKSAVE_MAX_QUERY_BYTES (filters and cursors are far shorter),
    and a NUL in a Django admin filter."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        limit: int = settings.QUICKSAVE_MAX_QUERY_BYTES
        length = len(request.META.get("QUERY_STRING", ""))
        if length <= limit:
            if request.path.startswith(ADMIN_PREFIX) and (field := _field_with_nul(request)) is not None:
                # Our own pages and API name such a filter in their own words; the Django admin's
                # changelists hand it to PostgreSQL, whose text cannot hold a NUL (a 500).
                message = f"The filter {field!r} holds a NUL character, which no stored text can contain."
                return render(request, "400.html", {"message": message}, status=400)
            return self.get_response(request)
        message = f"The query string is {length} bytes; the limit is {limit}."
        if request.path.startswith("/api/"):
            detail = {"limit": limit, "length": length}
            return JsonResponse({"error": {"code": "uri_too_long", "message": message, "detail": detail}}, status=414)
        return render(request, "400.html", {"message": message}, status=414)


def _field_with_nul(request: HttpRequest) -> str | None:
    """The first query parameter whose name or a value holds a NUL, if any."""
    for name, values in request.GET.lists():
        if "\x00" in name or any("\x00" in value for value in values):
            return name
    return None


class ContentSecurityPolicyMiddleware(CSPMiddleware):
    """django-csp's policy (settings.CONTENT_SECURITY_POLICY), with the live-update sockets of this
    very host added to connect-src: 'self' covers ws: and wss: only in newer browsers."""

    def get_policy_parts(
        self, request: HttpRequest, response: HttpResponseBase, report_only: bool = False
    ) -> PolicyParts:
        parts = super().get_policy_parts(request, response, report_only)
        try:
            host = request.get_host()  # validated against ALLOWED_HOSTS: it cannot inject a directive
        except DisallowedHost:
            return parts
        parts.update = {**(parts.update or {}), "connect-src": [f"ws://{host}", f"wss://{host}"]}
        return parts
