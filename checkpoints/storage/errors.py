"""Errors the checkpoint store raises; the API maps each to a status and a `code`."""

from __future__ import annotations

from quicksave.errors import DomainError


class StoreError(DomainError):
    """Anything the checkpoint store refuses."""


class InvalidState(StoreError):
    """The state, patch or a field is not something the store accepts."""

    code = "invalid_state"
    status = 422


class InvalidPatch(StoreError):
    code = "invalid_patch"
    status = 422


class StateTooLarge(StoreError):
    code = "state_too_large"
    status = 413

    @classmethod
    def stopped(cls, reason: object, *, field: str, limit: int) -> StateTooLarge:
        """A patch stopped part-way (jsonpatch.PatchTooLarge, the `reason`): the state it was
        building would pass `limit`, or building it would take more work than such a state."""
        return cls(
            f"The state would grow past its limit ({reason}); the limit is {limit} bytes (QUICKSAVE_MAX_STATE_BYTES).",
            detail={"field": field, "limit": limit},
        )


class StaleParent(StoreError):
    """The parent is not the head of its branch any more: someone else wrote first."""

    code = "stale_parent"
    status = 409


class NotFound(StoreError):
    code = "not_found"
    status = 404


class IntegrityFailure(StoreError):
    """A stored row does not match its integrity MAC: it was altered behind the store's back."""

    code = "integrity_failure"
    status = 500


class InvalidPath(StoreError):
    """A value's history asked of something that is not an RFC 6901 pointer (or a page cursor it
    did not hand out); `detail["field"]` names the parameter."""

    code = "invalid"
    status = 400
