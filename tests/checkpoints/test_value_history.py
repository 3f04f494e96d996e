"""A value's history (storage.value_history and GET /api/v1/threads/{id}/history/): the changes of
one JSON path on every branch, with the value before and after, read from the stored patches."""

from __future__ import annotations

import random
from typing import Any
from unittest import mock

import pytest
from django.db import connection
from django.test import override_settings
from rest_framework.test import APIClient

from checkpoints import storage
from checkpoints.models import ChangedPath, ChangedPathMark, Checkpoint, Thread
from checkpoints.storage import crypto, history
from checkpoints.storage.history import ABSENT
from checkpoints.storage.jsonpatch import apply_patch, json_equal

BATCH = "/config/batch_size"


def append(thread: Thread, parent: Checkpoint | None, *ops: dict[str, Any], branch: str | None = None,
           label: str = "") -> Checkpoint:  # fmt: skip
    return storage.append_checkpoint(thread=thread, parent=parent, patch=list(ops), branch=branch, label=label)


def replace(path: str, value: Any) -> dict[str, Any]:
    return {"op": "replace", "path": path, "value": value}


def add(path: str, value: Any) -> dict[str, Any]:
    return {"op": "add", "path": path, "value": value}


def remove(path: str) -> dict[str, Any]:
    return {"op": "remove", "path": path}


def changes(thread: Thread, path: str) -> list[tuple[str, int, str, Any, Any]]:
    """(branch, seq, kind, old, new) of each change, oldest first."""
    found = storage.value_history(thread, path)
    return [(c.branch, c.seq, c.change, c.old, c.new) for c in reversed(found)]


@pytest.fixture
def run(thread: Thread) -> list[Checkpoint]:
    """main: #1 batch 32 → #2 an unrelated step → #3 batch 64 → #4 batch 64 again → #5 batch 128."""
    first = storage.append_checkpoint(
        thread=thread, parent=None, label="start", state={"config": {"batch_size": 32, "lr": 0.1}, "log": []}
    )
    second = append(thread, first, add("/log/-", "warming up"), label="warm")
    third = append(thread, second, replace(BATCH, 64), add("/log/-", "bigger"), label="tune")
    fourth = append(thread, third, replace(BATCH, 64), label="same")
    fifth = append(thread, fourth, replace(BATCH, 128), label="tune")
    return [first, second, third, fourth, fifth]


# --------------------------------------------------------------------------- what counts as a change


def test_each_change_is_listed_with_the_value_before_and_after(thread: Thread, run: list[Checkpoint]) -> None:
    assert changes(thread, BATCH) == [
        ("main", 1, "added", ABSENT, 32),
        ("main", 3, "changed", 32, 64),
        ("main", 5, "changed", 64, 128),
    ]  # #4 wrote the same value: no change


def test_the_history_is_newest_first(thread: Thread, run: list[Checkpoint]) -> None:
    assert [c.checkpoint_id for c in storage.value_history(thread, BATCH)] == [run[4].pk, run[2].pk, run[0].pk]


def test_changes_on_every_branch_have_the_value_before_them_on_their_own_line(
    thread: Thread, run: list[Checkpoint]
) -> None:
    storage.start_branch(thread=thread, at=run[2], name="retry")
    retry = append(thread, run[2], replace(BATCH, 16), branch="retry")
    append(thread, retry, add("/log/-", "no change here"), branch="retry")
    storage.start_branch(thread=thread, at=retry, name="retry-2")
    append(thread, retry, replace("/config", {"batch_size": 8}), branch="retry-2")

    assert changes(thread, BATCH) == [
        ("main", 1, "added", ABSENT, 32),
        ("main", 3, "changed", 32, 64),
        ("main", 5, "changed", 64, 128),
        ("retry", 1, "changed", 64, 16),  # from the fork point's 64, not main's later 128
        ("retry-2", 1, "changed", 16, 8),  # a branch of a branch
    ]


def test_paging_one_change_at_a_time_gives_the_whole_history(thread: Thread, run: list[Checkpoint]) -> None:
    storage.start_branch(thread=thread, at=run[2], name="retry")
    retry = append(thread, run[2], replace(BATCH, 16), branch="retry")
    append(thread, retry, replace(BATCH, 8), branch="retry")
    whole = storage.value_history(thread, BATCH)

    paged: list[history.ValueChange] = []
    while True:
        page = storage.value_history(thread, BATCH, after=paged[-1].position if paged else None, limit=1)
        if not page:
            break
        paged += page

    assert paged == whole
    assert [(c.branch, c.seq, c.old, c.new) for c in paged][:2] == [("retry", 2, 16, 8), ("retry", 1, 64, 16)]


def test_a_replace_of_an_ancestor_counts_only_when_the_value_differs(thread: Thread, run: list[Checkpoint]) -> None:
    same = append(thread, run[4], replace("/config", {"batch_size": 128, "lr": 0.2}))
    append(thread, same, replace("/config", {"batch_size": 256}))

    assert changes(thread, BATCH)[-1] == ("main", 7, "changed", 128, 256)
    assert [seq for _, seq, *_ in changes(thread, BATCH)] == [1, 3, 5, 7]
    assert changes(thread, "/config/lr")[1:] == [("main", 6, "changed", 0.1, 0.2), ("main", 7, "removed", 0.2, ABSENT)]


def test_a_removal_and_a_later_add_are_listed(thread: Thread, run: list[Checkpoint]) -> None:
    gone = append(thread, run[4], remove(BATCH))
    back = append(thread, gone, add(BATCH, 1))
    append(thread, back, remove("/config"))

    assert changes(thread, BATCH)[-3:] == [
        ("main", 6, "removed", 128, ABSENT),
        ("main", 7, "added", ABSENT, 1),
        ("main", 8, "removed", 1, ABSENT),
    ]


def test_a_change_inside_the_value_is_applied_to_it(thread: Thread, run: list[Checkpoint]) -> None:
    assert changes(thread, "/config") == [
        ("main", 1, "added", ABSENT, {"batch_size": 32, "lr": 0.1}),
        ("main", 3, "changed", {"batch_size": 32, "lr": 0.1}, {"batch_size": 64, "lr": 0.1}),
        ("main", 5, "changed", {"batch_size": 64, "lr": 0.1}, {"batch_size": 128, "lr": 0.1}),
    ]


def test_array_elements_shifted_by_an_insertion_or_removal_are_followed(thread: Thread) -> None:
    first = storage.append_checkpoint(thread=thread, parent=None, state={"queue": ["a", "b", "c"]})
    inserted = append(thread, first, add("/queue/0", "z"))  # z a b c
    appended = append(thread, inserted, add("/queue/-", "d"))  # z a b c d: an append moves no element
    removed = append(thread, appended, remove("/queue/0"))  # a b c d
    append(thread, removed, {"op": "move", "from": "/queue/2", "path": "/queue/0"})  # c a b d

    assert changes(thread, "/queue/1") == [
        ("main", 1, "added", ABSENT, "b"),
        ("main", 2, "changed", "b", "a"),
        ("main", 4, "changed", "a", "b"),
        ("main", 5, "changed", "b", "a"),
    ]
    assert changes(thread, "/queue/3") == [("main", 2, "added", ABSENT, "c"), ("main", 4, "changed", "c", "d")]


def test_a_copy_into_the_path_is_followed(thread: Thread) -> None:
    first = storage.append_checkpoint(thread=thread, parent=None, state={"draft": {"to": "Rome"}, "sent": {}})
    append(thread, first, {"op": "copy", "from": "/draft", "path": "/sent/mail"})

    assert changes(thread, "/sent/mail/to") == [("main", 2, "added", ABSENT, "Rome")]


def test_a_key_with_slashes_and_tildes_is_its_own_path(thread: Thread) -> None:
    first = storage.append_checkpoint(thread=thread, parent=None, state={"a/b": 1, "a": {"b": 2}, "m~n": 3})
    append(thread, first, replace("/a~1b", 10), replace("/m~0n", 30))

    assert changes(thread, "/a~1b") == [("main", 1, "added", ABSENT, 1), ("main", 2, "changed", 1, 10)]
    assert changes(thread, "/a/b") == [("main", 1, "added", ABSENT, 2)]
    assert changes(thread, "/m~0n")[-1] == ("main", 2, "changed", 3, 30)


@override_settings(QUICKSAVE_SNAPSHOT_EVERY=2)
def test_checkpoints_stored_as_snapshots_are_indexed_by_their_diff(thread: Thread) -> None:
    parent = storage.append_checkpoint(thread=thread, parent=None, state={"n": 0, "other": 0})
    for i in range(1, 7):
        # Every other write sends the whole state: stored as a snapshot every second checkpoint.
        if i % 2:
            parent = storage.append_checkpoint(thread=thread, parent=parent, state={"n": i // 2 + 1, "other": i})
        else:
            parent = append(thread, parent, replace("/other", i))
    assert Checkpoint.objects.filter(thread=thread, kind=1).count() > 2

    assert changes(thread, "/n") == [
        ("main", 1, "added", ABSENT, 0), ("main", 2, "changed", 0, 1), ("main", 4, "changed", 1, 2),
        ("main", 6, "changed", 2, 3),
    ]  # fmt: skip


def test_the_whole_state_has_a_history_too(thread: Thread, run: list[Checkpoint]) -> None:
    assert [seq for _, seq, *_ in changes(thread, "")] == [1, 2, 3, 5]


def test_a_path_never_set_has_no_history(thread: Thread, run: list[Checkpoint]) -> None:
    assert storage.value_history(thread, "/config/batch") == []
    assert storage.value_history(thread, "/config/batch_size/x") == []


# --------------------------------------------------------------------------- read from the patches, checked


def test_only_the_patches_that_touched_the_path_are_read(thread: Thread) -> None:
    parent = storage.append_checkpoint(thread=thread, parent=None, state={"config": {"batch_size": 1}, "log": []})
    for i in range(1, 60):
        ops = [add("/log/-", f"step {i}")] + ([replace(BATCH, i)] if i % 20 == 0 else [])
        parent = append(thread, parent, *ops)
    storage.value_history(thread, "/log")  # indexes the thread
    storage.clear_caches()

    with (
        mock.patch("checkpoints.storage.history.decode_payload", wraps=storage.decode_payload) as decoded,
        mock.patch("checkpoints.storage.history.load_node", side_effect=AssertionError("a state was materialised")),
    ):
        found = storage.value_history(thread, BATCH)

    assert [(c.old, c.new) for c in reversed(found)] == [(ABSENT, 1), (1, 20), (20, 40)]
    assert decoded.call_count == 3  # the first checkpoint and the two that changed it, of 60


def test_an_encrypted_threads_history_is_read(thread: Thread, run: list[Checkpoint]) -> None:
    stored = bytes(Checkpoint.objects.values_list("payload", flat=True).get(pk=run[2].pk))
    assert stored[0] == crypto.SEALED and b"batch_size" not in stored
    crypto.forget_keys()
    storage.clear_caches()

    assert changes(thread, BATCH)[1] == ("main", 3, "changed", 32, 64)


def test_an_altered_row_that_changed_the_value_is_detected(thread: Thread, run: list[Checkpoint]) -> None:
    storage.value_history(thread, BATCH)  # indexed while intact
    with connection.cursor() as cursor:
        cursor.execute("UPDATE checkpoints_checkpoint SET label = 'forged' WHERE id = %s", [run[2].pk])

    with pytest.raises(storage.IntegrityFailure, match="fails its integrity check"):
        storage.value_history(thread, BATCH)


def test_an_altered_row_is_detected_while_indexing(thread: Thread, run: list[Checkpoint]) -> None:
    with connection.cursor() as cursor:
        cursor.execute("UPDATE checkpoints_checkpoint SET step = 99 WHERE id = %s", [run[1].pk])

    with pytest.raises(storage.IntegrityFailure, match="fails its integrity check"):
        storage.value_history(thread, BATCH)


def test_checkpoints_written_after_a_read_are_indexed_by_the_next(thread: Thread, run: list[Checkpoint]) -> None:
    assert len(storage.value_history(thread, BATCH)) == 3
    mark = ChangedPathMark.objects.get(thread=thread)
    assert (mark.seq, mark.checkpoint_id) == (5, run[4].pk)

    later = append(thread, run[4], replace(BATCH, 512))

    assert storage.value_history(thread, BATCH)[0].checkpoint_id == later.pk
    assert ChangedPathMark.objects.get(thread=thread).seq == 6


def test_an_index_whose_rows_were_rewritten_is_built_again(thread: Thread, run: list[Checkpoint]) -> None:
    storage.value_history(thread, BATCH)
    # As after compaction: the marked checkpoint's MAC is not the one indexed, and the index is stale.
    ChangedPathMark.objects.filter(thread=thread).update(integrity=b"\x00" * 32)
    ChangedPath.objects.filter(thread=thread).delete()
    ChangedPath.objects.create(thread=thread, path=BATCH, checkpoint_id=run[1].pk)

    assert [seq for _, seq, *_ in changes(thread, BATCH)] == [1, 3, 5]
    assert not ChangedPath.objects.filter(thread=thread, path=BATCH, checkpoint_id=run[1].pk).exists()


def test_a_deleted_thread_takes_its_index_along(thread: Thread, run: list[Checkpoint]) -> None:
    storage.value_history(thread, BATCH)
    assert ChangedPath.objects.filter(thread=thread).exists()

    storage.delete_thread(thread)

    assert not ChangedPath.objects.filter(thread_id=thread.pk).exists()
    assert not ChangedPathMark.objects.filter(thread_id=thread.pk).exists()


@pytest.mark.parametrize("pointer", ["config/batch_size", "/a~2", "/a~", "/a\x00", 7])
def test_a_path_that_is_no_json_pointer_is_refused(thread: Thread, pointer: Any) -> None:
    with pytest.raises(storage.InvalidPath) as refused:
        storage.value_history(thread, pointer)
    assert refused.value.detail == {"field": "path"}


def test_a_change_touching_many_paths_is_indexed_under_few_ancestors() -> None:
    ops = [add(f"/items/{i}/name", i) for i in range(200)] + [replace("/x", 1)]

    assert history.touched(ops) == ["/items", "/x"]
    assert history.touched([replace("/" + "k" * 500 + "/leaf", 1)]) == [""]
    assert history.touched([add("/q/3", 1), {"op": "test", "path": "/t", "value": 1}]) == ["/q/3", "/q"]


# --------------------------------------------------------------------------- the API


def url(thread: Thread, query: str = f"path={BATCH}") -> str:
    return f"/api/v1/threads/{thread.pk}/history/?{query}"


def test_the_api_lists_changes_with_old_and_new(owner_client: APIClient, thread: Thread, run: list[Checkpoint]) -> None:
    response = owner_client.get(url(thread))

    assert response.status_code == 200
    body = response.json()
    assert body["next"] is None
    assert [(c["seq"], c["change"], c["old"], c["new"]) for c in body["results"]] == [
        (5, "changed", 64, 128), (3, "changed", 32, 64), (1, "added", None, 32),
    ]  # fmt: skip
    newest = body["results"][0]
    assert newest["checkpoint"] == str(run[4].pk) and newest["parent"] == str(run[3].pk)
    assert (newest["branch"], newest["label"], newest["omitted"]) == ("main", "tune", [])


def test_the_api_pages_with_a_cursor(viewer_client: APIClient, thread: Thread, run: list[Checkpoint]) -> None:
    first = viewer_client.get(url(thread, f"path={BATCH}&limit=2")).json()
    assert [(c["seq"], c["old"], c["new"]) for c in first["results"]] == [(5, 64, 128), (3, 32, 64)]
    assert first["next"] is not None

    second = viewer_client.get(first["next"]).json()

    assert [(c["seq"], c["change"], c["old"], c["new"]) for c in second["results"]] == [(1, "added", None, 32)]
    assert second["next"] is None


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("path=config", "path"),
        ("path=/a~9", "path"),
        ("", "path"),
        (f"path={BATCH}&limit=0", "limit"),
        (f"path={BATCH}&limit=abc", "limit"),
        (f"path={BATCH}&cursor=bm90IGEgY3Vyc29y", "cursor"),
        (f"path={BATCH}&cursor=%25%25", "cursor"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(
    owner_client: APIClient, thread: Thread, run: list[Checkpoint], query: str, field: str
) -> None:
    response = owner_client.get(url(thread, query))

    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid"
    assert field in error["detail"]["fields"]
    assert error["message"].startswith(field)


def test_another_agents_key_gets_a_404(foreign_client: APIClient, anonymous_client: APIClient, thread: Thread,
                                       run: list[Checkpoint]) -> None:  # fmt: skip
    assert foreign_client.get(url(thread)).status_code == 404
    assert anonymous_client.get(url(thread)).status_code == 401
    assert ChangedPath.objects.filter(thread=thread).count() == 0  # nothing was read for them


def test_an_altered_row_is_an_integrity_failure_not_a_history(
    owner_client: APIClient, thread: Thread, run: list[Checkpoint]
) -> None:
    with connection.cursor() as cursor:
        cursor.execute("UPDATE checkpoints_checkpoint SET label = 'forged' WHERE id = %s", [run[4].pk])

    response = owner_client.get(url(thread))

    assert response.status_code == 500
    assert response.json()["error"]["code"] == "integrity_failure"


def test_values_larger_than_the_limit_are_left_out_of_a_page(owner_client: APIClient, thread: Thread) -> None:
    first = storage.append_checkpoint(thread=thread, parent=None, state={"doc": "short"})
    append(thread, first, replace("/doc", "x" * 70_000))

    newest = owner_client.get(url(thread, "path=/doc")).json()["results"][0]

    assert (newest["old"], newest["new"], newest["omitted"]) == ("short", None, ["new"])


def test_the_openapi_schema_documents_the_history(viewer_client: APIClient) -> None:
    schema = viewer_client.get("/api/schema/?format=json").json()

    operation = schema["paths"]["/api/v1/threads/{thread_id}/history/"]["get"]
    assert operation["operationId"] == "v1_threads_history"
    assert {parameter["name"] for parameter in operation["parameters"]} >= {"path", "limit", "cursor"}
    assert "ValueHistoryPage" in schema["components"]["schemas"]


# --------------------------------------------------------------------------- against every state


def every_change(thread: Thread, path: str) -> list[tuple[str, int, Any, Any]]:
    """The history the slow way: every checkpoint's state against its parent's, oldest first."""
    tokens = history.pointer_tokens(path)
    found = []
    rows = Checkpoint.objects.filter(thread=thread).select_related("branch").order_by("created_at", "id")
    for row in rows:
        new = history.lookup(storage.state_at(row.pk), tokens)
        old = history.lookup(storage.state_at(row.parent_id), tokens) if row.parent_id else ABSENT
        same = (old is ABSENT) == (new is ABSENT) and (old is ABSENT or json_equal(old, new))
        if not same:
            found.append((row.branch.name, row.seq, old, new))
    return found


def random_ops(state: dict[str, Any], rng: random.Random) -> list[dict[str, Any]]:
    """One to three valid ops against `state`: replaces, adds and removes in objects and arrays,
    array insertions in the middle, moves and copies."""
    ops: list[dict[str, Any]] = []
    doc = storage.clone(state)
    for _ in range(rng.randint(1, 3)):
        items = doc["a"]["l"]
        choice = rng.choice(["x", "insert", "append", "remove", "replace-item", "move", "copy", "whole", "b"])
        if choice == "x":
            op = replace("/a/x", rng.randint(0, 3))
        elif choice == "insert" and items:
            op = add(f"/a/l/{rng.randrange(len(items))}", rng.randint(0, 9))
        elif choice == "remove" and items:
            op = remove(f"/a/l/{rng.randrange(len(items))}")
        elif choice == "replace-item" and items:
            op = replace(f"/a/l/{rng.randrange(len(items))}", rng.randint(0, 9))
        elif choice == "move" and len(items) > 1:
            op = {
                "op": "move",
                "from": f"/a/l/{rng.randrange(len(items))}",
                "path": f"/a/l/{rng.randrange(len(items))}",
            }
        elif choice == "copy" and items:
            op = {"op": "copy", "from": f"/a/l/{rng.randrange(len(items))}", "path": "/b/-"}
        elif choice == "whole":
            op = replace("/a", {"x": rng.randint(0, 3), "l": [rng.randint(0, 9) for _ in range(rng.randint(0, 4))]})
        elif choice == "b":
            op = add("/b/0", {"k": rng.randint(0, 2)})
        else:
            op = add("/a/l/-", rng.randint(0, 9))
        doc = apply_patch(doc, [op]).doc
        ops.append(op)
    return ops


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_the_history_matches_every_state_compared_with_its_parents(thread: Thread, seed: int) -> None:
    rng = random.Random(seed)
    heads = {"main": storage.append_checkpoint(thread=thread, parent=None, state={"a": {"x": 0, "l": [1, 2]}, "b": []})}
    for step in range(40):
        branch = rng.choice(sorted(heads))
        head = heads[branch]
        if step % 13 == 12:  # a fork from somewhere on the branch
            at = Checkpoint.objects.filter(thread=thread, branch=head.branch_id).order_by("?").first()
            assert at is not None
            branch = f"fork-{step}"
            storage.start_branch(thread=thread, at=at, name=branch)
            head = at
        heads[branch] = append(thread, head, *random_ops(storage.state_at(head.pk), rng), branch=branch)

    for path in ("", "/a", "/a/x", "/a/l", "/a/l/0", "/a/l/2", "/a/l/-", "/b/0", "/b/1/k", "/missing"):
        found = [(c.branch, c.seq, c.old, c.new) for c in reversed(storage.value_history(thread, path))]
        assert found == every_change(thread, path), path


def test_the_history_of_a_compacted_thread_is_read_again(agent: Any) -> None:
    from checkpoints import compaction
    from checkpoints.models import ThreadStatus

    thread = storage.create_thread(agent=agent)[0]
    parent = storage.append_checkpoint(thread=thread, parent=None, state={"n": 0, "log": []})
    for i in range(1, 30):
        parent = append(thread, parent, replace("/n", i // 3), add("/log/-", i))
    assert len(storage.value_history(thread, "/n")) == 10  # indexed before compaction
    Thread.objects.filter(pk=thread.pk).update(status=ThreadStatus.COMPLETED)

    compaction.compact_thread(thread=thread, keep_every=5)
    storage.clear_caches()

    found = [(c.branch, c.seq, c.old, c.new) for c in reversed(storage.value_history(thread, "/n"))]
    assert found == every_change(thread, "/n")
    assert len(found) < 10  # the removed checkpoints' changes now lie in the kept ones
