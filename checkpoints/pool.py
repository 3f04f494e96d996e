"""Objects that are costly to make and not thread-safe, reused by whichever thread needs one.

A thread-local cache suits threads that live long. LangGraph runs a sync graph's checkpoint
writes on executor threads it starts afresh for every run, so a thread-local zstd context or
parameter binder would be made again for nearly every write. A pool keeps one object per
concurrent user instead, whichever thread that is.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Generic, TypeVar

T = TypeVar("T")


class Pool(Generic[T]):
    """Free objects made by `make`, one taken per user at a time (list pop and append are atomic)."""

    def __init__(self, make: Callable[[], T]) -> None:
        self._make = make
        self._free: list[T] = []

    @contextmanager
    def taken(self) -> Iterator[T]:
        """A free object, or a new one when every one is taken; given back at the end."""
        try:
            item = self._free.pop()
        except IndexError:
            item = self._make()
        try:
            yield item
        finally:
            self._free.append(item)
