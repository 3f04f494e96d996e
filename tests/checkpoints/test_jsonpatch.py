"""Unit tests for checkpoints.storage.jsonpatch (RFC 6902 JSON Patch / RFC 6901 JSON Pointer); no database needed."""

from __future__ import annotations

import copy
import enum
import json
import math
import re
import string
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from checkpoints.storage import jsonpatch
from checkpoints.storage.jsonpatch import (
    Applied,
    Op,
    PatchError,
    PatchTooLarge,
    apply_patch,
    canonical_json,
    canonical_size,
    format_pointer,
    json_depth,
    json_equal,
    make_patch,
    parse_pointer,
    validate_ops,
)

# ----------------------------------------------------------------------------------------------------
# Strategies and a deliberately naive reference implementation to compare against


scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=6)
)
# Keys are biased towards characters that need pointer escaping and towards collisions between documents.
keys = st.text(alphabet="ab~/0-", max_size=3) | st.text(max_size=3)
json_values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(keys, children, max_size=4),
    max_leaves=12,
)
# Small alphabet of leaves so that generated pairs of documents share structure and collide on True/1/1.0.
close_values = st.recursive(
    st.sampled_from([None, True, False, 0, 1, 1.0, "", "a"]),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.sampled_from("ab~/"), children, max_size=3),
    max_leaves=12,
)

# No example database: these run in a shared tree and failures print their reproducing example anyway.
PROPERTY = settings(max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
QUICK_PROPERTY = settings(PROPERTY, max_examples=50)


class RefError(Exception):
    pass


_INDEX = re.compile(r"0|[1-9][0-9]*")


def _ref_index(token: str, length: int, for_add: bool) -> int:
    if token == "-" and for_add:
        return length
    if not _INDEX.fullmatch(token):
        raise RefError(token)
    position = int(token)
    if position > length or (position == length and not for_add):
        raise RefError(token)
    return position


def _ref_get(doc: Any, tokens: list[str]) -> Any:
    for token in tokens:
        if isinstance(doc, dict):
            if token not in doc:
                raise RefError(token)
            doc = doc[token]
        elif isinstance(doc, list):
            doc = doc[_ref_index(token, len(doc), False)]
        else:
            raise RefError(token)
    return doc


def _ref_container(doc: Any, tokens: list[str]) -> Any:
    parent = _ref_get(doc, tokens[:-1])
    if not isinstance(parent, (dict, list)):
        raise RefError(tokens)
    return parent


def _ref_add(doc: Any, tokens: list[str], value: Any) -> Any:
    if not tokens:
        return value
    parent = _ref_container(doc, tokens)
    if isinstance(parent, dict):
        parent[tokens[-1]] = value
    else:
        parent.insert(_ref_index(tokens[-1], len(parent), True), value)
    return doc


def _ref_remove(doc: Any, tokens: list[str]) -> Any:
    if not tokens:
        raise RefError("root")
    parent = _ref_container(doc, tokens)
    if isinstance(parent, dict):
        if tokens[-1] not in parent:
            raise RefError(tokens)
        return parent.pop(tokens[-1])
    return parent.pop(_ref_index(tokens[-1], len(parent), False))


def reference_apply(doc: Any, ops: list[dict[str, Any]]) -> tuple[Any, int]:
    """Deep-copy-and-mutate RFC 6902, returning (new doc, depth) with the same depth definition."""
    doc = copy.deepcopy(doc)
    depth = 0
    for op in ops:
        tokens = parse_pointer(op["path"])
        name = op["op"]
        inserted: Any = None
        if name == "test":
            if not json_equal(_ref_get(doc, tokens), op["value"]):
                raise RefError("test")
            continue
        if name == "remove":
            _ref_remove(doc, tokens)
            continue
        if name == "add":
            inserted = copy.deepcopy(op["value"])
            doc = _ref_add(doc, tokens, inserted)
        elif name == "replace":
            inserted = copy.deepcopy(op["value"])
            _ref_get(doc, tokens)
            doc = _ref_add(doc, tokens, inserted) if not tokens else _ref_replace(doc, tokens, inserted)
        elif name == "copy":
            inserted = copy.deepcopy(_ref_get(doc, parse_pointer(op["from"])))
            doc = _ref_add(doc, tokens, inserted)
        elif name == "move":
            source = parse_pointer(op["from"])
            if source == tokens:
                _ref_get(doc, source)
                continue
            if tokens[: len(source)] == source:
                raise RefError("move into child")
            inserted = _ref_remove(doc, source)
            doc = _ref_add(doc, tokens, inserted)
        depth = max(depth, len(tokens) + json_depth(inserted))
    return doc, depth


def _ref_replace(doc: Any, tokens: list[str], value: Any) -> Any:
    parent = _ref_container(doc, tokens)
    if isinstance(parent, dict):
        parent[tokens[-1]] = value
    else:
        parent[_ref_index(tokens[-1], len(parent), False)] = value
    return doc


def _locations(doc: Any, tokens: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    found = [(tokens, doc)]
    if isinstance(doc, dict):
        for key, value in doc.items():
            found += _locations(value, (*tokens, key))
    elif isinstance(doc, list):
        for position, value in enumerate(doc):
            found += _locations(value, (*tokens, str(position)))
    return found


def _draw_slot(data: st.DataObject, doc: Any, avoid: tuple[str, ...] | None = None) -> tuple[str, ...] | None:
    """A location an add could target: the root, a member of an object, or a position in an array."""
    containers = [
        (tokens, value)
        for tokens, value in _locations(doc)
        if isinstance(value, (dict, list)) and (avoid is None or tokens[: len(avoid)] != avoid)
    ]
    if not containers or data.draw(st.integers(0, 9)) == 0:
        return ()
    tokens, container = data.draw(st.sampled_from(containers))
    if isinstance(container, dict):
        key = data.draw(st.sampled_from(sorted(container)) | keys) if container else data.draw(keys)
        return (*tokens, key)
    position = data.draw(st.sampled_from(["-", "0"]) | st.integers(0, len(container)).map(str))
    return (*tokens, position)


def _draw_op(data: st.DataObject, doc: Any) -> dict[str, Any]:
    locations = _locations(doc)
    inner = [tokens for tokens, _ in locations if tokens]
    kinds = ["add", "replace", "test", "copy"] + (["remove", "move", "move"] if inner else [])
    kind = data.draw(st.sampled_from(kinds))
    if kind == "add":
        slot = _draw_slot(data, doc)
        return {"op": "add", "path": format_pointer(slot or ()), "value": data.draw(json_values)}
    if kind == "remove":
        return {"op": "remove", "path": format_pointer(data.draw(st.sampled_from(inner)))}
    if kind == "replace":
        tokens = data.draw(st.sampled_from([tokens for tokens, _ in locations]))
        return {"op": "replace", "path": format_pointer(tokens), "value": data.draw(json_values)}
    if kind == "test":
        tokens, value = data.draw(st.sampled_from(locations))
        return {"op": "test", "path": format_pointer(tokens), "value": copy.deepcopy(value)}
    if kind == "copy":
        source = data.draw(st.sampled_from([tokens for tokens, _ in locations]))
        return {
            "op": "copy",
            "from": format_pointer(source),
            "path": format_pointer(_draw_slot(data, doc) or ()),
        }
    source = data.draw(st.sampled_from(inner))
    target = source if data.draw(st.integers(0, 9)) == 0 else _draw_slot(data, doc, avoid=source)
    return {"op": "move", "from": format_pointer(source), "path": format_pointer(target or ())}


def _check_applied(doc: Any, ops: list[dict[str, Any]], expected: Any, expected_depth: int) -> Applied:
    before = copy.deepcopy(doc)
    ops_before = copy.deepcopy(ops)
    result = apply_patch(doc, ops)
    assert json_equal(result.doc, expected)
    assert canonical_size(result.doc) == canonical_size(doc) + result.size_delta
    assert result.depth == expected_depth
    assert json_depth(result.doc) <= max(json_depth(doc), result.depth)
    assert json_equal(doc, before), "apply_patch mutated its input document"
    assert json_equal(ops, ops_before), "apply_patch mutated the values in its ops"
    return result


# ----------------------------------------------------------------------------------------------------
# JSON Pointer


def test_parse_pointer_of_empty_string_is_the_whole_document() -> None:
    assert parse_pointer("") == []


def test_parse_pointer_unescapes_slash_and_tilde() -> None:
    assert parse_pointer("/a~1b/~0c") == ["a/b", "~c"]
    # ~1 is decoded before ~0, so "~01" is a literal "~1", not "/".
    assert parse_pointer("/~01") == ["~1"]
    assert parse_pointer("/") == [""]
    assert parse_pointer("//x/") == ["", "x", ""]


@pytest.mark.parametrize("pointer", ["a", "a/b", "~0", " /a"])
def test_parse_pointer_rejects_pointers_not_starting_with_slash(pointer: str) -> None:
    with pytest.raises(PatchError, match="start with '/'"):
        parse_pointer(pointer)


@pytest.mark.parametrize("pointer", ["/a~2", "/a~", "/~x/b", "/ok/~"])
def test_parse_pointer_rejects_bad_tilde_escapes(pointer: str) -> None:
    with pytest.raises(PatchError, match="'~' must be followed by '0' or '1'"):
        parse_pointer(pointer)


def test_format_pointer_escapes_tokens_and_accepts_indices() -> None:
    assert format_pointer([]) == ""
    assert format_pointer(["a/b", "~c", 3, "-"]) == "/a~1b/~0c/3/-"
    assert format_pointer(["~1"]) == "/~01"


@QUICK_PROPERTY
@given(st.lists(st.text(max_size=5), max_size=5))
def test_format_then_parse_pointer_round_trips(tokens: list[str]) -> None:
    assert parse_pointer(format_pointer(tokens)) == tokens


RFC6901_DOC = {
    "foo": ["bar", "baz"],
    "": 0,
    "a/b": 1,
    "c%d": 2,
    "e^f": 3,
    "g|h": 4,
    "i\\j": 5,
    'k"l': 6,
    " ": 7,
    "m~n": 8,
}


@pytest.mark.parametrize(
    ("pointer", "expected"),
    [
        ("", RFC6901_DOC),
        ("/foo", ["bar", "baz"]),
        ("/foo/0", "bar"),
        ("/", 0),
        ("/a~1b", 1),
        ("/c%d", 2),
        ("/e^f", 3),
        ("/g|h", 4),
        ("/i\\j", 5),
        ('/k"l', 6),
        ("/ ", 7),
        ("/m~0n", 8),
    ],
)
def test_rfc6901_example_pointers_resolve_to_their_values(pointer: str, expected: Any) -> None:
    result = apply_patch(RFC6901_DOC, [{"op": "test", "path": pointer, "value": expected}])
    assert result.doc is RFC6901_DOC
    assert result.size_delta == 0


# ----------------------------------------------------------------------------------------------------
# validate_ops


def test_validate_ops_returns_the_patch_and_ignores_unknown_members() -> None:
    ops: list[Op] = [
        {"op": "add", "path": "/a", "value": None, "xyz": 1},
        {"op": "remove", "path": "/a", "value": "ignored", "from": 5},
        {"op": "replace", "path": "", "value": {}},
        {"op": "move", "from": "/a", "path": "/b"},
        {"op": "copy", "from": "", "path": "/c"},
        {"op": "test", "path": "/a~1b", "value": False},
    ]
    assert validate_ops(ops) is ops


@pytest.mark.parametrize(
    ("ops", "message", "index"),
    [
        ({"op": "add"}, "a patch must be an array of operations, not an object", None),
        ([{"op": "add", "path": "/a", "value": 1}, "remove"], "op 1: an operation must be an object", 1),
        ([{"path": "/a"}], "op 0: 'op' is required", 0),
        (
            [{"op": "delete", "path": "/a"}],
            "op 0: 'op' must be one of add, remove, replace, move, copy, test",
            0,
        ),
        ([{"op": ["add"], "path": "/a"}], "op 0: 'op' must be one of", 0),
        ([{"op": "remove"}], "op 0: 'path' is required for 'remove'", 0),
        ([{"op": "remove", "path": 3}], "op 0: 'path' must be a JSON pointer string, not a number", 0),
        ([{"op": "remove", "path": "a"}], "op 0: 'path' is not a valid JSON pointer", 0),
        ([{"op": "remove", "path": "/a~2"}], "op 0: 'path' is not a valid JSON pointer", 0),
        ([{}, {}, {}], "op 0: 'op' is required", 0),
        (
            [{"op": "test", "path": "/x", "value": 1}] * 3 + [{"op": "add", "path": "/a"}],
            "op 3: 'value' is required for 'add'",
            3,
        ),
        ([{"op": "replace", "path": "/a"}], "op 0: 'value' is required for 'replace'", 0),
        ([{"op": "test", "path": "/a"}], "op 0: 'value' is required for 'test'", 0),
        ([{"op": "move", "path": "/a"}], "op 0: 'from' is required for 'move'", 0),
        ([{"op": "copy", "path": "/a", "from": None}], "op 0: 'from' must be a JSON pointer string", 0),
        ([{"op": "copy", "path": "/a", "from": "b"}], "op 0: 'from' is not a valid JSON pointer", 0),
    ],
)
def test_validate_ops_errors_name_the_op_index(ops: object, message: str, index: int | None) -> None:
    with pytest.raises(PatchError) as caught:
        validate_ops(ops)
    assert caught.value.message.startswith(message)
    assert str(caught.value) == caught.value.message
    assert caught.value.index == index


def test_apply_patch_rejects_malformed_patches_before_touching_the_document() -> None:
    with pytest.raises(PatchError, match=r"^op 1: 'value' is required for 'add'$"):
        apply_patch({}, [{"op": "add", "path": "/a", "value": 1}, {"op": "add", "path": "/b"}])


# ----------------------------------------------------------------------------------------------------
# RFC 6902 appendix A


@pytest.mark.parametrize(
    ("doc", "ops", "expected"),
    [
        pytest.param(
            {"foo": "bar"},
            [{"op": "add", "path": "/baz", "value": "qux"}],
            {"baz": "qux", "foo": "bar"},
            id="A.1-add-object-member",
        ),
        pytest.param(
            {"foo": ["bar", "baz"]},
            [{"op": "add", "path": "/foo/1", "value": "qux"}],
            {"foo": ["bar", "qux", "baz"]},
            id="A.2-add-array-element",
        ),
        pytest.param(
            {"baz": "qux", "foo": "bar"},
            [{"op": "remove", "path": "/baz"}],
            {"foo": "bar"},
            id="A.3-remove-object-member",
        ),
        pytest.param(
            {"foo": ["bar", "qux", "baz"]},
            [{"op": "remove", "path": "/foo/1"}],
            {"foo": ["bar", "baz"]},
            id="A.4-remove-array-element",
        ),
        pytest.param(
            {"baz": "qux", "foo": "bar"},
            [{"op": "replace", "path": "/baz", "value": "boo"}],
            {"baz": "boo", "foo": "bar"},
            id="A.5-replace-value",
        ),
        pytest.param(
            {"foo": {"bar": "baz", "waldo": "fred"}, "qux": {"corge": "grault"}},
            [{"op": "move", "from": "/foo/waldo", "path": "/qux/thud"}],
            {"foo": {"bar": "baz"}, "qux": {"corge": "grault", "thud": "fred"}},
            id="A.6-move-value",
        ),
        pytest.param(
            {"foo": ["all", "grass", "cows", "eat"]},
            [{"op": "move", "from": "/foo/1", "path": "/foo/3"}],
            {"foo": ["all", "cows", "eat", "grass"]},
            id="A.7-move-array-element",
        ),
        pytest.param(
            {"baz": "qux", "foo": ["a", 2, "c"]},
            [{"op": "test", "path": "/baz", "value": "qux"}, {"op": "test", "path": "/foo/1", "value": 2}],
            {"baz": "qux", "foo": ["a", 2, "c"]},
            id="A.8-test-success",
        ),
        pytest.param(
            {"foo": "bar"},
            [{"op": "add", "path": "/child", "value": {"grandchild": {}}}],
            {"foo": "bar", "child": {"grandchild": {}}},
            id="A.10-add-nested-member-object",
        ),
        pytest.param(
            {"foo": "bar"},
            [{"op": "add", "path": "/baz", "value": "qux", "xyz": 123}],
            {"foo": "bar", "baz": "qux"},
            id="A.11-ignore-unrecognized-elements",
        ),
        pytest.param(
            {"/": 9, "~1": 10},
            [{"op": "test", "path": "/~01", "value": 10}],
            {"/": 9, "~1": 10},
            id="A.14-escape-ordering",
        ),
        pytest.param(
            {"foo": ["bar"]},
            [{"op": "add", "path": "/foo/-", "value": ["abc", "def"]}],
            {"foo": ["bar", ["abc", "def"]]},
            id="A.16-add-array-value",
        ),
    ],
)
def test_rfc6902_appendix_examples_apply(doc: Any, ops: list[dict[str, Any]], expected: Any) -> None:
    expected_doc, expected_depth = reference_apply(doc, ops)
    assert json_equal(expected_doc, expected)
    _check_applied(doc, ops, expected, expected_depth)


@pytest.mark.parametrize(
    ("doc", "patch_text", "message"),
    [
        pytest.param(
            {"baz": "qux"},
            '[{"op": "test", "path": "/baz", "value": "bar"}]',
            "op 0 (test /baz): test failed",
            id="A.9-test-error",
        ),
        pytest.param(
            {"foo": "bar"},
            '[{"op": "add", "path": "/baz/bat", "value": "qux"}]',
            "op 0 (add /baz/bat): path does not exist",
            id="A.12-add-to-nonexistent-target",
        ),
        # Python's JSON parser keeps the last duplicate member, so the op becomes a remove of a missing
        # member, which still fails as the RFC requires.
        pytest.param(
            {"foo": "bar"},
            '[{"op": "add", "path": "/baz", "value": "qux", "op": "remove"}]',
            "op 0 (remove /baz): path does not exist",
            id="A.13-invalid-patch-document",
        ),
        pytest.param(
            {"/": 9, "~1": 10},
            '[{"op": "test", "path": "/~01", "value": "10"}]',
            "op 0 (test /~01): test failed",
            id="A.15-comparing-strings-and-numbers",
        ),
    ],
)
def test_rfc6902_appendix_error_examples_raise(doc: Any, patch_text: str, message: str) -> None:
    before = copy.deepcopy(doc)
    with pytest.raises(PatchError) as caught:
        apply_patch(doc, json.loads(patch_text))
    assert caught.value.message.startswith(message)
    assert caught.value.index == 0
    assert doc == before


# ----------------------------------------------------------------------------------------------------
# Operation semantics


def test_add_with_dash_appends_to_an_array() -> None:
    result = apply_patch({"a": [1, 2]}, [{"op": "add", "path": "/a/-", "value": 3}])
    assert result.doc == {"a": [1, 2, 3]}
    assert result.size_delta == len(",3")


def test_add_at_index_equal_to_length_appends_but_past_it_fails() -> None:
    assert apply_patch([1, 2], [{"op": "add", "path": "/2", "value": 3}]).doc == [1, 2, 3]
    with pytest.raises(PatchError, match=r"^op 0 \(add /3\): path does not exist \(index 3 is out of range"):
        apply_patch([1, 2], [{"op": "add", "path": "/3", "value": 3}])


@pytest.mark.parametrize("index", ["01", "00", "-1", "1.0", "+1", "", " 1", "1e0", "\u0661"])
def test_array_indices_must_be_decimal_without_leading_zeros(index: str) -> None:
    doc = {"a": [0, 1, 2]}
    for op in (
        {"op": "replace", "path": f"/a/{index}", "value": 9},
        {"op": "add", "path": f"/a/{index}", "value": 9},
    ):
        with pytest.raises(PatchError, match="is not a valid array index"):
            apply_patch(doc, [op])
    with pytest.raises(PatchError, match="is not a valid array index"):
        apply_patch(doc, [{"op": "add", "path": f"/a/{index}/x", "value": 9}])


@pytest.mark.parametrize("name", ["remove", "replace", "test"])
def test_dash_never_names_an_existing_element(name: str) -> None:
    with pytest.raises(PatchError, match=rf"^op 0 \({name} /a/-\): path does not exist"):
        apply_patch({"a": [1]}, [{"op": name, "path": "/a/-", "value": 1}])


@pytest.mark.parametrize(
    "op",
    [
        {"op": "replace", "path": "/missing", "value": 1},
        {"op": "remove", "path": "/missing"},
        {"op": "replace", "path": "/list/2", "value": 1},
        {"op": "remove", "path": "/list/2"},
        {"op": "remove", "path": "/scalar/x"},
        {"op": "add", "path": "/scalar/x", "value": 1},
        {"op": "add", "path": "/missing/x", "value": 1},
        {"op": "test", "path": "/missing", "value": None},
        {"op": "test", "path": "/list/0/x", "value": None},
    ],
)
def test_targets_that_must_exist_are_checked(op: dict[str, Any]) -> None:
    with pytest.raises(PatchError, match="path does not exist"):
        apply_patch({"list": [1, 2], "scalar": 3}, [op])


def test_add_to_an_existing_member_replaces_it() -> None:
    result = apply_patch({"a": 1, "b": 2}, [{"op": "add", "path": "/a", "value": [10]}])
    assert result.doc == {"a": [10], "b": 2}
    assert result.size_delta == 3
    assert result.depth == 2


def test_empty_path_replaces_the_whole_document_for_add_and_replace() -> None:
    for name in ("add", "replace"):
        result = apply_patch({"a": 1}, [{"op": name, "path": "", "value": [1, 2]}])
        assert result.doc == [1, 2]
        assert result.size_delta == len("[1,2]") - len('{"a":1}')
        assert result.depth == 1
    assert apply_patch(1, [{"op": "replace", "path": "", "value": "x"}]).doc == "x"


def test_the_whole_document_cannot_be_removed() -> None:
    with pytest.raises(PatchError, match=r'^op 0 \(remove ""\): the whole document cannot be removed'):
        apply_patch({"a": 1}, [{"op": "remove", "path": ""}])


def test_move_into_its_own_child_is_rejected() -> None:
    doc: dict[str, Any] = {"a": {"b": {}}}
    with pytest.raises(PatchError, match=r"^op 0 \(move from /a to /a/b/c\): a value cannot be moved into"):
        apply_patch(doc, [{"op": "move", "from": "/a", "path": "/a/b/c"}])
    with pytest.raises(PatchError, match="cannot be moved into one of its own children"):
        apply_patch(doc, [{"op": "move", "from": "", "path": "/x"}])


def test_move_to_its_own_location_is_a_no_op_but_the_source_must_exist() -> None:
    doc = {"a": {"b": 1}}
    result = apply_patch(doc, [{"op": "move", "from": "/a", "path": "/a"}])
    assert result == Applied(doc, 0, 0)
    with pytest.raises(PatchError, match=r"^op 0 \(move from /x to /x\): 'from' location does not exist$"):
        apply_patch(doc, [{"op": "move", "from": "/x", "path": "/x"}])


def test_move_to_a_sibling_key_and_to_the_root() -> None:
    doc = {"a": {"b": [1, 2]}, "c": 3}
    assert apply_patch(doc, [{"op": "move", "from": "/a/b", "path": "/b"}]).doc == {
        "a": {},
        "b": [1, 2],
        "c": 3,
    }
    assert apply_patch(doc, [{"op": "move", "from": "/a/b", "path": ""}]).doc == [1, 2]


def test_test_op_uses_json_equality() -> None:
    doc = {"flag": True, "n": 1, "f": 2.0, "obj": {"x": 1, "y": [1, True]}}
    ok: list[Op] = [
        {"op": "test", "path": "/n", "value": 1.0},
        {"op": "test", "path": "/f", "value": 2},
        {"op": "test", "path": "/obj", "value": {"y": [1.0, True], "x": 1}},
    ]
    assert apply_patch(doc, ok).doc is doc
    for path, value in [("/flag", 1), ("/n", True), ("/obj/y", [True, 1]), ("/obj", {"x": 1}), ("/n", "1")]:
        with pytest.raises(PatchError, match="test failed"):
            apply_patch(doc, [{"op": "test", "path": path, "value": value}])


def test_copy_inserts_an_independent_deep_copy() -> None:
    doc = {"src": {"inner": [1, {"x": 1}]}}
    ops: list[Op] = [
        {"op": "copy", "from": "/src", "path": "/dst"},
        {"op": "add", "path": "/dst/inner/1/y", "value": 2},
        {"op": "add", "path": "/dst/inner/-", "value": 3},
    ]
    result = _check_applied(doc, ops, {"src": {"inner": [1, {"x": 1}]}, "dst": {"inner": [1, {"x": 1, "y": 2}, 3]}}, 4)
    assert result.doc["src"] is doc["src"]


def test_copy_of_a_value_edited_earlier_in_the_same_patch_does_not_alias_it() -> None:
    doc = {"a": {"list": [1]}}
    ops: list[Op] = [
        {"op": "add", "path": "/a/list/-", "value": 2},
        {"op": "copy", "from": "/a", "path": "/b"},
        {"op": "add", "path": "/a/list/-", "value": 3},
        {"op": "add", "path": "/b/list/0", "value": 0},
    ]
    result = apply_patch(doc, ops)
    assert result.doc == {"a": {"list": [1, 2, 3]}, "b": {"list": [0, 1, 2]}}
    assert doc == {"a": {"list": [1]}}


def containers_in(value: Any) -> int:
    """How many distinct dicts and lists `value` is made of (a part it holds twice counts once)."""
    seen: set[int] = set()
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, (dict, list)) and id(node) not in seen:
            seen.add(id(node))
            stack.extend(node.values() if isinstance(node, dict) else node)
    return len(seen)


def test_a_value_copied_into_itself_again_and_again_is_built_once_per_op() -> None:
    """Each op doubles the list: 16 of them read as 65,536 lists, but make one new list each."""
    doc = {"d": [0]}
    result = apply_patch(doc, [{"op": "copy", "from": "/d", "path": "/d/-"}] * 16)
    assert containers_in(result.doc) <= 2 + 16
    assert json_depth(result.doc) == result.depth == 18
    assert canonical_size(result.doc) == canonical_size(doc) + result.size_delta
    assert doc == {"d": [0]}


def test_an_edit_inside_one_copy_leaves_every_other_copy_as_it_was() -> None:
    doc = {"d": [{"n": 0}]}
    ops: list[Op] = [{"op": "copy", "from": "/d", "path": "/d/-"}] * 3
    ops += [{"op": "replace", "path": "/d/3/2/0/n", "value": 1}, {"op": "copy", "from": "/d/3", "path": "/e"},
            {"op": "add", "path": "/e/1/-", "value": 2}, {"op": "move", "from": "/d/2", "path": "/f"},
            {"op": "remove", "path": "/f/1/0/n"}]  # fmt: skip
    expected, depth = reference_apply(doc, ops)
    _check_applied(doc, ops, expected, depth)


def test_values_from_ops_are_inserted_as_is_and_never_mutated() -> None:
    value = {"x": [1]}
    ops: list[Op] = [
        {"op": "add", "path": "/a", "value": value},
        {"op": "add", "path": "/a/x/-", "value": 2},
        {"op": "add", "path": "/b", "value": value},
    ]
    result = apply_patch({}, ops)
    assert result.doc == {"a": {"x": [1, 2]}, "b": {"x": [1]}}
    assert value == {"x": [1]}
    assert result.doc["b"] is value
    single = apply_patch({}, ops[:1])
    assert single.doc["a"] is value


def test_non_json_values_are_rejected_as_patch_errors() -> None:
    with pytest.raises(PatchError, match=r"^op 0 \(add /a\): the value is not valid JSON"):
        apply_patch({}, [{"op": "add", "path": "/a", "value": math.nan}])
    with pytest.raises(PatchError, match="not valid JSON"):
        apply_patch({}, [{"op": "add", "path": "/a", "value": {1, 2}}])


# ----------------------------------------------------------------------------------------------------
# Non-mutation, structural sharing, atomicity, error messages


def _agent_state(messages: int = 20) -> dict[str, Any]:
    return {
        "messages": [{"role": "user", "content": f"message {i}", "meta": {"n": i}} for i in range(messages)],
        "facts": {"city": "Paris", "tags": ["a", "b"]},
        "config": {"model": {"name": "m", "params": {"t": 0.5}}},
        "step": 1,
    }


def test_apply_patch_never_mutates_the_input_document() -> None:
    doc = _agent_state()
    before = copy.deepcopy(doc)
    ops: list[Op] = [
        {"op": "add", "path": "/messages/-", "value": {"role": "assistant", "content": "hi"}},
        {"op": "replace", "path": "/messages/0/content", "value": "edited"},
        {"op": "remove", "path": "/messages/1/meta/n"},
        {"op": "move", "from": "/facts/tags", "path": "/config/tags"},
        {"op": "copy", "from": "/config/model", "path": "/facts/model"},
        {"op": "add", "path": "/facts/model/params/k", "value": 1},
        {"op": "replace", "path": "/step", "value": 2},
        {"op": "remove", "path": "/messages/5"},
    ]
    result = apply_patch(doc, ops)
    assert doc == before
    assert json_equal(result.doc, reference_apply(before, ops)[0])


def test_untouched_subtrees_are_shared_with_the_input() -> None:
    doc = _agent_state()
    result = apply_patch(doc, [{"op": "replace", "path": "/facts/city", "value": "Berlin"}])
    new = result.doc
    assert new is not doc and new["facts"] is not doc["facts"]
    assert new["messages"] is doc["messages"]
    assert new["config"] is doc["config"]
    assert new["facts"]["tags"] is doc["facts"]["tags"]

    appended = apply_patch(doc, [{"op": "add", "path": "/messages/-", "value": {"role": "user"}}]).doc
    assert appended["messages"] is not doc["messages"]
    assert all(x is y for x, y in zip(appended["messages"], doc["messages"], strict=False))
    assert appended["facts"] is doc["facts"]


class CountingList(list[Any]):
    copies = 0

    def copy(self) -> CountingList:
        CountingList.copies += 1
        return CountingList(self)


def test_a_container_is_copied_at_most_once_per_patch() -> None:
    CountingList.copies = 0
    doc = {"messages": CountingList([1, 2, 3])}
    ops = [{"op": "add", "path": "/messages/-", "value": n} for n in range(5)]
    ops += [{"op": "remove", "path": "/messages/0"}, {"op": "replace", "path": "/messages/0", "value": 0}]
    result = apply_patch(doc, ops)
    assert result.doc == {"messages": [0, 3, 0, 1, 2, 3, 4]}
    assert CountingList.copies == 1
    assert doc["messages"] == [1, 2, 3]


def test_a_failing_op_leaves_the_input_untouched_and_returns_nothing_partial() -> None:
    doc = _agent_state(3)
    before = copy.deepcopy(doc)
    ops: list[Op] = [
        {"op": "add", "path": "/messages/-", "value": {"role": "user"}},
        {"op": "remove", "path": "/facts/city"},
        {"op": "replace", "path": "/facts/city", "value": "Berlin"},
    ]
    with pytest.raises(PatchError) as caught:
        apply_patch(doc, ops)
    assert doc == before
    assert str(caught.value) == "op 2 (replace /facts/city): path does not exist"
    assert caught.value.index == 2
    assert caught.value.path == "/facts/city"


@pytest.mark.parametrize(
    ("op", "message"),
    [
        ({"op": "remove", "path": "/a/9"}, "op 1 (remove /a/9): path does not exist"),
        ({"op": "add", "path": "/a/x", "value": 1}, "op 1 (add /a/x): 'x' is not a valid array index"),
        ({"op": "test", "path": "/b", "value": 2}, "op 1 (test /b): test failed"),
        (
            {"op": "copy", "from": "/nope", "path": "/c"},
            "op 1 (copy from /nope to /c): 'from' location does not exist",
        ),
        (
            {"op": "move", "from": "/a/5", "path": "/c"},
            "op 1 (move from /a/5 to /c): 'from' location does not exist",
        ),
        ({"op": "move", "from": "/b", "path": "/a/7"}, "op 1 (move from /b to /a/7): path does not exist"),
    ],
)
def test_error_messages_name_the_op_index_and_path(op: dict[str, Any], message: str) -> None:
    ops = [{"op": "test", "path": "/b", "value": 1}, op]
    with pytest.raises(PatchError) as caught:
        apply_patch({"a": [1, 2], "b": 1}, ops)
    assert caught.value.message.startswith(message)
    assert caught.value.index == 1
    assert caught.value.path == op["path"]


# ----------------------------------------------------------------------------------------------------
# JSON helpers


def test_json_equal_follows_json_rather_than_python_equality() -> None:
    assert not json_equal(True, 1)
    assert not json_equal(0, False)
    assert not json_equal([1, True], [1, 1])
    assert not json_equal({"a": True}, {"a": 1.0})
    assert json_equal(1, 1.0)
    assert json_equal({"a": 1, "b": [1, {"c": None}]}, {"b": [1.0, {"c": None}], "a": 1})
    assert not json_equal([1, 2], [2, 1])
    assert not json_equal({"a": None}, {"b": None})
    assert not json_equal({"a": None}, {})
    assert not json_equal([], {})
    assert not json_equal("1", 1)
    assert not json_equal(None, 0)
    assert not json_equal([["x"]], [("x",)])


def test_canonical_json_is_sorted_compact_and_unescaped() -> None:
    value = {"b": [1, 2.5, None, True], "a": "é\n", "ü": {}}
    assert canonical_json(value) == '{"a":"é\\n","b":[1,2.5,null,true],"ü":{}}'.encode()
    assert canonical_size(value) == len(canonical_json(value))
    assert canonical_size("é") == 4
    with pytest.raises(ValueError):
        canonical_json(math.inf)


def _reference(value: Any) -> bytes:
    """What canonical JSON has always been: the standard library's bytes."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return text.encode("utf-8")


any_text = st.text(st.characters(codec="utf-8"), max_size=8)
wide_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | any_text,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(any_text, children, max_size=4),
    max_leaves=16,
)


@PROPERTY
@given(wide_values)
def test_canonical_json_writes_the_standard_librarys_bytes(value: Any) -> None:
    """orjson writes the plain values, the standard library the rest: the bytes never change."""
    assert canonical_json(value) == _reference(value)


class Colour(enum.IntEnum):
    RED = 1


class Label(str):
    pass


@pytest.mark.parametrize(
    "value",
    [
        {"big": 2**70, "neg": -(2**64)},  # beyond 64 bits: orjson refuses, json writes them
        {"f": [1e16, 1.5e-7, -0.0, 0.1]},  # floats: orjson writes 1e16 where json writes 1e+16
        ("a", 1, None),  # a tuple
        {"c": Colour.RED, "l": Label("x")},  # subclasses of int and str
        {"ctl": "\x00\x1f\x7f\u2028\U0001f600"},
    ],
)
def test_values_orjson_would_write_differently_still_get_the_standard_librarys_bytes(value: Any) -> None:
    assert canonical_json(value) == _reference(value)


def test_plain_values_are_written_without_the_standard_librarys_encoder(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fast path is the path: a state of dicts, lists, strings, integers and booleans."""

    class Refusing(json.JSONEncoder):
        def encode(self, o: Any) -> str:
            raise AssertionError("the standard library's encoder ran")

    monkeypatch.setattr(jsonpatch, "_ENCODER", Refusing())
    state = {"messages": [{"role": "assistant", "content": "Lisbon, ünd 東京\n"}], "step": 7, "ok": True, "x": None}
    assert canonical_json(state) == _reference(state)
    assert canonical_size(state) == len(_reference(state))
    with pytest.raises(AssertionError, match="standard library"):
        canonical_json({"price": 1.5})


def test_values_json_cannot_represent_fail_as_before() -> None:
    cycle: list[Any] = []
    cycle.append(cycle)
    with pytest.raises(ValueError, match="Circular reference"):
        canonical_json(cycle)
    with pytest.raises(UnicodeEncodeError):
        canonical_json({"s": "\ud800"})
    with pytest.raises(TypeError):
        canonical_json({"id": uuid.UUID(int=1)})  # orjson would write a UUID; JSON has none
    with pytest.raises(ValueError):
        canonical_json([math.nan])  # orjson would write null


@pytest.mark.parametrize(
    ("value", "depth"),
    [(None, 0), ("x", 0), ([], 1), ({}, 1), ([1, [2]], 2), ({"a": {"b": []}}, 3), ([{}, [[[]]], 1], 4)],
)
def test_json_depth_counts_container_nesting(value: Any, depth: int) -> None:
    assert json_depth(value) == depth


def test_json_depth_handles_nesting_beyond_the_recursion_limit() -> None:
    value: Any = []
    for _ in range(5000):
        value = [value]
    assert json_depth(value) == 5001


# ----------------------------------------------------------------------------------------------------
# make_patch


def test_make_patch_of_equal_documents_is_empty() -> None:
    doc = _agent_state()
    assert make_patch(doc, doc) == []
    assert make_patch(doc, copy.deepcopy(doc)) == []
    assert make_patch(1, 1.0) == []


def test_make_patch_for_an_agent_step_appends_and_edits_in_place() -> None:
    base = _agent_state(1000)
    new_message = {"role": "assistant", "content": "done"}
    target = {
        **base,
        "messages": [*base["messages"], new_message],
        "facts": {"city": "Berlin", "tags": ["a", "b"]},
    }
    ops = make_patch(base, target)
    assert ops == [
        {"op": "add", "path": "/messages/-", "value": new_message},
        {"op": "replace", "path": "/facts/city", "value": "Berlin"},
    ]
    assert ops[0]["value"] is new_message
    assert apply_patch(base, ops).doc == target


def test_make_patch_distinguishes_true_from_one() -> None:
    assert make_patch({"a": 1}, {"a": True}) == [{"op": "replace", "path": "/a", "value": True}]
    assert make_patch([0, 1], [False, 1]) == [{"op": "replace", "path": "/0", "value": False}]
    assert make_patch(1, True) == [{"op": "replace", "path": "", "value": True}]


def test_make_patch_escapes_member_names() -> None:
    ops = make_patch({"a/b": 1, "~": {"x": 1}, "keep": 0}, {"a/b": 2, "~": {"x": 1, "y/~": 3}, "keep": 0})
    assert ops == [
        {"op": "replace", "path": "/a~1b", "value": 2},
        {"op": "add", "path": "/~0/y~1~0", "value": 3},
    ]


def test_make_patch_prefixes_ops_with_the_given_path() -> None:
    ops = make_patch({"x": [1]}, {"x": [1, 2]}, path="/state/a~1b")
    assert ops == [{"op": "add", "path": "/state/a~1b/x/-", "value": 2}]
    with pytest.raises(PatchError):
        make_patch({}, {"a": 1}, path="state")


def test_make_patch_uses_common_prefix_and_suffix_for_lists() -> None:
    assert make_patch([1, 2, 3], [1, 9, 2, 3]) == [{"op": "add", "path": "/1", "value": 9}]
    assert make_patch([1, 2, 3, 4, 5], [1, 5]) == [
        {"op": "remove", "path": "/3"},
        {"op": "remove", "path": "/2"},
        {"op": "remove", "path": "/1"},
    ]
    assert make_patch(["a", "b"], ["a", "b", "c", "d"]) == [
        {"op": "add", "path": "/-", "value": "c"},
        {"op": "add", "path": "/-", "value": "d"},
    ]
    edited = [{"id": i, "text": "t" * 50} for i in range(10)]
    changed = [*edited[:4], {"id": 4, "text": "new"}, *edited[5:]]
    assert make_patch(edited, changed) == [{"op": "replace", "path": "/4/text", "value": "new"}]


def test_make_patch_replaces_a_whole_list_when_that_is_smaller() -> None:
    assert make_patch([1, 2, 3, 4], [5, 6, 7, 8]) == [{"op": "replace", "path": "", "value": [5, 6, 7, 8]}]
    assert make_patch({"a": {"x": 1}}, {"a": {"y": 2}}) == [{"op": "replace", "path": "/a", "value": {"y": 2}}]


def test_an_append_to_a_long_conversation_is_one_op_and_shares_every_old_message() -> None:
    # Timings live in bench/; here the O(change) shape: one op out, old messages shared, not copied.
    content = string.ascii_letters * 19
    base: dict[str, Any] = {
        "messages": [{"role": "user", "content": f"{i}{content}"} for i in range(1000)],
        "facts": {"city": "Paris", "name": "Ann"},
    }
    target: dict[str, Any] = {**base, "messages": [*base["messages"], {"role": "assistant", "content": content}]}

    ops = make_patch(base, target)

    assert ops == [{"op": "add", "path": "/messages/-", "value": target["messages"][-1]}]
    applied = apply_patch(base, ops)
    assert all(new is old for new, old in zip(applied.doc["messages"], base["messages"], strict=False))
    assert applied.doc["facts"] is base["facts"]


# ----------------------------------------------------------------------------------------------------
# Properties


@PROPERTY
@given(json_values, json_values)
def test_applying_make_patch_reaches_the_target(base: Any, target: Any) -> None:
    ops = make_patch(base, target)
    expected, expected_depth = reference_apply(base, ops)
    assert json_equal(expected, target)
    _check_applied(base, ops, target, expected_depth)


@PROPERTY
@given(close_values, close_values)
def test_make_patch_round_trips_between_similar_documents(base: Any, target: Any) -> None:
    ops = make_patch(base, target)
    assert (ops == []) == json_equal(base, target)
    expected, expected_depth = reference_apply(base, ops)
    assert json_equal(expected, target)
    _check_applied(base, ops, target, expected_depth)
    nested = make_patch({"k": base}, {"k": target})
    assert json_equal(apply_patch({"k": base}, nested).doc, {"k": target})


@PROPERTY
@given(json_values, st.data())
def test_hand_built_patches_match_a_reference_with_exact_size_and_depth(doc: Any, data: st.DataObject) -> None:
    ops: list[dict[str, Any]] = []
    state = doc
    for _ in range(data.draw(st.integers(1, 6))):
        op = _draw_op(data, state)
        try:
            state, _ = reference_apply(state, [op])
        except RefError:
            # The reference rejects it, so the whole patch must fail atomically too.
            before = copy.deepcopy(doc)
            with pytest.raises(PatchError) as caught:
                apply_patch(doc, [*ops, op])
            assert caught.value.index == len(ops)
            assert json_equal(doc, before)
            break
        ops.append(op)
    else:
        expected, expected_depth = reference_apply(doc, ops)
        _check_applied(doc, ops, expected, expected_depth)
        # The patch between the start and end states round-trips too.
        diff = make_patch(doc, expected)
        _check_applied(doc, diff, expected, reference_apply(doc, diff)[1])


@QUICK_PROPERTY
@given(json_values, st.data())
def test_single_insert_depth_is_path_length_plus_value_depth(doc: Any, data: st.DataObject) -> None:
    slot = _draw_slot(data, doc)
    value = data.draw(json_values)
    op = {"op": "add", "path": format_pointer(slot or ()), "value": value}
    result = apply_patch(doc, [op])
    assert result.depth == len(slot or ()) + json_depth(value)
    assert json_depth(result.doc) >= result.depth
    assert canonical_size(result.doc) == canonical_size(doc) + result.size_delta


@QUICK_PROPERTY
@given(json_values)
def test_patches_that_only_remove_report_zero_depth(doc: Any) -> None:
    inner = [tokens for tokens, _ in _locations(doc) if tokens]
    if not inner:
        return
    result = apply_patch(doc, [{"op": "remove", "path": format_pointer(inner[-1])}])
    assert result.depth == 0
    assert canonical_size(result.doc) == canonical_size(doc) + result.size_delta


def test_a_patch_that_doubles_its_document_stops_at_the_limit() -> None:
    """Each op copies the list into itself: 22 ops of a few bytes would make four million items."""
    doubling = [{"op": "copy", "from": "/d", "path": "/d/-"}] * 22

    with pytest.raises(PatchTooLarge, match=r"^op 1[0-9] \(copy\): the document would grow by more than 10000 bytes"):
        apply_patch({"d": [0]}, doubling, limit=10_000)


def test_a_patch_within_its_limit_applies_as_without_one() -> None:
    ops = [{"op": "copy", "from": "/d", "path": "/d/-"}] * 3
    assert apply_patch({"d": [0]}, ops, limit=10_000) == apply_patch({"d": [0]}, ops)


def test_a_patch_that_copies_and_removes_in_turn_stops_when_its_work_passes_the_budget() -> None:
    """Copying a large value and removing the copy again grows nothing, but each op measures it."""
    doc = {"big": "x" * 1000}
    churn = [{"op": "copy", "from": "/big", "path": "/x"}, {"op": "remove", "path": "/x"}] * 100

    with pytest.raises(PatchTooLarge, match="the patch takes too much work to apply"):
        apply_patch(doc, churn, limit=10_000)
    assert apply_patch(doc, churn).size_delta == 0  # without a limit it is a patch like any other
