"""Request limits checked before any view runs (an over-long query string is a 414, not work, and
a NUL in a Django admin filter is a 400 rather than the database's error), the
Content-Security-Policy every response carries, and what operators see of each request: its id
and thread on every log line, its latency and status in the metrics."""

from __future__ import annotations

import functools
import re
import time
import uuid
from collections.abc import Callable
from typing import Any

from csp.middleware import CSPMiddleware, PolicyParts
from django.conf import settings
from django.core.exceptions import DisallowedHost
from django.http import HttpRequest, HttpResponse, HttpResponseBase, JsonResponse
from django.shortcuts import render
from prometheus_client import Counter, Histogram

from quicksave import logs, metrics

ADMIN_PREFIX = "/admin/"
# A request id a proxy in front may set; anything else is replaced by one of ours.
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")
REQUEST_ID_HEADER = "X-Request-ID"
# The header as WSGI names it in META: `request.headers` would first copy every header of the request.
_REQUEST_ID_META = "HTTP_X_REQUEST_ID"
# The method label's values: anything else counts as "other", so a client cannot mint label values.
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


class RequestContextMiddleware:
    """Binds the request's id (the X-Request-ID a proxy sent, or a new one) and the thread its URL
    names to every line logged while it is handled, and returns the id in X-Request-ID."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        sent = request.META.get(_REQUEST_ID_META, "")
        request_id = sent if _REQUEST_ID.fullmatch(sent) else uuid.uuid4().hex
        # Not reset on the way out: Django logs a 4xx or 5xx (django.request) after the middleware
        # has returned, and that line must name the request too. `request_finished` forgets them
        # (logs.forget_request), once the server has closed the response.
        logs.request_id.set(request_id)
        logs.thread_id.set(None)
        response = self.get_response(request)
        response[REQUEST_ID_HEADER] = request_id
        return response

    def process_view(
        self, request: HttpRequest, view_func: Callable[..., Any], view_args: Any, view_kwargs: dict[str, Any]
    ) -> None:
        if (thread := view_kwargs.get("thread_id")) is not None:
            logs.bind_thread(thread)


class RequestMetricsMiddleware:
    """Counts each response and times it by the route pattern it matched (never the path, whose ids
    would make a time series per thread)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        started = time.perf_counter()
        response = self.get_response(request)
        elapsed = time.perf_counter() - started
        match = request.resolver_match
        route = (match.route or match.view_name or "unnamed") if match is not None else "unmatched"
        method = request.method if request.method in _METHODS else "other"
        _duration(method, route).observe(elapsed)
        _responses(method, route, response.status_code).inc()
        return response


# Each label set's child, looked up once: `labels()` checks its arguments and takes the metric's lock
# on every call. Few label sets exist (methods, route patterns and status codes), so these stay small.
@functools.cache
def _duration(method: str, route: str) -> Histogram:
    return metrics.http_request_duration_seconds.labels(method=method, route=route)


@functools.cache
def _responses(method: str, route: str, status: int) -> Counter:
    return metrics.http_responses_total.labels(method=method, route=route, status=str(status))


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
