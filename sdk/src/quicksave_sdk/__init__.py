"""Quicksave's Python SDK: save an agent's state after every step, log its tool calls so a replay
never repeats one, ask a person before a risky action, and resume from a checkpoint, over the REST API."""

from quicksave_sdk.client import (
    Approval,
    Checkpoint,
    Client,
    Run,
    Thread,
    ToolCall,
    ToolResult,
    __version__,
    call_key,
    tool_key,
)
from quicksave_sdk.errors import (
    AlreadyDecided,
    AuthenticationFailed,
    CallInDoubt,
    Conflict,
    InvalidInput,
    LeaseLost,
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
    "CallInDoubt",
    "Checkpoint",
    "Client",
    "Conflict",
    "InvalidInput",
    "LeaseLost",
    "NotFound",
    "PermissionDenied",
    "QuicksaveError",
    "Run",
    "StaleParent",
    "Thread",
    "ToolCall",
    "ToolResult",
    "__version__",
    "call_key",
    "make_patch",
    "tool_key",
]
