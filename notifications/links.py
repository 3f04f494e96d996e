"""Decision links: decide an approval from the message that announced it.

A link is single-use and expires (QUICKSAVE_DECISION_LINK_SECONDS, and never after the approval's
own deadline). Its token is a random 256-bit value that only the message holds; the row keeps its
SHA-256. Opening it still needs a signed-in person (the sign-in page sends them back to it), and
deciding goes through `approvals.services.decide` as that person, so every rule of who may decide
applies and the audit trail names them. A decision that is refused leaves the link unused.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.urls import reverse
from django.utils import timezone

from approvals import services
from approvals.models import ApprovalRequest
from audit import trail
from notifications.messages import absolute
from notifications.models import DecisionLink, Endpoint
from quicksave.errors import DomainError

DECISIONS = (services.APPROVE, services.REJECT)


class LinkUnusable(DomainError):
    """The link was used already, or expired."""

    code = "link_unusable"
    status = 410


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def issue(*, approval: ApprovalRequest, endpoint: Endpoint | None, now: datetime) -> dict[str, str]:
    """Make an approve and a reject link for `approval`; returns their URLs and when they expire.
    Call it inside the transaction that records the message carrying them."""
    expires_at = now + timedelta(seconds=settings.QUICKSAVE_DECISION_LINK_SECONDS)
    if approval.expires_at is not None:
        expires_at = min(expires_at, approval.expires_at)
    urls = {}
    for decision in DECISIONS:
        token = secrets.token_urlsafe(32)
        DecisionLink.objects.create(approval=approval, decision=decision, token_digest=_digest(token),
                                    endpoint=endpoint, expires_at=expires_at, created_at=now)  # fmt: skip
        urls[decision] = absolute(reverse("notifications:decide", args=[token]))
    return {**urls, "expires_at": expires_at.isoformat()}


def find(token: str) -> DecisionLink | None:
    """The link a token opens, or None (a token of the wrong shape, or none we made)."""
    if not 20 <= len(token) <= 100:
        return None
    return (
        DecisionLink.objects.select_related("approval__thread__agent", "used_by")
        .filter(token_digest=_digest(token))
        .first()
    )


@dataclass(frozen=True)
class Unusable:
    """Why a link cannot be used now, for its page."""

    code: str  # used | expired | decided
    message: str


def why_unusable(link: DecisionLink, *, now: datetime | None = None) -> Unusable | None:
    now = now or timezone.now()
    if link.used_at is not None:
        who = link.used_by.get_username() if link.used_by else "someone"
        return Unusable("used", f"This link was used by {who} at {link.used_at:%Y-%m-%d %H:%M:%S %Z}.")
    if link.expires_at <= now:
        return Unusable("expired", f"This link expired at {link.expires_at:%Y-%m-%d %H:%M:%S %Z}.")
    if link.approval.status != "pending":
        return Unusable("decided", f"This approval is {link.approval.get_status_display().lower()} already.")
    return None


def decide_with(*, token: str, user: User, comment: str = "", address: str | None = None) -> ApprovalRequest:
    """Use a link: decide its approval as `user`, through `approvals.services.decide`, and mark the
    link used, or raise why not (LinkUnusable, or whatever `decide` refuses with).

    The link's row stays locked until the decision commits, so of two people using it at once
    the second waits and then finds it used. A refused decision leaves the link as it was; what
    `decide` wrote before refusing (an approval it found overdue, expired) stays written.
    """
    refused: DomainError | None = None
    with transaction.atomic():
        link = DecisionLink.objects.select_for_update(of=("self",)).filter(token_digest=_digest(token)).first()
        if link is None:
            raise LinkUnusable("This link is not one Quicksave made.", detail={"reason": "unknown"})
        unusable = why_unusable(link)
        if unusable is not None and unusable.code != "decided":
            raise LinkUnusable(unusable.message, detail={"reason": unusable.code})
        try:
            decided = services.decide(approval=link.approval, user=user, decision=link.decision, comment=comment,
                                      address=address)  # fmt: skip
        except DomainError as exc:
            refused = exc  # decide's own savepoint is rolled back; its expiry of an overdue approval stays
        else:
            link.used_at, link.used_by = timezone.now(), user
            link.save(update_fields=["used_at", "used_by"])
            trail.record(
                actor=user, action="decision_link.use", target_type="approval", target_id=decided.pk,
                thread=decided.thread, address=address,
                after={"decision": link.decision, "link": str(link.pk),
                       "endpoint": link.endpoint.name if link.endpoint else None},
            )  # fmt: skip
    if refused is not None:
        raise refused
    return decided
