"""Production (QUICKSAVE_REQUIRE_SECRET_KEY=true) refuses a SECRET_KEY anyone could guess: the
integrity MACs and the session signatures derive from it."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from tests.processes import ROOT

STRONG = secrets.token_urlsafe(50)


def start_settings(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """Load quicksave.settings in a fresh process, as a production server would at start-up."""
    environment = {
        **os.environ,
        "DATABASE_URL": "postgresql://127.0.0.1/unused",
        "DEBUG": "false",
        "QUICKSAVE_REQUIRE_SECRET_KEY": "true",
        "QUICKSAVE_ENCRYPTION_KEYS": "prod-1:" + "A" * 43 + "=",
        "QUICKSAVE_VAR_DIR": str(tmp_path),
        "DJANGO_SETTINGS_MODULE": "quicksave.settings",
        **env,
    }
    if "QUICKSAVE_INTEGRITY_KEY" not in env:
        environment.pop("QUICKSAVE_INTEGRITY_KEY", None)
    code = "import django.conf; django.conf.settings.SECRET_KEY; print('STARTED')"
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=environment, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    ("key", "rule"),
    [
        ("changeme", "at least 50 characters"),
        ("secret", "at least 50 characters"),
        ("x" * 49, "at least 50 characters"),
        ("django-insecure-" + secrets.token_urlsafe(50), "django-insecure-"),
        ("changeme" * 8, "well-known"),
        ("your-secret-key-" + "a" * 40, "well-known"),
        ("ab" * 30, "5 different characters"),
    ],
)
def test_production_refuses_a_short_or_well_known_secret_key(tmp_path: Path, key: str, rule: str) -> None:
    result = start_settings(tmp_path, SECRET_KEY=key)

    assert result.returncode != 0 and "STARTED" not in result.stdout
    error = result.stderr.strip().splitlines()[-1]
    assert error.startswith("quicksave.env.ConfigError: SECRET_KEY ")
    assert rule in error
    assert f"{key!r}" not in error and f"got {key}" not in error  # the refused value is a secret too


def test_production_refuses_a_weak_integrity_key_set_on_its_own(tmp_path: Path) -> None:
    result = start_settings(tmp_path, SECRET_KEY=STRONG, QUICKSAVE_INTEGRITY_KEY="changeme")

    assert result.returncode != 0
    assert "ConfigError: QUICKSAVE_INTEGRITY_KEY " in result.stderr


def test_production_starts_with_a_generated_key(tmp_path: Path) -> None:
    result = start_settings(tmp_path, SECRET_KEY=STRONG)

    assert result.returncode == 0, result.stderr
    assert "STARTED" in result.stdout


def test_outside_production_a_short_key_is_still_accepted(tmp_path: Path) -> None:
    result = start_settings(tmp_path, SECRET_KEY="changeme", QUICKSAVE_REQUIRE_SECRET_KEY="false")

    assert result.returncode == 0, result.stderr
