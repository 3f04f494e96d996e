"""Long-term memory: namespaces, their items, every version of every item, what is indexed for
search, and the grants that share a namespace with another agent.

Rows are written only through `memory.store` (items, versions, index entries), `memory.spaces`
(namespaces and their data keys) and `memory.sharing` (grants); see `memory/__init__.py`.
"""

from __future__ import annotations

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.indexes import GinIndex
from django.contrib.postgres.search import SearchVectorField
from django.db import models
from django.utils import timezone

from checkpoints.ids import new_id
from quicksave_agents.models import Agent, AgentKey


class RealField(models.FloatField):  # type: ignore[type-arg]
    """A 4-byte float: an embedding's component, as pgvector's `vector` casts from `real[]`."""

    def db_type(self, connection: object) -> str:
        return "real"


class Namespace(models.Model):
    """A namespace path (`("users", "alice", "memories")`) and its data key.

    The agent that wrote the namespace's first item owns it (NULL: a person or Quicksave made
    it). Its data key is made with it and kept wrapped under the keyring's master key, as a
    thread's is; deleting the namespace destroys it (crypto-shredding)."""

    path = ArrayField(models.TextField(), unique=True)
    agent = models.ForeignKey(Agent, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    # A blackboard (memory.boards): made so, never changed, so every process may remember it.
    is_board = models.BooleanField(default=False)
    # The board's last event number; its row lock orders the board's writes.
    board_seq = models.BigIntegerField(default=0)
    master_key_id = models.CharField(max_length=32, null=True, blank=True)
    wrapped_key = models.BinaryField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["path"]
        indexes = [GinIndex(fields=["path"], name="memory_namespace_path_gin")]
        permissions = [("share_namespace", "Can share a memory namespace with another agent")]

    def __str__(self) -> str:
        return ".".join(self.path)


class Item(models.Model):
    """An item's head: its newest version, the value sealed under the namespace's data key.

    `tokens` are keyed digests of the value's fields (see memory.filters) so equality filters run
    in SQL on sealed values; `integrity` is the head version's MAC and `head_mac` binds this row's
    value to it (memory.sealing)."""

    id = models.UUIDField(primary_key=True, default=new_id, editable=False)
    namespace = models.ForeignKey(Namespace, on_delete=models.CASCADE, related_name="items", db_index=False)
    key = models.TextField()
    version = models.IntegerField()
    deleted = models.BooleanField(default=False)
    value = models.BinaryField(null=True)
    value_bytes = models.IntegerField(default=0)
    integrity = models.BinaryField()
    head_mac = models.BinaryField()
    tokens = ArrayField(models.BigIntegerField(), null=True)
    indexed = models.BooleanField(default=False)
    since_snapshot = models.IntegerField(default=0)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    expires_at = models.DateTimeField(null=True, blank=True)
    ttl_minutes = models.FloatField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["namespace", "key"], name="memory_item_namespace_key")]
        indexes = [
            models.Index(fields=["namespace", "-updated_at"], name="memory_item_recent"),
            GinIndex(fields=["tokens"], name="memory_item_tokens"),
            models.Index(
                fields=["expires_at"], name="memory_item_expiry", condition=models.Q(expires_at__isnull=False)
            ),
        ]

    def __str__(self) -> str:
        return f"{self.key} v{self.version}"


class VersionKind(models.IntegerChoices):
    SNAPSHOT = 0, "snapshot"
    DELTA = 1, "delta"  # RFC 6902 ops against the previous version's value
    DELETED = 2, "deleted"


class Writer(models.TextChoices):
    AGENT = "agent", "Agent"
    PERSON = "person", "Person"
    RULE = "rule", "Rule"
    SYSTEM = "system", "Quicksave"


class ItemVersion(models.Model):
    """One write of an item, immutable: its value (a snapshot, or a delta against the version
    before), who wrote it, from which thread and checkpoint, when, chained to the version before
    by an integrity MAC.

    Who and where are plain ids, not foreign keys: a version outlives the agent, key, person,
    thread or checkpoint it names, and its MAC covers them as written."""

    pk = models.CompositePrimaryKey("item_id", "version")
    item = models.ForeignKey(Item, on_delete=models.CASCADE, related_name="versions", db_index=False)
    version = models.IntegerField()
    kind = models.SmallIntegerField(choices=VersionKind.choices)
    payload = models.BinaryField()
    integrity = models.BinaryField()
    created_at = models.DateTimeField()
    value_bytes = models.IntegerField(default=0)
    writer = models.CharField(max_length=8, choices=Writer.choices)
    agent = models.ForeignKey(
        Agent, null=True, on_delete=models.DO_NOTHING, db_constraint=False, related_name="+", db_index=False
    )
    agent_key = models.ForeignKey(
        AgentKey, null=True, on_delete=models.DO_NOTHING, db_constraint=False, related_name="+", db_index=False
    )
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        related_name="+",
        db_index=False,
    )
    rule = models.CharField(max_length=200, blank=True, default="")
    thread_id = models.UUIDField(null=True, blank=True)
    checkpoint_id = models.UUIDField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(
                fields=["thread_id"], name="memory_version_thread", condition=models.Q(thread_id__isnull=False)
            )
        ]

    def __str__(self) -> str:
        return f"{self.item_id} v{self.version}"


class ItemRead(models.Model):
    """A version of an item read from a thread (and the checkpoint it was at, when known), when:
    recorded by memory.reads a moment after the read. Thread and checkpoint are plain ids, as a
    version's are: the record outlives them."""

    id = models.BigAutoField(primary_key=True)
    # No constraint in the database: the recording thread's insert must never block, or be blocked
    # by, the deletion of a namespace (which deletes its items' reads first, then the items).
    item = models.ForeignKey(Item, on_delete=models.CASCADE, db_constraint=False, related_name="reads", db_index=False)
    version = models.IntegerField()
    thread_id = models.UUIDField()
    checkpoint_id = models.UUIDField(null=True, blank=True)
    read_at = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["item", "-read_at"], name="memory_read_item_recent")]

    def __str__(self) -> str:
        return f"{self.item_id} v{self.version} read by {self.thread_id}"


class IndexEntry(models.Model):
    """Text of an item's indexed field, for search: full-text lexemes always, and the embedding
    an IndexConfig's function made of it, searched with pgvector where the server has it.

    These are not sealed: a search needs them as they are (as PostgresStore keeps its vectors)."""

    id = models.BigAutoField(primary_key=True)
    item = models.ForeignKey(Item, on_delete=models.CASCADE, related_name="+")
    namespace = models.ForeignKey(Namespace, on_delete=models.CASCADE, related_name="+", db_index=False)
    field = models.TextField()
    lexemes = SearchVectorField()
    embedding = ArrayField(RealField(), null=True)
    dims = models.SmallIntegerField(null=True)

    class Meta:
        indexes = [
            GinIndex(fields=["lexemes"], name="memory_index_lexemes"),
            # A vector search under a narrow prefix reads its namespaces' entries of the dimensions
            # exactly (memory.selectors._near_sql), and a namespace's deletion reads them all.
            models.Index(fields=["namespace", "dims"], name="memory_index_namespace"),
        ]

    def __str__(self) -> str:
        return self.field


class Lease(models.Model):
    """Who holds a key of a blackboard, until when, and the fencing token a write under it names.

    One row per key ever leased, taken over by the next acquire once released or expired; the
    token is the board's event number of the acquire, so a later lease has a larger one."""

    namespace = models.ForeignKey(Namespace, on_delete=models.CASCADE, related_name="+", db_index=False)
    key = models.TextField()
    holder = models.CharField(max_length=200)
    agent = models.ForeignKey(
        Agent, null=True, on_delete=models.DO_NOTHING, db_constraint=False, related_name="+", db_index=False
    )
    token = models.BigIntegerField()
    acquired_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    released_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["namespace", "key"], name="memory_lease_namespace_key")]

    def __str__(self) -> str:
        return f"{self.key} held by {self.holder}"


class BoardEvent(models.Model):
    """One change on a blackboard, numbered by the board's `board_seq`, written in the transaction
    of the change: what the live feed replays to a client that missed it. It names keys, versions
    and holders, never values (those stay sealed in the items)."""

    id = models.BigAutoField(primary_key=True)
    namespace = models.ForeignKey(Namespace, on_delete=models.CASCADE, related_name="+", db_index=False)
    seq = models.BigIntegerField()
    kind = models.CharField(max_length=32)
    key = models.TextField()
    data = models.JSONField(default=dict)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["namespace", "seq"], name="memory_boardevent_seq")]

    def __str__(self) -> str:
        return f"{self.seq} {self.kind} {self.key}"


class NamespaceGrant(models.Model):
    """A person's explicit, audited decision that `agent` may read and write every namespace whose
    path starts with `prefix`, until revoked."""

    prefix = ArrayField(models.TextField())
    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="+")
    reason = models.TextField()
    granted_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.PROTECT, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    revoke_reason = models.TextField(blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["prefix", "agent"], condition=models.Q(revoked_at__isnull=True), name="memory_grant_live"
            )
        ]

    def __str__(self) -> str:
        return f"{'.'.join(self.prefix)} → {self.agent_id}"
