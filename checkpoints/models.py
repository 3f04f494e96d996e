"""Threads, branches, checkpoints, cached tool results and the per-thread event log.

Rows are written only through `checkpoints.storage`; see that package for how a
checkpoint's state is kept (a delta against its parent, with snapshots).
"""

from __future__ import annotations

from typing import Any

from django.contrib.postgres.indexes import GinIndex
from django.db import models
from django.db.models.fields.json import KT
from django.db.models.functions import Collate
from django.utils import timezone

from checkpoints.fields import SealedJSONField
from checkpoints.ids import new_id
from quicksave_agents.models import Agent


class ThreadStatus(models.TextChoices):
    RUNNING = "running", "Running"
    WAITING_FOR_APPROVAL = "waiting_for_approval", "Waiting for approval"
    PAUSED = "paused", "Paused"
    COMPLETED = "completed", "Completed"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"


class Thread(models.Model):
    """One run of an agent: a tree of checkpoints split into named branches."""

    id = models.UUIDField(primary_key=True, default=new_id, editable=False)
    agent = models.ForeignKey(Agent, on_delete=models.PROTECT, related_name="threads", db_index=False)
    external_id = models.CharField(max_length=255, null=True, blank=True)
    status = models.CharField(max_length=24, choices=ThreadStatus.choices, default=ThreadStatus.RUNNING)
    metadata = models.JSONField(default=dict, blank=True)
    # The person the thread runs for: whoever created it signed in, or the person an agent named when
    # it started the thread. An approval policy may keep them from approving its requests.
    started_by = models.ForeignKey(
        "auth.User", null=True, blank=True, on_delete=models.SET_NULL, related_name="+", db_index=False
    )
    active_branch = models.ForeignKey(
        "Branch", null=True, blank=True, on_delete=models.SET_NULL, related_name="+", db_index=False
    )
    # Denormalised from the active branch's head so the list shows and filters it
    # without a join. Written only by the store, which keeps it pointing at a real row.
    head = models.ForeignKey(
        "Checkpoint",
        null=True,
        blank=True,
        on_delete=models.DO_NOTHING,
        related_name="+",
        db_index=False,
        db_constraint=False,
    )
    step = models.IntegerField(null=True, blank=True)
    event_seq = models.BigIntegerField(default=0, help_text="Seq of the latest event in this thread.")
    created_at = models.DateTimeField(default=timezone.now)
    # Moved by each write at most once a second (see store._APPEND_SQL).
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-updated_at"]
        permissions = [
            ("decide_approval", "Can approve or reject a suspended step"),
            ("fork_thread", "Can rewind, edit state and branch a thread"),
            ("cancel_thread", "Can cancel or resume a thread"),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["agent", "external_id"],
                condition=models.Q(external_id__isnull=False),
                name="thread_external_id_unique_per_agent",
            ),
        ]
        indexes = [
            models.Index(fields=["agent", "status", "-updated_at"], name="thread_agent_status_updated"),
            models.Index(fields=["status", "-updated_at"], name="thread_status_updated"),
            models.Index(fields=["-updated_at", "id"], name="thread_updated"),
            GinIndex(fields=["metadata"], name="thread_metadata_gin", opclasses=["jsonb_path_ops"]),
        ]

    def __str__(self) -> str:
        return str(self.id)


class Branch(models.Model):
    """A named line of checkpoints in a thread; `main` first, one more per fork.

    A branch's head is its checkpoint with the highest seq; the unique
    (thread, branch, seq) index is what lets exactly one writer extend it.
    """

    thread = models.ForeignKey(Thread, on_delete=models.CASCADE, related_name="branches", db_index=False)
    name = models.CharField(max_length=100)
    # Where the branch starts: its first checkpoint's parent (None for `main`).
    fork_point = models.ForeignKey(
        "Checkpoint", null=True, blank=True, on_delete=models.PROTECT, related_name="+", db_index=False
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["created_at", "id"]
        constraints = [models.UniqueConstraint(fields=["thread", "name"], name="branch_name_unique_per_thread")]
        verbose_name_plural = "branches"

    def __str__(self) -> str:
        return self.name


# A checkpoint records the status its thread had at that step, so they share one vocabulary.
CheckpointStatus = ThreadStatus


class PayloadKind(models.IntegerChoices):
    SNAPSHOT = 1, "snapshot"
    DELTA = 2, "delta"


class CheckpointSource(models.TextChoices):
    AGENT = "agent"
    HUMAN = "human"


class Checkpoint(models.Model):
    """An immutable node in the thread's tree.

    `payload` holds either the full state (a snapshot) or the RFC 6902 patch from
    the parent's state (a delta), encoded by `checkpoints.storage.codec`. `integrity`
    chains an HMAC over the parent's integrity and this row's payload and fields,
    so altering any row breaks every descendant's check.
    """

    id = models.UUIDField(primary_key=True, default=new_id, editable=False)
    # The (thread, branch, seq) unique index serves the thread and branch lookups,
    # so the foreign keys carry no index of their own. `thread` has no database
    # constraint either: the branch's constraint already proves the thread exists,
    # and every check left off this table is time saved on every write.
    thread = models.ForeignKey(
        Thread, on_delete=models.CASCADE, related_name="checkpoints", db_index=False, db_constraint=False
    )
    branch = models.ForeignKey(Branch, on_delete=models.CASCADE, related_name="checkpoints", db_index=False)
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.PROTECT, related_name="children", db_index=False
    )
    seq = models.IntegerField()
    step = models.IntegerField(null=True, blank=True)
    label = models.CharField(max_length=200, blank=True)
    status = models.CharField(max_length=24, choices=CheckpointStatus.choices, default=CheckpointStatus.RUNNING)
    source = models.CharField(max_length=8, choices=CheckpointSource.choices, default=CheckpointSource.AGENT)
    model_name = models.CharField(max_length=200, blank=True)
    model_version = models.CharField(max_length=100, blank=True)
    temperature = models.FloatField(null=True, blank=True)
    top_p = models.FloatField(null=True, blank=True)
    seed = models.BigIntegerField(null=True, blank=True)
    metadata = models.JSONField(default=dict, blank=True)
    schema_version = models.IntegerField(default=1)
    kind = models.SmallIntegerField(choices=PayloadKind.choices)
    payload = models.BinaryField()
    # Deltas replayed since the last snapshot on the path to this checkpoint (0 for a
    # snapshot) and their encoded size: the store snapshots when the chain would
    # cost more to replay than a snapshot costs to store.
    chain_length = models.IntegerField(default=0)
    chain_bytes = models.IntegerField(default=0)
    state_bytes = models.IntegerField(help_text="Size of the materialised state as canonical JSON.")
    integrity = models.BinaryField(max_length=32)
    created_at = models.DateTimeField(default=timezone.now)
    # The seq of this checkpoint's `checkpoint.created` event in its thread's log: the event is this
    # row (storage.events_after reads it beside the `Event` table). Null for a checkpoint written
    # when its event was an `Event` row, and for one whose row compaction rewrote (its event is
    # an `Event` row again, saying what the row said when it was published).
    event_seq = models.BigIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["thread", "branch", "seq"]
        constraints = [
            models.UniqueConstraint(fields=["thread", "branch", "seq"], name="checkpoint_timeline"),
        ]
        indexes = [
            # QuicksaveSaver finds LangGraph checkpoints by their id and lists them newest first
            # (ids are time-ordered, compared as bytes). Partial: rows not written by LangGraph,
            # the store's hot path, pay nothing for it.
            models.Index(
                "thread", Collate(KT("metadata__lg_id"), "C"), name="checkpoint_langgraph_id",
                condition=models.Q(metadata__has_key="lg_id"),
            ),
            # A socket's replay of the checkpoints' events after the seq it last saw (events_after).
            models.Index(
                fields=["thread", "event_seq"], name="checkpoint_event_seq",
                condition=models.Q(event_seq__isnull=False),
            ),
        ]  # fmt: skip

    def __str__(self) -> str:
        return f"{self.thread_id}@{self.seq}"

    @property
    def model(self) -> dict[str, Any]:
        return {
            "name": self.model_name or None,
            "version": self.model_version or None,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "seed": self.seed,
        }


class MaterialisedHead(models.Model):
    """A branch's state as materialised by the last read that had to replay many deltas for it.

    A cold read starts from here instead of the last snapshot when this checkpoint lies on the
    path it replays (the branch head, or a checkpoint since the last snapshot), so it replays
    only the deltas written after it. Never needed: a missing, stale or forged row only means a
    longer replay. `checkpoint_id` is no foreign key: compaction deletes and rewrites rows, and a
    reader ignores a head whose checkpoint is gone or whose `integrity` is no longer its MAC.
    """

    branch = models.OneToOneField(Branch, primary_key=True, on_delete=models.CASCADE, related_name="+")
    checkpoint_id = models.UUIDField()
    seq = models.IntegerField()
    # The checkpoint's integrity MAC when its state was materialised.
    integrity = models.BinaryField(max_length=32)
    # The state, framed by codec.encode and sealed like a checkpoint's payload.
    payload = models.BinaryField()
    # HMAC over all of the above (codec.head_mac): a row forged outside Quicksave is ignored.
    mac = models.BinaryField(max_length=32)
    updated_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"branch {self.branch_id} at {self.seq}"


class ThreadKey(models.Model):
    """A thread's data key, wrapped (AES-256-GCM) by the master key `master_key_id` names.

    Kept apart from the thread so that rotating master keys rewrites only these rows and
    deleting a thread's key (crypto-shredding) leaves its rows unreadable everywhere.
    """

    thread = models.OneToOneField(Thread, primary_key=True, on_delete=models.CASCADE, related_name="+")
    master_key_id = models.CharField(max_length=32)
    wrapped = models.BinaryField()
    created_at = models.DateTimeField(default=timezone.now)
    rotated_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"data key of {self.thread_id} under {self.master_key_id}"


class Blob(models.Model):
    """A large value of a thread's states, kept once in blob storage (see checkpoints/storage/blobs.py).

    Payloads refer to it by `sha256`; the file's name is derived from the thread and the digest.
    """

    thread = models.ForeignKey(Thread, on_delete=models.CASCADE, related_name="+", db_index=False)
    sha256 = models.CharField(max_length=64)
    size = models.BigIntegerField()
    type = models.CharField(max_length=8)
    created_at = models.DateTimeField(default=timezone.now)
    # Bumped by every write that refers to it; garbage collection spares recently used blobs,
    # which a write in flight may be about to reference.
    used_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["thread", "sha256"], name="blob_unique_per_thread")]

    def __str__(self) -> str:
        return f"{self.sha256[:12]} ({self.size} bytes)"


class SnapshotChunk(models.Model):
    """A piece of a large snapshot's canonical JSON, kept once per thread (checkpoints/storage/chunks.py).

    Snapshots name their chunks by `digest` (a keyed hash of the piece's bytes), so the older part
    of a growing state is stored once however many snapshots hold it. `data` is the piece framed
    and sealed like a payload, bound to the thread and the digest.
    """

    pk = models.CompositePrimaryKey("thread", "digest")
    thread = models.ForeignKey(Thread, on_delete=models.CASCADE, related_name="+", db_index=False)
    digest = models.BinaryField(max_length=32)
    data = models.BinaryField()
    # Bumped (at most once a minute) by every snapshot that names it; garbage collection spares
    # recently used chunks, which a snapshot being written may be about to name.
    used_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"chunk {bytes(self.digest).hex()[:12]} of {self.thread_id}"


class DeletedThread(models.Model):
    """A thread this installation deleted, until `manage.py prune` has removed its blob files.

    Blob storage may be shared (one bucket, several installations); only threads known to be
    deleted here, or alive here, have their files collected.
    """

    thread_id = models.UUIDField(primary_key=True)
    deleted_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"{self.thread_id} (deleted {self.deleted_at:%Y-%m-%d})"


class ToolResult(models.Model):
    """A tool call's result cached per thread, so a resumed agent never repeats the call."""

    thread = models.ForeignKey(Thread, on_delete=models.CASCADE, related_name="tool_results", db_index=False)
    key = models.CharField(max_length=128)
    tool = models.CharField(max_length=200, blank=True)
    result = SealedJSONField(bind=("thread_id", "key"))
    checkpoint = models.ForeignKey(
        Checkpoint, null=True, blank=True, on_delete=models.SET_NULL, related_name="+", db_index=False
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["created_at"]
        constraints = [models.UniqueConstraint(fields=["thread", "key"], name="tool_result_key_unique")]
        # QuicksaveSaver reads a LangGraph checkpoint's pending writes by tool name
        # (`langgraph:write:<checkpoint id>`) on every run: without this a read scans the thread.
        indexes = [models.Index(fields=["thread", "tool"], name="tool_result_by_tool")]

    def __str__(self) -> str:
        return f"{self.tool or 'tool'}:{self.key}"


class Event(models.Model):
    """Per-thread ordered log, written in the same transaction as the change it reports.

    `seq` comes from the thread row's counter, bumped under that row's lock, so
    events of one thread commit in seq order and a reader never sees a gap fill in later.
    A checkpoint's own event (`checkpoint.created`) is its row, numbered by `Checkpoint.event_seq`
    from the same counter; this table holds every other event, and the checkpoint events of rows
    written before that or rewritten by compaction.
    """

    # Written in the same statement that locks the thread row, so the row exists;
    # no database constraint to check on every checkpoint.
    thread = models.ForeignKey(
        Thread, on_delete=models.CASCADE, related_name="events", db_index=False, db_constraint=False
    )
    seq = models.BigIntegerField()
    type = models.CharField(max_length=40)
    data = models.JSONField(default=dict)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["thread", "seq"]
        constraints = [models.UniqueConstraint(fields=["thread", "seq"], name="event_seq_unique_per_thread")]
        indexes = [
            # The thread page's story (checkpoints.presentation.story): the events between checkpoints
            # without walking every checkpoint's event. Built concurrently (migration 0013).
            models.Index(
                fields=["thread", "created_at", "seq"],
                name="event_story",
                condition=~models.Q(type="checkpoint.created"),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.type} #{self.seq}"


class ChangedPath(models.Model):
    """A JSON pointer (prefix) a checkpoint's stored change touched: the index behind a value's
    history (`checkpoints/storage/history.py`), so a history reads only the patches that touched
    the path asked about.

    Derived data, filled by the first history read of a thread and extended by later ones; a
    checkpoint of a thread's branches is indexed once its branch's `ChangedPathMark` has passed it.
    `checkpoint_id` is no foreign key: compaction rewrites rows, and the marks find out (their MAC).
    """

    thread = models.ForeignKey(Thread, on_delete=models.CASCADE, related_name="+", db_index=False)
    # Compared byte-wise, so every pointer under `/a` lies in one range, [`/a/`, `/a0`).
    path = models.TextField(db_collation="C")
    checkpoint_id = models.UUIDField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["thread", "path", "checkpoint_id"], name="changed_path_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.checkpoint_id} {self.path}"


class ChangedPathMark(models.Model):
    """How far a branch's checkpoints are indexed in `ChangedPath`: up to `seq`, whose checkpoint
    had the MAC `integrity` then. A MAC chains from every row before it, so a mark whose checkpoint
    no longer has that MAC (compaction rewrote the chain) sends the thread's index to be rebuilt."""

    branch = models.OneToOneField(Branch, primary_key=True, on_delete=models.CASCADE, related_name="+")
    thread = models.ForeignKey(Thread, on_delete=models.CASCADE, related_name="+", db_index=False)
    checkpoint_id = models.UUIDField()
    seq = models.IntegerField()
    integrity = models.BinaryField(max_length=32)

    def __str__(self) -> str:
        return f"branch {self.branch_id} indexed to {self.seq}"
