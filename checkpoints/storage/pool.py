"""Objects that are costly to make and not thread-safe, reused by whichever thread needs one.

A thread-local cache suits threads that live long. LangGraph runs a sync graph's checkpoint
writes on executor threads it starts afresh for every run, so a thread-local zstd context or
parameter binder would be made again for nearly every write. A pool keeps one object per
concurrent user instead, whichever thread that is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Pool(Generic[T]):
    """Free objects made by `make`, each taken by one user at a time (list pop and append are
    atomic). Callers give back in a `finally`: on the hot write path that costs a tenth of a
    context manager's generator, and about what a thread-local lookup did."""

    def __init__(self, make: Callable[[], T]) -> None:
        self._make = make
        self._free: list[T] = []

    def take(self) -> T:
        """A free object, or a new one when every one is taken."""
        try:
            return self._free.pop()
        except IndexError:
            return self._make()

    def give_back(self, item: T) -> None:
        self._free.append(item)
