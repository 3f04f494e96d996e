"""What every API view shares: strict JSON parsing and the one error format.

Errors always read `{"error": {"code": "<snake_case>", "message": "<sentence>", "detail": {...}}}`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from django.core.exceptions import PermissionDenied, RequestDataTooBig
from django.http import Http404
from rest_framework import exceptions, status
from rest_framework.parsers import BaseParser
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from quicksave.errors import DomainError


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


class StrictJSONParser(BaseParser):
    """JSON bodies only, without the NaN/Infinity extension Python's json module accepts."""

    media_type = "application/json"

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Mapping[str, Any] | None = None) -> Any:
        try:
            raw = stream.read() if stream is not None else b""
        except RequestDataTooBig:
            raise PayloadTooLarge() from None
        if not raw:
            return {}
        try:
            return json.loads(raw, parse_constant=_reject_constant)
        except RecursionError:
            raise exceptions.ParseError("The JSON body is nested too deeply.") from None
        except (ValueError, UnicodeDecodeError) as exc:
            raise exceptions.ParseError(f"The body is not valid JSON: {exc}") from None


class PayloadTooLarge(exceptions.APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_detail = "The request body is larger than QUICKSAVE_MAX_REQUEST_BYTES."
    default_code = "payload_too_large"


class Conflict(exceptions.APIException):
    status_code = status.HTTP_409_CONFLICT
    default_code = "conflict"


def error_response(code: str, message: str, status_code: int, detail: dict[str, Any] | None = None) -> Response:
    return Response({"error": {"code": code, "message": message, "detail": detail or {}}}, status=status_code)


_CODES = {
    exceptions.ParseError: "malformed_json",
    exceptions.NotAuthenticated: "not_authenticated",
    exceptions.AuthenticationFailed: "authentication_failed",
    exceptions.PermissionDenied: "permission_denied",
    exceptions.NotFound: "not_found",
    exceptions.MethodNotAllowed: "method_not_allowed",
    exceptions.NotAcceptable: "not_acceptable",
    exceptions.UnsupportedMediaType: "unsupported_media_type",
    exceptions.Throttled: "throttled",
}


def _first_message(detail: Any, prefix: str = "") -> str:
    if isinstance(detail, dict):
        for key, value in detail.items():
            name = key if key != "non_field_errors" else ""
            return _first_message(value, f"{prefix}.{name}" if prefix and name else (name or prefix))
    if isinstance(detail, list) and detail:
        return _first_message(detail[0], prefix)
    return f"{prefix}: {detail}" if prefix else str(detail)


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, DomainError):
        return error_response(exc.code, exc.message, exc.status, exc.detail)
    if isinstance(exc, RequestDataTooBig):
        exc = PayloadTooLarge()
    if isinstance(exc, Http404):
        return error_response("not_found", str(exc) or "Not found.", 404)
    if isinstance(exc, PermissionDenied):
        return error_response("permission_denied", str(exc) or "You may not do this.", 403)
    response = drf_exception_handler(exc, context)
    if response is None or not isinstance(exc, exceptions.APIException):
        return response
    if isinstance(exc, exceptions.ValidationError):
        message = _first_message(exc.detail)
        return error_response("invalid", message, 400, {"fields": exc.detail})
    code = _CODES.get(type(exc)) or (exc.default_code if isinstance(exc.default_code, str) else "error")
    detail = exc.detail
    message = str(detail) if not isinstance(detail, (dict, list)) else _first_message(detail)
    response.data = {"error": {"code": code, "message": message, "detail": getattr(exc, "extra", {}) or {}}}
    return response
