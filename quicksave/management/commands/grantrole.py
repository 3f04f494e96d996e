"""Give a person one of the roles viewer, reviewer or admin."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from audit.trail import cli_actor_name
from quicksave.roles import ROLES, grant_role, username_problem


class Command(BaseCommand):
    help = "Set USER's role to viewer, reviewer or admin (replacing any other role)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("user", help="Username")
        parser.add_argument("role", choices=ROLES, help="viewer reads; reviewer decides approvals; admin does all")

    def handle(self, *args: Any, **options: Any) -> None:
        User = get_user_model()
        if problem := username_problem(options["user"]):
            raise CommandError(f"No user can be named {options['user']!r}: {problem}")
        try:
            user = User.objects.get(**{User.USERNAME_FIELD: options["user"]})
        except User.DoesNotExist:
            raise CommandError(f"No user is named {options['user']!r}; create one with `manage.py createsuperuser` "
                               "or the admin site first.") from None  # fmt: skip
        grant_role(user=user, role=options["role"], actor_name=cli_actor_name())
        self.stdout.write(f"{options['user']} is now {options['role']}.")
