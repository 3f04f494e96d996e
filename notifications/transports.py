"""Sending one message: a signed JSON POST, a Slack-compatible POST, or an email. No database here:
the dispatcher hands over what to send and records the outcome.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import httpx
from django.conf import settings
from django.core.mail import EmailMultiAlternatives
from django.utils import timezone

from notifications import messages, signing
from notifications.models import Kind

USER_AGENT = "Quicksave-Notifications/1"
# What the log keeps of a refusal's response body.
EXCERPT_CHARS = 300


@dataclass(frozen=True)
class Message:
    """Everything an attempt needs, read from the database before it starts."""

    delivery_id: int
    kind: str
    notice: str
    body: dict[str, Any]
    url: str = ""
    secret: str | None = None
    recipients: tuple[str, ...] = ()


@dataclass(frozen=True)
class Outcome:
    ok: bool
    started_at: datetime
    duration_ms: int
    response_code: int | None = None
    error: str = ""
    digest: str = ""
    # Seconds the receiver asked us to wait (Retry-After), when it did.
    retry_after: float | None = None
    # Nothing would change on another attempt (the message does not open, say).
    permanent: bool = False


def failed_before_sending(error: str) -> Outcome:
    return Outcome(ok=False, started_at=timezone.now(), duration_ms=0, error=error, permanent=True)


def send(message: Message, *, client: httpx.Client) -> Outcome:
    started_at, started = timezone.now(), time.monotonic()
    if message.kind == Kind.EMAIL:
        return _email(message, started_at, started)
    return _post(message, client, started_at, started)


def _elapsed(started: float) -> int:
    return int((time.monotonic() - started) * 1000)


def _post(message: Message, client: httpx.Client, started_at: datetime, started: float) -> Outcome:
    render = messages.slack_bytes if message.kind == Kind.SLACK else messages.webhook_bytes
    data = render(message.body)
    digest = hashlib.sha256(data).hexdigest()
    headers = {
        "Content-Type": "application/json; charset=utf-8",
        "User-Agent": USER_AGENT,
        "X-Quicksave-Delivery": str(message.delivery_id),
        "X-Quicksave-Event": message.notice,
    }
    if message.secret:
        headers.update(signing.headers(message.secret, data))
    try:
        response = client.post(message.url, content=data, headers=headers)
    except httpx.HTTPError as exc:
        error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        return Outcome(ok=False, started_at=started_at, duration_ms=_elapsed(started), error=error, digest=digest)
    code = response.status_code
    if 200 <= code < 300:
        return Outcome(ok=True, started_at=started_at, duration_ms=_elapsed(started), response_code=code, digest=digest)
    excerpt = response.text[:EXCERPT_CHARS]
    return Outcome(
        ok=False, started_at=started_at, duration_ms=_elapsed(started), response_code=code, digest=digest,
        error=f"HTTP {code}" + (f": {excerpt}" if excerpt else ""), retry_after=_retry_after(response),
    )  # fmt: skip


def _retry_after(response: httpx.Response) -> float | None:
    raw = response.headers.get("Retry-After", "")
    return float(raw) if raw.isdigit() else None


def _email(message: Message, started_at: datetime, started: float) -> Outcome:
    subject, text, html = messages.email_parts(message.body)
    digest = hashlib.sha256(text.encode()).hexdigest()
    email = EmailMultiAlternatives(subject, text, settings.DEFAULT_FROM_EMAIL, list(message.recipients),
                                   headers={"X-Quicksave-Event": message.notice,
                                            "X-Quicksave-Delivery": str(message.delivery_id)})  # fmt: skip
    email.attach_alternative(html, "text/html")
    try:
        email.send(fail_silently=False)
    except (OSError, ValueError) as exc:  # smtplib's errors are OSErrors; a bad header is a ValueError
        return Outcome(ok=False, started_at=started_at, duration_ms=_elapsed(started), error=f"{type(exc).__name__}: "
                       f"{exc}", digest=digest)  # fmt: skip
    return Outcome(ok=True, started_at=started_at, duration_ms=_elapsed(started), digest=digest)
