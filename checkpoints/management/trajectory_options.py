"""What the trajectory exports (`export_training`, `export_genai`) share: the options that choose
their threads, read into a `trajectories.Filter`, and the progress bar they draw on stderr."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from django.core.management.base import CommandError, CommandParser, OutputWrapper
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from checkpoints import trajectories
from checkpoints.models import ThreadStatus

BAR_WIDTH = 30


def add_filter_arguments(parser: CommandParser) -> None:
    """--agent, --since, --until and --outcome: which threads an export reads."""
    parser.add_argument("--agent", help="Only this agent's threads (its name)")
    parser.add_argument("--since", help="Threads started at or after this time (ISO 8601)")
    parser.add_argument("--until", help="Threads started before this time (ISO 8601)")
    parser.add_argument("--outcome", choices=ThreadStatus.values, help="Only threads with this status")


def chosen(options: dict[str, Any]) -> trajectories.Filter:
    """The filter the options of `add_filter_arguments` ask for; a CommandError names a bad time."""
    return trajectories.Filter(
        agent=options["agent"], since=_when(options["since"], "--since"), until=_when(options["until"], "--until"),
        outcome=options["outcome"],
    )  # fmt: skip


def progress_bar(stderr: OutputWrapper, total: int, what: str) -> Callable[[int], None]:
    """Draws `[####....] seen/total what` over itself on `stderr`."""

    def progress(seen: int) -> None:
        filled = BAR_WIDTH * seen // total if total else BAR_WIDTH
        stderr.write(f"\r[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {seen}/{total} {what}", ending="")
        stderr.flush()

    return progress


def _when(value: str | None, option: str) -> datetime | None:
    if value is None:
        return None
    try:
        parsed = parse_datetime(value)
    except ValueError:
        parsed = None
    if parsed is None:
        raise CommandError(f"{option} {value!r} is not an ISO 8601 time (e.g. 2026-01-31T00:00:00Z).")
    return parsed if timezone.is_aware(parsed) else timezone.make_aware(parsed, UTC)
