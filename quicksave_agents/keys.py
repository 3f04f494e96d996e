"""Agent API keys: issue one (the secret is shown once), look one up from a bearer token.

A key reads `qs_<prefix>_<secret>`. The prefix finds the row; the secret is
compared by its SHA-256 in constant time. Keys are 256-bit random, so a plain
hash is enough; a slow password hash would only slow every API call.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import threading
import time
from datetime import timedelta

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from audit import trail
from checkpoints import live
from quicksave_agents.models import Agent, AgentKey

KEY_PREFIX = "qs_"
# How fresh a key's `last_used_at` is kept (the agents page shows it).
LAST_USED_RESOLUTION = timedelta(minutes=1)
AGENT_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
LABEL_MAX_CHARS: int = AgentKey._meta.get_field("label").max_length or 100


def agent_name_problem(name: str) -> str | None:
    """Why `name` cannot name an agent, or None when it can."""
    if AGENT_NAME.fullmatch(name):
        return None
    return (
        f"Agent names are 1 to 64 lowercase letters, digits, '-' or '_', starting with a letter or digit; got {name!r}."
    )


def label_problem(label: str) -> str | None:
    """Why `label` cannot label a key, or None when it can."""
    if len(label) > LABEL_MAX_CHARS:
        return f"A label is at most {LABEL_MAX_CHARS} characters; got {len(label)}."
    for position, character in enumerate(label, start=1):
        if not character.isprintable():  # a tab, a NUL, a direction override, a lone surrogate…
            return f"A label holds printable characters only; character {position} is U+{ord(character):04X}."
    return None


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
    trail.record(
        actor=actor, actor_name=actor_name, action="agent_key.create", target_type="agent_key", target_id=prefix,
        after={"agent": agent.name, "prefix": prefix, "label": label}, address=address,
    )  # fmt: skip
    return key, f"{KEY_PREFIX}{prefix}_{secret}"


@transaction.atomic  # no agent is left behind without the key it was created for
def issue_key(
    *,
    agent_name: str,
    label: str = "",
    actor: User | None = None,
    actor_name: str | None = None,
    address: str | None = None,
) -> tuple[AgentKey, str]:
    """Issue a key for the agent named `agent_name`, creating the agent if it is new; returns the
    row and the plaintext key (never stored). Raises ValueError naming what is wrong with a name or
    label (`agent_name_problem`, `label_problem`)."""
    if (problem := agent_name_problem(agent_name) or label_problem(label)) is not None:
        raise ValueError(problem)
    agent = get_or_create_agent(name=agent_name)
    return create_agent_key(agent=agent, label=label, actor=actor, actor_name=actor_name, address=address)


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
    _note_use(key)
    return key


def _note_use(key: AgentKey) -> None:
    """Keep `last_used_at` to the minute: a key looked up again within it writes nothing (and a
    lookup happens only when the token is not in this process's cache)."""
    now = timezone.now()
    if key.last_used_at is None or now - key.last_used_at >= LAST_USED_RESOLUTION:
        AgentKey.objects.filter(pk=key.pk).update(last_used_at=now)
        key.last_used_at = now


@transaction.atomic
def revoke_agent_key(
    *, key: AgentKey, actor: User | None = None, actor_name: str | None = None, address: str | None = None
) -> None:
    """Revoke `key` (a key already revoked stays as it was, and no second audit entry is written).
    Its open websockets close with 4401 once the revocation commits, on every server process."""
    revoked_at = timezone.now()
    if AgentKey.objects.filter(pk=key.pk, revoked_at__isnull=True).update(revoked_at=revoked_at):
        live.close_sockets_on_commit(live.agent_key_group(key.pk))
        trail.record(
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
