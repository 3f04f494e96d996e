"""A small RFC 6902 diff: the patch a checkpoint sends instead of the whole state.

Tuned for how agent state grows: members added or changed inside objects, and
items appended to lists, cost one op each. Anything else inside a list falls
back to element-wise ops or, when that would be as long as the list, one replace.
"""

from __future__ import annotations

from typing import Any

Op = dict[str, Any]


def make_patch(base: Any, target: Any) -> list[Op]:
    """Ops that turn `base` into `target` (both JSON values); [] when they are equal."""
    ops: list[Op] = []
    _diff(base, target, "", ops)
    return ops


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def _diff(a: Any, b: Any, path: str, ops: list[Op]) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in a:
            if key not in b:
                ops.append({"op": "remove", "path": f"{path}/{_escape(key)}"})
        for key, value in b.items():
            if key in a:
                _diff(a[key], value, f"{path}/{_escape(key)}", ops)
            else:
                ops.append({"op": "add", "path": f"{path}/{_escape(key)}", "value": value})
    elif isinstance(a, list) and isinstance(b, list):
        _diff_list(a, b, path, ops)
    elif not json_equal(a, b):
        ops.append({"op": "replace", "path": path, "value": b})


def _diff_list(a: list[Any], b: list[Any], path: str, ops: list[Op]) -> None:
    changes: list[Op] = []
    common = min(len(a), len(b))
    edited = 0
    for index in range(common):
        before = len(changes)
        _diff(a[index], b[index], f"{path}/{index}", changes)
        edited += len(changes) > before
    # Removals from the end keep the earlier indices valid.
    changes.extend({"op": "remove", "path": f"{path}/{index}"} for index in range(len(a) - 1, common - 1, -1))
    changes.extend({"op": "add", "path": f"{path}/-", "value": value} for value in b[common:])
    touched = edited + max(len(a) - len(b), 0)
    if touched > 1 and touched >= len(b) / 2:
        # An insertion near the front shifts every item: one replace is shorter than editing them all.
        changes = [{"op": "replace", "path": path, "value": b}]
    ops.extend(changes)


def json_equal(a: Any, b: Any) -> bool:
    """JSON equality: unlike Python's ==, true is not 1 (while 1 and 1.0 are the same number)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(map(json_equal, a, b))
    if isinstance(b, (dict, list)):
        return False
    return bool(a == b)
