"""A dashboard fork of a checkpoint a `QuicksaveSession` wrote, kept a session checkpoint: its
step counts the user turns of the edited conversation (what `pop_item`, `clear_session` and
`create_branch_from_turn` read), and a fork of a paused run stays paused on the same call, so
resuming the fork files that call for a decision again.

No SDK import: the dashboard forks without `openai-agents` installed (the app registers this
shaper whether or not it is)."""

from __future__ import annotations

from typing import Any

from checkpoints.forks import ForkShape
from checkpoints.models import Checkpoint

# The same names as integrations.openai_agents.session (which imports the SDK, so not imported here).
FRAMEWORK = "openai-agents"
META = "openai_agents"
RUN_STATE = "run_state"
PAUSED_KEYS = ("paused", "call_id", "tool", "args_digest")


def openai_agents_fork(*, source: Checkpoint, before: dict[str, Any], after: dict[str, Any]) -> ForkShape | None:
    """The session side of a fork at `source` whose state goes from `before` to `after`, or None
    when no QuicksaveSession wrote `source`."""
    meta = source.metadata.get(META)
    # A session's thread names its framework; its checkpoints carry metadata of their own only
    # now and then (and always did before their turns moved to `step`).
    if not isinstance(meta, dict) and source.thread.metadata.get("framework") != FRAMEWORK:
        return None
    items = after.get("items")
    if not isinstance(items, list):
        return None
    turns = sum(1 for item in items if isinstance(item, dict) and item.get("role") == "user")
    waits = isinstance(meta, dict) and RUN_STATE in after  # a fork of a paused run stays paused on its call
    paused = {key: meta[key] for key in PAUSED_KEYS if key in meta} if waits else {}
    return ForkShape(ops=[], metadata={META: paused} if paused else {}, step=turns)
