"""GET /healthz: the state of the database and the channel layer."""

from __future__ import annotations

import time
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import connection
from django.http import HttpRequest, JsonResponse


def _check_database() -> dict[str, Any]:
    started = time.perf_counter()
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        return {"status": "ok", "ms": round((time.perf_counter() - started) * 1000, 2)}
    except Exception as exc:  # a health probe reports failures instead of raising them
        return {"status": "down", "error": str(exc)}


def _check_channel_layer() -> dict[str, Any]:
    layer = get_channel_layer()
    if layer is None:
        return {"status": "down", "error": "no channel layer configured"}
    backend = type(layer).__name__
    try:
        channel = async_to_sync(layer.new_channel)()
        async_to_sync(layer.send)(channel, {"type": "health.ping"})
        return {"status": "ok", "backend": backend}
    except Exception as exc:
        return {"status": "degraded", "backend": backend, "error": str(exc)}


def healthz(request: HttpRequest) -> JsonResponse:
    checks = {"database": _check_database(), "channel_layer": _check_channel_layer()}
    healthy = checks["database"]["status"] == "ok"
    overall = "ok" if all(c["status"] == "ok" for c in checks.values()) else "degraded"
    return JsonResponse({"status": overall if healthy else "down", **checks}, status=200 if healthy else 503)
