"""A materialised checkpoint (`Node`) and this process's cache of them, keyed by checkpoint id.

Checkpoints are immutable, so a cached node never goes stale; the cache only saves the replay
of deltas. It is bounded by the total size of the states it holds."""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from django.conf import settings


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


class StateCache:
    """LRU of materialised checkpoints, bounded by the total size of their states."""

    def __init__(self) -> None:
        self._nodes: OrderedDict[UUID, Node] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, checkpoint_id: UUID) -> Node | None:
        with self._lock:
            node = self._nodes.get(checkpoint_id)
            if node is not None:
                self._nodes.move_to_end(checkpoint_id)
            return node

    def put(self, node: Node) -> None:
        budget: int = settings.QUICKSAVE_STATE_CACHE_BYTES
        if node.state_bytes > budget:
            return
        with self._lock:
            if node.id in self._nodes:
                return
            self._nodes[node.id] = node
            self._bytes += node.state_bytes
            while self._bytes > budget and self._nodes:
                _, evicted = self._nodes.popitem(last=False)
                self._bytes -= evicted.state_bytes

    def drop_thread(self, thread_id: UUID) -> None:
        with self._lock:
            for node in [node for node in self._nodes.values() if node.thread_id == thread_id]:
                del self._nodes[node.id]
                self._bytes -= node.state_bytes

    def drop(self, checkpoint_id: UUID) -> None:
        with self._lock:
            node = self._nodes.pop(checkpoint_id, None)
            if node is not None:
                self._bytes -= node.state_bytes

    def clear(self) -> None:
        with self._lock:
            self._nodes.clear()
            self._bytes = 0


states = StateCache()
