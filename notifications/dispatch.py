"""The dispatcher: turns queued events into deliveries and sends them, retrying with backoff.

Each step is a short transaction of its own, and no message is sent inside one:

1. `fan_out` takes the events the trigger queued (`QueuedEvent`), matches them against the
   enabled endpoints' subscriptions, and records one delivery per endpoint, its message built
   and sealed, then drops the queue rows. One dispatcher fans out at a time (an advisory lock),
   so the deliveries of one thread are recorded in the order of its events.
2. `notice_expiring` does the same for approvals whose deadline is near (nothing logs that).
3. `claim_due` takes due deliveries (`FOR UPDATE SKIP LOCKED`, so dispatchers in several
   processes share the work), moves each one's next attempt past the attempt's timeout and
   commits; sender threads then send them and `record` the outcome. A dispatcher that dies
   mid-send leaves its deliveries due again when that time comes: sent at least once, never lost.

A delivery waits while an earlier one of the same thread to the same endpoint is pending, so a
receiver gets a thread's notices in order even across retries. The trigger's NOTIFY wakes an idle
dispatcher at once; it polls only as a fallback.
"""

from __future__ import annotations

import logging
import math
import queue
import random
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

import httpx
import psycopg
from django.conf import settings
from django.contrib.auth.models import User
from django.db import close_old_connections, connection, connections, transaction
from django.db.models import Min
from django.utils import timezone

from approvals.models import ApprovalKind, ApprovalRequest, ApprovalStatus
from audit import trail
from checkpoints.ids import new_id
from checkpoints.models import Checkpoint, Thread
from checkpoints.storage import IntegrityFailure
from notifications import endpoints, links, messages, transports
from notifications.models import (
    DecisionLink,
    Delivery,
    DeliveryAttempt,
    DeliveryStatus,
    Endpoint,
    ExpiryNotice,
    Notice,
    QueuedEvent,
    Subscription,
)
from notifications.secrets import UnreadableCredentials
from quicksave.errors import DomainError
from quicksave.listen import Listener

log = logging.getLogger(__name__)

CHANNEL = "quicksave_notifications"
# The advisory lock one fan-out holds (any constant unique to it in this database).
FAN_OUT_LOCK = 0x51534E46
BATCH = 200
# A claimed delivery is due again this long after its attempt's timeout, should its sender die.
LEASE_MARGIN_SECONDS = 10
BACKOFF_CAP_SECONDS = 3600
PURGE_EVERY_SECONDS = 3600
# Deadlines are looked for this often (and not on every wake, which is on a request's way to its webhook).
EXPIRING_EVERY_SECONDS = 5.0
# Notices that carry decision links, when the endpoint hands them out.
DECIDABLE = (Notice.APPROVAL_REQUESTED, Notice.APPROVAL_EXPIRING, Notice.APPROVAL_ESCALATED)


def notice_of(event_type: str, data: dict[str, Any]) -> str | None:
    """The notice a queued row makes, if any (the triggers queue only these)."""
    if event_type == "approval.requested":
        return Notice.IN_DOUBT if data.get("kind") == ApprovalKind.IN_DOUBT else Notice.APPROVAL_REQUESTED
    if event_type == "approval.escalated":
        return Notice.APPROVAL_ESCALATED
    if event_type == "thread.failed":
        return Notice.THREAD_FAILED
    return None


@dataclass(frozen=True)
class Target:
    """An enabled endpoint with its subscriptions."""

    endpoint: Endpoint
    subscriptions: tuple[Subscription, ...]

    def wants(self, *, notice: str, agent: str, action: str | None, risk: str | None) -> bool:
        """Whether any subscription asks for this notice (action and risk narrow approval notices only)."""
        for subscription in self.subscriptions:
            if notice not in subscription.events or (subscription.agents and agent not in subscription.agents):
                continue
            if action is not None and subscription.actions and action not in subscription.actions:
                continue
            if risk is not None and subscription.risks and risk not in subscription.risks:
                continue
            return True
        return False


def _targets(notice: str | None = None) -> list[Target]:
    """The enabled endpoints with their subscriptions (to `notice`, if given), in one query."""
    subscriptions = Subscription.objects.filter(endpoint__enabled=True).select_related("endpoint").order_by("id")
    if notice is not None:
        subscriptions = subscriptions.filter(events__contains=[notice])
    grouped: dict[Any, list[Subscription]] = {}
    for subscription in subscriptions:
        grouped.setdefault(subscription.endpoint_id, []).append(subscription)
    return [Target(endpoint=found[0].endpoint, subscriptions=tuple(found)) for found in grouped.values()]


def _fan_out_lock() -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [FAN_OUT_LOCK])
        return bool(cursor.fetchone()[0])


def _record(
    *, endpoint: Endpoint, key: str, notice: str, approval: ApprovalRequest | None, thread_id: UUID,
    body: dict[str, Any], now: datetime,
) -> Delivery:  # fmt: skip
    delivery = Delivery(endpoint=endpoint, thread_id=thread_id, notice=notice, key=key, body=body, next_attempt_at=now,
                        approval_id=approval.pk if approval else None, created_at=now)  # fmt: skip
    delivery.save(force_insert=True)
    return delivery


def _approval_delivery(
    *, endpoint: Endpoint, key: str, notice: str, approval: ApprovalRequest, event: dict[str, Any] | None,
    occurred_at: datetime, now: datetime,
) -> Delivery:  # fmt: skip
    decide = None
    if endpoint.decision_links and notice in DECIDABLE and approval.kind == ApprovalKind.APPROVAL:
        decide = links.issue(approval=approval, endpoint=endpoint, now=now)
    body = messages.approval_body(id=key, notice=notice, approval=approval, occurred_at=occurred_at, event=event,
                                  decide=decide)  # fmt: skip
    return _record(endpoint=endpoint, key=key, notice=notice, approval=approval, thread_id=approval.thread_id,
                   body=body, now=now)  # fmt: skip


def fan_out(*, limit: int = BATCH) -> int:
    """Turn up to `limit` queued events into deliveries; returns how many events it took."""
    with transaction.atomic():
        if not _fan_out_lock():
            return 0  # another dispatcher is fanning out; it takes these too
        # Taken off the queue as they are read: one statement, and this transaction holds them.
        rows = sorted(QueuedEvent.objects.raw(_TAKE_QUEUED, [limit]), key=lambda row: row.pk)
        if not rows:
            return 0
        targets = _targets()
        approval_ids = [_uuid(row.data.get("approval")) for row in rows if row.type.startswith("approval.")]
        approvals = ApprovalRequest.objects.select_related("thread__agent", "policy__escalate_to").in_bulk(
            [value for value in approval_ids if value is not None]
        )
        failed = {row.thread_id for row in rows if row.type in _THREAD_EVENTS}
        threads = {approval.thread_id: approval.thread for approval in approvals.values()}
        threads.update(Thread.objects.select_related("agent").in_bulk(failed - set(threads)) if failed else {})
        now = timezone.now()
        for row in rows:
            try:
                with transaction.atomic():
                    _fan_out_one(row, targets, approvals, threads, now)
            except Exception:
                # One event that cannot be turned into messages must not hold up every one after it.
                log.exception("notifications: event %s #%s of thread %s was dropped", row.type, row.seq,
                              row.thread_id)  # fmt: skip
    return len(rows)


_TAKE_QUEUED = """
DELETE FROM notifications_queuedevent WHERE id IN (SELECT id FROM notifications_queuedevent ORDER BY id LIMIT %s)
RETURNING *
"""
_THREAD_EVENTS = ("thread.failed",)


def _fan_out_one(
    row: QueuedEvent, targets: list[Target], approvals: dict[Any, ApprovalRequest], threads: dict[Any, Thread],
    now: datetime,
) -> None:  # fmt: skip
    notice = notice_of(row.type, row.data)
    thread = threads.get(row.thread_id)
    if notice is None or thread is None:  # not ours, or the thread was deleted meanwhile
        return
    event = {"type": row.type, "seq": row.seq, "data": row.data}
    if notice == Notice.THREAD_FAILED:
        key = f"failed:{row.thread_id}:{row.seq}"
        event["data"] = {**row.data, "error": _failure(row.data.get("head"))}
        for target in targets:
            if target.wants(notice=notice, agent=thread.agent.name, action=None, risk=None):
                body = messages.thread_body(id=key, notice=notice, thread=thread, occurred_at=row.created_at,
                                            event=event)  # fmt: skip
                _record(endpoint=target.endpoint, key=key, notice=notice, approval=None, thread_id=thread.pk,
                        body=body, now=now)  # fmt: skip
        return
    key = f"event:{row.thread_id}:{row.seq}"
    approval = approvals.get(_uuid(row.data.get("approval")))
    if approval is None:
        log.warning("event %s #%s of thread %s names no approval; no notice sent", row.type, row.seq, row.thread_id)
        return
    # A notice asks someone to act: one decided meanwhile (quickly, or by a rule) needs nobody.
    if approval.status != ApprovalStatus.PENDING:
        return
    for target in targets:
        if target.wants(notice=notice, agent=thread.agent.name, action=approval.action, risk=approval.risk):
            _approval_delivery(endpoint=target.endpoint, key=key, notice=notice, approval=approval, event=event,
                               occurred_at=row.created_at, now=now)  # fmt: skip


def _failure(checkpoint_id: Any) -> str | None:
    """What the failed thread's head says went wrong (an in-process agent's `Fail` leaves it in the
    checkpoint's metadata), if anything."""
    found = _uuid(checkpoint_id)
    if found is None:
        return None
    metadata = Checkpoint.objects.filter(pk=found).values_list("metadata", flat=True).first() or {}
    error = metadata.get("error") if isinstance(metadata, dict) else None
    return str(error)[:500] if error else None


def _uuid(value: Any) -> UUID | None:
    try:
        return UUID(str(value))
    except ValueError:
        return None


def notice_expiring(*, now: datetime | None = None, limit: int = 100) -> int:
    """Record "expiring soon" deliveries for pending approvals whose deadline is within
    QUICKSAVE_NOTIFY_EXPIRING_SECONDS, once per approval; returns how many approvals."""
    window = settings.QUICKSAVE_NOTIFY_EXPIRING_SECONDS
    if not window:
        return 0
    now = now or timezone.now()
    with transaction.atomic():
        if not _fan_out_lock():
            return 0
        targets = _targets(Notice.APPROVAL_EXPIRING)
        if not targets:
            return 0
        soon = now + timedelta(seconds=window)
        due = list(
            ApprovalRequest.objects.filter(status=ApprovalStatus.PENDING, kind=ApprovalKind.APPROVAL)
            .filter(expires_at__gt=now, expires_at__lte=soon)
            .exclude(pk__in=ExpiryNotice.objects.values("approval_id"))
            .select_related("thread__agent", "policy__escalate_to")
            .order_by("expires_at")[:limit]
        )
        for approval in due:
            ExpiryNotice.objects.create(approval_id=approval.pk, created_at=now)
            key = f"expiring:{approval.pk}"
            for target in targets:
                if target.wants(notice=Notice.APPROVAL_EXPIRING, agent=approval.thread.agent.name,
                                action=approval.action, risk=approval.risk):  # fmt: skip
                    _approval_delivery(endpoint=target.endpoint, key=key, notice=Notice.APPROVAL_EXPIRING,
                                       approval=approval, event=None, occurred_at=now, now=now)  # fmt: skip
    return len(due)


def claim_due(*, limit: int, now: datetime | None = None) -> list[Delivery]:
    """Claim up to `limit` due deliveries of enabled endpoints, oldest first, each the earliest
    pending one of its thread and endpoint; their attempt counts go up and their next attempt
    moves past this attempt's timeout."""
    if limit <= 0:
        return []
    now = now or timezone.now()
    lease = now + timedelta(seconds=settings.QUICKSAVE_NOTIFY_TIMEOUT_SECONDS + LEASE_MARGIN_SECONDS)
    # One statement (it commits on its own): the claim is on the path from a request to its webhook.
    claimed = Delivery.objects.raw(_CLAIM, {"now": now, "lease": lease, "limit": limit})
    return sorted(claimed, key=lambda delivery: delivery.pk)


_CLAIM = """
UPDATE notifications_delivery d
SET attempts = d.attempts + 1, next_attempt_at = %(lease)s, last_attempt_at = %(now)s
WHERE d.id IN (
    SELECT c.id FROM notifications_delivery c JOIN notifications_endpoint e ON e.id = c.endpoint_id
    WHERE c.status = 'pending' AND c.next_attempt_at <= %(now)s AND e.enabled
    -- The earliest pending delivery of its thread to its endpoint: a thread's notices go out in order.
    AND NOT EXISTS (
        SELECT 1 FROM notifications_delivery p
        WHERE p.endpoint_id = c.endpoint_id AND p.thread_id = c.thread_id AND p.status = 'pending' AND p.id < c.id)
    ORDER BY c.id
    LIMIT %(limit)s
    FOR UPDATE OF c SKIP LOCKED)
RETURNING d.*
"""


def prepare(delivery: Delivery) -> transports.Message | transports.Outcome:
    """What to send for a claimed delivery, or the outcome of a delivery that cannot be sent."""
    endpoint = Endpoint.objects.filter(pk=delivery.endpoint_id).first()
    if endpoint is None:
        return transports.failed_before_sending("The channel was deleted.")
    try:
        body = delivery.body
        found = endpoints.credentials(endpoint)
    except (IntegrityFailure, UnreadableCredentials) as exc:
        return transports.failed_before_sending(str(getattr(exc, "message", exc)))
    return transports.Message(delivery_id=delivery.pk, kind=endpoint.kind, notice=delivery.notice, body=body,
                              url=found.get("url") or "", secret=found.get("secret"),
                              recipients=tuple(endpoint.recipients))  # fmt: skip


def backoff_seconds(attempts: int, *, retry_after: float | None = None) -> float:
    """How long after its `attempts`-th failure a delivery is tried again: doubling from
    QUICKSAVE_NOTIFY_RETRY_SECONDS, with jitter, at most an hour, never before a Retry-After."""
    delay = settings.QUICKSAVE_NOTIFY_RETRY_SECONDS * 2 ** (attempts - 1) * random.uniform(0.8, 1.2)
    if retry_after is not None:
        delay = max(delay, retry_after)
    return min(delay, BACKOFF_CAP_SECONDS)


def record(delivery: Delivery, outcome: transports.Outcome) -> str | None:
    """Record an attempt's outcome; returns the delivery's status, or None when it is gone (its
    channel was deleted meanwhile). A delivered one wakes the dispatchers: a later notice of the
    same thread may have waited for it."""
    now = timezone.now()
    fields: dict[str, Any] = {"response_code": outcome.response_code, "error": outcome.error[:2000]}
    if outcome.digest:
        fields["body_digest"] = outcome.digest
    if outcome.ok:
        fields.update(status=DeliveryStatus.DELIVERED, delivered_at=now, error="")
    elif outcome.permanent or delivery.attempts >= settings.QUICKSAVE_NOTIFY_MAX_ATTEMPTS:
        fields.update(status=DeliveryStatus.FAILED)
    else:
        delay = backoff_seconds(delivery.attempts, retry_after=outcome.retry_after)
        fields.update(next_attempt_at=now + timedelta(seconds=delay))
    with transaction.atomic():
        if not Delivery.objects.filter(pk=delivery.pk, status=DeliveryStatus.PENDING).update(**fields):
            return None
        DeliveryAttempt.objects.create(
            delivery_id=delivery.pk, number=delivery.attempts, started_at=outcome.started_at,
            duration_ms=outcome.duration_ms, response_code=outcome.response_code, error=outcome.error[:2000],
        )  # fmt: skip
        if fields.get("status") != DeliveryStatus.FAILED:
            wake_on_commit()
    return str(fields.get("status", DeliveryStatus.PENDING))


def send_due(*, client: httpx.Client, limit: int = BATCH) -> int:
    """Claim, send and record due deliveries one after the other (`run_notifications --once`)."""
    claimed = claim_due(limit=limit)
    for delivery in claimed:
        _attempt(delivery, client)
    return len(claimed)


def _attempt(delivery: Delivery, client: httpx.Client) -> None:
    prepared = prepare(delivery)
    outcome = prepared if isinstance(prepared, transports.Outcome) else transports.send(prepared, client=client)
    status = record(delivery, outcome)
    log.info("delivery %s (%s) attempt %s: %s %s", delivery.pk, delivery.notice, delivery.attempts,
             status or "gone", outcome.response_code or outcome.error[:200])  # fmt: skip


def wake_on_commit() -> None:
    """Wake every idle dispatcher once the current transaction commits."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, '')", [CHANNEL])


@transaction.atomic
def resend(*, delivery: Delivery, actor: User, address: str | None = None) -> Delivery:
    """Send a delivery's message again (a person's "send again"): a new delivery with the same
    message, tried at once; the old one stays in the log as it was."""
    try:
        body = delivery.body
    except IntegrityFailure as exc:
        raise DomainError(f"This delivery's message does not open ({exc.message}); it cannot be sent again.") from None
    again = Delivery(endpoint_id=delivery.endpoint_id, thread_id=delivery.thread_id, notice=delivery.notice,
                     key=f"{delivery.key.partition('+')[0]}+{new_id().hex}", approval_id=delivery.approval_id,
                     body=body, resend_of=delivery, requested_by=actor)  # fmt: skip
    again.save(force_insert=True)
    trail.record(actor=actor, action="notification_delivery.resend", target_type="notification_delivery",
                 target_id=delivery.pk, after={"delivery": again.pk, "endpoint": str(delivery.endpoint_id)},
                 address=address)  # fmt: skip
    wake_on_commit()
    return again


def purge(*, now: datetime | None = None) -> int:
    """Delete finished deliveries, used-up decision links and expiry notes older than
    QUICKSAVE_NOTIFY_KEEP_DAYS; returns how many deliveries went."""
    cutoff = (now or timezone.now()) - timedelta(days=settings.QUICKSAVE_NOTIFY_KEEP_DAYS)
    deleted, _ = Delivery.objects.filter(created_at__lt=cutoff).exclude(status=DeliveryStatus.PENDING).delete()
    DecisionLink.objects.filter(expires_at__lt=cutoff).delete()
    ExpiryNotice.objects.filter(created_at__lt=cutoff).delete()
    return deleted


def seconds_until_due(now: datetime | None = None) -> float | None:
    """How long until the next pending delivery of an enabled endpoint is due (None: none is)."""
    due = Delivery.objects.filter(status=DeliveryStatus.PENDING, endpoint__enabled=True).aggregate(at=Min(
        "next_attempt_at"))["at"]  # fmt: skip
    if due is None:
        return None
    return max((due - (now or timezone.now())).total_seconds(), 0.0)


class Dispatcher:
    """Fans out and claims in its own thread; `concurrency` sender threads send and record, so a
    slow receiver holds up one sender, not the rest."""

    def __init__(self, *, poll_seconds: float = 5.0, concurrency: int | None = None) -> None:
        if not 0.01 <= poll_seconds <= 3600:
            raise ValueError(f"The poll interval must be 0.01 to 3600 seconds; got {poll_seconds}")
        self.poll_seconds = poll_seconds
        self.concurrency = concurrency or settings.QUICKSAVE_NOTIFY_CONCURRENCY
        self.client = httpx.Client(timeout=settings.QUICKSAVE_NOTIFY_TIMEOUT_SECONDS, follow_redirects=False)
        self._work: queue.SimpleQueue[Delivery | None] = queue.SimpleQueue()
        self._in_flight = 0
        self._lock = threading.Lock()
        self._senders: list[threading.Thread] = []
        # Both run on the first round, then every so often.
        self._purged_at = -math.inf
        self._expiring_at = -math.inf

    def run_forever(self, stopping: threading.Event) -> None:
        self._senders = [
            threading.Thread(target=self._sender, name=f"notify-sender-{n}", daemon=True)
            for n in range(self.concurrency)
        ]
        for sender in self._senders:
            sender.start()
        try:
            with Listener(CHANNEL) as wakeups:
                while not stopping.is_set():
                    try:
                        busy = self.run_once()
                    except Exception:  # the database went away, say: log it, wait, try again
                        log.exception("notifications: dispatching failed")
                        busy = False
                    if not busy:
                        close_old_connections()
                        self._wait(wakeups, stopping)
        finally:
            self._stop_senders()
            self.client.close()
            connections.close_all()

    def run_once(self) -> bool:
        """Fan out what is queued, then hand due deliveries to free senders; whether it did anything."""
        moved = fan_out()
        if time.monotonic() - self._expiring_at > EXPIRING_EVERY_SECONDS:
            self._expiring_at = time.monotonic()
            moved += notice_expiring()
        if time.monotonic() - self._purged_at > PURGE_EVERY_SECONDS:
            self._purged_at = time.monotonic()
            purge()
            endpoints.reseal_stale()
        with self._lock:
            free = self.concurrency - self._in_flight
        claimed = claim_due(limit=free)
        with self._lock:
            self._in_flight += len(claimed)
        for delivery in claimed:
            self._work.put(delivery)
        return bool(moved or claimed)

    def _wait(self, wakeups: Listener, stopping: threading.Event) -> None:
        timeout = self.poll_seconds
        try:
            due = seconds_until_due()
            if due is not None:
                timeout = min(timeout, max(due, 0.01))
            wakeups.wait(timeout)
        except psycopg.Error as exc:
            log.warning("notifications: the LISTEN connection broke (%s); polling until it is back", exc)
            wakeups.close()
            stopping.wait(self.poll_seconds)
        except Exception:
            log.exception("notifications: waiting for work failed")
            stopping.wait(self.poll_seconds)

    def _sender(self) -> None:
        try:
            while (delivery := self._work.get()) is not None:
                try:
                    _attempt(delivery, self.client)
                except Exception:
                    log.exception("notifications: delivery %s failed to send or record", delivery.pk)
                finally:
                    with self._lock:
                        self._in_flight -= 1
                    close_old_connections()
        finally:
            connections.close_all()

    def _stop_senders(self) -> None:
        for _ in self._senders:
            self._work.put(None)
        for sender in self._senders:
            sender.join(timeout=settings.QUICKSAVE_NOTIFY_TIMEOUT_SECONDS + 5)


def serve(stopping: threading.Event) -> None:
    """The background service `quicksave.background` starts in `run_agents` and the embedded server."""
    Dispatcher().run_forever(stopping)
