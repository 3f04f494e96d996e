"""The one way in for channel writes: create, change, rotate the secret of and delete an endpoint,
and add or remove its subscriptions. Every write is audited.

The rules a channel's settings must follow live here too (`target_problems`,
`subscription_problems`), so the API's serializers, the page's forms and these functions agree.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.core.validators import EmailValidator
from django.db import IntegrityError, transaction
from django.utils import timezone

from approvals.models import Risk
from audit import trail
from notifications import secrets
from notifications.models import Endpoint, Kind, Notice, Subscription
from quicksave.errors import DomainError
from quicksave_agents.keys import agent_name_problem

NAME_MAX = 100
URL_MAX = 2000
MAX_RECIPIENTS = 20
MAX_SUBSCRIPTIONS = 50
# Webhooks are signed; Slack-compatible hooks take no signature (their URL is the credential).
SIGNED_KINDS = (Kind.WEBHOOK,)


class InvalidEndpoint(DomainError):
    code = "invalid_endpoint"
    status = 400


@dataclass(frozen=True)
class SubscriptionSpec:
    """What a subscription asks for: notices, narrowed by agent, action and risk (empty: any)."""

    events: Sequence[str]
    agents: Sequence[str] = field(default_factory=tuple)
    actions: Sequence[str] = field(default_factory=tuple)
    risks: Sequence[str] = field(default_factory=tuple)


def name_problem(name: str) -> str | None:
    if not name.strip():
        return "A channel needs a name."
    if len(name) > NAME_MAX:
        return f"A name is at most {NAME_MAX} characters; got {len(name)}."
    if not name.isprintable():
        return "A name holds printable characters only."
    return None


def url_problem(url: str) -> str | None:
    if not url:
        return "This kind of channel needs a URL."
    if len(url) > URL_MAX:
        return f"A URL is at most {URL_MAX} characters; got {len(url)}."
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (raises on a port that is not a number)
    except ValueError as exc:
        return f"This is not a URL: {exc}."
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "The URL must start with http:// or https:// and name a host."
    if not url.isprintable() or " " in url:
        return "A URL holds no spaces or control characters."
    return None


def recipients_problem(recipients: Sequence[str]) -> str | None:
    if not recipients:
        return "An email channel needs at least one address."
    if len(recipients) > MAX_RECIPIENTS:
        return f"At most {MAX_RECIPIENTS} addresses; got {len(recipients)}."
    validate = EmailValidator()
    for address in recipients:
        try:
            validate(address)
        except ValidationError:
            return f"{address!r} is not an email address."
    return None


def target_problems(*, kind: str, url: str, recipients: Sequence[str]) -> dict[str, str]:
    """What is wrong with where a channel sends, by field (empty when nothing is)."""
    problems: dict[str, str] = {}
    if kind not in Kind.values:
        return {"kind": f"The kinds of channel are {', '.join(Kind.values)}."}
    if kind == Kind.EMAIL:
        if url:
            problems["url"] = "An email channel sends to `recipients`, not to a URL."
        if problem := recipients_problem(recipients):
            problems["recipients"] = problem
    else:
        if recipients:
            problems["recipients"] = f"A {kind} channel sends to its URL, not to email addresses."
        if problem := url_problem(url):
            problems["url"] = problem
    return problems


def subscription_problems(spec: SubscriptionSpec) -> dict[str, str]:
    problems: dict[str, str] = {}
    if not spec.events:
        problems["events"] = "Choose at least one event."
    elif unknown := [event for event in spec.events if event not in Notice.values]:
        problems["events"] = f"{unknown[0]!r} is not an event; the events are {', '.join(Notice.values)}."
    for agent in spec.agents:
        if problem := agent_name_problem(agent):
            problems["agents"] = problem
            break
    for action in spec.actions:
        if not action.strip() or len(action) > 200 or not action.isprintable():
            problems["actions"] = "An action is 1 to 200 printable characters."
            break
    if unknown := [risk for risk in spec.risks if risk not in Risk.values]:
        problems["risks"] = f"{unknown[0]!r} is not a risk; the risks are {', '.join(Risk.values)}."
    return problems


def url_hint(kind: str, url: str) -> str:
    """What pages show of a URL: its scheme, host and port (a Slack hook's path is its secret)."""
    if kind == Kind.EMAIL or not url:
        return ""
    parts = urlsplit(url)
    rest = "/…" if parts.path.strip("/") or parts.query else "/"
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}{rest}"[:200]


def credentials(endpoint: Endpoint) -> dict[str, Any]:
    """The endpoint's URL and secret, opened (raises secrets.UnreadableCredentials)."""
    return secrets.open_sealed(endpoint.pk, endpoint.credentials)


def reseal_stale() -> int:
    """Seal again, under the keyring's first master key, the credentials of every endpoint sealed
    under an older one; returns how many. Credentials that do not open are left as they are."""
    resealed = 0
    for endpoint in Endpoint.objects.only("id", "credentials"):
        if secrets.is_current(endpoint.credentials):
            continue
        with transaction.atomic():
            locked = Endpoint.objects.select_for_update().only("id", "credentials").get(pk=endpoint.pk)
            try:
                found = secrets.open_sealed(locked.pk, locked.credentials)
            except secrets.UnreadableCredentials:
                continue
            locked.credentials = secrets.seal(locked.pk, found)
            locked.save(update_fields=["credentials"])
            resealed += 1
    return resealed


def _summary(endpoint: Endpoint) -> dict[str, Any]:
    return {
        "name": endpoint.name, "kind": endpoint.kind, "url": endpoint.url_hint, "recipients": list(endpoint.recipients),
        "enabled": endpoint.enabled, "decision_links": endpoint.decision_links,
        "subscriptions": [_subscription_summary(sub) for sub in endpoint.subscriptions.all()],
    }  # fmt: skip


def _subscription_summary(subscription: Subscription) -> dict[str, Any]:
    return {"events": list(subscription.events), "agents": list(subscription.agents),
            "actions": list(subscription.actions), "risks": list(subscription.risks)}  # fmt: skip


def _check(problems: dict[str, str]) -> None:
    if problems:
        field_name, message = next(iter(problems.items()))
        raise InvalidEndpoint(message, detail={"field": field_name, "fields": problems})


def _save(endpoint: Endpoint, *, create: bool) -> None:
    try:
        with transaction.atomic():
            endpoint.save(force_insert=create)
    except IntegrityError:
        taken = f"A channel is already named {endpoint.name!r}."
        raise InvalidEndpoint(taken, detail={"field": "name", "fields": {"name": taken}}) from None


def _subscribe(endpoint: Endpoint, specs: Sequence[SubscriptionSpec]) -> None:
    if len(specs) > MAX_SUBSCRIPTIONS:
        _check({"subscriptions": f"At most {MAX_SUBSCRIPTIONS} subscriptions; got {len(specs)}."})
    for spec in specs:
        _check(subscription_problems(spec))
    Subscription.objects.bulk_create(
        Subscription(endpoint=endpoint, events=list(dict.fromkeys(spec.events)), agents=list(spec.agents),
                     actions=list(spec.actions), risks=list(spec.risks))
        for spec in specs
    )  # fmt: skip


@transaction.atomic
def create_endpoint(
    *, name: str, kind: str, url: str = "", recipients: Sequence[str] = (), enabled: bool = True,
    decision_links: bool = False, subscriptions: Sequence[SubscriptionSpec] = (), actor: User,
    address: str | None = None,
) -> tuple[Endpoint, str | None]:  # fmt: skip
    """Add a channel; returns it and, for a webhook, its signing secret (shown once: Quicksave
    keeps it sealed and hands it out again only by rotating it)."""
    _check({"name": problem} if (problem := name_problem(name)) else {})
    _check(target_problems(kind=kind, url=url, recipients=recipients))
    secret = secrets.new_signing_secret() if kind in SIGNED_KINDS else None
    endpoint = Endpoint(name=name.strip(), kind=kind, url_hint=url_hint(kind, url), recipients=list(recipients),
                        enabled=enabled, decision_links=decision_links, created_by=actor)  # fmt: skip
    endpoint.credentials = secrets.seal(endpoint.pk, {"url": url, "secret": secret})
    _save(endpoint, create=True)
    _subscribe(endpoint, subscriptions)
    trail.record(actor=actor, action="notification_endpoint.create", target_type="notification_endpoint",
                 target_id=endpoint.pk, after=_summary(endpoint), address=address)  # fmt: skip
    return endpoint, secret


_UNSET: Any = object()


@transaction.atomic
def update_endpoint(
    *, endpoint: Endpoint, actor: User, address: str | None = None, name: str = _UNSET, url: str = _UNSET,
    recipients: Sequence[str] = _UNSET, enabled: bool = _UNSET, decision_links: bool = _UNSET,
    subscriptions: Sequence[SubscriptionSpec] = _UNSET,
) -> Endpoint:  # fmt: skip
    """Change what is given (`subscriptions` replaces them all); the kind of a channel stays."""
    locked = Endpoint.objects.select_for_update().get(pk=endpoint.pk)
    before = _summary(locked)
    if name is not _UNSET:
        _check({"name": problem} if (problem := name_problem(name)) else {})
        locked.name = name.strip()
    current = credentials(locked)
    new_url = current["url"] if url is _UNSET else url
    new_recipients = locked.recipients if recipients is _UNSET else list(recipients)
    _check(target_problems(kind=locked.kind, url=new_url, recipients=new_recipients))
    locked.url_hint, locked.recipients = url_hint(locked.kind, new_url), list(new_recipients)
    locked.credentials = secrets.seal(locked.pk, {**current, "url": new_url})
    if enabled is not _UNSET:
        locked.enabled = enabled
    if decision_links is not _UNSET:
        locked.decision_links = decision_links
    locked.updated_at = timezone.now()
    _save(locked, create=False)
    if subscriptions is not _UNSET:
        locked.subscriptions.all().delete()
        _subscribe(locked, subscriptions)
    trail.record(actor=actor, action="notification_endpoint.update", target_type="notification_endpoint",
                 target_id=locked.pk, before=before, after=_summary(locked), address=address)  # fmt: skip
    return locked


@transaction.atomic
def rotate_secret(*, endpoint: Endpoint, actor: User, address: str | None = None) -> str:
    """Give a webhook a new signing secret (returned, shown once); the old one stops at once."""
    locked = Endpoint.objects.select_for_update().get(pk=endpoint.pk)
    if locked.kind not in SIGNED_KINDS:
        raise InvalidEndpoint(f"A {locked.kind} channel has no signing secret.", detail={"field": "kind"})
    secret = secrets.new_signing_secret()
    locked.credentials = secrets.seal(locked.pk, {**credentials(locked), "secret": secret})
    locked.updated_at = timezone.now()
    locked.save(update_fields=["credentials", "updated_at"])
    trail.record(actor=actor, action="notification_endpoint.rotate_secret", target_type="notification_endpoint",
                 target_id=locked.pk, after={"name": locked.name}, address=address)  # fmt: skip
    return secret


@transaction.atomic
def delete_endpoint(*, endpoint: Endpoint, actor: User, address: str | None = None) -> None:
    """Delete a channel with its subscriptions and delivery log."""
    before = _summary(endpoint)
    Endpoint.objects.filter(pk=endpoint.pk).delete()
    trail.record(actor=actor, action="notification_endpoint.delete", target_type="notification_endpoint",
                 target_id=endpoint.pk, before=before, address=address)  # fmt: skip


@transaction.atomic
def add_subscription(
    *, endpoint: Endpoint, spec: SubscriptionSpec, actor: User, address: str | None = None
) -> Subscription:
    locked = Endpoint.objects.select_for_update().get(pk=endpoint.pk)
    if locked.subscriptions.count() >= MAX_SUBSCRIPTIONS:
        _check({"subscriptions": f"A channel has at most {MAX_SUBSCRIPTIONS} subscriptions."})
    _subscribe(locked, [spec])
    subscription = locked.subscriptions.order_by("-id").first()
    assert subscription is not None
    trail.record(actor=actor, action="notification_subscription.create", target_type="notification_endpoint",
                 target_id=locked.pk, after=_subscription_summary(subscription), address=address)  # fmt: skip
    return subscription


@transaction.atomic
def remove_subscription(*, subscription: Subscription, actor: User, address: str | None = None) -> None:
    Subscription.objects.filter(pk=subscription.pk).delete()
    trail.record(actor=actor, action="notification_subscription.delete", target_type="notification_endpoint",
                 target_id=subscription.endpoint_id, before=_subscription_summary(subscription),
                 address=address)  # fmt: skip
