"""`manage.py ensureadmin`: the first superuser of a fresh install, created once."""

from __future__ import annotations

import re
import stat
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command

from audit.models import AuditEntry


def ensureadmin() -> str:
    out = StringIO()
    call_command("ensureadmin", stdout=out)
    return out.getvalue()


@pytest.fixture(autouse=True)
def _no_admin_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("QUICKSAVE_ADMIN_USER", raising=False)
    monkeypatch.delenv("QUICKSAVE_ADMIN_PASSWORD", raising=False)


@pytest.fixture(autouse=True)
def var_dir(settings: Any, tmp_path: Path) -> Path:
    """The password file goes to a var dir of the test's own, never the checkout's."""
    settings.VAR_DIR = tmp_path / "var"
    return tmp_path / "var"


def command(*args: str) -> str:
    out = StringIO()
    call_command("ensureadmin", *args, stdout=out)
    return out.getvalue()


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


def test_a_generated_password_is_kept_in_a_file_only_its_owner_reads(db: Any, var_dir: Path) -> None:
    printed = re.search(r"Password: (\S+)", ensureadmin())
    assert printed

    kept = var_dir / "admin-password"
    assert kept.read_text() == printed.group(1) + "\n"
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    assert User.objects.get(username="admin").check_password(kept.read_text().strip())


def test_a_password_from_the_environment_is_not_written_anywhere(db: Any, var_dir: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.setenv("QUICKSAVE_ADMIN_PASSWORD", "from-the-env-123")

    ensureadmin()

    assert not (var_dir / "admin-password").exists()
    assert command("--describe").splitlines()[1] == "Password     the value of QUICKSAVE_ADMIN_PASSWORD"


def test_describe_names_the_user_the_file_and_the_reset_command(db: Any, var_dir: Path) -> None:
    ensureadmin()

    assert command("--describe").splitlines() == [
        "Sign in as   admin",
        f"Password     in {var_dir / 'admin-password'}",
        "New password python3 dev.py reset-password",
    ]


def test_describe_says_when_the_file_no_longer_holds_the_password(db: Any) -> None:
    ensureadmin()
    admin = User.objects.get(username="admin")
    admin.set_password("changed-in-the-browser-1")
    admin.save()

    assert "is out of date" in command("--describe").splitlines()[1]


def test_reset_password_gives_the_admin_a_new_one_in_the_file_and_audits_it(db: Any, var_dir: Path) -> None:
    ensureadmin()
    old = (var_dir / "admin-password").read_text().strip()

    output = command("--reset-password")

    new = (var_dir / "admin-password").read_text().strip()
    admin = User.objects.get(username="admin")
    assert new != old and new in output
    assert admin.check_password(new) and not admin.check_password(old)
    entry = AuditEntry.objects.get(action="user.password_reset")
    assert (entry.target_id, entry.actor_name.startswith("cli:")) == (str(admin.pk), True)


def test_reset_password_of_nobody_says_how_to_create_the_admin(db: Any, var_dir: Path) -> None:
    with pytest.raises(CommandError, match=r"No user is named 'admin' and there is no other superuser: run `manage.py"):
        command("--reset-password")

    assert not (var_dir / "admin-password").exists()


def test_reset_password_refuses_a_user_who_is_not_an_admin(db: Any, var_dir: Path) -> None:
    User.objects.create_user("admin", password="plain-user-1")

    with pytest.raises(CommandError, match=r"'admin' is not a superuser; reset a person's password with"):
        command("--reset-password")

    assert User.objects.get(username="admin").check_password("plain-user-1")
    assert not (var_dir / "admin-password").exists()


def test_describe_and_reset_find_a_superuser_with_another_name(db: Any, var_dir: Path) -> None:
    User.objects.create_superuser("root", password="chosen-by-root-1")

    assert command("--describe").splitlines()[:2] == [
        "Sign in as   root",
        "Password     the one you chose (none is kept in a file)",
    ]
    command("--reset-password")
    assert User.objects.get(username="root").check_password((var_dir / "admin-password").read_text().strip())
