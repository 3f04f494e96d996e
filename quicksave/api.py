"""What every API view shares: strict JSON parsing and the one error format.

Errors always read `{"error": {"code": "<snake_case>", "message": "<sentence>", "detail": {...}}}`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime
from typing import Any
from urllib import parse

from django.conf import settings
from django.core.exceptions import PermissionDenied, RequestDataTooBig
from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import Http404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import exceptions, serializers, status
from rest_framework.pagination import Cursor, CursorPagination
from rest_framework.parsers import BaseParser
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from quicksave import metrics
from quicksave.errors import PAYLOAD_TOO_LARGE, DomainError, payload_too_large
from quicksave.jsontext import UnstorableText, loads_strict
from quicksave_agents.fencing import Fence


class UnsupportedText(exceptions.ParseError):
    default_code = "unsupported_text"


class StrictJSONParser(BaseParser):
    """JSON bodies only: no NaN/Infinity (nor numbers that overflow to it), and no text PostgreSQL
    cannot store (NUL, lone surrogates), so bad input is a 400 here and never a failed write later."""

    media_type = "application/json"

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Mapping[str, Any] | None = None) -> Any:
        # DRF hands over the request itself as the stream, which Django does not hold to
        # DATA_UPLOAD_MAX_MEMORY_SIZE (= QUICKSAVE_MAX_REQUEST_BYTES): read at most one byte past it.
        limit: int = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        request = (parser_context or {}).get("request")
        declared = str(request.META.get("CONTENT_LENGTH") or "") if request is not None else ""
        if declared.isdigit() and int(declared) > limit:
            raise PayloadTooLarge()  # the ASGI entry point refuses it before reading; this covers the rest
        try:
            raw = stream.read(limit + 1) if stream is not None else b""
        except RequestDataTooBig:
            raise PayloadTooLarge() from None
        if len(raw) > limit:
            raise PayloadTooLarge()
        if not raw:
            return {}
        try:
            # Decoded here, strictly: json.loads would let UTF-8-encoded surrogates through.
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise exceptions.ParseError(f"The body is not valid UTF-8: {exc}") from None
        try:
            return loads_strict(text)
        except UnstorableText as exc:
            raise UnsupportedText(f"The body contains {exc}, which Quicksave cannot store.") from None
        except ValueError as exc:
            raise exceptions.ParseError(f"The body is not valid JSON: {exc}") from None


class FiniteFloatField(serializers.FloatField):
    """DRF's FloatField takes the strings "NaN" and "Infinity" (float() does): this one refuses
    them, as comparisons with NaN are all false and would pass any range check."""

    default_error_messages = {"not_finite": "A finite number is required."}

    def to_internal_value(self, data: Any) -> float:
        value: float = super().to_internal_value(data)
        if not math.isfinite(value):
            self.fail("not_finite")
        return value


FENCE_HELP = (
    "The fence token of the run attempt making this write (`run.fence` from a claim): refused with 409 "
    "lease_lost once another attempt holds the run. Without it the write is not fenced."
)


def parse_fence(value: Any, *, field: str = "fence") -> Fence | None:
    """A fence token from a request body (or None), as a 400 naming `field` when it is malformed."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise serializers.ValidationError({field: "must be a string, `<run id>:<attempt>`."})
    try:
        return Fence.parse(value)
    except ValueError:
        message = "is not a fence token; it looks like `<run id>:<attempt>`."
        raise serializers.ValidationError({field: message}) from None


@extend_schema_field(OpenApiTypes.STR)
class FenceField(serializers.Field):  # type: ignore[type-arg]
    """A run attempt's fence token, read as a quicksave_agents.fencing.Fence."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("required", False)
        kwargs.setdefault("allow_null", True)
        kwargs.setdefault("default", None)
        kwargs.setdefault("help_text", FENCE_HELP)
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> Fence | None:
        if isinstance(data, str) and len(data) > 80:
            raise serializers.ValidationError("is not a fence token; it looks like `<run id>:<attempt>`.")
        try:
            return parse_fence(data, field=self.field_name or "fence")
        except serializers.ValidationError as exc:
            raise serializers.ValidationError(next(iter(exc.detail.values()))) from None  # type: ignore[union-attr]

    def to_representation(self, value: Any) -> str | None:
        return value.token if isinstance(value, Fence) else value


class StrictSerializer(serializers.Serializer[Any]):
    """Refuses fields it does not know, so a misspelt option (`resume_agent`) is a 400, not ignored."""

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if isinstance(self.initial_data, dict):
            unknown = sorted(set(self.initial_data) - set(self.fields))
            if unknown:
                raise serializers.ValidationError(
                    {unknown[0]: f"is not a field here; the fields are {', '.join(self.fields)}."}
                )
        return attrs


class CursorPage(CursorPagination):
    """Cursor pagination as every list in API v1 answers it: `{"results": [...], "next": url}`,
    `limit` from 1 to `max_page_size`, and a bad `limit` or `cursor` a 400 naming it (DRF
    quietly ignores `limit=abc` or `limit=0` and answers an undecodable cursor with a 404)."""

    page_size = 50
    max_page_size = 200
    page_size_query_param = "limit"

    def get_page_size(self, request: Any) -> int:
        raw = request.query_params.get(self.page_size_query_param)
        if raw is None:
            return self.page_size
        field = serializers.IntegerField(min_value=1, max_value=self.max_page_size)
        try:
            value: int = field.run_validation(raw)
        except exceptions.ValidationError as exc:
            raise exceptions.ValidationError({self.page_size_query_param: exc.detail}) from None
        return value

    def paginate_queryset(self, queryset: Any, request: Any, view: Any = None) -> list[Any] | None:
        self._model = queryset.model  # what decode_cursor checks a cursor's position against
        return super().paginate_queryset(queryset, request, view)

    def decode_cursor(self, request: Any) -> Cursor | None:
        """The cursor `next` handed out, or a 400: DRF takes any base64 that decodes to nothing
        for the first page, and filters by whatever position a made-up cursor carries."""
        given = request.query_params.get(self.cursor_query_param)
        try:
            cursor = super().decode_cursor(request)
        except exceptions.NotFound:
            cursor = None
        if given is not None and (cursor is None or self._encoded(cursor) != given or not self._fits(cursor)):
            raise exceptions.ValidationError(
                {self.cursor_query_param: ["Not a cursor this list handed out: follow `next` or leave it out."]}
            )
        return cursor

    def _encoded(self, cursor: Cursor) -> str | None:
        """The cursor parameter of the link this cursor would be handed out in."""
        query = parse.parse_qs(parse.urlsplit(self.encode_cursor(cursor)).query)
        return query.get(self.cursor_query_param, [None])[0]

    def _fits(self, cursor: Cursor) -> bool:
        """Whether the cursor's position is a value of the field the list is ordered by."""
        if cursor.position is None:
            return True
        field = self._model._meta.get_field(self.ordering[0].lstrip("-"))
        try:
            value = field.to_python(cursor.position)
        except (DjangoValidationError, ValueError, OverflowError):
            return False
        return not isinstance(value, datetime) or value.tzinfo is not None

    def get_paginated_response(self, data: Any) -> Response:
        return Response({"results": data, "next": self.get_next_link()})


class PayloadTooLarge(exceptions.APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_code = PAYLOAD_TOO_LARGE

    def __init__(self) -> None:
        error = payload_too_large(settings.DATA_UPLOAD_MAX_MEMORY_SIZE)
        super().__init__(error["message"])
        self.extra = error["detail"]


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
        if exc.status == status.HTTP_409_CONFLICT:
            metrics.conflicts_total.labels(code=exc.code).inc()
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
