"""A materialised checkpoint (`Node`) and this process's cache of them, keyed by checkpoint id.

A checkpoint's state never changes, so a cached node only saves the replay of deltas; a node
whose row compaction rewrote is noticed by its MAC and dropped (see `reads` and `append`).
The cache is bounded by the total size of the states it holds plus what keeping each costs
besides (QUICKSAVE_STATE_CACHE_BYTES), and a node written in a transaction is kept only once that
transaction commits (`lru`). An append's node takes the place of its parent and of the head this
process kept for its branch before (`keep_head`), so a branch written step after step holds one
node here, its head, even when other processes wrote some of its steps; what else the cache holds
is what readers asked for.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from uuid import UUID

from django.conf import settings

from checkpoints.storage.lru import LRU


@dataclass(frozen=True, slots=True)
class Node:
    """What the store knows about a materialised checkpoint. `state` is shared: never mutate it."""

    id: UUID
    thread_id: UUID
    branch_id: int
    seq: int
    state: dict[str, Any]
    state_bytes: int
    chain_length: int
    chain_bytes: int
    integrity: bytes


# What a cached node costs beyond its state's canonical JSON: the Node, its ids, its MAC, the state's
# outer dict and the cache's entry (about 680 bytes on CPython 3.11, rounded up). Weighed by their
# states alone, small states overran the budget many times over: 100,000 states of 10 bytes "weighed"
# 1 MiB and held 65 MiB.
NODE_OVERHEAD_BYTES = 1024


def weight(node: Node) -> int:
    """A node's share of the cache's budget."""
    return node.state_bytes + NODE_OVERHEAD_BYTES


def _budget() -> int:
    budget: int = settings.QUICKSAVE_STATE_CACHE_BYTES
    return budget


states: LRU[UUID, Node] = LRU(_budget, weigh=weight)
# The node this process last kept as each branch's head, by (thread, branch id).
_heads: LRU[tuple[UUID, int], UUID] = LRU(100_000)


def keep_head(node: Node, *, parent_id: UUID | None) -> None:
    """Keep an appended node, once its append committed (the caller waits for that), in place of its
    parent (when on its branch) and of the head this process kept for its branch before: servers
    that share an agent's writes round-robin would otherwise each keep every state they wrote,
    since the parent of what one writes is nearly always the other's."""
    branch = (node.thread_id, node.branch_id)
    states.put(node.id, node, replacing=_heads.get(branch))
    _heads.put(branch, node.id)
    if parent_id is not None:
        states.drop(parent_id)


def drop_thread(thread_id: UUID) -> None:
    states.drop_where(lambda _, node: node.thread_id == thread_id)
