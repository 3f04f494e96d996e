"""Request limits checked before any view runs: an over-long query string is a 414, not work."""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render


class QueryStringLimitMiddleware:
    """Refuses a query string longer than QUICKSAVE_MAX_QUERY_BYTES (filters and cursors are far shorter)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        limit: int = settings.QUICKSAVE_MAX_QUERY_BYTES
        length = len(request.META.get("QUERY_STRING", ""))
        if length <= limit:
            return self.get_response(request)
        message = f"The query string is {length} bytes; the limit is {limit}."
        if request.path.startswith("/api/"):
            detail = {"limit": limit, "length": length}
            return JsonResponse({"error": {"code": "uri_too_long", "message": message, "detail": detail}}, status=414)
        return render(request, "400.html", {"message": message}, status=414)
