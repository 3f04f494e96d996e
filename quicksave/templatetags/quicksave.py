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
