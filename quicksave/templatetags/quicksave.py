"""Template filters the dashboard shares."""

from __future__ import annotations

import json
from typing import Any

from django import template

register = template.Library()


@register.filter
def compact_json(value: Any) -> str:
    """A JSON value on one line, as an agent wrote it (not Python's repr)."""
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "), default=str)


@register.filter
def framework(thread: Any) -> str:
    """The agent framework that wrote a thread, as its integration recorded it in the thread's
    metadata (`framework`), or "" for a thread written through Quicksave's own SDK or runtime."""
    metadata = getattr(thread, "metadata", None)
    named = metadata.get("framework") if isinstance(metadata, dict) else None
    return named[:40] if isinstance(named, str) else ""
