"""Reads, for display only, the values LangGraph's saver stores as typed envelopes
(`{"__lg_typed__": ["msgpack", <base64>]}`, integrations/langgraph/saver.py): LangChain messages
and other objects LangGraph's serde packed with msgpack. A small decoder of the msgpack format,
so the core needs neither LangGraph nor a msgpack package: extension values become plain data
(a Pydantic model its field values, a constructed object its arguments), never objects, and
nothing named in the bytes is imported or called. Anything it cannot read is left as it was."""

from __future__ import annotations

import base64
import binascii
import struct
from typing import Any

ENVELOPE = "__lg_typed__"
# Envelopes larger than this are not opened for display (the JSON tree still shows them).
MAX_BYTES = 1_000_000
MAX_DEPTH = 64
# LangGraph's extension codes (langgraph.checkpoint.serde.jsonplus): a Pydantic v2 model is packed
# as (module, class name, field values, method); the others as (module, name, arguments...).
_EXT_PYDANTIC_V2 = 5
_EXT_PYDANTIC_V1 = 4


class _Unreadable(Exception):
    pass


def unwrap(value: Any) -> Any:
    """`value`'s contents when it is a LangGraph msgpack (or json) envelope, else `value` itself."""
    if not (isinstance(value, dict) and len(value) == 1 and ENVELOPE in value):
        return value
    typed = value[ENVELOPE]
    if not (isinstance(typed, list) and len(typed) == 2 and all(isinstance(part, str) for part in typed)):
        return value
    kind, data = typed
    if kind != "msgpack" or len(data) > MAX_BYTES * 4 // 3 + 4:
        return value
    try:
        raw = base64.b64decode(data, validate=True)
        found, end = _Reader(raw).read(0, 0)
    except (_Unreadable, binascii.Error, ValueError, IndexError, struct.error, RecursionError):
        return value
    return found if end == len(raw) else value


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data

    def read(self, at: int, depth: int) -> tuple[Any, int]:
        if depth > MAX_DEPTH:
            raise _Unreadable("too deep")
        data = self.data
        first = data[at]
        at += 1
        if first <= 0x7F:
            return first, at
        if first >= 0xE0:
            return first - 0x100, at
        if 0x80 <= first <= 0x8F:
            return self._map(first & 0x0F, at, depth)
        if 0x90 <= first <= 0x9F:
            return self._array(first & 0x0F, at, depth)
        if 0xA0 <= first <= 0xBF:
            return self._str(first & 0x1F, at)
        if first == 0xC0:
            return None, at
        if first in (0xC2, 0xC3):
            return first == 0xC3, at
        if first in (0xC4, 0xC5, 0xC6):  # bin: shown as its size
            size, at = self._length(first - 0xC4, at)
            self._need(at, size)
            return f"<{size} bytes>", at + size
        if first in (0xC7, 0xC8, 0xC9):
            size, at = self._length(first - 0xC7, at)
            return self._ext(size, at, depth)
        if first == 0xCA:
            return struct.unpack_from(">f", data, at)[0], at + 4
        if first == 0xCB:
            return struct.unpack_from(">d", data, at)[0], at + 8
        if 0xCC <= first <= 0xCF:
            width = 1 << (first - 0xCC)
            self._need(at, width)
            return int.from_bytes(data[at : at + width], "big"), at + width
        if 0xD0 <= first <= 0xD3:
            width = 1 << (first - 0xD0)
            self._need(at, width)
            return int.from_bytes(data[at : at + width], "big", signed=True), at + width
        if 0xD4 <= first <= 0xD8:
            return self._ext(1 << (first - 0xD4), at, depth)
        if first in (0xD9, 0xDA, 0xDB):
            size, at = self._length(first - 0xD9, at)
            return self._str(size, at)
        if first in (0xDC, 0xDD):
            size, at = self._length(first - 0xDC + 1, at)
            return self._array(size, at, depth)
        if first in (0xDE, 0xDF):
            size, at = self._length(first - 0xDE + 1, at)
            return self._map(size, at, depth)
        raise _Unreadable(f"byte {first:#x}")

    def _need(self, at: int, size: int) -> None:
        if at + size > len(self.data):
            raise _Unreadable("cut short")

    def _length(self, width_code: int, at: int) -> tuple[int, int]:
        width = 1 << width_code
        self._need(at, width)
        return int.from_bytes(self.data[at : at + width], "big"), at + width

    def _str(self, size: int, at: int) -> tuple[str, int]:
        self._need(at, size)
        return self.data[at : at + size].decode("utf-8", errors="replace"), at + size

    def _array(self, size: int, at: int, depth: int) -> tuple[list[Any], int]:
        if size > len(self.data) - at:  # every item takes a byte at least
            raise _Unreadable("array longer than the data")
        items = []
        for _ in range(size):
            item, at = self.read(at, depth + 1)
            items.append(item)
        return items, at

    def _map(self, size: int, at: int, depth: int) -> tuple[dict[str, Any], int]:
        if size * 2 > len(self.data) - at:
            raise _Unreadable("map longer than the data")
        found: dict[str, Any] = {}
        for _ in range(size):
            key, at = self.read(at, depth + 1)
            value, at = self.read(at, depth + 1)
            found[key if isinstance(key, str) else str(key)] = value
        return found, at

    def _ext(self, size: int, at: int, depth: int) -> tuple[Any, int]:
        self._need(at, size + 1)
        code = int.from_bytes(self.data[at : at + 1], "big", signed=True)
        start, end = at + 1, at + 1 + size
        inner, stop = _Reader(self.data[start:end]).read(0, depth + 1)
        if stop != size:
            raise _Unreadable("extension with trailing bytes")
        if code in (_EXT_PYDANTIC_V2, _EXT_PYDANTIC_V1) and isinstance(inner, list) and len(inner) >= 3:
            fields = inner[2]
            if isinstance(fields, dict):
                return {**fields, "__class__": str(inner[1])} if "type" not in fields else fields, end
        if isinstance(inner, list) and len(inner) >= 3:  # (module, name, arguments): the arguments
            return inner[2], end
        return inner, end
