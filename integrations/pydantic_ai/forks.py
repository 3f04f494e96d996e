"""A dashboard fork of a checkpoint that QuicksaveAgent wrote: the fork keeps the (edited) message
history and drops how the run ended there (`deferred`, `output`), so the agent, resumed from the
fork, goes on from those messages: it calls the model, runs pending tool calls, or asks again for
the deferred ones, in Pydantic AI's own terms.

No Pydantic AI import: the dashboard forks without it installed.
"""

from __future__ import annotations

from typing import Any

from checkpoints.forks import ForkShape
from checkpoints.models import Checkpoint
from integrations.pydantic_ai.threads import ENDINGS, FRAMEWORK


def pydantic_ai_fork(*, source: Checkpoint, before: dict[str, Any], after: dict[str, Any]) -> ForkShape | None:
    """The Pydantic AI side of a fork at `source`, or None when QuicksaveAgent did not write `source`."""
    if source.metadata.get("framework") != FRAMEWORK:
        return None
    return ForkShape(
        ops=[{"op": "remove", "path": f"/{key}"} for key in ENDINGS if key in after],
        metadata={"framework": FRAMEWORK},
        step=(source.step or 0) + 1,
    )
