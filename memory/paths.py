"""What a namespace path and an item key may be: the checks every way in makes first.

A namespace is a tuple of labels (`("users", "alice", "memories")`), written `users.alice.memories`
in URLs, which is why a label holds no `.` (LangGraph's rule too)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from memory.errors import InvalidKey, InvalidNamespace

MAX_DEPTH = 32
MAX_LABEL = 255
MAX_KEY = 1024

Path = tuple[str, ...]


def namespace_path(labels: Sequence[Any], *, field: str = "namespace", allow_empty: bool = False) -> Path:
    """The labels as a namespace path, or InvalidNamespace naming what is wrong with them."""
    if isinstance(labels, str) or not isinstance(labels, Sequence):
        raise InvalidNamespace(f"A {field} is a list of labels.", detail={"field": field})
    path = tuple(labels)
    if not path and not allow_empty:
        raise InvalidNamespace(f"A {field} needs at least one label.", detail={"field": field})
    if len(path) > MAX_DEPTH:
        raise InvalidNamespace(f"A {field} has at most {MAX_DEPTH} labels.", detail={"field": field})
    for label in path:
        problem = _label_problem(label)
        if problem:
            raise InvalidNamespace(f"The {field} label {label!r} {problem}.", detail={"field": field})
    return path


def _label_problem(label: Any) -> str | None:
    if not isinstance(label, str):
        return "is not a string"
    if not label:
        return "is empty"
    if "." in label:
        return "contains a period, which separates labels"
    if len(label) > MAX_LABEL:
        return f"is longer than {MAX_LABEL} characters"
    if "\x00" in label:
        return "contains a NUL character"
    return None


def pattern(labels: Sequence[Any], *, field: str) -> Path:
    """A prefix or suffix to match namespaces against: labels, `*` matching any one."""
    return namespace_path(labels, field=field, allow_empty=True)


def parse_dotted(text: str, *, field: str = "namespace") -> Path:
    """`users.alice` as ("users", "alice")."""
    return namespace_path(text.split(".") if text else [], field=field)


def dotted(path: Path) -> str:
    return ".".join(path)


def item_key(key: Any) -> str:
    if not isinstance(key, str):
        raise InvalidKey("An item key is a string.", detail={"field": "key"})
    if not key:
        raise InvalidKey("An item key cannot be empty.", detail={"field": "key"})
    if len(key) > MAX_KEY:
        raise InvalidKey(f"An item key is at most {MAX_KEY} characters.", detail={"field": "key"})
    if "\x00" in key:
        raise InvalidKey("An item key cannot contain a NUL character.", detail={"field": "key"})
    return key


def matches(path: Path, pattern: Path, kind: str) -> bool:
    """Whether `path` starts (kind "prefix") or ends ("suffix") with `pattern`; `*` is any label."""
    if len(path) < len(pattern):
        return False
    if kind == "suffix":
        path, pattern = path[::-1], pattern[::-1]
    pairs = zip(path, pattern, strict=False)
    return all(wanted == "*" or label == wanted for label, wanted in pairs)
