"""Property tests of GET /api/v1/checkpoints/{id}/diff/: through the API, against the database, the patch
it returns turns the base's state into the target's, as applied by Quicksave's own RFC 6902 code and by
the independent third-party `jsonpatch` package."""

from __future__ import annotations

import json
import math
from itertools import pairwise
from typing import Any
from uuid import UUID

import jsonpatch as rfc6902
import pytest
from django.test import override_settings
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rest_framework.test import APIClient

from checkpoints import storage
from checkpoints.models import Thread
from checkpoints.storage.jsonpatch import apply_patch, json_equal, make_patch

# --------------------------------------------------------------------------- strategies

# The API refuses NUL and lone UTF-16 surrogates (`unsupported_text`: PostgreSQL text and jsonb cannot hold
# either, and a surrogate is not a character of UTF-8); every other character must round-trip.
text = st.characters(exclude_characters="\x00", exclude_categories=["Cs"])
# Leaves that collide across states (True vs 1 vs 1.0, "" vs None) so that diffs must tell them apart.
close_scalars = st.sampled_from([None, True, False, 0, 1, 1.0, -0.0, "", "a", "é", "🙂"])
scalars = (
    close_scalars
    | st.integers(min_value=-(2**53), max_value=2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(text, max_size=8)
    | st.text(alphabet='aé日本🙂\u0001\t"\\/~', max_size=6)
)
# Member names that need RFC 6901 escaping ("~", "/"), look like array indices or "-", or are empty.
keys = (
    st.text(alphabet="ab~/-0é🙂", max_size=3)
    | st.sampled_from(["", "-", "0", "1", "~1", "a/b"])
    | st.text(text, max_size=5)
)
json_values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(keys, children, max_size=4),
    max_leaves=10,
)
# A few member names and leaves, so that two unrelated states still meet at the same paths with twin values.
close_keys = st.sampled_from(["a", "b", "~", "/"])
close_values = st.recursive(
    close_scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(close_keys, children, max_size=3),
    max_leaves=10,
)
values = json_values | close_values
# A message log that successors mostly keep: against it a small edit is cheap enough to be stored as a delta.
LOG = [f"message {i}: " + "lorem ipsum " * 8 for i in range(6)]
_plain_states = st.dictionaries(keys, json_values, max_size=5) | st.dictionaries(close_keys, close_values, max_size=4)
states = _plain_states | _plain_states.map(lambda state: {**state, "log": list(LOG)})

# No example database (it would write .hypothesis/ into a shared tree); a failure prints its example anyway.
PROPERTY = settings(
    max_examples=40,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _twins(value: Any) -> list[Any]:
    """Values a sloppy equality would mistake for `value` (in Python True == 1 == 1.0 and 0 == False)."""
    if value is True or value is False:
        return [int(value), float(value)]
    if isinstance(value, (int, float)) and value in (0, 1):
        return [bool(value), None, ""]
    if value is None or value == "":
        return [False, 0, "", None, [], {}]
    return []


def _twin_leaves(value: Any, path: tuple[str | int, ...] = ()) -> list[tuple[str | int, ...]]:
    """Paths to the leaves of `value` that have twins."""
    if isinstance(value, dict):
        return [leaf for key, item in value.items() for leaf in _twin_leaves(item, (*path, key))]
    if isinstance(value, list):
        return [leaf for at, item in enumerate(value) for leaf in _twin_leaves(item, (*path, at))]
    return [path] if _twins(value) else []


def _replaced(value: Any, path: tuple[str | int, ...], new: Any) -> Any:
    if not path:
        return new
    copy = json.loads(json.dumps(value))
    node = copy
    for step in path[:-1]:
        node = node[step]
    node[path[-1]] = new
    return copy


def _edit(draw: st.DrawFn, value: Any, depth: int, *, keep_kind: bool = False) -> Any:
    """`value` after a few random edits somewhere inside it; the result shares most of its structure."""
    if not isinstance(value, (dict, list)) or (not keep_kind and (depth > 3 or draw(st.integers(0, 4)) == 0)):
        return draw(values)
    if isinstance(value, dict):
        edited = dict(value)
        for _ in range(draw(st.integers(1, 3))):
            action = draw(st.sampled_from(["set", "edit", "edit", "delete"]))
            if action == "set" or not edited:
                edited[draw(keys)] = draw(values)
                continue
            key = draw(st.sampled_from(sorted(edited)))
            if action == "delete":
                del edited[key]
            else:
                edited[key] = _edit(draw, edited[key], depth + 1)
        return edited
    items = list(value)
    for _ in range(draw(st.integers(1, 3))):
        action = draw(st.sampled_from(["insert", "append", "edit", "edit", "delete"]))
        if action == "append" or not items:
            items.append(draw(values))
        elif action == "insert":
            items.insert(draw(st.integers(0, len(items))), draw(values))
        else:
            at = draw(st.integers(0, len(items) - 1))
            if action == "delete":
                del items[at]
            else:
                items[at] = _edit(draw, items[at], depth + 1)
    return items


@st.composite
def successor(draw: st.DrawFn, state: dict[str, Any]) -> dict[str, Any]:
    """The next state: unrelated, equal, one leaf swapped for its twin, or a few edits away (which the
    store keeps as a delta)."""
    how = draw(st.sampled_from(["fresh", "same", "twin", "twin", "edit", "edit"]))
    if how == "fresh":
        return draw(states)
    if how == "same":
        return json.loads(json.dumps(state))
    leaves = _twin_leaves(state)
    if how == "twin" and leaves:
        path = draw(st.sampled_from(leaves))
        leaf: Any = state
        for step in path:
            leaf = leaf[step]
        twin: dict[str, Any] = _replaced(state, path, draw(st.sampled_from(_twins(leaf))))
        return twin
    edited = _edit(draw, state, 0, keep_kind=True)
    assert isinstance(edited, dict)
    return edited


@st.composite
def chains(draw: st.DrawFn, *, min_size: int, max_size: int) -> list[dict[str, Any]]:
    chain = [draw(states)]
    for _ in range(draw(st.integers(min_size - 1, max_size - 1))):
        chain.append(draw(successor(chain[-1])))
    return chain


# Snapshot after every checkpoint, every other one, or only when the replay cost rule says so.
snapshot_every = st.sampled_from([1, 2, 1000])


# --------------------------------------------------------------------------- helpers


def same_json(a: Any, b: Any) -> bool:
    """JSON value equality written independently of checkpoints.storage.jsonpatch: booleans are not numbers,
    numbers compare by value (1 == 1.0), objects ignore member order, arrays do not."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b and not (isinstance(a, float) and math.isnan(a))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_json(a[key], b[key]) for key in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_json(x, y) for x, y in zip(a, b, strict=True))
    if a is None or b is None:
        return a is b
    return type(a) is type(b) and isinstance(a, str) and a == b


def _json(response: Any, status: int) -> Any:
    assert response.status_code == status, response.content
    return response.json()


def new_thread(client: APIClient) -> str:
    # No external_id: every example gets a thread of its own inside the test's one transaction.
    thread_id: str = _json(client.post("/api/v1/threads/", data="{}", content_type="application/json"), 201)["id"]
    return thread_id


def write(client: APIClient, thread_id: str, *, parent: str | None, **body: Any) -> str:
    response = client.post(
        f"/api/v1/threads/{thread_id}/checkpoints/",
        data=json.dumps({"parent": parent, **body}),
        content_type="application/json",
    )
    checkpoint_id: str = _json(response, 201)["id"]
    return checkpoint_id


def read_state(client: APIClient, checkpoint_id: str) -> dict[str, Any]:
    state: dict[str, Any] = _json(client.get(f"/api/v1/checkpoints/{checkpoint_id}/"), 200)["state"]
    return state


def read_diff(client: APIClient, target: str, base: str | None = None) -> dict[str, Any]:
    query = f"?base={base}" if base is not None else ""
    body: dict[str, Any] = _json(client.get(f"/api/v1/checkpoints/{target}/diff/{query}"), 200)
    return body


def assert_patch_turns(patch: list[dict[str, Any]], base: dict[str, Any], target: dict[str, Any]) -> None:
    """Both RFC 6902 implementations turn `base` into `target` with `patch`, leaving `base` untouched."""
    before = json.dumps(base, sort_keys=True)
    ours = apply_patch(base, patch).doc
    theirs = rfc6902.apply_patch(base, patch)
    assert json.dumps(base, sort_keys=True) == before
    assert same_json(ours, target), (patch, ours, target)
    assert json_equal(ours, target)
    assert same_json(theirs, target), (patch, theirs, target)


# --------------------------------------------------------------------------- properties


@PROPERTY
@given(a=states, data=st.data(), every=snapshot_every, replay=st.booleans())
def test_diff_of_a_child_turns_its_parents_state_into_its_own(
    owner_client: APIClient, a: dict[str, Any], data: st.DataObject, every: int, replay: bool
) -> None:
    b = data.draw(successor(a), label="b")
    with override_settings(QUICKSAVE_SNAPSHOT_EVERY=every):
        thread_id = new_thread(owner_client)
        a_id = write(owner_client, thread_id, parent=None, state=a)
        b_id = write(owner_client, thread_id, parent=a_id, state=b)
    if replay:
        storage.clear_caches()  # materialise from the rows, not from the states cached by the writes

    body = read_diff(owner_client, b_id)

    assert (body["base"], body["target"]) == (a_id, b_id)
    assert_patch_turns(body["patch"], a, b)
    assert_patch_turns(body["patch"], read_state(owner_client, a_id), read_state(owner_client, b_id))
    if same_json(a, b):
        assert body["patch"] == []


@st.composite
def trees(draw: st.DrawFn) -> tuple[list[dict[str, Any]], list[tuple[int, list[dict[str, Any]]]]]:
    """States along main, then one or two branches, each forking at any checkpoint written before it
    (so a second branch may fork off the first) and holding its own chain of states."""
    main = draw(chains(min_size=1, max_size=4))
    written = list(main)
    branches = []
    for _ in range(draw(st.integers(1, 2))):
        fork = draw(st.integers(0, len(written) - 1))
        states_on_branch = []
        previous = written[fork]
        for _ in range(draw(st.integers(1, 3))):
            previous = draw(successor(previous))
            states_on_branch.append(previous)
        branches.append((fork, states_on_branch))
        written.extend(states_on_branch)
    return main, branches


@PROPERTY
@given(tree=trees(), data=st.data(), every=snapshot_every, replay=st.booleans())
def test_diff_between_any_two_checkpoints_of_a_thread_turns_one_state_into_the_other(
    owner_client: APIClient,
    tree: tuple[list[dict[str, Any]], list[tuple[int, list[dict[str, Any]]]]],
    data: st.DataObject,
    every: int,
    replay: bool,
) -> None:
    main, branches = tree
    ids: list[str] = []
    expected: list[dict[str, Any]] = []
    with override_settings(QUICKSAVE_SNAPSHOT_EVERY=every):
        thread_id = new_thread(owner_client)
        for state in main:
            ids.append(write(owner_client, thread_id, parent=ids[-1] if ids else None, state=state))
            expected.append(state)
        thread = Thread.objects.get(pk=thread_id)
        for number, (fork, states_on_branch) in enumerate(branches):
            name = f"alt-{number}" if number else "alt"
            storage.start_branch(thread=thread, at=UUID(ids[fork]), name=name)
            parent = ids[fork]
            for state in states_on_branch:
                parent = write(owner_client, thread_id, parent=parent, branch=name, state=state)
                ids.append(parent)
                expected.append(state)
    if replay:
        storage.clear_caches()

    index = st.integers(0, len(ids) - 1)
    pairs = data.draw(st.lists(st.tuples(index, index), min_size=1, max_size=4), label="(base, target) pairs")
    for x, y in pairs:
        body = read_diff(owner_client, ids[y], base=ids[x])

        assert (body["base"], body["target"]) == (ids[x], ids[y])
        x_state, y_state = read_state(owner_client, ids[x]), read_state(owner_client, ids[y])
        assert same_json(x_state, expected[x]) and same_json(y_state, expected[y])
        assert_patch_turns(body["patch"], x_state, y_state)
        assert_patch_turns(body["patch"], expected[x], expected[y])
        if x == y or same_json(expected[x], expected[y]):
            assert body["patch"] == []


@PROPERTY
@given(chain=chains(min_size=2, max_size=5), every=snapshot_every, replay=st.booleans())
def test_checkpoints_written_by_patch_read_back_as_the_patched_state(
    owner_client: APIClient, chain: list[dict[str, Any]], every: int, replay: bool
) -> None:
    with override_settings(QUICKSAVE_SNAPSHOT_EVERY=every):
        thread_id = new_thread(owner_client)
        ids = [write(owner_client, thread_id, parent=None, state=chain[0])]
        for before, after in pairwise(chain):
            ids.append(write(owner_client, thread_id, parent=ids[-1], patch=make_patch(before, after)))
    if replay:
        storage.clear_caches()

    for position, (checkpoint_id, state) in enumerate(zip(ids, chain, strict=True)):
        assert same_json(read_state(owner_client, checkpoint_id), state), position
        if position:
            assert_patch_turns(read_diff(owner_client, checkpoint_id)["patch"], chain[position - 1], state)


def test_the_independent_implementation_agrees_on_a_known_patch() -> None:
    # The properties lean on `jsonpatch` as an oracle: it must apply ops, unescape pointers and fail tests.
    base = {"a/b": [1, 2], "~": True}
    patch = make_patch(base, {"a/b": [1, 2, 3], "~": 1})
    assert rfc6902.apply_patch(base, patch) == {"a/b": [1, 2, 3], "~": 1}
    assert not same_json(rfc6902.apply_patch(base, patch)["~"], True)
    with pytest.raises(rfc6902.JsonPatchException):
        rfc6902.apply_patch(base, [{"op": "test", "path": "/~0", "value": False}])
