"""Branches by name: their ids and fork points (which never change, so this process caches
them) and their heads (which do, so they are always read)."""

from __future__ import annotations

from uuid import UUID

from checkpoints.models import Branch, Checkpoint
from checkpoints.storage import cursors
from checkpoints.storage.errors import NotFound
from checkpoints.storage.lru import LRU

MAIN_BRANCH = "main"

# A branch's id and fork point never change, nor does the name of a branch id: both are kept,
# once the transaction that read them commits (a branch created in one that rolls back is not).
_branches: LRU[tuple[UUID, str], tuple[int, UUID | None]] = LRU(100_000)
_branch_names: LRU[int, str] = LRU(100_000)


def forget_thread(thread_id: UUID) -> None:
    """Forget a deleted thread's branches."""
    _branches.drop_where(lambda key, _: key[0] == thread_id)


def forget_all() -> None:
    _branches.clear()
    _branch_names.clear()


def branch_head(*, thread_id: UUID, branch_id: int) -> tuple[UUID, int] | None:
    """(id, seq) of the newest checkpoint on a branch, or None while it is empty."""
    row = (
        Checkpoint.objects.filter(thread_id=thread_id, branch_id=branch_id)
        .order_by("-seq")
        .values_list("id", "seq")
        .first()
    )
    return (row[0], row[1]) if row else None


def branch_by_name(thread_id: UUID, name: str) -> tuple[int, UUID | None]:
    """(id, fork point) of a thread's branch by name; both never change, so they are cached."""
    key = (thread_id, name)
    known = _branches.get(key)
    if known is None:
        found = Branch.objects.filter(thread_id=thread_id, name=name).values_list("id", "fork_point_id").first()
        if found is None:
            raise NotFound(f"Thread {thread_id} has no branch named '{name}'.", detail={"field": "branch"})
        known = _remember_branch(thread_id, name, found[0], found[1])
    return known


def _remember_branch(thread_id: UUID, name: str, branch_id: int, fork_point: UUID | None) -> tuple[int, UUID | None]:
    _branches.remember((thread_id, name), (branch_id, fork_point))
    _branch_names.remember(branch_id, name)
    return branch_id, fork_point


def get_branch_name(branch_id: int) -> str:
    name = _branch_names.get(branch_id)
    if name is None:
        found = Branch.objects.filter(pk=branch_id).values_list("name", flat=True).first()
        if found is None:
            raise NotFound(f"Branch {branch_id} no longer exists (its thread was deleted).")
        name = found
        _branch_names.remember(branch_id, name)
    return name


_BRANCH_HEAD_SQL = """
SELECT b.id, b.fork_point_id, h.id
FROM checkpoints_branch b
LEFT JOIN LATERAL (
    SELECT c.id FROM checkpoints_checkpoint c WHERE c.thread_id = b.thread_id AND c.branch_id = b.id
    ORDER BY c.seq DESC LIMIT 1
) h ON TRUE
WHERE b.thread_id = %(thread)s AND b.name = %(name)s
"""


def head_by_name(thread_id: UUID, name: str) -> UUID | None:
    known = _branches.get((thread_id, name))
    if known is not None:
        head = branch_head(thread_id=thread_id, branch_id=known[0])
        return head[0] if head else None
    with cursors.cursor() as cursor:
        cursor.execute(_BRANCH_HEAD_SQL, {"thread": thread_id, "name": name})
        found = cursor.fetchone()
    if found is None:
        raise NotFound(f"Thread {thread_id} has no branch named '{name}'.", detail={"field": "branch"})
    _remember_branch(thread_id, name, found[0], found[1])
    head_id: UUID | None = found[2]
    return head_id
