"""Reading JSON text the way the API reads a body, wherever else text comes in (the dashboard's
JSON fields, import files): strict JSON, and nothing PostgreSQL cannot store."""

from __future__ import annotations

import json
import math
import re
from typing import Any


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):  # 1e400 overflows to infinity, which no JSON column can hold
        raise ValueError(f"the number {text[:40]} is too large")
    return value


# A NUL or a UTF-16 surrogate left unpaired after decoding: PostgreSQL cannot store either.
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def unstorable_character(value: Any) -> str | None:
    """The first character of `value`'s strings or keys that PostgreSQL cannot store, if any."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            found = _UNSTORABLE.search(item)
            if found:
                return found.group()
        elif isinstance(item, dict):
            pending.extend(item)
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
    return None


class UnstorableText(ValueError):
    """JSON text holding a character PostgreSQL cannot store; the message names it."""


def loads_strict(text: str) -> Any:
    """JSON text read as the API reads a body, for the dashboard's JSON fields too: no NaN or
    Infinity (nor a number that overflows to one), no nesting deeper than Python can parse, and no
    NUL or lone surrogate, which PostgreSQL cannot store. Raises ValueError saying what is wrong
    (UnstorableText for the last)."""
    try:
        data = json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    except RecursionError:
        raise ValueError("it is nested too deeply") from None
    # Either can now only come from a \u escape (a raw NUL is invalid JSON), so most texts skip the walk.
    if "\\u0000" in text or "\\ud" in text or "\\uD" in text:
        character = unstorable_character(data)
        if character is not None:
            name = "a NUL character" if character == "\x00" else "a lone UTF-16 surrogate"
            raise UnstorableText(f"{name} (\\u{ord(character):04x})")
    return data
