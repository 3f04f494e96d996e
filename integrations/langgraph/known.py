"""What a saver remembers of the last checkpoint it wrote or read in each (LangGraph thread,
namespace): the row and a private copy of its channel values, so the next put is written as a
patch of what changed. Only a hint: a put checks that its parent is the one remembered.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from checkpoints.models import Thread
from integrations.langgraph.values import private, shallow_copy

# How many (thread, namespace) pairs a saver remembers its last checkpoint of.
KNOWN_THREADS = 64


@dataclass(slots=True)
class Known:
    """A LangGraph checkpoint this saver just wrote or read, with a private copy of its channel
    values: the next checkpoint after it is written as a patch of what changed."""

    thread: Thread
    lg_id: str
    row: UUID
    values: dict[str, Any]  # by channel: copies no one outside this saver holds (see private)
    # The list channels in `values` whose items are all shallow_item (messages as plain JSON, mostly).
    shallow: frozenset[str]
    # The (LangGraph id, row) of the checkpoint this one was written after, whose pending writes
    # LangGraph may still be saving.
    previous: tuple[str, UUID] | None = None

    def lists(self) -> dict[str, list[Any]]:
        """Fresh copies of the list channels: a read of this very checkpoint hands those out
        instead of decoding the stored values again. LangGraph reads the thread's checkpoint
        before every run, so a growing message list is copied on every step: a list of
        shallow_item items is copied a dict at a time, without walking each item again."""
        return {
            name: shallow_copy(value) if name in self.shallow else private(value)
            for name, value in self.values.items()
            if type(value) is list
        }

    def row_of(self, lg_id: str) -> UUID | None:
        if lg_id == self.lg_id:
            return self.row
        return self.previous[1] if self.previous is not None and self.previous[0] == lg_id else None


class KnownCheckpoints:
    """The last checkpoint of each (LangGraph thread, namespace) a saver touched, least recently
    used first out. Only a hint: a put checks that its parent is the one remembered."""

    def __init__(self, size: int = KNOWN_THREADS) -> None:
        self._known: OrderedDict[tuple[str, str], Known] = OrderedDict()
        self._size = size
        self._lock = threading.Lock()

    def get(self, thread_id: str, checkpoint_ns: str) -> Known | None:
        with self._lock:
            known = self._known.get((thread_id, checkpoint_ns))
            if known is not None:
                self._known.move_to_end((thread_id, checkpoint_ns))
            return known

    def remember(self, thread_id: str, checkpoint_ns: str, known: Known) -> None:
        with self._lock:
            self._known[(thread_id, checkpoint_ns)] = known
            self._known.move_to_end((thread_id, checkpoint_ns))
            while len(self._known) > self._size:
                self._known.popitem(last=False)

    def forget(self, thread_id: str, checkpoint_ns: str | None = None) -> None:
        """Forget one namespace of a thread, or all of them."""
        with self._lock:
            for key in [key for key in self._known if key[0] == thread_id and checkpoint_ns in (None, key[1])]:
                del self._known[key]
