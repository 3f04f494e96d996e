"""Channels (endpoints), what they subscribe to, the deliveries made to them, and decision links.

Written only through `notifications.endpoints` (channels and subscriptions), `notifications.dispatch`
(queued events, deliveries and their attempts) and `notifications.links` (decision links).
"""

from __future__ import annotations

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.utils import timezone

from checkpoints.fields import SealedJSONField
from checkpoints.ids import new_id


class Kind(models.TextChoices):
    WEBHOOK = "webhook", "Webhook"
    SLACK = "slack", "Slack-compatible"
    EMAIL = "email", "Email"


class Notice(models.TextChoices):
    """What a subscription can ask to be told about."""

    APPROVAL_REQUESTED = "approval.requested", "Approval requested"
    IN_DOUBT = "approval.in_doubt", "In-doubt call filed"
    APPROVAL_EXPIRING = "approval.expiring", "Approval expiring soon"
    APPROVAL_ESCALATED = "approval.escalated", "Approval escalated"
    THREAD_FAILED = "thread.failed", "Thread failed"


class Endpoint(models.Model):
    """Where notifications go: a URL that takes signed JSON, a Slack-compatible incoming webhook, or
    email addresses. The URL and the signing secret are credentials (a Slack webhook URL is one by
    itself), so they are kept sealed (`notifications.secrets`); `url_hint` is what pages show."""

    id = models.UUIDField(primary_key=True, default=new_id, editable=False)
    name = models.CharField(max_length=100, unique=True)
    kind = models.CharField(max_length=8, choices=Kind.choices)
    # {"url": ..., "secret": ...} sealed under the master keyring, bound to this row's id.
    credentials = models.BinaryField()
    url_hint = models.CharField(max_length=200, blank=True)
    recipients = ArrayField(models.EmailField(), default=list, blank=True)
    enabled = models.BooleanField(default=True)
    # Messages carry single-use, expiring links to approve or reject from the message.
    decision_links = models.BooleanField(default=False)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.name} ({self.kind})"


class Subscription(models.Model):
    """The notices an endpoint wants, narrowed by agent, action and risk (an empty list: any).

    Action and risk narrow approval notices only; a thread that failed matches on its agent."""

    endpoint = models.ForeignKey(Endpoint, on_delete=models.CASCADE, related_name="subscriptions")
    events = ArrayField(models.CharField(max_length=24, choices=Notice.choices))
    agents = ArrayField(models.CharField(max_length=64), default=list, blank=True)
    actions = ArrayField(models.CharField(max_length=200), default=list, blank=True)
    risks = ArrayField(models.CharField(max_length=8), default=list, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"{', '.join(self.events)} to {self.endpoint_id}"


class QueuedEvent(models.Model):
    """Something to tell people about, queued by a trigger in the transaction that did it (while
    any endpoint is enabled) until the dispatcher has fanned it out: an event of interest copied
    from the event table, or `thread.failed` when a thread's status becomes failed (its `seq` is
    the thread's event seq then; it has no event of its own, so no `event_id`).

    Event ids are not commit order, so following the event table by id could skip an event
    whose transaction commits after a later one's; a queue row commits with what it reports."""

    event_id = models.BigIntegerField(null=True, blank=True)
    thread_id = models.UUIDField()
    seq = models.BigIntegerField()
    type = models.CharField(max_length=40)
    data = models.JSONField(default=dict)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.type} #{self.seq} of {self.thread_id}"


class DeliveryStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    DELIVERED = "delivered", "Delivered"
    FAILED = "failed", "Failed"  # every attempt failed; "send again" tries once more


class Delivery(models.Model):
    """One notice to one endpoint: its message (sealed under the thread's data key, since it holds
    the approval's args), and where its attempts stand.

    A pending delivery is due at `next_attempt_at`; a dispatcher claims it by moving that past the
    attempt's timeout, so a dispatcher that dies mid-attempt leaves it due again, never lost.
    Deliveries of one thread to one endpoint go out in order: one waits while an earlier is pending."""

    endpoint = models.ForeignKey(Endpoint, on_delete=models.CASCADE, related_name="deliveries", db_index=False)
    thread = models.ForeignKey("checkpoints.Thread", on_delete=models.CASCADE, related_name="+", db_index=False)
    notice = models.CharField(max_length=24, choices=Notice.choices)
    # What it reports, unique per endpoint: `event:<thread>:<seq>`, `expiring:<approval>`, and a
    # suffix for each time a person sent it again.
    key = models.CharField(max_length=200)
    approval_id = models.UUIDField(null=True, blank=True)
    body = SealedJSONField(bind=("endpoint_id", "key"))
    status = models.CharField(max_length=10, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING)
    attempts = models.IntegerField(default=0)
    next_attempt_at = models.DateTimeField(default=timezone.now)
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    response_code = models.IntegerField(null=True, blank=True)
    error = models.TextField(blank=True)
    # SHA-256 of the bytes sent (the JSON body of a webhook or Slack message, an email's text).
    body_digest = models.CharField(max_length=64, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    resend_of = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-id"]
        verbose_name_plural = "deliveries"
        constraints = [models.UniqueConstraint(fields=["endpoint", "key"], name="delivery_key_unique_per_endpoint")]
        indexes = [
            models.Index(fields=["next_attempt_at"], name="delivery_due", condition=models.Q(status="pending")),
            models.Index(
                fields=["endpoint", "thread", "id"], name="delivery_pending_order", condition=models.Q(status="pending")
            ),
            models.Index(fields=["endpoint", "-id"], name="delivery_log"),
        ]

    def __str__(self) -> str:
        return f"{self.notice} to {self.endpoint_id} ({self.status})"


class DeliveryAttempt(models.Model):
    """One try at sending a delivery: what came back, or why nothing did."""

    delivery = models.ForeignKey(Delivery, on_delete=models.CASCADE, related_name="attempt_log")
    number = models.IntegerField()
    started_at = models.DateTimeField()
    duration_ms = models.IntegerField()
    response_code = models.IntegerField(null=True, blank=True)
    error = models.TextField(blank=True)

    class Meta:
        ordering = ["number"]

    def __str__(self) -> str:
        return f"attempt {self.number} of {self.delivery_id}"


class ExpiryNotice(models.Model):
    """An approval whose "expiring soon" notices were fanned out, so they go out once."""

    approval_id = models.UUIDField(primary_key=True)
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return str(self.approval_id)


class DecisionLink(models.Model):
    """A single-use, expiring link to approve or reject one approval from a message.

    The link's token is in the message only; the row keeps its SHA-256. Using it still needs a
    signed-in person allowed to decide, and decides through `approvals.services.decide` as them."""

    id = models.UUIDField(primary_key=True, default=new_id, editable=False)
    approval = models.ForeignKey("approvals.ApprovalRequest", on_delete=models.CASCADE, related_name="+")
    decision = models.CharField(max_length=8)  # approve or reject
    token_digest = models.CharField(max_length=64, unique=True)
    endpoint = models.ForeignKey(Endpoint, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    expires_at = models.DateTimeField()
    used_at = models.DateTimeField(null=True, blank=True)
    used_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"{self.decision} {self.approval_id}"
