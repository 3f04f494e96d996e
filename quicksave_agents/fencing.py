"""Fencing tokens: every write a run makes names the attempt that makes it, and the database
refuses the write once a newer attempt holds the run.

A run's `attempts` goes up by one at every claim, so (run, attempt) names one claim. A worker
frozen past its lease (a long GC pause, SIGSTOP, a partition) wakes holding an old attempt;
whatever it then writes — a checkpoint, a tool call's intent or result, an approval request,
complete or fail — carries that attempt and is refused by the statement that would write it,
not by a check read beforehand: `SQL` is a condition spliced into the write's own statement.
It takes a share lock on the run row, so a claim (an UPDATE of that row) waits for the write's
transaction to end, and a write waits for a claim in flight and then sees its new attempt.

This module imports nothing of Quicksave's but the error base: the store, the tool-call log
and the approvals use it without depending on the run queue.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from uuid import UUID

from quicksave.errors import DomainError


class LeaseLost(DomainError):
    """The run is no longer held by this attempt: its lease ran out and someone else claimed it."""

    code = "lease_lost"
    status = 409


@dataclass(frozen=True)
class Fence:
    """One claim of a run: the run and the attempt number the claim gave it."""

    run_id: UUID
    attempt: int

    @property
    def token(self) -> str:
        """The fence as the REST API hands it out and takes it back: `<run id>:<attempt>`."""
        return f"{self.run_id}:{self.attempt}"

    @classmethod
    def parse(cls, token: str) -> Fence:
        """The fence a token names; ValueError when it is not `<run id>:<attempt>`."""
        run, sep, attempt = token.partition(":")
        if not sep or not attempt.isascii() or not attempt.isdigit() or len(attempt) > 9:
            raise ValueError(f"not a fence token: {token[:80]!r}")
        return cls(UUID(run), int(attempt))

    def lost(self, *, thread_id: UUID | None = None) -> LeaseLost:
        return LeaseLost(
            f"Attempt {self.attempt} of run {self.run_id} no longer holds the run; another attempt claimed it, "
            "or it finished.",
            detail={"run": str(self.run_id), "attempt": self.attempt, "thread": str(thread_id) if thread_id else None},
        )


# True when the write carries no fence (a write outside any run), or when its attempt still holds
# its run and the run is running. Parameters: fence_run and fence_attempt. The thread written is not
# compared with the run's: a fence only ever refuses a write (one without a fence is let through),
# and a LangGraph run writes its subgraphs' namespaces, which are threads of their own.
SQL = """(%(fence_run)s::uuid IS NULL OR EXISTS (
    SELECT 1 FROM agents_run fence
    WHERE fence.id = %(fence_run)s::uuid AND fence.attempts = %(fence_attempt)s::bigint
      AND fence.status = 'running'
    FOR SHARE))"""


def params(fence: Fence | None) -> dict[str, Any]:
    """The fence's parameters for a statement that splices in `SQL`."""
    if fence is None:
        return {"fence_run": None, "fence_attempt": None}
    return {"fence_run": fence.run_id, "fence_attempt": fence.attempt}


# The same condition as a statement of its own, for a transaction whose writes go through the ORM:
# run first in the transaction, it holds the share lock until the transaction ends.
_HOLD_SQL = """SELECT 1 FROM agents_run fence
WHERE fence.id = %(fence_run)s::uuid AND fence.attempts = %(fence_attempt)s::bigint AND fence.status = 'running'
FOR SHARE"""


def holds(fence: Fence, *, thread_id: UUID) -> bool:
    """Whether the fence's attempt still holds its run (a plain read, to say why a write was refused)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(_HOLD_SQL.replace("FOR SHARE", ""), params(fence))
        return cursor.fetchone() is not None


def hold(fence: Fence | None, *, thread_id: UUID) -> None:
    """Inside a transaction: lock the fence's run against a new claim until the transaction ends,
    or raise LeaseLost when the attempt no longer holds it. No-op without a fence."""
    if fence is None:
        return
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(_HOLD_SQL, params(fence))
        if cursor.fetchone() is None:
            raise fence.lost(thread_id=thread_id)
