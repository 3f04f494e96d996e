"""Errors the memory store raises; the API maps each to a status and a `code`."""

from __future__ import annotations

from quicksave.errors import DomainError


class MemoryStoreError(DomainError):
    """Anything the memory store refuses."""


class InvalidNamespace(MemoryStoreError):
    code = "invalid_namespace"
    status = 400


class InvalidKey(MemoryStoreError):
    code = "invalid_key"
    status = 400


class InvalidValue(MemoryStoreError):
    code = "invalid_value"
    status = 422


class InvalidFilter(MemoryStoreError):
    code = "invalid_filter"
    status = 400


class ValueTooLarge(MemoryStoreError):
    code = "value_too_large"
    status = 413


class ItemNotFound(MemoryStoreError):
    code = "not_found"
    status = 404


class VersionConflict(MemoryStoreError):
    """A write that expected another version than the item's current one."""

    code = "version_conflict"
    status = 409


class NoVectorSearch(MemoryStoreError):
    """Semantic search asked of a server without pgvector."""

    code = "vector_search_unavailable"
    status = 400


class NotABoard(MemoryStoreError):
    """A lease or a board's feed asked of a namespace that is not a blackboard."""

    code = "not_a_board"
    status = 409


class LeaseHeld(MemoryStoreError):
    """A key of a blackboard someone else holds a live lease on."""

    code = "lease_held"
    status = 409


class LeaseLost(MemoryStoreError):
    """A write, renewal or release naming a lease that is no longer the key's live one: it
    expired, was released, or another holder has the key now."""

    code = "lease_lost"
    status = 409
