"""Typed readers for environment variables that fail loudly on a bad value."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path


class ConfigError(RuntimeError):
    """An environment variable holds a value Quicksave cannot use."""


def envstr(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def envbool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    value = raw.strip().lower()
    if value in {"1", "true", "yes", "on"}:
        return True
    if value in {"0", "false", "no", "off"}:
        return False
    raise ConfigError(f"{name} must be one of true/false/1/0/yes/no/on/off, got {raw!r}")


def envint(name: str, default: int, *, minimum: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be an integer, got {raw!r}") from None
    if minimum is not None and value < minimum:
        raise ConfigError(f"{name} must be at least {minimum}, got {value}")
    return value


def envlist(name: str, default: list[str] | None = None) -> list[str]:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return list(default or [])
    return [item.strip() for item in raw.split(",") if item.strip()]


def envsecret(name: str, file: Path, *, generate: Callable[[], str], required: bool) -> str:
    """A secret from the environment; unset, refused when `required` (production), else one
    generated once and kept in `file` (readable by its owner only) so restarts keep it."""
    value = envstr(name)
    if value:
        return value
    if required:
        raise ConfigError(f"{name} must be set in production")
    if not file.exists():
        file.parent.mkdir(parents=True, exist_ok=True)
        file.touch(mode=0o600)
        file.write_text(generate() + "\n")
    return file.read_text().strip()


# Placeholders from examples and tutorials: a key containing one is public knowledge, however long.
WELL_KNOWN_SECRETS = ("changeme", "change-me", "change_me", "replaceme", "replace-me", "your-secret-key",
                      "yoursecretkey", "secret-key", "secretkey", "insecure", "example", "notsecret")  # fmt: skip
SECRET_MIN_LENGTH = 50


def check_strong_secret(name: str, value: str) -> None:
    """Refuse a secret anyone could guess (production only): shorter than 50 characters, fewer than 5
    different characters, Django's `django-insecure-` placeholder, or a well-known one. The message
    names the variable and the rule, never the value."""
    generate = "generate one with: python -c 'import secrets; print(secrets.token_urlsafe(50))'"
    if len(value) < SECRET_MIN_LENGTH:
        problem = f"must be at least {SECRET_MIN_LENGTH} characters long in production, got {len(value)}"
    elif len(set(value)) < 5:
        problem = "must hold at least 5 different characters in production"
    elif value.startswith("django-insecure-"):
        problem = "must not start with Django's django-insecure- prefix in production"
    elif any(word in value.lower() for word in WELL_KNOWN_SECRETS):
        problem = "must not contain a well-known placeholder (changeme, your-secret-key, insecure…) in production"
    else:
        return
    raise ConfigError(f"{name} {problem} (QUICKSAVE_REQUIRE_SECRET_KEY=true); {generate}")
