"""RFC 6902 JSON Patch / RFC 6901 JSON Pointer for the checkpoint store's agent-state deltas, applied
copy-on-write so cached parent states are never mutated and untouched subtrees are shared."""

from __future__ import annotations

import json
from collections.abc import Sequence
from operator import is_
from typing import Any, NamedTuple, NoReturn

import orjson

__all__ = [
    "JSON",
    "Applied",
    "Op",
    "PatchError",
    "apply_patch",
    "apply_validated",
    "canonical_json",
    "canonical_json_plain",
    "canonical_size",
    "depth_bound",
    "format_pointer",
    "json_depth",
    "json_equal",
    "make_patch",
    "parse_pointer",
    "validate_ops",
    "validate_patch",
]

JSON = Any  # a JSON value: None, bool, int, float, str, list, dict[str, ...]
Op = dict[str, Any]

_OPS = ("add", "remove", "replace", "move", "copy", "test")
_NEEDS_VALUE = frozenset({"add", "replace", "test"})
_NEEDS_FROM = frozenset({"move", "copy"})
# Distinguishes "absent" from a stored null without a second dict lookup.
_MISSING: Any = object()

# One reusable encoder: json.dumps() with non-default options builds a new encoder on every call, which
# dominates the cost of measuring the small values a typical patch inserts.
_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, sort_keys=True, separators=(",", ":"))
# The string encoder _ENCODER itself uses when ensure_ascii=False, for measuring member names.
_encode_string = json.encoder.encode_basestring


class PatchTooLarge(Exception):
    """A patch that would grow its document by more than the `limit` it was applied with, or that
    took more than WORK_PER_LIMIT times that many bytes of measuring to apply: a copy of a copy of
    a copy doubles the document with each op of a few bytes."""


# How much measuring (canonical JSON bytes) a patch may cost per byte it may grow the document by.
WORK_PER_LIMIT = 4


class PatchError(ValueError):
    """A patch that is malformed or does not apply. `index` is the op's position, `path` its pointer."""

    message: str
    index: int | None
    path: str | None

    def __init__(self, message: str, *, index: int | None = None, path: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.index = index
        self.path = path


class Applied(NamedTuple):
    doc: JSON  # the new document
    size_delta: int  # exact change in canonical_size(doc) vs the input doc
    depth: int  # max nesting depth reached by any inserted value (len(path tokens) + json_depth(value))


# ----------------------------------------------------------------------------------------------------
# JSON helpers


def canonical_json(value: JSON) -> bytes:
    """Sorted-key, compact, UTF-8 (not \\u-escaped) JSON; NaN/Infinity are rejected.

    The standard library's encoder defines these bytes. orjson writes the very same bytes
    several times faster for a value made only of dicts, lists, strings, integers, booleans
    and nulls, so it writes those; anything else (a float, which orjson formats its own way,
    1e16 where json writes 1e+16; a tuple, a subclass, another type) goes to the standard
    library, and so do the values orjson refuses (a lone surrogate, an integer beyond 64
    bits, a non-string key, a cycle, deep nesting), which then encode or fail as they did.
    """
    return canonical_json_plain(value)[0]


def canonical_json_plain(value: JSON) -> tuple[bytes, bool]:
    """`canonical_json(value)`, and whether the value is plain: only dicts, lists, strings,
    integers, booleans and nulls, which orjson wrote and reads back exactly (no float to round,
    no integer beyond its 64 bits), and whose every part's canonical JSON is orjson's too."""
    try:
        encoded = orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError:
        pass
    else:
        if _plain(value):
            return encoded, True
    return _ENCODER.encode(value).encode("utf-8"), False


_PLAIN_SCALARS = frozenset({str, int, bool, type(None)})


def _plain(value: JSON) -> bool:
    """Whether a value (finite: orjson encoded it) holds only dicts, lists, str, int, bool, None."""
    stack: list[Any] = [value]
    while stack:
        node = stack.pop()
        kind = type(node)
        if kind is dict:
            stack.extend(node.values())
        elif kind is list:
            stack.extend(node)
        elif kind not in _PLAIN_SCALARS:
            return False
    return True


def _byte_len(text: str) -> int:
    # isascii() is O(1) on CPython and skips building the bytes object in the common case.
    return len(text) if text.isascii() else len(text.encode("utf-8"))


_NULL_SIZE, _TRUE_SIZE, _FALSE_SIZE = 4, 4, 5


def _scalar_size(value: JSON) -> int:
    """len(canonical_json(value)) for an int, a string, a bool or null, without encoding the
    number or walking a container; -1 for anything else (and for a string orjson refuses).
    A string's canonical JSON is orjson's (see canonical_json)."""
    kind = type(value)
    if kind is str:
        try:
            return len(orjson.dumps(value))
        except orjson.JSONEncodeError:
            return -1
    if kind is int:
        return len(str(value)) if -_INT_LIMIT < value < _INT_LIMIT else -1
    if value is None:
        return _NULL_SIZE
    if kind is bool:
        return _TRUE_SIZE if value else _FALSE_SIZE
    return -1


# Well inside what int.__str__ writes without hitting Python's limit on digits (and what orjson writes).
_INT_LIMIT = 2**63


def canonical_size(value: JSON) -> int:
    """Length in bytes of canonical_json(value)."""
    return len(canonical_json(value))


def json_depth(value: JSON) -> int:
    """Container nesting depth: a scalar is 0, [] is 1, {"a": {"b": []}} is 3."""
    if not isinstance(value, (dict, list)):
        return 0
    # Iterative so that deep-but-valid documents can't hit the recursion limit here.
    best = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > best:
            best = depth
        children = node.values() if isinstance(node, dict) else node
        for child in children:
            if isinstance(child, (dict, list)):
                stack.append((child, depth + 1))
    return best


def _shared_depth(value: JSON) -> int:
    """json_depth(value) for a value whose parts may be shared (a copy's): each part is walked once."""
    if not isinstance(value, (dict, list)):
        return 0
    # Keyed by id: every part is held by `value` while the walk lasts, so no id is reused.
    depths: dict[int, int] = {}
    stack: list[tuple[Any, bool]] = [(value, False)]
    while stack:
        node, children_done = stack.pop()
        if id(node) in depths:
            continue
        children = [child for child in (node.values() if isinstance(node, dict) else node)
                    if isinstance(child, (dict, list))]  # fmt: skip
        if children_done:
            depths[id(node)] = 1 + max((depths[id(child)] for child in children), default=0)
        else:
            stack.append((node, True))
            stack.extend((child, False) for child in children if id(child) not in depths)
    return depths[id(value)]


def _plain_shared(value: JSON) -> bool:
    """_plain(value) for a value whose parts may be shared (a copy's): each part is checked once."""
    seen: set[int] = set()
    stack: list[Any] = [value]
    while stack:
        node = stack.pop()
        kind = type(node)
        if kind is dict or kind is list:
            if id(node) in seen:
                continue
            seen.add(id(node))
            stack.extend(node.values() if kind is dict else node)
        elif kind not in _PLAIN_SCALARS:
            return False
    return True


def json_equal(a: JSON, b: JSON) -> bool:
    """JSON equality: True != 1, 1 == 1.0, object key order is irrelevant, array order matters."""
    if a is b:
        return True
    # bools are singletons, so two equal bools were caught by the identity check; Python's True == 1 is not
    # JSON equality.
    if type(a) is bool or type(b) is bool:
        return False
    if isinstance(a, dict):
        if not isinstance(b, dict) or len(a) != len(b):
            return False
        for key, x in a.items():
            y = b.get(key, _MISSING)
            if x is y:
                continue
            # Inline the common leaf types: a call per string dominates comparing e.g. reloaded messages.
            kind = type(x)
            if (kind is str or kind is int) and type(y) is kind:
                if x != y:
                    return False
            elif y is _MISSING or not json_equal(x, y):
                return False
        return True
    if isinstance(a, list):
        if not isinstance(b, list) or len(a) != len(b):
            return False
        for x, y in zip(a, b, strict=True):
            if x is y:
                continue
            kind = type(x)
            if (kind is str or kind is int) and type(y) is kind:
                if x != y:
                    return False
            elif not json_equal(x, y):
                return False
        return True
    if isinstance(b, (dict, list)):
        return False
    return bool(a == b)


def _clone(value: JSON) -> JSON:
    if isinstance(value, dict):
        return {key: _clone(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_clone(item) for item in value]
    return value


def _kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


# ----------------------------------------------------------------------------------------------------
# JSON Pointer (RFC 6901)


class _BadPointer(Exception):
    """Internal: carries the reason a pointer is invalid so callers can phrase the error in context."""


def _split_pointer(pointer: str) -> list[str]:
    if pointer == "":
        return []
    if pointer[0] != "/":
        raise _BadPointer("it must be empty or start with '/'")
    tokens = pointer[1:].split("/")
    if "~" not in pointer:
        return tokens
    return [_unescape(token) for token in tokens]


def _unescape(token: str) -> str:
    at = token.find("~")
    if at == -1:
        return token
    while at != -1:
        if token[at + 1 : at + 2] not in ("0", "1"):
            raise _BadPointer("'~' must be followed by '0' or '1'")
        at = token.find("~", at + 2)
    # RFC 6901 order: "~1" first, so that "~01" decodes to "~1" rather than "/".
    return token.replace("~1", "/").replace("~0", "~")


def escape_token(token: str) -> str:
    """A member name as one reference token of a JSON pointer (RFC 6901: ~ and / escaped)."""
    if "~" in token or "/" in token:
        return token.replace("~", "~0").replace("/", "~1")
    return token


def parse_pointer(pointer: str) -> list[str]:
    """Split an RFC 6901 pointer into unescaped reference tokens ("" is the whole document)."""
    if not isinstance(pointer, str):
        raise PatchError(f"a JSON pointer must be a string, not {_kind(pointer)}")
    try:
        return _split_pointer(pointer)
    except _BadPointer as exc:
        raise PatchError(f"invalid JSON pointer {pointer!r}: {exc}", path=pointer) from None


def format_pointer(tokens: Sequence[str | int]) -> str:
    """Build an RFC 6901 pointer from reference tokens (ints are array indices)."""
    parts: list[str] = []
    for token in tokens:
        if isinstance(token, bool) or not isinstance(token, (str, int)):
            raise TypeError(f"pointer tokens must be str or int, not {type(token).__name__}")
        parts.append("/" + (escape_token(token) if isinstance(token, str) else str(token)))
    return "".join(parts)


# ----------------------------------------------------------------------------------------------------
# Patch validation

# (op name, path, path tokens, from pointer or None, from tokens or None, the op object)
_Parsed = tuple[str, str, list[str], str | None, list[str] | None, Op]


def _pointer_member(op: Op, member: str, index: int, name: str, where: str | None) -> tuple[str, list[str]]:
    if member not in op:
        raise PatchError(f"op {index}: {member!r} is required for {name!r}", index=index, path=where)
    pointer = op[member]
    if not isinstance(pointer, str):
        message = f"op {index}: {member!r} must be a JSON pointer string, not {_kind(pointer)}"
        raise PatchError(message, index=index, path=where)
    try:
        return pointer, _split_pointer(pointer)
    except _BadPointer as exc:
        message = f"op {index}: {member!r} is not a valid JSON pointer ({pointer!r}: {exc})"
        raise PatchError(message, index=index, path=where) from None


def _parse_ops(ops: object) -> list[_Parsed]:
    if not isinstance(ops, list):
        raise PatchError(f"a patch must be an array of operations, not {_kind(ops)}")
    parsed: list[_Parsed] = []
    for index, op in enumerate(ops):
        if not isinstance(op, dict):
            raise PatchError(f"op {index}: an operation must be an object, not {_kind(op)}", index=index)
        raw_path = op.get("path")
        where = raw_path if isinstance(raw_path, str) else None
        if "op" not in op:
            raise PatchError(f"op {index}: 'op' is required", index=index, path=where)
        name = op["op"]
        if not isinstance(name, str) or name not in _OPS:
            raise PatchError(
                f"op {index}: 'op' must be one of {', '.join(_OPS)}, not {name!r}", index=index, path=where
            )
        path, tokens = _pointer_member(op, "path", index, name, where)
        if name in _NEEDS_VALUE and "value" not in op:
            raise PatchError(f"op {index}: 'value' is required for {name!r}", index=index, path=path)
        from_path: str | None = None
        from_tokens: list[str] | None = None
        if name in _NEEDS_FROM:
            from_path, from_tokens = _pointer_member(op, "from", index, name, path)
        parsed.append((name, path, tokens, from_path, from_tokens, op))
    return parsed


def validate_ops(ops: object) -> list[Op]:
    """Check a patch's shape (not whether it applies) and return it; raises PatchError naming the bad op."""
    _parse_ops(ops)
    assert isinstance(ops, list)  # narrowed by _parse_ops
    return ops


def validate_patch(ops: object) -> list[_Parsed]:
    """`validate_ops`, keeping what it parsed for `apply_validated`."""
    return _parse_ops(ops)


# ----------------------------------------------------------------------------------------------------
# Applying patches


class _Patcher:
    """Copy-on-write state for one apply_patch call.

    `owned` maps id -> container for every container this patch created, so those (and only those) may be
    mutated in place; everything else is shared with the caller's document or the ops and must be copied
    first. Holding the containers themselves keeps their ids from being reused while the patch runs.
    """

    __slots__ = ("budget", "delta", "from_path", "in_place", "index", "measuring", "name", "owned", "path", "root")

    def __init__(
        self, root: JSON, *, measuring: bool = True, in_place: bool = False, budget: int | None = None
    ) -> None:
        self.root: JSON = root
        self.measuring = measuring
        self.in_place = in_place
        self.owned: dict[int, Any] = {}
        self.delta = 0
        self.budget = budget  # bytes of measuring left before the patch is refused; None: no end
        self.index = 0
        self.name = ""
        self.path = ""
        self.from_path: str | None = None

    def fail(self, reason: str) -> NoReturn:
        # The root pointer is the empty string, which would vanish from the message.
        shown = self.path or '""'
        if self.from_path is None:
            label = f"{self.name} {shown}"
        else:
            source = self.from_path or '""'
            label = f"{self.name} from {source} to {shown}"
        raise PatchError(f"op {self.index} ({label}): {reason}", index=self.index, path=self.path)

    def measure(self, value: JSON, *, plain: bool = False) -> int:
        """len(canonical_json(value)), counted against the budget; `plain`: the value is (see
        canonical_json_plain), so orjson's JSON of it, sorted or not, is as long."""
        if not self.measuring:
            return 0
        size = len(orjson.dumps(value)) if plain else _scalar_size(value)
        return self.charge(size if size >= 0 else self.encoded_size(value))

    def encoded_size(self, value: JSON) -> int:
        """len(canonical_json(value)) for a value whose parts may be shared, as a copy's are (see
        copy): orjson writes a part as often as it occurs, but the walk that tells whether its
        bytes are the canonical ones visits each part once, not once per occurrence."""
        try:
            encoded: bytes | None = orjson.dumps(value)  # unsorted: as long as sorted
        except orjson.JSONEncodeError:
            encoded = None
        if encoded is not None and _plain_shared(value):
            return len(encoded)
        try:
            return len(_ENCODER.encode(value).encode("utf-8"))  # canonical_json's other way
        except (TypeError, ValueError, RecursionError) as exc:
            self.fail(f"the value is not valid JSON ({exc})")

    def charge(self, size: int) -> int:
        """Count `size` bytes of measuring against the budget."""
        if self.budget is not None:
            self.budget -= size
            if self.budget < 0:
                raise PatchTooLarge(f"op {self.index} ({self.name}): the patch takes too much work to apply")
        return size

    def copy(self, source: JSON) -> JSON:
        """The value a copy op inserts, independent of `source` for every later op of this patch.

        Patching in place mutates whatever it reaches, so the copy is a deep one. Otherwise only
        the containers this patch made (`owned`, edited in place by later ops) are copied; the
        rest is shared with `source`, as the untouched rest of the document is shared with the
        input, because a later op copies it on its way before writing in it. A patch of a few
        bytes that copies a value into itself again and again then makes one container per op,
        not a tree twice as big with each op."""
        if self.in_place:
            return _clone(source)
        owned = self.owned
        if id(source) not in owned:
            return source
        if isinstance(source, dict):
            return {key: self.copy(item) for key, item in source.items()}
        return [self.copy(item) for item in source]

    def key_size(self, key: str) -> int:
        if not self.measuring:
            return 0
        try:
            return _byte_len(_encode_string(key))
        except ValueError as exc:  # a lone surrogate can't be encoded as UTF-8
            self.fail(f"the member name is not valid JSON ({exc})")

    def array_index(self, segment: str, length: int, for_add: bool, what: str) -> int:
        if segment == "-":
            if for_add:
                return length
            self.fail(f"{what} does not exist ('-' refers to the nonexistent element after the last one)")
        # Decimal without leading zeros; isascii() because isdigit() also accepts e.g. Arabic-Indic digits.
        if not (segment.isdigit() and segment.isascii()) or (segment[0] == "0" and len(segment) > 1):
            self.fail(f"{segment!r} is not a valid array index")
        position = int(segment)
        if position > length or (position == length and not for_add):
            self.fail(f"{what} does not exist (index {position} is out of range for an array of {length})")
        return position

    def get(self, tokens: list[str], what: str) -> JSON:
        node = self.root
        for token in tokens:
            if isinstance(node, dict):
                node = node.get(token, _MISSING)
                if node is _MISSING:
                    self.fail(f"{what} does not exist")
            elif isinstance(node, list):
                node = node[self.array_index(token, len(node), False, what)]
            else:
                self.fail(f"{what} does not exist")
        return node

    def parent(self, tokens: list[str], what: str) -> Any:
        """Return the container holding tokens[-1], made private to this patch along the whole path."""
        if self.in_place:
            node = self.get(tokens[:-1], what)
            if not isinstance(node, (dict, list)):
                self.fail(f"{what} does not exist")
            return node
        owned = self.owned
        node = self.root
        if id(node) not in owned:
            if not isinstance(node, (dict, list)):
                self.fail(f"{what} does not exist")
            node = node.copy()
            owned[id(node)] = node
            self.root = node
        for position in range(len(tokens) - 1):
            token = tokens[position]
            key: str | int
            if isinstance(node, dict):
                child = node.get(token, _MISSING)
                if child is _MISSING:
                    self.fail(f"{what} does not exist")
                key = token
            else:
                key = self.array_index(token, len(node), False, what)
                child = node[key]
            if id(child) not in owned:
                if not isinstance(child, (dict, list)):
                    self.fail(f"{what} does not exist")
                child = child.copy()
                owned[id(child)] = child
                node[key] = child
            node = child
        return node

    def add(self, tokens: list[str], value: JSON, size: int) -> None:
        if not tokens:
            self.delta += size - self.measure(self.root)
            self.root = value
            return
        parent = self.parent(tokens, "path")
        last = tokens[-1]
        if isinstance(parent, dict):
            old = parent.get(last, _MISSING)
            if old is _MISSING:
                # "key":value, plus a comma unless it's the only member
                self.delta += self.key_size(last) + 1 + size + (1 if parent else 0)
            else:
                self.delta += size - self.measure(old)
            parent[last] = value
        else:
            length = len(parent)
            parent.insert(self.array_index(last, length, True, "path"), value)
            self.delta += size + (1 if length else 0)

    def remove(self, tokens: list[str], what: str) -> tuple[JSON, int]:
        if not tokens:
            self.fail("the whole document cannot be removed")
        parent = self.parent(tokens, what)
        last = tokens[-1]
        if isinstance(parent, dict):
            value = parent.pop(last, _MISSING)
            if value is _MISSING:
                self.fail(f"{what} does not exist")
            size = self.measure(value)
            self.delta -= self.key_size(last) + 1 + size + (1 if parent else 0)
        else:
            value = parent.pop(self.array_index(last, len(parent), False, what))
            size = self.measure(value)
            self.delta -= size + (1 if parent else 0)
        return value, size

    def replace(self, tokens: list[str], value: JSON, size: int) -> None:
        if not tokens:
            self.delta += size - self.measure(self.root)
            self.root = value
            return
        parent = self.parent(tokens, "path")
        last = tokens[-1]
        key: str | int
        if isinstance(parent, dict):
            if last not in parent:
                self.fail("path does not exist")
            key = last
        else:
            key = self.array_index(last, len(parent), False, "path")
        self.delta += size - self.measure(parent[key])
        parent[key] = value


def apply_patch(
    doc: JSON, ops: list[Op], *, measure: bool = True, in_place: bool = False, limit: int | None = None
) -> Applied:
    """Apply an RFC 6902 patch atomically without mutating `doc`; cost is proportional to the change.

    `measure=False` skips the size and depth accounting (size_delta and depth come back 0), for
    replaying deltas already checked when they were written. `in_place=True` mutates `doc` itself
    instead of copying along the touched paths: only for a document the caller owns outright,
    and the patch is then not atomic. With a `limit` (measuring), PatchTooLarge is raised as soon
    as the document has grown by more than `limit` bytes of canonical JSON, or the patch has cost
    more than WORK_PER_LIMIT times that in measuring: a patch from outside can then make neither
    a document past the caller's limit nor the work to build one.
    """
    return _apply_parsed(doc, _parse_ops(ops), measure=measure, in_place=in_place, limit=limit)


def apply_validated(
    doc: JSON,
    validated: Sequence[_Parsed],
    ops: list[Op],
    *,
    limit: int | None = None,
    plain: bool = False,
    depth: bool = True,
) -> Applied:
    """`apply_patch(doc, ops, limit=limit)` for `ops` equal to the patch `validate_patch` checked
    (its canonical JSON read back, say): the pointers it parsed then are used again, not parsed
    a second time. Each of `ops` must be the op at the same place in that patch, or equal to it.

    `plain`: every op's value is plain (canonical_json_plain), so its size is orjson's length and
    not a walk of it. `depth=False`: the caller knows the patch cannot nest the document too deep
    (see `depth_bound`), so the depth is not measured (0 comes back)."""
    if len(validated) != len(ops):
        raise ValueError("the ops are not those of the validated patch")
    parsed = [(name, path, tokens, from_path, from_tokens, op)
              for (name, path, tokens, from_path, from_tokens, _), op in zip(validated, ops, strict=True)]  # fmt: skip
    return _apply_parsed(doc, parsed, measure=True, in_place=False, limit=limit, plain=plain, depth=depth)


def depth_bound(validated: Sequence[_Parsed], canonical: bytes) -> int | None:
    """An upper bound of the depth a validated patch of add, replace, remove and test ops can give
    the document, from its canonical JSON: no value nests deeper than it has brackets. None for a
    patch that moves or copies (its values come from the document)."""
    deepest = 0
    for name, _, tokens, _, _, _ in validated:
        if name == "move" or name == "copy":
            return None
        deepest = max(deepest, len(tokens))
    return deepest + canonical.count(b"[") + canonical.count(b"{")


def _apply_parsed(
    doc: JSON,
    parsed: list[_Parsed],
    *,
    measure: bool,
    in_place: bool,
    limit: int | None,
    plain: bool = False,
    depth: bool = True,
) -> Applied:
    budget = WORK_PER_LIMIT * max(limit, 0) if measure and limit is not None else None
    patcher = _Patcher(doc, measuring=measure, in_place=in_place, budget=budget)
    deepest = 0
    for index, (name, path, tokens, from_path, from_tokens, op) in enumerate(parsed):
        patcher.index = index
        patcher.name = name
        patcher.path = path
        patcher.from_path = from_path
        if name == "add" or name == "replace":
            value = op["value"]
            size = patcher.measure(value, plain=plain)
            if name == "add":
                patcher.add(tokens, value, size)
            else:
                patcher.replace(tokens, value, size)
        elif name == "remove":
            patcher.remove(tokens, "path")
            continue
        elif name == "test":
            if not json_equal(patcher.get(tokens, "path"), op["value"]):
                patcher.fail("test failed: the value at the path is not equal to the expected value")
            continue
        elif name == "move":
            assert from_tokens is not None
            if from_tokens == tokens:
                patcher.get(from_tokens, "'from' location")
                continue
            if len(from_tokens) < len(tokens) and tokens[: len(from_tokens)] == from_tokens:
                patcher.fail("a value cannot be moved into one of its own children")
            value, size = patcher.remove(from_tokens, "'from' location")
            patcher.add(tokens, value, size)
        else:  # copy
            assert from_tokens is not None
            source = patcher.get(from_tokens, "'from' location")
            size = patcher.measure(source)  # before the copy is made: the budget may refuse it
            value = patcher.copy(source)
            patcher.add(tokens, value, size)
        if limit is not None and patcher.delta > limit:
            raise PatchTooLarge(f"op {index} ({name}): the document would grow by more than {limit} bytes")
        if measure and depth:
            # A moved or copied value is the document's, whose parts a copy may share: walk each once.
            depth_of = json_depth if name == "add" or name == "replace" else _shared_depth
            deepest = max(deepest, len(tokens) + depth_of(value))
    return Applied(patcher.root, patcher.delta, deepest)


# ----------------------------------------------------------------------------------------------------
# Diffing


def make_patch(base: JSON, target: JSON, path: str = "") -> list[Op]:
    """Ops turning `base` into `target`; `path` is where `base` sits in the document the ops will apply to.

    Op values are taken from `target` as-is (not copied); apply_patch never mutates them.
    """
    parse_pointer(path)
    ops: list[Op] = []
    _diff(base, target, path, ops)
    return ops


def _diff(a: JSON, b: JSON, path: str, ops: list[Op]) -> None:
    if a is b:
        return
    if isinstance(a, dict) and isinstance(b, dict):
        _diff_dict(a, b, path, ops)
    elif isinstance(a, list) and isinstance(b, list):
        _diff_list(a, b, path, ops)
    elif not json_equal(a, b):
        ops.append({"op": "replace", "path": path, "value": b})


def _diff_dict(a: dict[str, Any], b: dict[str, Any], path: str, ops: list[Op]) -> None:
    if not a and not b:
        return
    if not a or not b or a.keys().isdisjoint(b):
        # Nothing to keep: one replace is smaller than removing and adding every member.
        ops.append({"op": "replace", "path": path, "value": b})
        return
    for key in a:
        if key not in b:
            ops.append({"op": "remove", "path": f"{path}/{escape_token(key)}"})
    for key, new in b.items():
        old = a.get(key, _MISSING)
        if old is new:
            continue
        if old is _MISSING:
            ops.append({"op": "add", "path": f"{path}/{escape_token(key)}", "value": new})
        else:
            _diff(old, new, f"{path}/{escape_token(key)}", ops)


def _diff_list(a: list[Any], b: list[Any], path: str, ops: list[Op]) -> None:
    n, m = len(a), len(b)
    shortest = min(n, m)
    # Common prefix. The usual agent step appends to a list whose old items are the very same objects, which
    # the C-level identity scan settles without a Python-level loop.
    start = shortest if all(map(is_, a, b)) else 0
    while start < shortest:
        x, y = a[start], b[start]
        if x is not y and not json_equal(x, y):
            break
        start += 1
    # Common suffix, not overlapping the prefix.
    end = 0
    limit = shortest - start
    while end < limit:
        x, y = a[n - 1 - end], b[m - 1 - end]
        if x is not y and not json_equal(x, y):
            break
        end += 1
    old_count, new_count = n - start - end, m - start - end
    if old_count == 0 and new_count == 0:
        return
    if old_count == 0:
        for offset in range(new_count):
            at = start + offset
            # With nothing after the insertion point, "-" keeps append ops independent of the list length.
            ops.append({"op": "add", "path": f"{path}/{'-' if end == 0 else at}", "value": b[at]})
        return
    if new_count == 0:
        # From the end, so earlier indices stay valid (and the array shifts the least).
        for at in range(start + old_count - 1, start - 1, -1):
            ops.append({"op": "remove", "path": f"{path}/{at}"})
        return
    changes: list[Op] = []
    common = min(old_count, new_count)
    for offset in range(common):
        at = start + offset
        _diff(a[at], b[at], f"{path}/{at}", changes)
    for at in range(start + old_count - 1, start + common - 1, -1):
        changes.append({"op": "remove", "path": f"{path}/{at}"})
    for offset in range(common, new_count):
        at = start + offset
        changes.append({"op": "add", "path": f"{path}/{'-' if end == 0 else at}", "value": b[at]})
    # When most elements changed, replacing the whole list may be smaller. Only weigh it then, so that a small
    # edit inside a long list never pays for serialising the whole list.
    if len(changes) > 1 and 2 * len(changes) >= m:
        whole: Op = {"op": "replace", "path": path, "value": b}
        try:
            if canonical_size([whole]) <= canonical_size(changes):
                changes = [whole]
        except (TypeError, ValueError):
            pass
    ops.extend(changes)
