"""Roles are Django groups: viewer reads, reviewer also decides approvals, admin also forks,
edits state, cancels, manages keys and sets approval policies and auto-approve rules.
`grantrole` and the dashboard use these definitions."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AnonymousUser, Group, Permission, User
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Field

from audit import trail

VIEWER = "viewer"
REVIEWER = "reviewer"
ADMIN = "admin"
ROLES = (VIEWER, REVIEWER, ADMIN)

_VIEW = ["checkpoints.view_thread", "checkpoints.view_checkpoint", "memory.view_item"]
_REVIEW = [*_VIEW, "checkpoints.decide_approval"]
_ADMIN = [*_REVIEW, "checkpoints.fork_thread", "checkpoints.cancel_thread", "checkpoints.delete_thread",
          "checkpoints.add_thread", "checkpoints.add_checkpoint", "agents.add_agentkey",
          "agents.change_agentkey", "approvals.manage_policies", "notifications.change_endpoint",
          "memory.change_item", "memory.share_namespace"]  # fmt: skip
ROLE_PERMISSIONS: dict[str, list[str]] = {VIEWER: _VIEW, REVIEWER: _REVIEW, ADMIN: _ADMIN}


def username_problem(name: str) -> str | None:
    """Why `name` cannot be a user name (too long, characters the user model refuses, bytes that
    are not UTF-8), or None when it can: commands check a name before they look it up or create it."""
    users = get_user_model()
    field = users._meta.get_field(users.USERNAME_FIELD)
    assert isinstance(field, Field)
    if not name:
        return "A user name cannot be empty."
    try:
        field.run_validators(name)
    except ValidationError as exc:
        return " ".join(exc.messages)
    return None


def _permissions(names: list[str]) -> list[Permission]:
    found = []
    for name in names:
        app_label, codename = name.split(".")
        found.append(Permission.objects.get(content_type__app_label=app_label, codename=codename))
    return found


@transaction.atomic
def ensure_roles() -> dict[str, Group]:
    """Create the three role groups and set their permissions to exactly the definitions above."""
    groups = {}
    for role, names in ROLE_PERMISSIONS.items():
        group, _ = Group.objects.get_or_create(name=role)
        group.permissions.set(_permissions(names))
        groups[role] = group
    return groups


@transaction.atomic
def grant_role(
    *, user: User, role: str, actor: User | None = None, actor_name: str | None = None, address: str | None = None
) -> None:
    """Give `user` exactly one role, replacing any other; the audit trail records who granted it
    (`actor`, or `actor_name` such as `cli:<os user>`; neither: Quicksave itself)."""
    if role not in ROLES:
        raise ValueError(f"Unknown role {role!r}; the roles are {', '.join(ROLES)}.")
    groups = ensure_roles()
    before = sorted(user.groups.filter(name__in=ROLES).values_list("name", flat=True))
    user.groups.remove(*[groups[other] for other in ROLES if other != role])
    user.groups.add(groups[role])
    trail.record(
        actor=actor, actor_name=actor_name, action="role.grant", target_type="user", target_id=user.get_username(),
        before={"roles": before}, after={"roles": [role]}, address=address,
    )  # fmt: skip


def role_of(user: User | AnonymousUser) -> str | None:
    """The highest role a person holds (a superuser counts as admin)."""
    if not user.is_authenticated:
        return None
    if isinstance(user, AnonymousUser):
        return None
    if user.is_superuser:
        return ADMIN
    names = {group.name for group in user.groups.all()}
    for role in reversed(ROLES):
        if role in names:
            return role
    return None
