"""Typed errors built from the server's `{"error": {"code", "message", "detail"}}` bodies."""

from __future__ import annotations

from typing import Any


class QuicksaveError(Exception):
    """An error answer from Quicksave: `code` (snake_case), `message`, `detail` and the HTTP `status`."""

    def __init__(self, code: str, message: str, detail: dict[str, Any] | None = None, status: int = 0) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.detail = detail or {}
        self.status = status

    def __str__(self) -> str:
        return f"{self.status} {self.code}: {self.message}"


class InvalidInput(QuicksaveError):
    """400, 413, 415 or 422: the server refused the request as sent; nothing changed."""


class AuthenticationFailed(QuicksaveError):
    """401: no key, or an unknown or revoked one."""


class PermissionDenied(QuicksaveError):
    """403: the key may not do this (e.g. act for another agent)."""


class NotFound(QuicksaveError):
    """404: unknown, or belonging to another agent (the server does not tell the two apart)."""


class Conflict(QuicksaveError):
    """409: the request lost to a concurrent change (a lease lost, a run already finished...)."""


class StaleParent(Conflict):
    """409 stale_parent: another writer moved the head since this thread object last saw it."""

    @property
    def head(self) -> str | None:
        """The id of the branch's current head checkpoint."""
        head = self.detail.get("head")
        return str(head) if head is not None else None


class AlreadyDecided(Conflict):
    """409 already_decided: someone else decided the approval first."""


class LeaseLost(Conflict):
    """409 lease_lost: the lease this write named is over. For a run: another attempt holds it now
    (this one was too slow to renew its lease). For a key of a memory board: the lease expired, was
    released, or another holder took the key (its fencing token is newer). Stop working under it:
    nothing written under it is accepted any more."""


class LeaseHeld(Conflict):
    """409 lease_held: another holder has a live lease on the board's key (`holder`, `expires_at`)."""

    @property
    def holder(self) -> str | None:
        holder = self.detail.get("holder")
        return str(holder) if holder is not None else None


class VersionConflict(Conflict):
    """409 version_conflict: the memory item is not at the version the write expected;
    `current_version` is the one it is at (0: it does not exist)."""

    @property
    def current_version(self) -> int | None:
        current = self.detail.get("current_version")
        return int(current) if current is not None else None


class CallInDoubt(Conflict):
    """409 in_doubt: the call was started before (by an attempt that died) and has no result, so it
    may or may not have happened. It is not run again; a person answers in the inbox, and the
    answer queues the next run. `approval` is the inbox item's id."""

    @property
    def approval(self) -> str | None:
        approval = self.detail.get("approval")
        return str(approval) if approval is not None else None


_BY_CODE: dict[str, type[QuicksaveError]] = {
    "stale_parent": StaleParent,
    "already_decided": AlreadyDecided,
    "lease_lost": LeaseLost,
    "lease_held": LeaseHeld,
    "version_conflict": VersionConflict,
    "in_doubt": CallInDoubt,
}
_BY_STATUS: dict[int, type[QuicksaveError]] = {
    400: InvalidInput,
    401: AuthenticationFailed,
    403: PermissionDenied,
    404: NotFound,
    409: Conflict,
    413: InvalidInput,
    415: InvalidInput,
    422: InvalidInput,
}


def error_from_response(status: int, body: Any, text: str = "") -> QuicksaveError:
    """The typed error for an error answer; a body without the error format (a proxy's page) still maps by status."""
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        code = str(error.get("code") or f"http_{status}")
        message = str(error.get("message") or "")
        detail = error.get("detail") if isinstance(error.get("detail"), dict) else {}
    else:
        code, message, detail = f"http_{status}", text[:500] or f"HTTP {status}", {}
    kind = _BY_CODE.get(code) or _BY_STATUS.get(status, QuicksaveError)
    return kind(code, message, detail, status)
