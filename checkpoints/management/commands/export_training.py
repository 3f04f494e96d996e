"""Write fine-tuning JSONL or preference pairs (checkpoints/trajectories.py) for the matching threads,
with a progress bar on stderr and a count of what was written and skipped."""

from __future__ import annotations

import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, BinaryIO

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from checkpoints import trajectories
from checkpoints.models import Thread, ThreadStatus

BAR_WIDTH = 30


class Command(BaseCommand):
    help = "Export fine-tuning JSONL (`fine-tuning`) or preference pairs (`preferences`) to stdout or a file (-o)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("kind", choices=["fine-tuning", "preferences"])
        parser.add_argument("--agent", help="Only this agent's threads (its name)")
        parser.add_argument("--since", help="Threads started at or after this time (ISO 8601)")
        parser.add_argument("--until", help="Threads started before this time (ISO 8601)")
        parser.add_argument("--outcome", choices=ThreadStatus.values, help="Only threads with this status")
        parser.add_argument(
            "--rejections", choices=["skip", "comment"], default="skip",
            help="preferences: a rejection's comment as the preferred assistant turn (comment), or leave it out",
        )  # fmt: skip
        parser.add_argument("-o", "--output", help="Write to this file instead of stdout")
        parser.add_argument("--no-progress", action="store_true", help="No progress bar")

    def handle(self, *args: Any, **options: Any) -> None:
        chosen = trajectories.Filter(
            agent=options["agent"], since=_when(options["since"], "--since"), until=_when(options["until"], "--until"),
            outcome=options["outcome"],
        )  # fmt: skip
        threads = chosen.apply(Thread.objects.all())
        if options["kind"] == "fine-tuning":
            total = trajectories.fine_tuning_candidates(threads).count()
            what = "threads"
        else:
            total = trajectories.pair_candidates(threads).count()
            what = "approvals"
        tally = trajectories.Tally(progress=None if options["no_progress"] else self._bar(total, what))
        if options["kind"] == "fine-tuning":
            records = trajectories.fine_tuning_records(threads, tally=tally)
        else:
            records = trajectories.preference_records(threads, rejections=options["rejections"], tally=tally)
        path = options["output"]
        out = _opened(path) if path else sys.stdout.buffer
        try:
            for chunk in trajectories.lines(records):
                out.write(chunk)
        finally:
            if path:
                out.close()
            else:
                out.flush()
        if not options["no_progress"]:
            self.stderr.write("")
        self.stderr.write(
            f"Wrote {tally.written} line(s) from {tally.seen} {what}; skipped {tally.skipped}"
            + (f" (e.g. {', '.join(tally.skipped_ids[:5])})" if tally.skipped else "")
            + "."
        )

    def _bar(self, total: int, what: str) -> Callable[[int], None]:
        def progress(seen: int) -> None:
            filled = BAR_WIDTH * seen // total if total else BAR_WIDTH
            self.stderr.write(f"\r[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {seen}/{total} {what}", ending="")
            self.stderr.flush()

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


def _opened(path: str) -> BinaryIO:
    try:
        return open(path, "wb")
    except OSError as exc:
        raise CommandError(f"Cannot write the export to {path}: {exc.strerror or exc}.") from None
