"""`manage.py ensureadmin`: the first superuser of a fresh install, created once."""

from __future__ import annotations

import re
from io import StringIO
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command


def ensureadmin() -> str:
    out = StringIO()
    call_command("ensureadmin", stdout=out)
    return out.getvalue()


@pytest.fixture(autouse=True)
def _no_admin_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("QUICKSAVE_ADMIN_USER", raising=False)
    monkeypatch.delenv("QUICKSAVE_ADMIN_PASSWORD", raising=False)


def test_password_is_taken_from_the_environment(db: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUICKSAVE_ADMIN_USER", "root-of-trust")
    monkeypatch.setenv("QUICKSAVE_ADMIN_PASSWORD", "from-the-env-123")

    output = ensureadmin()

    admin = User.objects.get(username="root-of-trust")
    assert admin.is_superuser and admin.is_staff
    assert admin.check_password("from-the-env-123")
    assert "from-the-env-123" not in output


def test_generated_password_is_printed_once_and_works(db: Any) -> None:
    first = ensureadmin()

    match = re.search(r"Password: (\S+)", first)
    assert match, first
    admin = User.objects.get(username="admin")
    assert admin.is_superuser
    assert admin.check_password(match.group(1))

    second = ensureadmin()
    assert "admin user exists" in second
    assert match.group(1) not in second


def test_second_run_creates_nothing(db: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    ensureadmin()
    monkeypatch.setenv("QUICKSAVE_ADMIN_USER", "another-admin")
    monkeypatch.setenv("QUICKSAVE_ADMIN_PASSWORD", "another-password-1")

    assert ensureadmin().strip() == "admin user exists"

    assert list(User.objects.values_list("username", flat=True)) == ["admin"]
    assert not User.objects.get(username="admin").check_password("another-password-1")


def test_existing_plain_user_with_the_admin_name_is_not_promoted_silently(db: Any) -> None:
    User.objects.create_user("admin", password="plain-user-1")

    with pytest.raises(CommandError, match="not a superuser"):
        ensureadmin()

    assert not User.objects.filter(is_superuser=True).exists()


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("a" * 200, "at most 150 characters (it has 200)"),
        ("root admin", "Enter a valid username"),
        ("adm\udcffin", "Enter a valid username"),  # an environment value that was not UTF-8
    ],
    ids=["too long", "a space", "not UTF-8"],
)
def test_an_admin_name_no_user_can_have_is_refused_before_anything_is_made(
    db: Any, monkeypatch: pytest.MonkeyPatch, name: str, problem: str
) -> None:
    monkeypatch.setenv("QUICKSAVE_ADMIN_USER", name)

    with pytest.raises(CommandError, match=r"QUICKSAVE_ADMIN_USER .* cannot be a user name: ") as refused:
        ensureadmin()

    assert problem in str(refused.value)
    assert not User.objects.exists()
