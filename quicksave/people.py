"""People, managed from the browser by admins: add a person with a role and a temporary password,
change their role (through `roles.grant_role`, the one way a role is given), deactivate and
reactivate them, give them a new temporary password; and a person choosing their own password.

Every change is one keyword-only function here, in one transaction with its audit entry. A
temporary password is returned to be shown once and never stored in clear or in the audit trail;
whoever holds one must choose their own at their next sign-in (`PasswordToSet`).
No change may leave Quicksave without an active admin: changes that could are serialised
under one advisory lock and checked under it.
"""

from __future__ import annotations

import secrets
import smtplib

from django.contrib.auth import password_validation
from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.core.mail import send_mail
from django.db import IntegrityError, connection, transaction
from django.db.models import Q
from django.utils import timezone

from audit import trail
from quicksave.errors import DomainError
from quicksave.models import PasswordToSet
from quicksave.roles import ADMIN, ROLES, grant_role, role_of, username_problem

# pg_advisory_xact_lock key of changes that may remove an admin (an arbitrary constant, "qspeople").
_ADMINS_LOCK = 0x7173_7065_6F70_6C65
TEMPORARY_PASSWORD_BYTES = 12


class PeopleError(DomainError):
    """A change to a person that is refused; `field` names the form field it is about."""

    code = "invalid_person"
    status = 400

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message, detail={"field": field} if field else {})
        self.field = field


class LastAdmin(PeopleError):
    code = "last_admin"
    status = 409


def temporary_password() -> str:
    return secrets.token_urlsafe(TEMPORARY_PASSWORD_BYTES)


def must_set_password(user: AbstractBaseUser) -> bool:
    """Whether `user` must choose their own password before using Quicksave."""
    return PasswordToSet.objects.filter(user_id=user.pk).exists()


def active_admins() -> list[User]:
    """Active people with the admin role (superusers count), by name."""
    admins = User.objects.filter(Q(is_superuser=True) | Q(groups__name=ADMIN), is_active=True)
    return list(admins.distinct().order_by("username"))


def create_person(
    *, actor: User, username: str, role: str, email: str = "", password: str = "", address: str | None = None
) -> tuple[User, str]:
    """Add a person with `role` and a temporary password (`password`, or a generated one), returned
    to be handed over once; they choose their own when they first sign in."""
    username = username.strip()
    if problem := username_problem(username):
        raise PeopleError(f"User name: {problem}", field="username")
    if role not in ROLES:
        raise PeopleError(f"Role: {role!r} is not a role; the roles are {', '.join(ROLES)}.", field="role")
    if User.objects.filter(username__iexact=username).exists():
        raise PeopleError(f"User name: someone is already called {username!r} (names ignore case).", field="username")
    password = password or temporary_password()
    candidate = User(username=username, email=email)
    try:
        password_validation.validate_password(password, candidate)
    except ValidationError as exc:
        raise PeopleError("Temporary password: " + " ".join(exc.messages), field="password") from None
    try:
        with transaction.atomic():
            user = User.objects.create_user(username=username, email=email, password=password)
            PasswordToSet.objects.create(user=user)
            grant_role(user=user, role=role, actor=actor, address=address)
            trail.record(actor=actor, action="user.create", target_type="user", target_id=username,
                         after={"email": email, "role": role, "must_set_password": True}, address=address)  # fmt: skip
    except IntegrityError:  # the same name, added a moment ago by another admin
        raise PeopleError(f"User name: someone is already called {username!r}.", field="username") from None
    return user, password


def send_invitation(*, actor: User, user: User, sign_in_url: str, address: str | None = None) -> None:
    """Email `user` where to sign in and their user name; never the password, which the admin hands
    over another way. Sent outside any transaction; PeopleError says why it could not be."""
    if not user.email:
        raise PeopleError(f"Email: {user.get_username()} has no email address to invite.", field="email")
    name, inviter = user.get_username(), actor.get_username()
    # Plain text, not markup: nothing here is ever rendered as HTML.
    message = (
        f"Hello {name},\n\n{inviter} added you to Quicksave, where your team follows its AI agents' runs "
        f'and approves their risky steps.\n\nSign in at {sign_in_url} as "{name}" with the temporary '
        f"password {inviter} gives you. You will then choose your own.\n"
    )
    try:
        send_mail(subject="You have a Quicksave account", message=message, from_email=None,
                  recipient_list=[user.email])  # fmt: skip
    except (OSError, smtplib.SMTPException) as exc:
        raise PeopleError(f"The invitation to {user.email} could not be sent: {exc}", field="email") from None
    trail.record(actor=actor, action="user.invite", target_type="user", target_id=user.get_username(),
                 after={"email": user.email}, address=address)  # fmt: skip


@transaction.atomic
def change_role(*, actor: User, user: User, role: str, address: str | None = None) -> bool:
    """Give `user` exactly `role` (through `grant_role`, which audits it); False when they held it already."""
    if role not in ROLES:
        raise PeopleError(f"Role: {role!r} is not a role; the roles are {', '.join(ROLES)}.", field="role")
    if user.is_superuser:
        raise PeopleError(
            f"Role: {user.get_username()} is a superuser, an admin whatever their role; "
            "take away superuser status in the Django admin first.",
            field="role",
        )
    current = role_of(_fresh(user))
    if current == role:
        return False
    if current == ADMIN and user.is_active:
        _keep_an_admin(user, doing=f"make {user.get_username()} a {role}")
    grant_role(user=user, role=role, actor=actor, address=address)
    return True


@transaction.atomic
def deactivate(*, actor: User, user: User, reason: str = "", address: str | None = None) -> None:
    """Stop `user` signing in or using any session they have open; their history stays."""
    user = _locked(user)
    if not user.is_active:
        raise PeopleError(f"{user.get_username()} is already deactivated.")
    if role_of(user) == ADMIN:
        _keep_an_admin(user, doing=f"deactivate {user.get_username()}")
    user.is_active = False
    user.save(update_fields=["is_active"])
    trail.record(actor=actor, action="user.deactivate", target_type="user", target_id=user.get_username(),
                 reason=reason, before={"active": True}, after={"active": False}, address=address)  # fmt: skip


@transaction.atomic
def reactivate(*, actor: User, user: User, address: str | None = None) -> None:
    """Let a deactivated person sign in again, with the role they had."""
    user = _locked(user)
    if user.is_active:
        raise PeopleError(f"{user.get_username()} is active already.")
    user.is_active = True
    user.save(update_fields=["is_active"])
    trail.record(actor=actor, action="user.reactivate", target_type="user", target_id=user.get_username(),
                 before={"active": False}, after={"active": True}, address=address)  # fmt: skip


@transaction.atomic
def reset_password(*, actor: User, user: User, address: str | None = None) -> str:
    """Give `user` a new temporary password (returned, to be handed over once): their sessions end,
    and they choose their own password when they next sign in."""
    user = _locked(user)
    password = temporary_password()
    user.set_password(password)  # a new password hash: every session of theirs stops verifying
    user.save(update_fields=["password"])
    PasswordToSet.objects.update_or_create(user=user, defaults={"since": timezone.now()})
    trail.record(actor=actor, action="user.password_reset", target_type="user", target_id=user.get_username(),
                 after={"must_set_password": True}, address=address)  # fmt: skip
    return password


@transaction.atomic
def set_own_password(*, user: User, password: str, address: str | None = None) -> None:
    """`user` chooses their password (already validated by the form); none is then left to set."""
    user.set_password(password)
    user.save(update_fields=["password"])
    had_to = PasswordToSet.objects.filter(user_id=user.pk).delete()[0] > 0
    trail.record(actor=user, action="user.password_set", target_type="user", target_id=user.get_username(),
                 before={"must_set_password": had_to}, after={"must_set_password": False}, address=address)  # fmt: skip


def _fresh(user: User) -> User:
    # Permissions and groups are cached per instance: read the person as they are now.
    return User.objects.get(pk=user.pk)


def _locked(user: User) -> User:
    return User.objects.select_for_update().get(pk=user.pk)


def _keep_an_admin(user: User, *, doing: str) -> None:
    """Refuse, under the one lock such changes take, a change that would leave no active admin."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_ADMINS_LOCK])
    others = User.objects.filter(Q(is_superuser=True) | Q(groups__name=ADMIN), is_active=True).exclude(pk=user.pk)
    if not others.exists():
        raise LastAdmin(
            f"Cannot {doing}: {user.get_username()} is the last active admin, and Quicksave would have "
            "nobody left to manage it. Make someone else an admin first."
        )
