"""The text of an item's indexed fields: what full-text search reads and an embedding function
is given. Paths are LangGraph's: `$` (the whole value), `a.b`, `a[0]`, `a[-1]`, `a[*]` (each
element its own text), `*` (each member)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from memory.errors import InvalidValue

_STEP = re.compile(r"\[(\*|-?\d+)\]|([^.\[\]]+)")
# Names are possessive (`++`): a run of name characters is one step, so a long path that does not
# match fails at once instead of trying every way to split the run.
_PATH = re.compile(r"(?:\[(?:\*|-?\d+)\]|[^.\[\]]++)(?:\.?(?:\[(?:\*|-?\d+)\]|[^.\[\]]++))*")
MAX_FIELDS = 32


@dataclass(frozen=True, slots=True)
class IndexText:
    """One indexed text of an item: the field it came from (`a.b`, or `a[*].0` for each of
    several), the text, and its embedding when an embedding function made one."""

    field: str
    text: str
    embedding: list[float] | None = None


def check_fields(fields: Any) -> list[str]:
    if not isinstance(fields, list) or not all(isinstance(field, str) and field for field in fields):
        raise InvalidValue(
            '`index` is a list of field paths such as "text" or "notes[*].body".', detail={"field": "index"}
        )
    if len(fields) > MAX_FIELDS:
        raise InvalidValue(
            f"`index` names at most {MAX_FIELDS} fields.", detail={"field": "index", "limit": MAX_FIELDS}
        )
    for field in fields:
        if field != "$" and not _PATH.fullmatch(field):
            raise InvalidValue(f"{field!r} is not a field path.", detail={"field": "index"})
    return fields


def _steps(path: str) -> list[str]:
    return [match.group(0) for match in _STEP.finditer(path)]


def _as_text(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, (bool, int, float)):
        return [json.dumps(value)]
    if value is None:
        return []
    return [json.dumps(value, sort_keys=True, ensure_ascii=False)]


def texts_at(value: Any, path: str) -> list[str]:
    if path == "$":
        return [json.dumps(value, sort_keys=True, ensure_ascii=False)]
    nodes = [value]
    for step in _steps(path):
        following: list[Any] = []
        for node in nodes:
            if step.startswith("["):
                if not isinstance(node, list):
                    continue
                index = step[1:-1]
                if index == "*":
                    following.extend(node)
                elif -len(node) <= int(index) < len(node):
                    following.append(node[int(index)])
            elif step == "*":
                if isinstance(node, dict):
                    following.extend(node.values())
                elif isinstance(node, list):
                    following.extend(node)
            elif isinstance(node, dict) and step in node:
                following.append(node[step])
        nodes = following
    return [text for node in nodes for text in _as_text(node)]


def index_texts(value: Any, fields: list[str]) -> list[IndexText]:
    """The texts of `fields` in `value`, named as PostgresStore names them (`field`, or `field.i`
    for the i-th of several)."""
    found: list[IndexText] = []
    for field in fields:
        texts = texts_at(value, field)
        for position, text in enumerate(texts):
            found.append(IndexText(field=f"{field}.{position}" if len(texts) > 1 else field, text=text))
    return found
