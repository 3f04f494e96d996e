"""The base of every error a domain module raises for the API to turn into a 4xx.

Each subclass names its `code` (snake_case, part of the API contract) and HTTP `status`.
"""

from __future__ import annotations

from typing import Any, TypeVar


class DomainError(Exception):
    code = "invalid"
    status = 400

    def __init__(self, message: str, *, detail: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail or {}


PAYLOAD_TOO_LARGE = "payload_too_large"


def payload_too_large(limit: int) -> dict[str, Any]:
    """The API's error for a request body past QUICKSAVE_MAX_REQUEST_BYTES, wherever it is refused:
    by the ASGI entry point before reading it, or by the JSON parser."""
    return {
        "code": PAYLOAD_TOO_LARGE,
        "message": f"The request body is larger than {limit} bytes (QUICKSAVE_MAX_REQUEST_BYTES).",
        "detail": {"limit": limit},
    }


E = TypeVar("E", bound=BaseException)


def found_in_chain(exc: BaseException, kind: type[E]) -> E | None:
    """`exc`, its cause or context, or one in an exception group among them, that is a `kind`:
    ours, found inside whatever an agent framework raised around it."""
    seen: set[int] = set()
    pending: list[BaseException] = [exc]
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, kind):
            return current
        if isinstance(current, BaseExceptionGroup):
            pending.extend(current.exceptions)
        pending.extend(found for found in (current.__cause__, current.__context__) if found is not None)
    return None
