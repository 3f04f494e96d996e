"""A person's changes to an item from the dashboard: an edit, or a rollback to an earlier version.
Each is a new version written by that person (the old ones stay), refused unless the item is
still at the version the person saw, and recorded with its reason in the audit trail, in one
transaction."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.db import transaction

from audit import trail
from memory import selectors
from memory.access import EVERYTHING, WRITE
from memory.errors import InvalidValue, ItemNotFound
from memory.paths import Path, namespace_path
from memory.store import Author, Written, put_item

MAX_REASON = 1000


def edit_item(
    *,
    namespace: Path | list[str],
    key: str,
    value: Any,
    user: User,
    reason: str,
    seen_version: int,
    address: str | None = None,
) -> Written:
    """Write `value` as the item's next version, as `user`, for `reason`; VersionConflict when the
    item moved past `seen_version` meanwhile."""
    path, reason = namespace_path(namespace), _reason(reason)
    _check_can_change(user)
    with transaction.atomic():
        written = put_item(namespace=path, key=key, value=value, author=Author.person(user.pk), scope=EVERYTHING,
                           expected_version=seen_version)  # fmt: skip
        _audit("memory.item_edited", written, user=user, reason=reason, address=address,
               after={"version": written.version, "from_version": seen_version})  # fmt: skip
    return written


def roll_back_item(
    *,
    namespace: Path | list[str],
    key: str,
    to_version: int,
    user: User,
    reason: str,
    seen_version: int,
    address: str | None = None,
) -> Written:
    """Write the value of version `to_version` again, as the item's next version (a deleted
    version cannot be restored this way: it holds no value)."""
    path, reason = namespace_path(namespace), _reason(reason)
    _check_can_change(user)
    older = _version(path, key, to_version)
    if older.deleted:
        raise InvalidValue(f"Version {to_version} is a deletion; it has no value to go back to.",
                           detail={"field": "to_version"})  # fmt: skip
    with transaction.atomic():
        written = put_item(namespace=path, key=key, value=older.value, author=Author.person(user.pk),
                           scope=EVERYTHING, expected_version=seen_version)  # fmt: skip
        after = {"version": written.version, "restored_version": to_version, "from_version": seen_version}
        _audit("memory.item_rolled_back", written, user=user, reason=reason, address=address, after=after)
    return written


def _version(path: Path, key: str, number: int) -> selectors.Version:
    if isinstance(number, bool) or not isinstance(number, int) or number < 1:
        raise InvalidValue("to_version must be a version number from 1.", detail={"field": "to_version"})
    versions = selectors.item_history(namespace=path, key=key, scope=EVERYTHING, limit=1, before=number + 1)
    if versions is None:
        raise ItemNotFound(f"There is no item {key!r} in {'/'.join(path)}.")
    if not versions or versions[0].version != number:
        raise InvalidValue(f"The item has no version {number}.", detail={"field": "to_version"})
    return versions[0]


def _reason(reason: Any) -> str:
    text = reason.strip() if isinstance(reason, str) else ""
    if not text or len(text) > MAX_REASON:
        raise InvalidValue(f"Give a reason of 1 to {MAX_REASON} characters.", detail={"field": "reason"})
    return text


def _check_can_change(user: User) -> None:
    if not user.has_perm(WRITE):
        raise PermissionDenied("Changing memory needs the admin role.")


def _audit(action: str, written: Written, *, user: User, reason: str, address: str | None,
           after: dict[str, Any]) -> None:  # fmt: skip
    named = {"namespace": list(written.namespace), "key": written.key}
    trail.record(actor=user, action=action, target_type="memory_item", target_id=written.item_id, reason=reason,
                 before=named, after=after, address=address)  # fmt: skip
