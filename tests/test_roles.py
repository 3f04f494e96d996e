"""Roles: grantrole gives exactly one role, and each role carries its permissions."""

from __future__ import annotations

from io import StringIO
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError

from quicksave.roles import role_of


def test_grantrole_replaces_the_previous_role(db: Any) -> None:
    user = User.objects.create_user("rita", password="pw-12345678")
    call_command("grantrole", "rita", "reviewer", stdout=StringIO())
    assert role_of(user) == "reviewer"
    assert user.has_perm("checkpoints.decide_approval")
    assert not user.has_perm("checkpoints.fork_thread")

    call_command("grantrole", "rita", "viewer", stdout=StringIO())
    user = User.objects.get(pk=user.pk)  # permissions are cached per instance
    assert role_of(user) == "viewer"
    assert [group.name for group in user.groups.all()] == ["viewer"]
    assert not user.has_perm("checkpoints.decide_approval")


def test_admin_role_can_fork_and_write(db: Any) -> None:
    user = User.objects.create_user("ada", password="pw-12345678")
    call_command("grantrole", "ada", "admin", stdout=StringIO())
    assert user.has_perm("checkpoints.fork_thread")
    assert user.has_perm("checkpoints.add_checkpoint")


def test_grantrole_names_an_unknown_user(db: Any) -> None:
    with pytest.raises(CommandError, match="No user is named 'ghost'"):
        call_command("grantrole", "ghost", "viewer")
