"""LangGraph's channel values as the saver holds and stores them: private copies that share
nothing mutable with what a graph holds, and the RFC 6902 ops from one checkpoint's JSON-safe
values to the next's, found without a full walk where LangGraph's shapes allow (a growing list,
a dict of versions). No database here: `saver` decides what to copy and what to write.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Mapping
from typing import Any

from checkpoints.storage.jsonpatch import escape_token, format_pointer, make_patch

Ops = list[dict[str, Any]]  # RFC 6902

# The envelope of a value that is not plain JSON: {TYPED: [type, base64 of LangGraph's serde]}.
TYPED = "__lg_typed__"
# A member or channel the other side does not have.
MISSING: Any = object()
# The JSON values that decode as themselves.
PLAIN = frozenset({str, int, float, bool, type(None)})


def private(value: Any) -> Any:
    """A copy of a channel value that shares nothing mutable with `value`: the saver's own, or one
    to hand out. Plain JSON is copied by hand (most channel values are), anything else deeply."""
    kind = type(value)
    if kind in PLAIN:
        return value
    if kind is list:
        return [item if type(item) in PLAIN else private(item) for item in value]
    if kind is dict:
        # A message is mostly a flat dict of strings: copied in C, then its nested values replaced.
        copied = value.copy()
        for key, item in value.items():
            if type(item) not in PLAIN:
                copied[key] = private(item)
        return copied
    return copy.deepcopy(value)


def shallow_item(item: Any) -> bool:
    """Whether `item` is a JSON scalar or a dict of them (a message as plain JSON), which a copy
    of the dict alone makes private."""
    kind = type(item)
    return kind in PLAIN or (kind is dict and all(type(value) in PLAIN for value in item.values()))


def shallow_copy(items: list[Any]) -> list[Any]:
    """A private copy of a list of shallow_item items: each dict copied, scalars as they are."""
    try:
        # A message list as plain JSON holds dicts alone: copied by one C loop, not a Python one
        # per item (half the instructions of a read at a thousand messages). `dict.copy` refuses
        # anything but a dict, and a shallow_item item is a dict or a scalar, never a subclass.
        return list(map(dict.copy, items))
    except TypeError:
        return [item.copy() if type(item) is dict else item for item in items]


def shallow_lists(values: Mapping[str, Any]) -> frozenset[str]:
    """The names of the lists in `values` whose items are all shallow_item."""
    return frozenset(name for name, value in values.items() if type(value) is list and all(map(shallow_item, value)))


@functools.lru_cache(maxsize=4096)
def pointer(*tokens: str) -> str:
    """The JSON pointer of a checkpoint member or channel: the same few on every put."""
    return format_pointer(tokens)


def member_ops(stored: Any, value: Any, path: str) -> Ops:
    """Ops turning the stored value at `path` (MISSING: none) into `value`, both JSON-safe.

    A flat dict of which at least half the members changed (`channel_versions` after a node ran,
    a dict channel a node returns anew each step) is replaced whole: one op instead of one per
    member, no more bytes, and each op the store checks and applies costs about 30,000
    instructions (of a put's 1.7 million)."""
    if stored is MISSING:
        return [{"op": "add", "path": path, "value": value}]
    kind = type(value)
    if (kind is str or kind is int) and type(stored) is kind:
        # A checkpoint's id, time and version, a counter channel: what make_patch would find,
        # without its walk (a put's members are mostly such scalars).
        return [] if value == stored else [{"op": "replace", "path": path, "value": value}]
    ops = make_patch(stored, value, path)
    if len(ops) > 1 and type(value) is dict and 2 * len(ops) >= len(value) and _flat(value):
        return [{"op": "replace", "path": path, "value": value}]
    return ops


def _flat(value: dict[str, Any]) -> bool:
    """Whether every member of a dict is a JSON scalar."""
    return all(type(item) in PLAIN for item in value.values())


# The JSON scalars `_encode` keeps as they are (a str without NUL) and whose JSON equality, between
# two of one type, is Python's: no float (1 == 1.0 in JSON, and a float may need an envelope).
_SCALARS = frozenset({str, int, bool, type(None)})


def _scalar_dict(value: Any) -> bool:
    """Whether `value` is a dict of _SCALARS under str keys, with no NUL in any string: `_encode`
    gives it back equal to itself (LangGraph's channel versions, and a node's versions seen)."""
    if type(value) is not dict or TYPED in value:
        return False
    for key, item in value.items():
        kind = type(item)
        if type(key) is not str or "\x00" in key or kind not in _SCALARS or (kind is str and "\x00" in item):
            return False
    return True


def _scalar_dict_ops(stored: dict[str, Any], value: dict[str, Any], path: str, ops: Ops) -> bool:
    """Append to `ops` what make_patch finds from `stored` to `value`, two _scalar_dicts, without
    its walk; False (nothing appended) when `stored` holds a float, which make_patch compares as JSON."""
    if not stored and not value:
        return True
    if not stored or not value or stored.keys().isdisjoint(value):
        ops.append({"op": "replace", "path": path, "value": value})
        return True
    found: Ops = [{"op": "remove", "path": f"{path}/{escape_token(key)}"} for key in stored if key not in value]
    for key, item in value.items():
        old = stored.get(key, MISSING)
        if old is item:
            continue
        if type(old) is float:
            return False
        if old is MISSING:
            found.append({"op": "add", "path": f"{path}/{escape_token(key)}", "value": item})
        elif type(old) is not type(item) or old != item:
            found.append({"op": "replace", "path": f"{path}/{escape_token(key)}", "value": item})
    ops += found
    return True


def scalar_dicts_ops(stored: Any, value: Any, path: str) -> Ops | None:
    """`member_ops(stored, self._encode(value), path)` for a checkpoint member that is a
    _scalar_dict (`channel_versions`) or a dict of them (`versions_seen`), both changed on nearly
    every put, without encoding and walking them; None for any other member, or when unsure.

    A third of a put's own Python went to these two members through `_encode` and make_patch."""
    if type(stored) is not dict or type(value) is not dict or TYPED in value or TYPED in stored:
        return None
    ops: Ops = []
    if _scalar_dict(value):
        if not _scalar_dict(stored) or not _scalar_dict_ops(stored, value, path, ops):
            return None
        if len(ops) > 1 and 2 * len(ops) >= len(value):
            return [{"op": "replace", "path": path, "value": value}]  # as member_ops collapses a flat dict
        return ops
    # A dict of _scalar_dicts: make_patch's walk of its outer dict, each member by the rule above.
    if not all(type(key) is str and "\x00" not in key and _scalar_dict(item) for key, item in value.items()):
        return None
    if not stored or not value or stored.keys().isdisjoint(value):
        return None  # rare (the first put after a thread starts): make_patch decides
    ops += [{"op": "remove", "path": f"{path}/{escape_token(key)}"} for key in stored if key not in value]
    for key, item in value.items():
        old = stored.get(key, MISSING)
        if old is item:
            continue
        if old is MISSING:
            ops.append({"op": "add", "path": f"{path}/{escape_token(key)}", "value": item})
        elif not _scalar_dict(old) or not _scalar_dict_ops(old, item, f"{path}/{escape_token(key)}", ops):
            return None
    return ops
