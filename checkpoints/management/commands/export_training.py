"""Write fine-tuning JSONL or preference pairs (checkpoints/trajectories.py) for the matching threads,
with a progress bar on stderr and a count of what was written and skipped."""

from __future__ import annotations

import sys
from typing import Any, BinaryIO

from django.core.management.base import BaseCommand, CommandError, CommandParser

from checkpoints import trajectories
from checkpoints.management.trajectory_options import add_filter_arguments, chosen, progress_bar
from checkpoints.models import Thread


class Command(BaseCommand):
    help = "Export fine-tuning JSONL (`fine-tuning`) or preference pairs (`preferences`) to stdout or a file (-o)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("kind", choices=["fine-tuning", "preferences"])
        add_filter_arguments(parser)
        parser.add_argument(
            "--rejections", choices=["skip", "comment"], default="skip",
            help="preferences: a rejection's comment as the preferred assistant turn (comment), or leave it out",
        )  # fmt: skip
        parser.add_argument("-o", "--output", help="Write to this file instead of stdout")
        parser.add_argument("--no-progress", action="store_true", help="No progress bar")

    def handle(self, *args: Any, **options: Any) -> None:
        threads = chosen(options).apply(Thread.objects.all())
        if options["kind"] == "fine-tuning":
            total = trajectories.fine_tuning_candidates(threads).count()
            what = "threads"
        else:
            total = trajectories.pair_candidates(threads).count()
            what = "approvals"
        tally = trajectories.Tally(progress=None if options["no_progress"] else progress_bar(self.stderr, total, what))
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


def _opened(path: str) -> BinaryIO:
    try:
        return open(path, "wb")
    except OSError as exc:
        raise CommandError(f"Cannot write the export to {path}: {exc.strerror or exc}.") from None
