"""Agents (a named kind of agent) and the API keys that let one agent write its threads."""

from __future__ import annotations

from django.db import models
from django.utils import timezone
from django.utils.functional import cached_property

from checkpoints.fields import SealedJSONField, unreadable
from checkpoints.ids import new_id


class Agent(models.Model):
    name = models.SlugField(max_length=64, unique=True)
    version = models.CharField(max_length=32, default="1")
    description = models.TextField(blank=True)
    state_schema = models.JSONField(null=True, blank=True, help_text="Optional JSON Schema for the state.")
    action_schemas = models.JSONField(
        default=dict, blank=True, help_text="{action: JSON Schema} that edited approval args must satisfy."
    )
    created_at = models.DateTimeField(auto_now_add=True)
    # Retention, applied by `manage.py prune` (checkpoints/retention.py); set with `manage.py retention`.
    # NULL keeps threads forever / never compacts.
    retain_completed_days = models.PositiveIntegerField(
        null=True, blank=True, help_text="Delete completed threads this many days after their last update."
    )
    retain_failed_days = models.PositiveIntegerField(
        null=True, blank=True, help_text="Delete failed threads this many days after their last update."
    )
    compact_after = models.PositiveIntegerField(
        null=True, blank=True, help_text="Compact threads that have more than this many checkpoints."
    )
    compact_keep_every = models.PositiveIntegerField(
        null=True, blank=True, help_text="When compacting, keep every Nth checkpoint of each branch."
    )

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                condition=(models.Q(retain_completed_days__isnull=True) | models.Q(retain_completed_days__gte=1))
                & (models.Q(retain_failed_days__isnull=True) | models.Q(retain_failed_days__gte=1)),
                name="agent_retention_days_positive",
            ),
            # Compaction needs both numbers, and keeping every checkpoint (1) is no compaction.
            models.CheckConstraint(
                condition=models.Q(compact_after__isnull=True, compact_keep_every__isnull=True)
                | models.Q(compact_after__gte=1, compact_keep_every__gte=2),
                name="agent_compaction_complete",
            ),
        ]

    def __str__(self) -> str:
        return self.name


class AgentKey(models.Model):
    """An API key scoped to one agent. Only a SHA-256 of the secret is kept."""

    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="keys")
    prefix = models.CharField(max_length=16, unique=True, help_text="Public part, shown in lists.")
    secret_hash = models.CharField(max_length=64)
    label = models.CharField(max_length=100, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.agent.name}:{self.prefix}"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None


class RunStatus(models.TextChoices):
    QUEUED = "queued", "Queued"
    RUNNING = "running", "Running"
    COMPLETED = "completed", "Completed"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"


class RunReason(models.TextChoices):
    START = "start", "Start"
    APPROVAL = "approval", "Approval decided"
    FORK = "fork", "Fork"
    MANUAL = "manual", "Manual resume"
    RECOVERY = "recovery", "Crash recovery"


class Run(models.Model):
    """A resume job: continue thread T from checkpoint C because of R.

    A worker (or an external agent) claims it under a lease and keeps the lease
    with heartbeats; a run whose lease ran out is claimed again by someone else.
    """

    id = models.UUIDField(primary_key=True, default=new_id, editable=False)
    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="runs", db_index=False)
    thread = models.ForeignKey("checkpoints.Thread", on_delete=models.CASCADE, related_name="runs")
    checkpoint = models.ForeignKey("checkpoints.Checkpoint", on_delete=models.CASCADE, related_name="+", db_index=False)
    reason = models.CharField(max_length=16, choices=RunReason.choices)
    approval = models.ForeignKey(
        "approvals.ApprovalRequest", null=True, blank=True, on_delete=models.SET_NULL, related_name="runs"
    )
    status = models.CharField(max_length=16, choices=RunStatus.choices, default=RunStatus.QUEUED)
    attempts = models.IntegerField(default=0)
    claimed_by = models.CharField(max_length=200, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # The W3C trace context (traceparent, tracestate) of the request that queued the run, so its
    # resume continues that trace; empty without tracing (quicksave.telemetry). Nullable, so the
    # previous release, which does not know the column, still queues runs during an upgrade.
    trace_context = models.JSONField(default=dict, blank=True, null=True)

    class Meta:
        ordering = ["created_at"]
        indexes = [
            # What claim() scans: an agent's open runs, oldest first.
            models.Index(
                fields=["agent", "created_at"],
                name="run_claimable",
                condition=models.Q(status__in=["queued", "running"]),
            ),
        ]

    def __str__(self) -> str:
        return f"run {self.pk} ({self.reason}, {self.status})"


class ToolCallState(models.TextChoices):
    PENDING = "pending", "Pending"  # the intent is recorded; the effect may or may not have happened
    DONE = "done", "Done"  # the result is recorded
    IN_DOUBT = "in_doubt", "In doubt"  # a later attempt found it pending: a person decides
    RETRY = "retry", "Run again"  # a person said it did not happen: the next attempt runs it


class ToolCall(models.Model):
    """One side-effecting call an agent makes: its intent, written before the call runs, and its result.

    `key` is the call's idempotency key, the same every time a step is replayed from the same
    checkpoint (quicksave_agents.tool_calls.call_key), and handed to the tool. Written only through
    quicksave_agents.tool_calls; every write of a run's attempt is fenced (quicksave_agents.fencing).
    """

    thread = models.ForeignKey(
        "checkpoints.Thread", on_delete=models.CASCADE, related_name="tool_calls", db_index=False
    )
    key = models.CharField(max_length=128)
    tool = models.CharField(max_length=200)
    # SHA-256 of the canonical JSON of [tool, args]: a replay that calls something else at the
    # same place is refused instead of handed this call's result.
    args_digest = models.CharField(max_length=64)
    args = SealedJSONField(bind=("thread_id", "key"))
    idempotent = models.BooleanField(default=False)
    state = models.CharField(max_length=16, choices=ToolCallState.choices, default=ToolCallState.PENDING)
    # The attempt that last started the call: the one that died, when it is in doubt.
    run = models.ForeignKey(
        Run, null=True, blank=True, on_delete=models.DO_NOTHING, db_constraint=False, db_index=False,
        related_name="+",
    )  # fmt: skip
    attempt = models.IntegerField(null=True, blank=True)
    starts = models.IntegerField(default=1, help_text="How many times the call was started.")
    result = SealedJSONField(null=True, blank=True, bind=("thread_id", "key"))
    started_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["started_at"]
        constraints = [models.UniqueConstraint(fields=["thread", "key"], name="tool_call_key_unique")]

    def __str__(self) -> str:
        return f"{self.tool} ({self.state})"

    @cached_property
    def unreadable(self) -> str:
        """Why this call's sealed args or result do not open ("" when they do): an altered row, or a
        data key that no longer unwraps."""
        return unreadable(self, "args", "result")
