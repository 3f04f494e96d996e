"""Export and import of a thread's trajectory as JSON Lines: the round trip (states, branches and
forks), streaming in constant memory, who may export, integrity failures and precise import errors."""

from __future__ import annotations

import io
import json
import re
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.http import StreamingHttpResponse
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from checkpoints import export, forks, storage
from checkpoints.export import InvalidTrajectory, import_thread
from checkpoints.models import Branch, Checkpoint, Event, Thread, ThreadStatus
from checkpoints.storage.verify import verify_thread
from quicksave_agents.models import Agent
from tests.conftest import person, signed_in


def build_trajectory(thread: Thread) -> list[Checkpoint]:
    """Main with snapshots and deltas, a fork (made active, as a person's fork is) that goes on, and an
    empty branch: every shape an export has to carry."""
    written = [
        storage.append_checkpoint(
            thread=thread, parent=None, state={"messages": [], "city": "Lisbon"}, step=0, label="start",
            model={"name": "gpt-test", "version": "2024-05", "temperature": 0.2, "top_p": 0.9, "seed": 7},
            metadata={"run": "a"},
        )
    ]  # fmt: skip
    for i in range(1, 8):
        written.append(
            storage.append_checkpoint(
                thread=thread, parent=written[-1], step=i, label=f"step {i}", metadata={"i": i},
                patch=[{"op": "add", "path": "/messages/-", "value": {"role": "tool", "content": f"result {i}"}}],
                status=ThreadStatus.WAITING_FOR_APPROVAL if i == 7 else ThreadStatus.RUNNING,
            )
        )  # fmt: skip
    admin = person("ada", "admin")
    fork_head = forks.fork(
        checkpoint=written[3], user=admin, reason="try Porto instead", branch="porto",
        patch=[{"op": "replace", "path": "/city", "value": "Porto"}],
    )  # fmt: skip
    written.append(fork_head)
    written.append(
        storage.append_checkpoint(
            thread=thread, parent=fork_head, state={"messages": [], "city": "Porto", "done": True},
            step=5, label="booked", status=ThreadStatus.COMPLETED,
        )
    )  # fmt: skip
    storage.start_branch(thread=thread, at=written[1], name="empty")
    return written


def lines_of(data: bytes) -> list[dict[str, Any]]:
    return [json.loads(line) for line in data.decode().splitlines()]


def exported(thread: Thread) -> bytes:
    return b"".join(export.export_lines(thread))


def summary(checkpoint: Checkpoint) -> tuple[Any, ...]:
    return (
        storage.get_branch_name(checkpoint.branch_id), checkpoint.seq, checkpoint.step, checkpoint.label,
        checkpoint.status, checkpoint.source, checkpoint.model, checkpoint.metadata, checkpoint.schema_version,
        storage.state_at(checkpoint),
    )  # fmt: skip


def tree(thread: Thread) -> dict[str, tuple[Any, ...]]:
    """Each branch's fork point (as branch and seq) and its checkpoints, ids left out."""
    branches = {}
    for branch in Branch.objects.filter(thread=thread).select_related("fork_point__branch").order_by("id"):
        fork = branch.fork_point
        rows = Checkpoint.objects.filter(branch=branch).order_by("seq")
        branches[branch.name] = (
            (fork.branch.name, fork.seq) if fork else None,
            [summary(row) for row in rows],
        )
    return branches


# --------------------------------------------------------------------------- round trip


@pytest.mark.django_db
def test_round_trip_restores_every_state_branch_and_fork(
    settings: Any, agent: Agent, other_agent: Agent, thread: Thread
) -> None:
    settings.QUICKSAVE_SNAPSHOT_EVERY = 3  # so the file holds both `state` and `patch` lines
    build_trajectory(thread)
    thread.refresh_from_db()
    data = exported(thread)
    records = lines_of(data)
    assert [r["type"] for r in records] == ["thread"] + ["checkpoint"] * 10 + ["end"]
    assert {"state", "patch"} <= {key for r in records[1:-1] for key in r}
    source_tree = tree(thread)

    # Another installation: its own integrity key, nothing cached from the source.
    settings.QUICKSAVE_INTEGRITY_KEY = "another-installation"
    storage.clear_caches()
    before = Thread.objects.count()
    copy = import_thread(file=io.BytesIO(data), agent=other_agent)

    assert Thread.objects.count() == before + 1
    assert (copy.agent, copy.external_id, copy.metadata) == (other_agent, thread.external_id, thread.metadata)
    assert copy.status == thread.status == ThreadStatus.COMPLETED
    assert copy.active_branch is not None and copy.active_branch.name == "porto"
    assert copy.head_id is not None
    head = Checkpoint.objects.get(pk=copy.head_id)
    assert (head.label, storage.state_at(head)) == ("booked", {"messages": [], "city": "Porto", "done": True})
    assert list(verify_thread(copy)) == []  # MACs made with this installation's key
    assert tree(copy) == source_tree
    assert set(tree(copy)) == {"main", "porto", "empty"}
    event = Event.objects.filter(thread=copy, type="thread.imported").get()
    assert event.data["source_thread"] == str(thread.pk)


@pytest.mark.django_db
def test_commands_export_to_a_file_and_import_it_with_progress(
    tmp_path: Path, agent: Agent, other_agent: Agent, thread: Thread
) -> None:
    written = build_trajectory(thread)
    path = tmp_path / "trip.jsonl"
    call_command("export_thread", str(thread.pk), "-o", str(path), stderr=io.StringIO())
    assert lines_of(path.read_bytes())[-1] == {"type": "end", "checkpoints": len(written)}

    out, err = io.StringIO(), io.StringIO()
    call_command("import_thread", str(path), "--agent", "code-review", "--external-id", "trip-2", stdout=out,
                 stderr=err)  # fmt: skip

    copy = Thread.objects.get(agent=other_agent, external_id="trip-2")
    assert str(copy.pk) in out.getvalue()
    assert f"Imported {len(written)}/{len(written)} checkpoints (100%)" in err.getvalue()
    assert tree(copy) == tree(thread)


# --------------------------------------------------------------------------- streaming


@pytest.mark.django_db
def test_export_streams_in_batches_in_constant_memory(thread: Thread) -> None:
    parent = storage.append_checkpoint(thread=thread, parent=None, state={"note": ""})
    for i in range(3000):
        note = f"{i:05d} " + "lorem ipsum dolor sit amet " * 40  # ~1 KiB per line, whatever the length
        parent = storage.append_checkpoint(thread=thread, parent=parent, patch=[
            {"op": "replace", "path": "/note", "value": note}])  # fmt: skip

    tracemalloc.start()
    try:
        with CaptureQueriesContext(connection) as queries:
            total = sum(len(chunk) for chunk in export.export_lines(thread, batch_size=100))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert total > 3_000_000
    # Measured at about 0.6 MB: one batch of rows and one chunk of lines, never the whole export.
    assert peak < 1_500_000, f"peak {peak} bytes for a {total}-byte export"
    reads = [q for q in queries.captured_queries if 'FROM "checkpoints_checkpoint"' in q["sql"]]
    assert len(reads) <= 3001 // 100 + 3  # batches, plus the per-branch counts


@pytest.mark.django_db
def test_api_export_is_a_streaming_ndjson_attachment(owner_client: APIClient, thread: Thread) -> None:
    written = build_trajectory(thread)

    response = owner_client.get(f"/api/v1/threads/{thread.pk}/export/", HTTP_ACCEPT="application/x-ndjson")

    assert response.status_code == 200
    assert isinstance(response, StreamingHttpResponse)
    assert response["Content-Type"] == "application/x-ndjson"
    assert response["Content-Disposition"] == f'attachment; filename="quicksave-thread-{thread.pk}.jsonl"'
    records = lines_of(b"".join(response.streaming_content))
    assert records[0]["id"] == str(thread.pk)
    assert [r["id"] for r in records[1:-1]] == [str(c.pk) for c in sorted(written, key=lambda c: c.branch_id)]


# --------------------------------------------------------------------------- who may export


@pytest.mark.django_db
def test_owner_key_and_viewer_may_export_others_get_404_or_401(
    owner_client: APIClient, foreign_client: APIClient, viewer_client: APIClient, stranger_client: APIClient,
    anonymous_client: APIClient, thread: Thread,
) -> None:  # fmt: skip
    storage.append_checkpoint(thread=thread, parent=None, state={"secret": 1})
    url = f"/api/v1/threads/{thread.pk}/export/"

    assert owner_client.get(url).status_code == 200
    assert viewer_client.get(url).status_code == 200
    for client in (foreign_client, stranger_client):
        response = client.get(url)
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "not_found"
        assert b"secret" not in response.content
    response = anonymous_client.get(url)
    assert response.status_code in (401, 403)
    assert response.json()["error"]["code"] == "not_authenticated"


@pytest.mark.django_db
def test_thread_page_links_to_the_export(thread: Thread) -> None:
    page = signed_in(person("vera", "viewer")).get(f"/threads/{thread.pk}/")
    assert page.status_code == 200
    assert f'href="/api/v1/threads/{thread.pk}/export/"' in page.content.decode()
    assert "Export JSONL" in page.content.decode()


def test_openapi_schema_documents_the_export(viewer_client: APIClient) -> None:
    schema = viewer_client.get("/api/schema/", {"format": "json"}).json()
    operation = schema["paths"]["/api/v1/threads/{thread_id}/export/"]["get"]
    assert "application/x-ndjson" in operation["responses"]["200"]["content"]


# --------------------------------------------------------------------------- integrity


@pytest.mark.django_db
def test_a_tampered_row_ends_the_export_with_an_integrity_error(owner_client: APIClient, thread: Thread) -> None:
    written = build_trajectory(thread)
    tampered = written[4]
    Checkpoint.objects.filter(pk=tampered.pk).update(label="edited behind Quicksave's back")

    response = owner_client.get(f"/api/v1/threads/{thread.pk}/export/")
    records = lines_of(b"".join(response.streaming_content))  # type: ignore[attr-defined]

    assert [r["type"] for r in records] == ["thread"] + ["checkpoint"] * 4 + ["error"]
    error = records[-1]["error"]
    assert error["code"] == "integrity_failure"
    assert error["detail"]["checkpoint"] == str(tampered.pk)
    assert "fails its integrity check" in error["message"]


@pytest.mark.django_db
def test_importing_an_export_that_failed_names_the_error_line(other_agent: Agent, thread: Thread) -> None:
    written = build_trajectory(thread)
    Checkpoint.objects.filter(pk=written[2].pk).update(metadata={"i": 99})
    data = exported(thread)

    with pytest.raises(InvalidTrajectory, match=r"^line 4: the export failed here"):
        import_thread(file=io.BytesIO(data), agent=other_agent)


# --------------------------------------------------------------------------- malformed files


def _edit(data: bytes, number: int, change: Any) -> bytes:
    """The file with line `number` (1-based) passed through `change` (a dict edit, or None to drop it)."""
    lines = data.decode().splitlines()
    if change is None:
        del lines[number - 1]
    else:
        record = json.loads(lines[number - 1])
        change(record)
        lines[number - 1] = json.dumps(record)
    return ("\n".join(lines) + "\n").encode()


def _set_patch(record: dict[str, Any], patch: list[dict[str, Any]]) -> None:
    record.pop("state", None)
    record["patch"] = patch


def _set_state(record: dict[str, Any], state: dict[str, Any]) -> None:
    record.pop("patch", None)
    record["state"] = state


MALFORMED = [
    # (what is wrong, line, edit, line and field named in the error)
    ("a bad status", 3, lambda r: r.update(status="sleeping"), "line 3, field `status`"),
    ("a step that is not a number", 5, lambda r: r.update(step="five"), "line 5, field `step`"),
    ("both state and patch", 2, lambda r: r.update(patch=[]), "line 2, field `state`"),
    ("an unknown model field", 2, lambda r: r["model"].update(temp=1), "line 2, field `model.temp`"),
    ("an unknown field", 7, lambda r: r.update(colour="red"), "line 7, field `colour`"),
    ("a parent that is not the previous checkpoint", 4, lambda r: r.update(parent=r["id"]),
     "line 4, field `parent`"),
    ("an unknown branch", 6, lambda r: r.update(branch="nope"), "line 6, field `branch`"),
    ("a newer format version", 1, lambda r: r.update(version=2), "line 1, field `version`"),
    # Python takes true and 1.0 for 1; the format means the integer.
    ("a version of true", 1, lambda r: r.update(version=True), "line 1, field `version`"),
    ("a version of 1.0", 1, lambda r: r.update(version=1.0), "line 1, field `version`"),
    # An id that is not a string used to be read as null.
    ("a thread id that is a number", 1, lambda r: r.update(id=1), "line 1, field `id`: must be a UUID string"),
    ("a fork point that is a number", 1, lambda r: r["branches"][1].update(fork_point=4),
     "line 1, field `branches[1].fork_point`: must be a UUID string"),
    ("a checkpoint id that is a number", 2, lambda r: r.update(id=5), "line 2, field `id`: must be a UUID string"),
    ("a parent that is a list", 4, lambda r: r.update(parent=[r["parent"]]),
     "line 4, field `parent`: must be a UUID string"),
    ("a header without branches", 1, lambda r: r.pop("branches"), "line 1, field `branches`"),
    ("a truncated file", 12, None, "line 12: the file ends without its `end` line"),
    ("a missing checkpoint", 5, None, "line 5, field `parent`"),
    # Text PostgreSQL cannot store, read as strictly as an API body.
    ("a NUL in a label", 3, lambda r: r.update(label="a\x00b"), "line 3: the line holds a NUL character"),
    ("a lone surrogate as the agent", 1, lambda r: r.update(agent="\ud800"),
     "line 1: the line holds a lone UTF-16 surrogate"),
    ("a number that overflows to infinity", 4, lambda r: r.update(step=None, state={"x": 1e308 * 10}),
     "line 4: not a JSON line"),
    # Only the store finds this one, while writing: the transaction takes back what it wrote.
    ("a patch that does not apply", 3, lambda r: _set_patch(r, [{"op": "remove", "path": "/nope"}]),
     "line 3, field `patch`"),
]  # fmt: skip


@pytest.mark.django_db
@pytest.mark.parametrize(("wrong", "number", "change", "named"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_a_malformed_file_names_line_and_field_and_writes_nothing(
    other_agent: Agent, thread: Thread, wrong: str, number: int, change: Any, named: str
) -> None:
    build_trajectory(thread)
    data = _edit(exported(thread), number, change)
    counts = (Thread.objects.count(), Branch.objects.count(), Checkpoint.objects.count(), Event.objects.count())

    with pytest.raises(InvalidTrajectory) as raised:
        import_thread(file=io.BytesIO(data), agent=other_agent)

    assert raised.value.message.startswith(named), raised.value.message
    assert raised.value.detail["line"] == number
    assert (Thread.objects.count(), Branch.objects.count(), Checkpoint.objects.count(),
            Event.objects.count()) == counts  # fmt: skip


@pytest.mark.django_db
def test_a_line_that_is_not_json_is_named(other_agent: Agent, thread: Thread) -> None:
    build_trajectory(thread)
    lines = exported(thread).split(b"\n")
    lines[2] = lines[2][:40]

    with pytest.raises(InvalidTrajectory, match=r"^line 3: not a JSON line"):
        import_thread(file=io.BytesIO(b"\n".join(lines)), agent=other_agent)
    assert not Thread.objects.filter(agent=other_agent).exists()


# --------------------------------------------------------------------------- oversized lines


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("over", "named"),
    [(1, "line 3: the line is longer than {limit} bytes"), (0, "line 3, field `state`: The state would")],
    ids=["one byte over the limit", "at the limit, read and left to the store"],
)
def test_import_command_refuses_a_line_over_the_limit_and_imports_nothing(
    tmp_path: Path, settings: Any, other_agent: Agent, thread: Thread, over: int, named: str
) -> None:
    build_trajectory(thread)
    lines = exported(thread).splitlines(keepends=True)
    settings.QUICKSAVE_MAX_STATE_BYTES = settings.QUICKSAVE_MAX_METADATA_BYTES = 1024
    limit = export.max_line_bytes()
    record = json.loads(lines[2])
    _set_state(record, {"pad": ""})
    record["state"]["pad"] = "x" * (limit + over - len(json.dumps(record)) - 1)
    lines[2] = json.dumps(record).encode() + b"\n"
    assert len(lines[2]) == limit + over
    path = tmp_path / "big.jsonl"
    path.write_bytes(b"".join(lines))
    counts = (Thread.objects.count(), Branch.objects.count(), Checkpoint.objects.count(), Event.objects.count())
    expected = re.escape(named.format(limit=limit))

    with pytest.raises(CommandError, match=rf"big\.jsonl: {expected}.*Nothing was imported"):
        call_command("import_thread", str(path), "--agent", "code-review", stdout=io.StringIO(), stderr=io.StringIO())
    assert (Thread.objects.count(), Branch.objects.count(), Checkpoint.objects.count(),
            Event.objects.count()) == counts  # fmt: skip


class _Endless(io.RawIOBase):
    """/dev/zero, except that it fails the test instead of filling memory when read far past `stop`."""

    def __init__(self, stop: int) -> None:
        self.served, self.stop = 0, stop

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self.served > self.stop:
            raise AssertionError(f"the import read {self.served} bytes of one line")
        size = len(buffer)
        buffer[:size] = bytes(size)
        self.served += size
        return size


@pytest.mark.django_db
def test_an_endless_line_is_refused_at_the_limit_without_reading_on(settings: Any, other_agent: Agent) -> None:
    settings.QUICKSAVE_MAX_STATE_BYTES = settings.QUICKSAVE_MAX_METADATA_BYTES = 1024
    limit = export.max_line_bytes()
    endless = _Endless(stop=4 * limit)
    before = Thread.objects.count()

    with pytest.raises(InvalidTrajectory, match=rf"^line 1: the line is longer than {limit} bytes"):
        import_thread(file=io.BufferedReader(endless), agent=other_agent)
    assert endless.served <= limit + io.DEFAULT_BUFFER_SIZE
    assert Thread.objects.count() == before


@pytest.mark.django_db
def test_import_from_stdin_stops_an_endless_line_while_spooling_it(
    settings: Any, other_agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.QUICKSAVE_MAX_STATE_BYTES = settings.QUICKSAVE_MAX_METADATA_BYTES = 1024
    limit = export.max_line_bytes()
    endless = _Endless(stop=4 * limit)
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BufferedReader(endless)))

    with pytest.raises(CommandError, match=rf"^-: line 1: the line is longer than {limit} bytes"):
        call_command("import_thread", "-", "--agent", "code-review", stdout=io.StringIO(), stderr=io.StringIO())
    assert endless.served <= limit + io.DEFAULT_BUFFER_SIZE
    assert not Thread.objects.exists()


@pytest.mark.django_db
def test_import_command_reports_the_line_and_imports_nothing(tmp_path: Path, other_agent: Agent) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"type": "thread"}\n')

    with pytest.raises(
        CommandError, match=r"bad.jsonl: line 1, field `type`: the first line must be the thread header"
    ):
        call_command("import_thread", str(path), "--agent", "code-review", stdout=io.StringIO(), stderr=io.StringIO())
    assert not Thread.objects.exists()


@pytest.mark.django_db
def test_import_command_reports_a_refusal_of_the_store_and_imports_nothing(
    tmp_path: Path, other_agent: Agent, thread: Thread, settings: Any
) -> None:
    """The header's metadata goes to create_thread, whose own refusal used to end in a traceback."""
    build_trajectory(thread)
    path = tmp_path / "big.jsonl"
    path.write_bytes(_edit(exported(thread), 1, lambda r: r.update(metadata={"x": "y" * 2000})))
    settings.QUICKSAVE_MAX_METADATA_BYTES = 1024
    before = Thread.objects.count()

    with pytest.raises(CommandError, match=r"QUICKSAVE_MAX_METADATA_BYTES.*Nothing was imported"):
        call_command("import_thread", str(path), "--agent", "code-review", stdout=io.StringIO(), stderr=io.StringIO())
    assert Thread.objects.count() == before


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("option", "value"), [("--external-id", "x" * 256), ("--agent", "\udcff"), ("--external-id", "tab\there")]
)
def test_import_command_refuses_an_option_no_column_can_hold(tmp_path: Path, option: str, value: str) -> None:
    path = tmp_path / "any.jsonl"
    path.write_bytes(b"{}\n")

    with pytest.raises(CommandError, match="printable characters"):
        call_command("import_thread", str(path), option, value, stdout=io.StringIO(), stderr=io.StringIO())


@pytest.mark.django_db
@pytest.mark.parametrize("target", ["missing/trip.jsonl", "."], ids=["missing directory", "a directory"])
def test_export_to_a_path_that_cannot_be_written_names_it(tmp_path: Path, thread: Thread, target: str) -> None:
    path = tmp_path / target
    with pytest.raises(CommandError, match=f"Cannot write the export to {re.escape(str(path))}: "):
        call_command("export_thread", str(thread.pk), "-o", str(path), stderr=io.StringIO())
