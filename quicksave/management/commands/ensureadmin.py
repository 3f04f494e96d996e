"""Make sure a fresh install has someone who can sign in: the first superuser, created once.

A generated password is printed once and kept in $QUICKSAVE_VAR_DIR/admin-password (readable by
this OS user only), so it can be read again after the console scrolled it away. `--reset-password`
gives the admin a new one in the same file; `--describe` says who signs in and where the password is,
for `dev.py run`'s closing box.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.core.management.base import BaseCommand, CommandError, CommandParser

from audit import trail
from quicksave.env import envstr
from quicksave.roles import username_problem

RESET_COMMAND = "python3 dev.py reset-password"


def password_file() -> Path:
    return Path(settings.VAR_DIR) / "admin-password"


def shown(path: Path) -> str:
    """`path` relative to the working directory when it is under it (var/admin-password), else absolute."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def save_password(password: str) -> Path:
    """Write the password to its file, readable and writable by this OS user only."""
    path = password_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(password + "\n")
    path.chmod(0o600)  # an older file keeps its mode through O_TRUNC
    return path


class Command(BaseCommand):
    help = (
        "Create a superuser named $QUICKSAVE_ADMIN_USER (default 'admin') unless a superuser already exists. "
        "The password is $QUICKSAVE_ADMIN_PASSWORD, or a generated one, printed once and kept in "
        "$QUICKSAVE_VAR_DIR/admin-password."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_mutually_exclusive_group()
        actions.add_argument("--reset-password", action="store_true",
                             help="Give the admin a new generated password, kept in the password file")  # fmt: skip
        actions.add_argument("--describe", action="store_true",
                             help="Say who signs in and where the password is; change nothing")  # fmt: skip

    def handle(self, *args: Any, **options: Any) -> None:
        username = envstr("QUICKSAVE_ADMIN_USER") or "admin"
        if problem := username_problem(username):
            raise CommandError(f"QUICKSAVE_ADMIN_USER {username!r} cannot be a user name: {problem}")
        if options["describe"]:
            self.stdout.write("\n".join(self._describe(username)))
        elif options["reset_password"]:
            self._reset(username)
        else:
            self._ensure(username)

    def _ensure(self, username: str) -> None:
        users = get_user_model()
        if users.objects.filter(is_superuser=True).exists():
            self.stdout.write("admin user exists")
            return
        if users.objects.filter(username=username).exists():
            raise CommandError(
                f"User {username!r} exists but is not a superuser; promote it with `manage.py shell` "
                "or set QUICKSAVE_ADMIN_USER to another name."
            )
        password = envstr("QUICKSAVE_ADMIN_PASSWORD")
        if password:
            users.objects.create_superuser(username=username, email="", password=password)
            self.stdout.write(f"admin user {username!r} created with the password from QUICKSAVE_ADMIN_PASSWORD")
            return
        password = secrets.token_urlsafe(15)
        users.objects.create_superuser(username=username, email="", password=password)
        path = save_password(password)
        self.stdout.write(_box([f"Admin user created: {username}", f"Password: {password}",
                                f"Kept in {shown(path)} (readable by you only)."]))  # fmt: skip

    def _reset(self, username: str) -> None:
        user = _admin(username)
        if user is None:
            raise CommandError(
                f"No user is named {username!r} and there is no other superuser: run `manage.py ensureadmin` "
                "to create the admin, or set QUICKSAVE_ADMIN_USER to the admin's name."
            )
        if not user.is_superuser:
            raise CommandError(
                f"{username!r} is not a superuser; reset a person's password with "
                f"`manage.py changepassword {username}`."
            )
        username = user.get_username()
        password = secrets.token_urlsafe(15)
        user.set_password(password)
        user.save(update_fields=["password"])
        trail.record(actor=None, actor_name=trail.cli_actor_name(), action="user.password_reset", target_type="user",
                     target_id=user.pk, reason="ensureadmin --reset-password")  # fmt: skip
        path = save_password(password)
        self.stdout.write(_box([f"New password for {username}: {password}",
                                f"Kept in {shown(path)} (readable by you only)."]))  # fmt: skip

    def _describe(self, username: str) -> list[str]:
        user = _admin(username)
        if user is None:
            return ["Sign in as   nobody yet: run manage.py ensureadmin"]
        return [f"Sign in as   {user.get_username()}", f"Password     {_where(user)}",
                f"New password {RESET_COMMAND}"]  # fmt: skip


def _admin(username: str) -> Any:
    """The user named `username`, or else the first active superuser: the one who signs in first."""
    users = get_user_model()
    return users.objects.filter(username=username).first() or (
        users.objects.filter(is_superuser=True, is_active=True).order_by("date_joined").first()
    )


def _where(user: AbstractBaseUser) -> str:
    """Where the user's password can be read, checked against the password itself."""
    from_env = envstr("QUICKSAVE_ADMIN_PASSWORD")
    if from_env and user.check_password(from_env):
        return "the value of QUICKSAVE_ADMIN_PASSWORD"
    path = password_file()
    try:
        kept = path.read_text().strip()
    except OSError:
        return "the one you chose (none is kept in a file)"
    if kept and user.check_password(kept):
        return f"in {shown(path)}"
    return f"the one you chose ({shown(path)} is out of date)"


def _box(lines: list[str]) -> str:
    width = max(len(line) for line in lines)
    rule = "+" + "-" * (width + 2) + "+"
    return "\n".join([rule, *(f"| {line.ljust(width)} |" for line in lines), rule])
