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
