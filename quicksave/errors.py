"""The base of every error a domain module raises for the API to turn into a 4xx.

Each subclass names its `code` (snake_case, part of the API contract) and HTTP `status`.
"""

from __future__ import annotations

from typing import Any


class DomainError(Exception):
    code = "invalid"
    status = 400

    def __init__(self, message: str, *, detail: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail or {}
