"""Search filters on item values, which are sealed: what a filter means, and the keyed digests
("tokens") that let PostgreSQL find the items an equality filter can match without opening any.

A filter is LangGraph's: `{"color": "red", "score": {"$gte": 3}, "owner": {"name": "al"}}` — each
top-level field equals the value, satisfies every `$eq`/`$ne`/`$gt`/`$gte`/`$lt`/`$lte` given, or,
for an object without operators, matches it field by field. Equality is JSON's (1 == 1.0, true
!= 1); comparisons are numeric for numbers and lexicographic for strings.

A token is the first 8 bytes of an HMAC of (field path, value) keyed from the integrity key: an
item's row lists the tokens of its fields (down to `TOKEN_DEPTH` levels), a filter's equality
conditions name the tokens a match must have, and a GIN index finds the rows. Tokens show which
items share a field's value, never the value, and not to anyone without the key. Every candidate
is still opened and checked against the whole filter (`matches`), so a digest collision or an
operator tokens cannot express costs time, never a wrong answer.

A row's tokens are its namespace's: each is XORed with a mask made from the namespace's id
(`namespace_mask`, which SQL computes too, `MASK_SQL`). The index then finds the matches within
one namespace by itself, rather than every item of the namespace being read to find none; a
search masks the filter's tokens per namespace in SQL (memory.selectors). The mask is public and
hides nothing: the tokens were keyed digests already.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from typing import Any

import orjson

from checkpoints.storage import codec
from checkpoints.storage.jsonpatch import json_equal
from memory.errors import InvalidFilter

OPERATORS = frozenset({"$eq", "$ne", "$gt", "$gte", "$lt", "$lte"})
TOKEN_DEPTH = 3
# An item with more fields than this has no tokens (NULL): every search that filters reads it.
MAX_TOKENS = 256
_DOMAIN = b"quicksave-memory-filter-v1:"


def _normal(value: Any) -> Any:
    """The value as tokens see it: 1.0 and 1 are the same JSON number."""
    if type(value) is float and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if isinstance(value, dict):
        return {key: _normal(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_normal(item) for item in value]
    return value


def token(path: tuple[str, ...], value: Any) -> int:
    return _token(codec.keyed_digest(_DOMAIN, _message(path, value)))


def _token(digest: bytes) -> int:
    return int.from_bytes(digest[:8], "big", signed=True)


_PLAIN = frozenset({str, int, bool, type(None)})


def _message(path: tuple[str, ...], value: Any) -> bytes:
    """What a token digests: the canonical JSON of [path, value]. For a string, integer, boolean
    or null under a path of strings that is orjson's output as it is (as codec.canonical_json
    itself finds), without the walk that proves the value plain."""
    if type(value) in _PLAIN and all(type(name) is str for name in path):
        try:
            return orjson.dumps((path, value))
        except orjson.JSONEncodeError:  # an integer beyond 64 bits, a lone surrogate: as before
            pass
    return codec.to_canonical_bytes([list(path), _normal(value)])


@lru_cache(maxsize=4096)
def namespace_mask(namespace_id: int) -> int:
    """What the tokens of a namespace's items are XORed with: as MASK_SQL computes it."""
    return int.from_bytes(
        hashlib.md5(str(namespace_id).encode(), usedforsecurity=False).digest()[:8], "big", signed=True
    )


# `namespace_mask` of the namespace id column or parameter `{}`, in SQL.
MASK_SQL = "('x' || left(md5(({})::text), 16))::bit(64)::bigint"


def value_tokens(value: Any, namespace_id: int) -> list[int] | None:
    """The tokens of a value's fields in a namespace, or None when it has more than MAX_TOKENS."""
    messages = _field_messages(value)
    if messages is None:
        return None
    if not messages:
        return []
    mask = namespace_mask(namespace_id)
    return sorted({_token(digest) ^ mask for digest in codec.keyed_digests(_DOMAIN, messages)})


def _field_messages(value: Any) -> list[bytes] | None:
    if not isinstance(value, dict):
        return []
    found: list[bytes] = []
    pending: list[tuple[tuple[str, ...], dict[str, Any]]] = [((), value)]
    while pending:
        path, node = pending.pop()
        for name, item in node.items():
            if len(found) >= MAX_TOKENS:
                return None
            here = (*path, name)
            found.append(_message(here, item))
            if isinstance(item, dict) and len(here) < TOKEN_DEPTH:
                pending.append((here, item))
    return found


def check(filter: Any) -> dict[str, Any]:
    """The filter, or InvalidFilter saying what is wrong with it."""
    if filter is None:
        return {}
    if not isinstance(filter, dict):
        raise InvalidFilter("A filter is an object of field names and values.", detail={"field": "filter"})
    _check(filter, ())
    return filter


def _check(filter: dict[str, Any], path: tuple[str, ...]) -> None:
    for name, wanted in filter.items():
        if not isinstance(name, str) or name.startswith("$"):
            raise InvalidFilter(
                f"The filter's {'.'.join((*path, str(name)))!r} is not a field name; operators go inside a field.",
                detail={"field": "filter"},
            )
        if isinstance(wanted, dict) and any(key.startswith("$") for key in wanted):
            unknown = sorted(set(wanted) - OPERATORS)
            if unknown:
                raise InvalidFilter(
                    f"The filter uses {unknown[0]!r}; the operators are {', '.join(sorted(OPERATORS))}.",
                    detail={"field": "filter"},
                )
            for operator, operand in wanted.items():
                if operator in ("$gt", "$gte", "$lt", "$lte") and not _comparable(operand):
                    raise InvalidFilter(
                        f"{operator} compares with a number or a string, not {type(operand).__name__}.",
                        detail={"field": "filter"},
                    )
        elif isinstance(wanted, dict):
            _check(wanted, (*path, name))


def _comparable(value: Any) -> bool:
    return isinstance(value, (int, float, str)) and not isinstance(value, bool)


def filter_tokens(filter: dict[str, Any]) -> tuple[list[int], bool]:
    """The tokens every match has (before its namespace's mask), and whether they decide the
    filter alone (only equalities within TOKEN_DEPTH): then a page can be cut in SQL."""
    found: list[int] = []
    exact = _filter_tokens(filter, (), found)
    return sorted(set(found)), exact


def _filter_tokens(filter: dict[str, Any], path: tuple[str, ...], found: list[int]) -> bool:
    exact = True
    for name, wanted in filter.items():
        here = (*path, name)
        if len(here) > TOKEN_DEPTH:
            exact = False
            continue
        if isinstance(wanted, dict) and any(key.startswith("$") for key in wanted):
            for operator, operand in wanted.items():
                if operator == "$eq":
                    found.append(token(here, operand))
                else:
                    exact = False
        elif isinstance(wanted, dict):
            # {} matches any object there, which no token says
            exact = bool(wanted) and _filter_tokens(wanted, here, found) and exact
        else:
            found.append(token(here, wanted))
    return exact


def matches(value: Any, filter: dict[str, Any]) -> bool:
    if not filter:
        return True
    if not isinstance(value, dict):
        return False
    return all(_matches(value.get(name, _ABSENT), wanted) for name, wanted in filter.items())


_ABSENT: Any = object()


def _matches(value: Any, wanted: Any) -> bool:
    if isinstance(wanted, dict):
        if any(key.startswith("$") for key in wanted):
            return all(_apply(value, operator, operand) for operator, operand in wanted.items())
        if not isinstance(value, dict):
            return False
        return all(_matches(value.get(name, _ABSENT), inner) for name, inner in wanted.items())
    return value is not _ABSENT and json_equal(value, wanted)


def _apply(value: Any, operator: str, operand: Any) -> bool:
    if operator == "$eq":
        return value is not _ABSENT and json_equal(value, operand)
    if operator == "$ne":
        return value is _ABSENT or not json_equal(value, operand)
    if value is _ABSENT or not _comparable(value):
        return False
    number = not isinstance(operand, str)
    if number != (not isinstance(value, str)):
        return False  # a number is not compared with a string
    if operator == "$gt":
        return bool(value > operand)
    if operator == "$gte":
        return bool(value >= operand)
    if operator == "$lt":
        return bool(value < operand)
    return bool(value <= operand)
