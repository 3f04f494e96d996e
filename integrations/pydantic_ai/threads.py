"""A Pydantic AI conversation as a Quicksave thread: its creation (tagged `framework: pydantic-ai`),
its checkpoints and their states. The one module of this package that writes through the storage engine.

A checkpoint's state is `{"messages": [...]}`, the message history as `ModelMessagesTypeAdapter`
dumps it to JSON, plus `deferred` (the calls a paused run waits on) or `output` (a finished run's
output). Each checkpoint is written as a patch against the one before: the messages appended since
(and any message Pydantic AI rewrote), so a long conversation costs each turn only what it added.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from checkpoints import storage
from checkpoints.models import Checkpoint, CheckpointStatus, Thread
from quicksave_agents.fencing import Fence
from quicksave_agents.keys import get_or_create_agent

FRAMEWORK = "pydantic-ai"
# The state's keys besides `messages`: what a run ended with.
ENDINGS = ("deferred", "output")


def open_thread(*, agent: str, version: str, conversation_id: str) -> Thread:
    """The agent's thread for `conversation_id`, created (with the framework in its metadata) if new."""
    record = get_or_create_agent(name=agent, version=version)
    thread, _ = storage.create_thread(agent=record, external_id=conversation_id,
                                    metadata={"framework": FRAMEWORK, "conversation_id": conversation_id})  # fmt: skip
    return thread


def head(thread: Thread) -> Checkpoint | None:
    """The head of the thread's active branch, or None before its first checkpoint."""
    head_id = Thread.objects.values_list("head_id", flat=True).get(pk=thread.pk)
    return Checkpoint.objects.defer("payload").get(pk=head_id) if head_id else None


def latest_on_branch(checkpoint: Checkpoint) -> Checkpoint:
    """The newest checkpoint on `checkpoint`'s branch from `checkpoint` on (what a retried run goes on from)."""
    latest = (
        Checkpoint.objects.defer("payload")
        .filter(thread_id=checkpoint.thread_id, branch_id=checkpoint.branch_id, seq__gt=checkpoint.seq)
        .order_by("-seq")
        .first()
    )
    return latest or checkpoint


def state_of(checkpoint: Checkpoint | UUID) -> dict[str, Any]:
    return storage.state_at(checkpoint, hot=True)


def state_patch(before: dict[str, Any], after: dict[str, Any]) -> list[dict[str, Any]]:
    """RFC 6902 ops taking the state `before` to `after`: new messages as `add /messages/-`, a
    `replace` for each earlier message that changed (Pydantic AI stamps a request as it sends it),
    and the ending keys set or removed."""
    old, new = before.get("messages", []), after["messages"]
    ops: list[dict[str, Any]] = [{"op": "remove", "path": f"/messages/{len(new)}"} for _ in range(len(new), len(old))]
    for index, message in enumerate(new):
        if index >= len(old):
            ops.append({"op": "add", "path": "/messages/-", "value": message})
        elif old[index] != message:
            ops += _message_patch(index, old[index], message)
    for key in ENDINGS:
        if key in after and before.get(key) != after[key]:
            ops.append({"op": "add", "path": f"/{key}", "value": after[key]})
        elif key in before and key not in after:
            ops.append({"op": "remove", "path": f"/{key}"})
    return ops


def _message_patch(index: int, before: Any, after: Any) -> list[dict[str, Any]]:
    """Ops for a message Pydantic AI changed after it joined the history: only its changed fields
    (stamping a request as it is sent sets `timestamp`, `run_id` and `conversation_id`; its
    parts, a long prompt say, stay as they were)."""
    path = f"/messages/{index}"
    if not (isinstance(before, dict) and isinstance(after, dict)):
        return [{"op": "replace", "path": path, "value": after}]
    ops: list[dict[str, Any]] = [
        {"op": "remove", "path": f"{path}/{_pointer(key)}"} for key in before if key not in after
    ]
    ops += [{"op": "add", "path": f"{path}/{_pointer(key)}", "value": value}
            for key, value in after.items() if before.get(key, _MISSING) != value]  # fmt: skip
    return ops


def _pointer(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


_MISSING = object()


def append(
    *,
    thread: Thread,
    parent: Checkpoint | None,
    before: dict[str, Any],
    after: dict[str, Any],
    label: str,
    status: str = CheckpointStatus.RUNNING,
    error: str = "",
    model: str = "",
    fence: Fence | None = None,
) -> Checkpoint:
    """Append a checkpoint after `parent` (None: the thread's first) going from state `before` to `after`;
    `model` names the model whose response it holds."""
    metadata = {"framework": FRAMEWORK, **({"error": error[:2000]} if error else {})}
    fields: dict[str, Any] = {"label": label, "status": status, "metadata": metadata, "fence": fence,
                              "model": {"name": model[:200]} if model else None}  # fmt: skip
    if parent is None:
        return storage.append_checkpoint(thread=thread, parent=None, state=after, step=0, **fields)
    return storage.append_checkpoint(thread=thread, parent=parent, patch=state_patch(before, after),
                                   step=(parent.step or 0) + 1, **fields)  # fmt: skip
