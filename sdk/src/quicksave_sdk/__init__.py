"""Quicksave's Python SDK: save an agent's state after every step, log its tool calls so a replay
never repeats one, ask a person before a risky action, resume from a checkpoint, and keep long-term memory
and blackboards shared with other agents (`Client.memory`), over the REST API."""

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
    LeaseHeld,
    LeaseLost,
    NotFound,
    PermissionDenied,
    QuicksaveError,
    StaleParent,
    VersionConflict,
)
from quicksave_sdk.jsonpatch import make_patch
from quicksave_sdk.memory import Board, BoardEvent, Lease, Memory, MemoryItem, MemoryVersion, Written

__all__ = [
    "AlreadyDecided",
    "Approval",
    "AuthenticationFailed",
    "Board",
    "BoardEvent",
    "CallInDoubt",
    "Checkpoint",
    "Client",
    "Conflict",
    "InvalidInput",
    "Lease",
    "LeaseHeld",
    "LeaseLost",
    "Memory",
    "MemoryItem",
    "MemoryVersion",
    "NotFound",
    "PermissionDenied",
    "QuicksaveError",
    "Run",
    "StaleParent",
    "Thread",
    "ToolCall",
    "ToolResult",
    "VersionConflict",
    "Written",
    "__version__",
    "call_key",
    "make_patch",
    "tool_key",
]
