"""What this process remembers of memory: namespaces (memory.spaces), item heads and large values
(memory.heads). Dropping it is always safe: the next read or write asks the database."""

from __future__ import annotations

from memory import heads, spaces


def clear() -> None:
    spaces.clear()
    heads.clear()
