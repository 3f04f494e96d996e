"""The audit trail: one entry per human action, written in the same transaction as the action.

An entry outlives its thread, but the thread's secrets in it (an approval's args, a fork's edits)
must not: `record` seals the values it is told are secret under the thread's data key, so
deleting the thread (which destroys that key) shreds them, and the entry then reads
"[sealed; thread deleted]" where they were.
"""

from __future__ import annotations

import base64
import getpass
import hashlib
import hmac
import ipaddress
import os
from collections.abc import Collection
from typing import Any, NamedTuple
from uuid import UUID

from django.conf import settings
from django.contrib.auth.models import User
from django.http import HttpRequest

from audit.models import AuditEntry
from checkpoints.fields import associated_data
from checkpoints.models import Thread
from checkpoints.storage import codec, crypto

# The key under which an entry's before/after holds its sealed values:
# {"thread": id, "keys": [names], "box": base64 of the sealed JSON object of those values}, or,
# for a thread stored without a data key, "digest" (a keyed hash) in place of "box".
SEALED = "_sealed"
SHREDDED = "[sealed; thread deleted]"
UNREADABLE = "[sealed; does not open]"
DIGEST_ONLY = "[not kept: the thread has no data key]"


def client_address(request: HttpRequest | None) -> str | None:
    """The caller's address as the server saw it (behind a proxy, configure it to set REMOTE_ADDR),
    or None when that is no IP address: a server that trusts a proxy's X-Forwarded-For takes
    whatever the header says, and a made-up one must not fail the action it would audit."""
    if request is None:
        return None
    address = request.META.get("REMOTE_ADDR") or ""
    try:
        return str(ipaddress.ip_address(address))
    except ValueError:
        return None


def cli_actor_name() -> str:
    """Who ran a management command, as the audit trail names them: `cli:<os user>`."""
    try:
        return f"cli:{getpass.getuser()}"
    except (OSError, KeyError):  # no login name and no passwd entry (a bare container)
        return f"cli:uid-{os.getuid()}"


def record(
    *,
    actor: User | None,
    action: str,
    target_type: str,
    target_id: Any,
    thread: Thread | None = None,
    reason: str = "",
    before: dict[str, Any] | None = None,
    after: dict[str, Any] | None = None,
    address: str | None = None,
    actor_name: str | None = None,
    sealed: Collection[str] = (),
) -> AuditEntry:
    """Write one entry. `actor_name` names an actor who is not a user (`cli:<os user>`);
    with neither, the actor is Quicksave itself. `sealed` names the keys of `before` and `after`
    whose values are the thread's secrets: they are stored sealed under its data key (see the
    module docstring); read them back with `opened`."""
    name = actor_name or (actor.get_username() if actor else "quicksave")
    before, after = before or {}, after or {}
    if sealed:
        if thread is None:
            raise ValueError("Only an entry about a thread can seal values under its key: pass `thread`.")
        before = _sealed(before, sealed, thread_id=thread.pk, ad=_ad("before", action, target_type, target_id))
        after = _sealed(after, sealed, thread_id=thread.pk, ad=_ad("after", action, target_type, target_id))
    return AuditEntry.objects.create(
        actor=actor, actor_name=name, action=action,
        target_type=target_type, target_id=str(target_id), thread=thread, reason=reason,
        before=before, after=after, address=address,
    )  # fmt: skip


class Opened(NamedTuple):
    """An entry's before and after as a person reads them: sealed values opened, or marked."""

    before: dict[str, Any]
    after: dict[str, Any]


def opened(entry: AuditEntry) -> Opened:
    """`entry`'s before and after with their sealed values opened while the thread lives; once it
    is deleted each such value reads SHREDDED (UNREADABLE if its ciphertext was altered)."""
    return Opened(
        _opened(entry.before, ad=_ad("before", entry.action, entry.target_type, entry.target_id)),
        _opened(entry.after, ad=_ad("after", entry.action, entry.target_type, entry.target_id)),
    )


def _ad(column: str, action: str, target_type: str, target_id: Any) -> bytes:
    # Bound to the entry's column, action and target: sealed values copied into another entry do not open.
    return associated_data(f"approvals_auditentry.{column}", action, target_type, target_id)


def _sealed(values: dict[str, Any], secret: Collection[str], *, thread_id: UUID, ad: bytes) -> dict[str, Any]:
    keys = sorted(key for key in secret if key in values)
    if not keys:
        return values
    plain = codec.to_canonical_bytes({key: values[key] for key in keys})
    marker: dict[str, Any] = {"thread": str(thread_id), "keys": keys}
    if not crypto.has_data_key(thread_id):
        # Stored without a data key (QUICKSAVE_ENCRYPT=false): nothing could shred the values, so
        # only a keyed digest is kept, which shows whether a claimed value was the one recorded.
        marker["digest"] = hmac.digest(_digest_key(), plain, "sha256").hex()
    else:
        marker["box"] = base64.b64encode(crypto.seal(thread_id, ad, codec.encode(plain))).decode()
    return {**{key: value for key, value in values.items() if key not in keys}, SEALED: marker}


def _digest_key() -> bytes:
    return hashlib.sha256(b"quicksave-audit:" + settings.QUICKSAVE_INTEGRITY_KEY.encode()).digest()


def _opened(values: dict[str, Any], *, ad: bytes) -> dict[str, Any]:
    marker = values.get(SEALED)
    if not isinstance(marker, dict):
        return values
    rest = {key: value for key, value in values.items() if key != SEALED}
    keys = [str(key) for key in marker.get("keys") or []]
    if "box" not in marker:
        return {**rest, **dict.fromkeys(keys, DIGEST_ONLY)}
    try:
        thread_id = UUID(str(marker.get("thread")))
        if not crypto.has_data_key(thread_id):
            return {**rest, **dict.fromkeys(keys, SHREDDED)}
        found = codec.decode(crypto.unseal(thread_id, ad, base64.b64decode(str(marker["box"]), validate=True)))
    except (ValueError, crypto.DecryptionFailure):  # a malformed marker, altered bytes, a key that does not unwrap
        return {**rest, **dict.fromkeys(keys, UNREADABLE)}
    return {**rest, **(found if isinstance(found, dict) else dict.fromkeys(keys, UNREADABLE))}
