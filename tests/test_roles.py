"""Roles: grantrole gives exactly one role, each role carries its permissions, and every grant is audited."""

from __future__ import annotations

import getpass
from io import StringIO
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError

from audit.models import AuditEntry
from quicksave.roles import grant_role, role_of
from tests.conftest import password_hash


def test_grantrole_replaces_the_previous_role(db: Any) -> None:
    user = User.objects.create(username="rita", password=password_hash("pw-12345678"))
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
    user = User.objects.create(username="ada", password=password_hash("pw-12345678"))
    call_command("grantrole", "ada", "admin", stdout=StringIO())
    assert user.has_perm("checkpoints.fork_thread")
    assert user.has_perm("checkpoints.add_checkpoint")


def test_grantrole_names_an_unknown_user(db: Any) -> None:
    with pytest.raises(CommandError, match="No user is named 'ghost'"):
        call_command("grantrole", "ghost", "viewer")


@pytest.mark.parametrize("name", ["r" * 200, "ri\udcffta"], ids=["too long", "not UTF-8"])
def test_grantrole_refuses_a_name_no_user_can_have(db: Any, name: str) -> None:
    with pytest.raises(CommandError, match=r"No user can be named .*: (Ensure this value|Enter a valid username)"):
        call_command("grantrole", name, "viewer")

    assert not AuditEntry.objects.exists()


def test_grantrole_records_the_grant_and_the_previous_role_in_the_audit_trail(db: Any) -> None:
    User.objects.create(username="rita", password=password_hash("pw-12345678"))
    call_command("grantrole", "rita", "reviewer", stdout=StringIO())
    call_command("grantrole", "rita", "admin", stdout=StringIO())

    first, second = AuditEntry.objects.filter(action="role.grant").order_by("created_at", "pk")
    assert (second.target_type, second.target_id) == ("user", "rita")
    assert (first.before, first.after) == ({"roles": []}, {"roles": ["reviewer"]})
    assert (second.before, second.after) == ({"roles": ["reviewer"]}, {"roles": ["admin"]})
    assert second.actor is None
    assert second.actor_name == f"cli:{getpass.getuser()}"


def test_a_grant_by_a_person_names_them_and_their_address(db: Any) -> None:
    admin = User.objects.create(username="ada", password=password_hash("pw-12345678"))
    rita = User.objects.create(username="rita", password=password_hash("pw-12345678"))

    grant_role(user=rita, role="viewer", actor=admin, address="10.0.0.9")

    entry = AuditEntry.objects.get(action="role.grant")
    assert (entry.actor, entry.actor_name, entry.address) == (admin, "ada", "10.0.0.9")


def test_an_unknown_role_is_refused_without_an_audit_entry(db: Any) -> None:
    rita = User.objects.create(username="rita", password=password_hash("pw-12345678"))
    with pytest.raises(ValueError, match="Unknown role 'owner'"):
        grant_role(user=rita, role="owner")
    assert not AuditEntry.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_migrate_brings_existing_role_groups_up_to_date() -> None:
    from django.contrib.auth.models import Group, Permission
    from django.core.management import call_command

    from quicksave.roles import ensure_roles

    admin = ensure_roles()["admin"]
    admin.permissions.remove(Permission.objects.get(codename="delete_thread"))  # as before an upgrade

    call_command("migrate", verbosity=0)

    assert Group.objects.get(name="admin").permissions.filter(codename="delete_thread").exists()
