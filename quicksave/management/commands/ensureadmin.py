"""Make sure a fresh install has someone who can sign in: the first superuser, created once."""

from __future__ import annotations

import secrets
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from quicksave.env import envstr
from quicksave.roles import username_problem


class Command(BaseCommand):
    help = (
        "Create a superuser named $QUICKSAVE_ADMIN_USER (default 'admin') unless a superuser already exists. "
        "The password is $QUICKSAVE_ADMIN_PASSWORD, or a generated one printed this once and never again."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        users = get_user_model()
        if users.objects.filter(is_superuser=True).exists():
            self.stdout.write("admin user exists")
            return
        username = envstr("QUICKSAVE_ADMIN_USER") or "admin"
        if problem := username_problem(username):
            raise CommandError(f"QUICKSAVE_ADMIN_USER {username!r} cannot be a user name: {problem}")
        if users.objects.filter(username=username).exists():
            raise CommandError(
                f"User {username!r} exists but is not a superuser; promote it with `manage.py shell` "
                "or set QUICKSAVE_ADMIN_USER to another name."
            )
        password = envstr("QUICKSAVE_ADMIN_PASSWORD")
        generated = not password
        if generated:
            password = secrets.token_urlsafe(15)
        users.objects.create_superuser(username=username, email="", password=password)
        if generated:
            self.stdout.write(
                _box([f"Admin user created: {username}", f"Password: {password}", "Shown once: save it now."])
            )
        else:
            self.stdout.write(f"admin user {username!r} created with the password from QUICKSAVE_ADMIN_PASSWORD")


def _box(lines: list[str]) -> str:
    width = max(len(line) for line in lines)
    rule = "+" + "-" * (width + 2) + "+"
    return "\n".join([rule, *(f"| {line.ljust(width)} |" for line in lines), rule])
