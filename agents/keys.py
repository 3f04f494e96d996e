"""Agent API keys: issue one (the secret is shown once), look one up from a bearer token.

A key reads `qs_<prefix>_<secret>`. The prefix finds the row; the secret is
compared by its SHA-256 in constant time. Keys are 256-bit random, so a plain
hash is enough; a slow password hash would only slow every API call.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from agents.models import Agent, AgentKey
from approvals import audit

KEY_PREFIX = "qs_"


def _hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


@transaction.atomic
def create_agent_key(
    *,
    agent: Agent,
    label: str = "",
    actor: User | None = None,
    actor_name: str | None = None,
    address: str | None = None,
) -> tuple[AgentKey, str]:
    """Issue a key for `agent`; returns the row and the plaintext key (never stored).

    `actor`/`actor_name` say who asked, for the audit trail (neither: Quicksave itself).
    """
    prefix = secrets.token_hex(6)
    secret = secrets.token_urlsafe(32)
    key = AgentKey.objects.create(agent=agent, prefix=prefix, secret_hash=_hash_secret(secret), label=label)
    audit.record(
        actor=actor, actor_name=actor_name, action="agent_key.create", target_type="agent_key", target_id=prefix,
        after={"agent": agent.name, "prefix": prefix, "label": label}, address=address,
    )  # fmt: skip
    return key, f"{KEY_PREFIX}{prefix}_{secret}"


# Tokens recently found valid, by SHA-256, so an agent writing many checkpoints a
# second does not pay a key lookup on each. A revocation reaches other processes
# within QUICKSAVE_KEY_CACHE_SECONDS; this process forgets the key at once.
_recent: dict[str, tuple[AgentKey, float]] = {}
_recent_lock = threading.Lock()


def find_agent_key(raw: str) -> AgentKey | None:
    """The active key a bearer token names, or None when it is unknown, revoked or wrong."""
    token_hash = _hash_secret(raw)
    now = time.monotonic()
    with _recent_lock:
        hit = _recent.get(token_hash)
    if hit is not None and hit[1] > now:
        return hit[0]
    key = _lookup(raw)
    ttl: int = settings.QUICKSAVE_KEY_CACHE_SECONDS
    if key is not None and ttl > 0:
        with _recent_lock:
            if len(_recent) > 10_000:
                _recent.clear()
            _recent[token_hash] = (key, now + ttl)
    return key


def _lookup(raw: str) -> AgentKey | None:
    if not raw.startswith(KEY_PREFIX):
        return None
    prefix, sep, secret = raw[len(KEY_PREFIX) :].partition("_")
    if not sep or not prefix or not secret:
        return None
    key = AgentKey.objects.select_related("agent").filter(prefix=prefix, revoked_at__isnull=True).first()
    if key is None or not hmac.compare_digest(key.secret_hash, _hash_secret(secret)):
        return None
    return key


@transaction.atomic
def revoke_agent_key(
    *, key: AgentKey, actor: User | None = None, actor_name: str | None = None, address: str | None = None
) -> None:
    """Revoke `key` (a key already revoked stays as it was, and no second audit entry is written)."""
    revoked_at = timezone.now()
    if AgentKey.objects.filter(pk=key.pk, revoked_at__isnull=True).update(revoked_at=revoked_at):
        audit.record(
            actor=actor, actor_name=actor_name, action="agent_key.revoke", target_type="agent_key",
            target_id=key.prefix, before={"agent": key.agent.name, "revoked_at": None},
            after={"agent": key.agent.name, "revoked_at": revoked_at.isoformat()}, address=address,
        )  # fmt: skip
    with _recent_lock:
        for token_hash in [h for h, (cached, _) in _recent.items() if cached.pk == key.pk]:
            del _recent[token_hash]


def get_or_create_agent(*, name: str, version: str = "1", description: str = "") -> Agent:
    agent, _ = Agent.objects.get_or_create(name=name, defaults={"version": version, "description": description})
    return agent
