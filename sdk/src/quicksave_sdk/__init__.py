"""Quicksave's Python SDK: save an agent's state after every step, cache its tool calls,
ask a person before a risky action, and resume from a checkpoint, over the REST API."""

from quicksave_sdk.client import Approval, Checkpoint, Client, Run, Thread, ToolResult, __version__, tool_key
from quicksave_sdk.errors import (
    AlreadyDecided,
    AuthenticationFailed,
    Conflict,
    InvalidInput,
    NotFound,
    PermissionDenied,
    QuicksaveError,
    StaleParent,
)
from quicksave_sdk.jsonpatch import make_patch

__all__ = [
    "AlreadyDecided",
    "Approval",
    "AuthenticationFailed",
    "Checkpoint",
    "Client",
    "Conflict",
    "InvalidInput",
    "NotFound",
    "PermissionDenied",
    "QuicksaveError",
    "Run",
    "StaleParent",
    "Thread",
    "ToolResult",
    "__version__",
    "make_patch",
    "tool_key",
]
