"""A thread's trajectory as JSON Lines: streamed out in constant memory, and imported into
this installation (possibly another database) through the store's one way in.

Format version 1, one JSON object per line, each with a `type`:

1. `thread`: `format` ("quicksave-trajectory"), `version` (1), `id`, `agent`, `external_id`,
   `status`, `metadata`, `created_at`, `active_branch`, `branches` (`[{name, fork_point,
   checkpoints}]`, in the order they were made, `main` first), `checkpoints` (the total)
   and `exported_at`.
2. `checkpoint`, one per checkpoint, branch by branch and each branch in seq order, so a
   parent always comes before its children: `id`, `parent`, `branch`, `seq`, `step`,
   `label`, `status`, `source`, `model` (`name`, `version`, `temperature`, `top_p`, `seed`),
   `metadata`, `schema_version`, `created_at`, and either `state` (the full state, where
   the row is a stored snapshot) or `patch` (RFC 6902 ops against the parent's state,
   where the row is a stored delta).
3. `end`, with `checkpoints` (how many came before it). A file without it was cut short.

A row that fails its integrity MAC ends the stream with an `error` line (`{"type":
"error", "error": {"code", "message", "detail"}}`) in place of the `end` line: by then
the HTTP status has gone out, so the failure travels in the body.

The export is a consistent cut: the branches and each branch's last seq are read once,
up front, and checkpoints written later are left out (checkpoints never change). Rows
are read in keyset batches on the (thread, branch, seq) index and each row's MAC is
checked against its parent's, which is the row just before it except at a branch's
first checkpoint; so memory stays flat however long the thread is.

Import checks the whole file first and writes nothing if any line is wrong (the error
names the line and the field; a line longer than `max_line_bytes()` is refused without
reading the rest of it); then, in one transaction, creates the thread, its branches
(`storage.start_branch`) and its checkpoints (`storage.append_checkpoint`, a stored
snapshot's `state` or a stored delta's `patch`), so this installation computes its own
MACs, snapshots and encryption. Everything gets a new id: the store makes
every id, and new ids cannot collide with rows already here. `created_at` is the time
of the import; the source thread's id is kept in the `thread.imported` event. Tool
results, approvals, runs and events are not part of a trajectory.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import IO, Any
from uuid import UUID

from django.conf import settings
from django.db import transaction
from django.db.models import Count, Max
from django.utils import timezone

from checkpoints import storage
from checkpoints.models import Branch, Checkpoint, CheckpointSource, CheckpointStatus, PayloadKind, Thread
from checkpoints.storage.errors import IntegrityFailure, StoreError
from checkpoints.storage.verify import mac_matches
from quicksave.errors import DomainError
from quicksave.jsontext import UnstorableText, loads_strict
from quicksave_agents.models import Agent

FORMAT = "quicksave-trajectory"
VERSION = 1
CONTENT_TYPE = "application/x-ndjson"
BATCH_SIZE = 200
# Rows are held a batch at a time with their payloads, so batches of big states are made smaller.
BATCH_BYTES = 8 * 1024 * 1024
# Lines are sent in chunks of about this size: one write per line would cost a syscall
# (and, behind the ASGI server, a message) for every checkpoint.
CHUNK_BYTES = 64 * 1024

CHECKPOINT_KEYS = frozenset({
    "type", "id", "parent", "branch", "seq", "step", "label", "status", "source", "model", "metadata",
    "schema_version", "created_at", "state", "patch",
})  # fmt: skip
MODEL_KEYS = frozenset({"name", "version", "temperature", "top_p", "seed"})
HEADER_KEYS = frozenset({
    "type", "format", "version", "id", "agent", "external_id", "status", "metadata", "created_at", "active_branch",
    "branches", "checkpoints", "exported_at",
})  # fmt: skip
BRANCH_KEYS = frozenset({"name", "fork_point", "checkpoints"})
END_KEYS = frozenset({"type", "checkpoints"})
# Room on an import line for what is not a state or metadata: ids, label, model, branches.
LINE_ROOM = 1024 * 1024


# --------------------------------------------------------------------------- export


def filename(thread: Thread) -> str:
    return f"quicksave-thread-{thread.pk}.jsonl"


def export_lines(thread: Thread, *, batch_size: int = BATCH_SIZE) -> Iterator[bytes]:
    """The trajectory as JSON Lines, in chunks of whole lines (for a streaming response)."""
    chunk = bytearray()
    for record in trajectory(thread, batch_size=batch_size):
        chunk += encode_line(record)
        if len(chunk) >= CHUNK_BYTES:
            yield bytes(chunk)
            chunk.clear()
    if chunk:
        yield bytes(chunk)


def encode_line(record: dict[str, Any]) -> bytes:
    return json.dumps(record, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


def trajectory(thread: Thread, *, batch_size: int = BATCH_SIZE) -> Iterator[dict[str, Any]]:
    """The header, one record per checkpoint, then `end` (or `error` at a row that fails its MAC)."""
    branches = list(Branch.objects.filter(thread=thread).order_by("id"))
    extent = {
        row["branch_id"]: (row["last_seq"], row["count"])
        for row in Checkpoint.objects.filter(thread=thread)
        .order_by()
        .values("branch_id")
        .annotate(last_seq=Max("seq"), count=Count("id"))
    }
    names = {branch.id: branch.name for branch in branches}
    total = sum(count for _, count in extent.values())
    yield {
        "type": "thread", "format": FORMAT, "version": VERSION, "id": str(thread.pk), "agent": thread.agent.name,
        "external_id": thread.external_id, "status": thread.status, "metadata": thread.metadata,
        "created_at": thread.created_at.isoformat(),
        "active_branch": names.get(thread.active_branch_id or 0, storage.MAIN_BRANCH),
        "branches": [{"name": branch.name, "fork_point": _str(branch.fork_point_id),
                      "checkpoints": extent.get(branch.id, (0, 0))[1]} for branch in branches],
        "checkpoints": total, "exported_at": timezone.now().isoformat(),
    }  # fmt: skip
    written = 0
    previous: tuple[UUID, bytes] | None = None
    for branch in branches:
        last_seq = extent.get(branch.id, (0, 0))[0]
        for row in _rows(thread, branch_id=branch.id, last_seq=last_seq, batch_size=batch_size):
            try:
                payload = _opened(row, branch=branch.name, previous=previous)
            except IntegrityFailure as exc:
                yield {"type": "error", "error": {"code": exc.code, "message": exc.message, "detail": exc.detail}}
                return
            previous = (row.id, bytes(row.integrity))
            yield _checkpoint_record(row, branch=branch.name, payload=payload)
            written += 1
    yield {"type": "end", "checkpoints": written}


def _rows(thread: Thread, *, branch_id: int, last_seq: int, batch_size: int) -> Iterator[Checkpoint]:
    """A branch's checkpoints up to `last_seq`, oldest first, read at most `batch_size` at a time."""
    rows = Checkpoint.objects.filter(thread=thread, branch_id=branch_id, seq__lte=last_seq).order_by("seq")
    after, size = 0, batch_size
    while after < last_seq:
        batch = list(rows.filter(seq__gt=after)[:size])
        yield from batch
        if len(batch) < size:
            return
        after = batch[-1].seq
        payload_bytes = sum(len(row.payload) for row in batch)
        size = max(1, min(batch_size, size * BATCH_BYTES // max(payload_bytes, 1)))


def _opened(row: Checkpoint, *, branch: str, previous: tuple[UUID, bytes] | None) -> Any:
    """The row's payload, once its MAC (chained from its parent's) is checked."""
    parent_mac: bytes | None = None
    if row.parent_id is not None:
        if previous is not None and previous[0] == row.parent_id:
            parent_mac = previous[1]
        else:  # a branch's first checkpoint: its parent is on an earlier branch
            found = Checkpoint.objects.filter(pk=row.parent_id).values_list("integrity", flat=True).first()
            parent_mac = bytes(found) if found is not None else None
    where = f"Checkpoint {row.id} (branch {branch}, seq {row.seq})"
    detail = {"checkpoint": str(row.id), "seq": row.seq}
    if row.parent_id is not None and parent_mac is None:
        raise IntegrityFailure(f"{where} has lost its parent {row.parent_id}. The export stops here.", detail=detail)
    if not mac_matches(row, parent_integrity=parent_mac):
        raise IntegrityFailure(
            f"{where} fails its integrity check: it was altered outside Quicksave. The export stops here.",
            detail=detail,
        )
    try:
        return storage.decode_payload(row)
    except ValueError as exc:
        raise IntegrityFailure(f"{where} has a payload that does not decode ({exc}).", detail=detail) from None


def _checkpoint_record(row: Checkpoint, *, branch: str, payload: Any) -> dict[str, Any]:
    return {
        "type": "checkpoint", "id": str(row.id), "parent": _str(row.parent_id), "branch": branch, "seq": row.seq,
        "step": row.step, "label": row.label, "status": row.status, "source": row.source, "model": row.model,
        "metadata": row.metadata, "schema_version": row.schema_version, "created_at": row.created_at.isoformat(),
        "state" if row.kind == PayloadKind.SNAPSHOT else "patch": payload,
    }  # fmt: skip


def _str(value: UUID | None) -> str | None:
    return str(value) if value is not None else None


# --------------------------------------------------------------------------- import


def max_line_bytes() -> int:
    """The longest line (newline included) import reads.

    A line holds at most one state (a stored delta is never larger than its state) and one
    metadata object, each written as the store measures it; twice that, plus LINE_ROOM, is
    generous, and a file that is one endless line (/dev/zero) stops there instead of filling memory.
    """
    state: int = settings.QUICKSAVE_MAX_STATE_BYTES
    metadata: int = settings.QUICKSAVE_MAX_METADATA_BYTES
    return 2 * (state + metadata) + LINE_ROOM


class InvalidTrajectory(DomainError):
    """An import file (or the installation it goes into) that cannot take the trajectory."""

    code = "invalid_trajectory"
    status = 400

    def __init__(self, message: str, *, line: int | None = None, field: str | None = None) -> None:
        where = [f"line {line}"] if line else []
        if field:
            where.append(f"field `{field}`")
        super().__init__(f"{', '.join(where)}: {message}" if where else message, detail={"line": line, "field": field})


@dataclass(frozen=True)
class BranchHeader:
    name: str
    fork_point: UUID | None
    checkpoints: int


@dataclass(frozen=True)
class ThreadHeader:
    id: UUID
    agent: str
    external_id: str | None
    status: str
    metadata: dict[str, Any]
    active_branch: str
    branches: tuple[BranchHeader, ...]
    checkpoints: int


@dataclass(frozen=True)
class CheckpointLine:
    id: UUID
    parent: UUID | None
    branch: str
    state: dict[str, Any] | None
    patch: list[Any] | None
    fields: dict[str, Any]  # step, label, status, source, model, metadata, schema_version


Progress = Callable[[int, int], None]


def import_thread(
    *, file: IO[bytes], agent: Agent | None = None, external_id: str | None = None, progress: Progress | None = None
) -> Thread:
    """Restore a trajectory from a seekable binary file as a new thread; returns it.

    `agent` defaults to the agent the file names (which must exist here) and `external_id`
    to the file's. The file is read twice: checked whole first, then written in one
    transaction, so a bad line or a refused write leaves nothing behind.
    """
    header = check_file(file)
    if agent is None:
        agent = Agent.objects.filter(name=header.agent).first()
        if agent is None:
            raise InvalidTrajectory(
                f"no agent here is named '{header.agent}'; create it (manage.py createagentkey {header.agent}) "
                "or import under another agent.",
                line=1, field="agent",
            )  # fmt: skip
    file.seek(0)
    with transaction.atomic():
        thread, created = storage.create_thread(
            agent=agent, external_id=external_id or header.external_id, metadata=header.metadata
        )
        if not created:
            raise InvalidTrajectory(
                f"agent '{agent.name}' already has thread {thread.pk} with external_id "
                f"'{thread.external_id}'; import under another external_id.",
                line=1, field="external_id",
            )  # fmt: skip
        _write(thread, header, _records(file, header), progress)
    thread.refresh_from_db()
    return thread


def _write(
    thread: Thread, header: ThreadHeader, lines: Iterable[tuple[int, CheckpointLine]], progress: Progress | None
) -> None:
    forks = {branch.name: branch.fork_point for branch in header.branches}
    opened = {storage.MAIN_BRANCH}
    new_ids: dict[UUID, UUID] = {}

    def open_branch(name: str) -> None:
        fork_point = forks[name]
        assert fork_point is not None  # check_file allows no other branch without one
        branch = storage.start_branch(thread=thread, at=new_ids[fork_point], name=name)
        opened.add(name)
        if name == header.active_branch:
            # Before the branch's first write, as forks do: the store moves the thread's
            # head, step and status only for writes on the active branch.
            thread.active_branch = branch
            thread.save(update_fields=["active_branch"])

    done = 0
    for number, line in lines:
        if line.branch not in opened:
            open_branch(line.branch)
        try:
            written = storage.append_checkpoint(
                thread=thread, parent=new_ids[line.parent] if line.parent else None, state=line.state,
                patch=line.patch, branch=line.branch, **line.fields,
            )  # fmt: skip
        except StoreError as exc:
            raise InvalidTrajectory(exc.message, line=number, field=exc.detail.get("field")) from None
        new_ids[line.id] = written.pk
        done += 1
        if progress is not None:
            progress(done, header.checkpoints)
    for branch in header.branches:
        if branch.name not in opened:
            open_branch(branch.name)
    Thread.objects.filter(pk=thread.pk).update(status=header.status)
    storage.record_event(thread=thread, type="thread.imported", data={
        "agent": thread.agent.name, "source_thread": str(header.id), "checkpoints": done,
        "branches": len(header.branches), "status": header.status,
    })  # fmt: skip


# --------------------------------------------------------------------------- checking a file


def check_file(file: IO[bytes]) -> ThreadHeader:
    """Read the whole file and check every line and the tree they make; writes nothing."""
    lines = _json_lines(file)
    header: ThreadHeader | None = None
    heads: dict[str, UUID | None] = {}  # the last checkpoint of each branch so far, or its fork point
    counts: dict[str, int] = {}
    seen: set[UUID] = set()
    number = 0
    for number, obj in lines:
        if header is None:
            header = _thread_header(obj, number)
            heads = {branch.name: branch.fork_point for branch in header.branches}
            counts = dict.fromkeys(heads, 0)
            continue
        kind = obj.get("type")
        if kind == "end":
            _check_end(obj, number, header, counts, seen)
            for extra, _ in lines:
                raise InvalidTrajectory("nothing may follow the `end` line.", line=extra)
            return header
        line = _checkpoint_line(obj, number, header)
        if line.id in seen:
            raise InvalidTrajectory(f"checkpoint {line.id} appears twice.", line=number, field="id")
        expected = heads[line.branch]
        if line.parent != expected:
            what = "the previous checkpoint" if counts[line.branch] else "the fork point"
            raise InvalidTrajectory(
                f"must be {expected or 'null'} ({what} of branch '{line.branch}'), not {line.parent or 'null'}.",
                line=number, field="parent",
            )  # fmt: skip
        if line.parent is not None and line.parent not in seen:
            raise InvalidTrajectory(f"{line.parent} is not an earlier checkpoint.", line=number, field="parent")
        seen.add(line.id)
        heads[line.branch] = line.id
        counts[line.branch] += 1
    if header is None:
        raise InvalidTrajectory("the file is empty; it should start with a `thread` line.", line=1)
    raise InvalidTrajectory(
        "the file ends without its `end` line: it was cut short. Export the thread again.", line=number + 1
    )


def _records(file: IO[bytes], header: ThreadHeader) -> Iterator[tuple[int, CheckpointLine]]:
    """The checkpoint lines of a file check_file has passed."""
    for number, obj in _json_lines(file):
        if number > 1 and obj.get("type") == "checkpoint":
            yield number, _checkpoint_line(obj, number, header)


def raw_lines(file: IO[bytes]) -> Iterator[tuple[int, bytes]]:
    """Each line of an import file with its number; one longer than `max_line_bytes()` is refused
    before more of it is read."""
    limit = max_line_bytes()
    for number, raw in enumerate(iter(lambda: file.readline(limit + 1), b""), start=1):
        if len(raw) > limit:
            raise InvalidTrajectory(
                f"the line is longer than {limit} bytes, the limit for a line (2 * (QUICKSAVE_MAX_STATE_BYTES + "
                "QUICKSAVE_MAX_METADATA_BYTES) + 1 MiB); the import read no further.",
                line=number,
            )
        yield number, raw


def _json_lines(file: IO[bytes]) -> Iterator[tuple[int, dict[str, Any]]]:
    for number, raw in raw_lines(file):
        if not raw.strip():
            raise InvalidTrajectory("the line is blank; every line must be a JSON object.", line=number)
        try:
            # As strictly as an API body: text PostgreSQL cannot store would fail the import's writes.
            obj = loads_strict(raw.decode("utf-8"))
        except UnicodeDecodeError:
            raise InvalidTrajectory("the line is not UTF-8.", line=number) from None
        except UnstorableText as exc:
            raise InvalidTrajectory(f"the line holds {exc}, which Quicksave cannot store.", line=number) from None
        except ValueError as exc:
            raise InvalidTrajectory(f"not a JSON line ({exc}).", line=number) from None
        if not isinstance(obj, dict):
            raise InvalidTrajectory("each line must be a JSON object.", line=number)
        if obj.get("type") == "error":
            error = obj.get("error")
            message = error.get("message") if isinstance(error, dict) else None
            raise InvalidTrajectory(
                f"the export failed here and the file is incomplete: {message or 'no message'}", line=number
            )
        yield number, obj


def _thread_header(obj: dict[str, Any], number: int) -> ThreadHeader:
    check = _Fields(obj, number)
    if obj.get("type") != "thread" or obj.get("format") != FORMAT:
        raise InvalidTrajectory(
            f'the first line must be the thread header ({{"type": "thread", "format": "{FORMAT}", ...}}); '
            "is this a Quicksave export?",
            line=number, field="type",
        )  # fmt: skip
    version = obj.get("version")
    # Not just `!= VERSION`: true and 1.0 both equal 1 in Python.
    if isinstance(version, bool) or not isinstance(version, int) or version != VERSION:
        raise InvalidTrajectory(
            f"version {version!r} is not one this Quicksave reads (it reads {VERSION}).",
            line=number, field="version",
        )  # fmt: skip
    _known_keys(obj, HEADER_KEYS, number, what="the thread header")
    raw_branches = obj.get("branches")
    if not isinstance(raw_branches, list) or not raw_branches:
        raise InvalidTrajectory("must be a non-empty list, `main` first.", line=number, field="branches")
    branches: list[BranchHeader] = []
    for index, raw in enumerate(raw_branches):
        if not isinstance(raw, dict):
            raise InvalidTrajectory("must be an object.", line=number, field=f"branches[{index}]")
        _known_keys(raw, BRANCH_KEYS, number, what="a branch", prefix=f"branches[{index}].")
        item = _Fields(raw, number, prefix=f"branches[{index}].")
        branch = BranchHeader(
            name=item.string("name", max_length=100, empty=False),
            fork_point=item.uuid("fork_point", null=True),
            checkpoints=item.integer("checkpoints", minimum=0),
        )
        if index == 0 and (branch.name != storage.MAIN_BRANCH or branch.fork_point is not None):
            raise InvalidTrajectory("the first branch must be `main`, with no fork point.", line=number,
                                    field="branches[0]")  # fmt: skip
        if index > 0 and branch.fork_point is None:
            raise InvalidTrajectory("a branch other than `main` needs a fork point.", line=number,
                                    field=f"branches[{index}].fork_point")  # fmt: skip
        if branch.name in {seen.name for seen in branches}:
            raise InvalidTrajectory(f"branch '{branch.name}' is listed twice.", line=number,
                                    field=f"branches[{index}].name")  # fmt: skip
        branches.append(branch)
    header = ThreadHeader(
        id=check.uuid("id"),
        agent=check.string("agent", max_length=64, empty=False),
        external_id=check.string("external_id", max_length=255, null=True),
        status=check.choice("status", CheckpointStatus.values),
        metadata=check.mapping("metadata"),
        active_branch=check.choice("active_branch", [branch.name for branch in branches]),
        branches=tuple(branches),
        checkpoints=check.integer("checkpoints", minimum=0),
    )
    if header.checkpoints != sum(branch.checkpoints for branch in branches):
        raise InvalidTrajectory("is not the sum of the branches' `checkpoints`.", line=number, field="checkpoints")
    return header


def _checkpoint_line(obj: dict[str, Any], number: int, header: ThreadHeader) -> CheckpointLine:
    if obj.get("type") != "checkpoint":
        raise InvalidTrajectory(
            f"must be `checkpoint` (or `end` on the last line), not {obj.get('type')!r}.", line=number, field="type"
        )
    _known_keys(obj, CHECKPOINT_KEYS, number, what="a checkpoint line")
    check = _Fields(obj, number)
    has_state, has_patch = "state" in obj, "patch" in obj
    if has_state == has_patch:
        raise InvalidTrajectory("give exactly one of `state` or `patch`.", line=number, field="state")
    model = obj.get("model")
    if model is not None:
        if not isinstance(model, dict):
            raise InvalidTrajectory("must be an object or null.", line=number, field="model")
        _known_keys(model, MODEL_KEYS, number, what="a checkpoint's model", prefix="model.")
    check.integer("seq", minimum=1)  # the store gives each checkpoint its seq; the file's is only checked
    check.string("created_at", null=True)
    return CheckpointLine(
        id=check.uuid("id"),
        parent=check.uuid("parent", null=True),
        branch=check.choice("branch", [branch.name for branch in header.branches]),
        state=check.mapping("state") if has_state else None,
        patch=check.ops("patch") if has_patch else None,
        fields={
            "step": check.integer("step", minimum=0, null=True),
            "label": check.string("label", max_length=200),
            "status": check.choice("status", CheckpointStatus.values),
            "source": check.choice("source", CheckpointSource.values),
            "model": model,
            "metadata": check.mapping("metadata"),
            "schema_version": check.integer("schema_version", minimum=1),
        },
    )


def _check_end(obj: dict[str, Any], number: int, header: ThreadHeader, counts: dict[str, int], seen: set[UUID]) -> None:
    _known_keys(obj, END_KEYS, number, what="the end line")
    written = _Fields(obj, number).integer("checkpoints", minimum=0)
    if written != len(seen) or written != header.checkpoints:
        raise InvalidTrajectory(
            f"says {written} checkpoints; the file has {len(seen)} and its header says {header.checkpoints}.",
            line=number, field="checkpoints",
        )  # fmt: skip
    for branch in header.branches:
        if counts[branch.name] != branch.checkpoints:
            raise InvalidTrajectory(
                f"branch '{branch.name}' has {counts[branch.name]} checkpoints in the file; the header says "
                f"{branch.checkpoints}.",
                line=1, field="branches",
            )  # fmt: skip
        if branch.fork_point is not None and branch.fork_point not in seen:
            raise InvalidTrajectory(
                f"branch '{branch.name}' forks from {branch.fork_point}, which is not a checkpoint in the file.",
                line=1, field="branches",
            )  # fmt: skip


def _known_keys(obj: dict[str, Any], known: frozenset[str], number: int, *, what: str, prefix: str = "") -> None:
    unknown = sorted(set(obj) - known)
    if unknown:
        raise InvalidTrajectory(f"is not a field of {what}.", line=number, field=prefix + unknown[0])


class _Fields:
    """Typed reads of one line's fields, each failure naming the line and the field."""

    def __init__(self, obj: dict[str, Any], line: int, *, prefix: str = "") -> None:
        self.obj, self.line, self.prefix = obj, line, prefix

    def _fail(self, name: str, message: str) -> InvalidTrajectory:
        return InvalidTrajectory(message, line=self.line, field=self.prefix + name)

    def _get(self, name: str, *, null: bool) -> Any:
        if name not in self.obj:
            raise self._fail(name, "is missing.")
        value = self.obj[name]
        if value is None and not null:
            raise self._fail(name, "must not be null.")
        return value

    def uuid(self, name: str, *, null: bool = False) -> Any:
        value = self._get(name, null=null)
        if value is None:
            return None
        if isinstance(value, str):
            try:
                return UUID(value)
            except ValueError:
                pass
        raise self._fail(name, f"must be a UUID string, not {value!r}.")

    def string(self, name: str, *, max_length: int | None = None, empty: bool = True, null: bool = False) -> Any:
        value = self._get(name, null=null)
        if value is None:
            return None
        if not isinstance(value, str) or (not empty and not value):
            raise self._fail(name, "must be a non-empty string." if not empty else "must be a string.")
        if max_length is not None and len(value) > max_length:
            raise self._fail(name, f"must be at most {max_length} characters.")
        return value

    def integer(self, name: str, *, minimum: int, null: bool = False) -> Any:
        value = self._get(name, null=null)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self._fail(name, f"must be an integer of at least {minimum}, not {value!r}.")
        return value

    def choice(self, name: str, choices: list[str]) -> str:
        value = self._get(name, null=False)
        if value not in choices:
            raise self._fail(name, f"must be one of {', '.join(choices)}, not {value!r}.")
        return str(value)

    def mapping(self, name: str) -> dict[str, Any]:
        value = self._get(name, null=False)
        if not isinstance(value, dict):
            raise self._fail(name, "must be a JSON object.")
        return value

    def ops(self, name: str) -> list[Any]:
        value = self._get(name, null=False)
        if not isinstance(value, list):
            raise self._fail(name, "must be a list of RFC 6902 operations.")
        return value
