"""Template filters the dashboard shares."""

from __future__ import annotations

import json
from typing import Any

from django import template

register = template.Library()


@register.filter
def compact_json(value: Any, limit: int | None = None) -> str:
    """A JSON value on one line, as an agent wrote it (not Python's repr); with a `limit`, cut to
    that many characters, the last an ellipsis (what `truncatechars` does, at a tenth of its cost
    in a list of a hundred rows)."""
    text = json.dumps(value, ensure_ascii=False, separators=(", ", ": "), default=str)
    if limit is not None and len(text) > limit:
        return text[: max(limit - 1, 0)] + "…"
    return text


@register.filter
def framework(thread: Any) -> str:
    """The agent framework that wrote a thread, as its integration recorded it in the thread's
    metadata (`framework`), or "" for a thread written through Quicksave's own SDK or runtime."""
    metadata = getattr(thread, "metadata", None)
    named = metadata.get("framework") if isinstance(metadata, dict) else None
    return named[:40] if isinstance(named, str) else ""
