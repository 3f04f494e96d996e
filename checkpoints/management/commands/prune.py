"""Apply every agent's retention policy: delete expired threads, compact long histories, collect blobs."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser, OutputWrapper

from audit.trail import cli_actor_name
from checkpoints import retention


class ProgressBar:
    """`prune [#####-----]  50% 5/10 threads` on a terminal, redrawn in place; elsewhere (a log, a
    pipe) one line per tenth of the way, so a scheduled run's log stays short. Other commands
    (import_langgraph) name their own `label` and `unit`."""

    WIDTH = 30

    def __init__(self, stream: OutputWrapper, *, label: str = "prune", unit: str = "threads") -> None:
        self.stream = stream
        self.label = label
        self.unit = unit
        self.tty = stream.isatty()
        self.shown = -1

    def __call__(self, done: int, total: int) -> None:
        tenth = 10 if total == 0 else done * 10 // total
        if not self.tty and tenth == self.shown:
            return
        self.shown = tenth
        filled = self.WIDTH if total == 0 else done * self.WIDTH // total
        percent = 100 if total == 0 else done * 100 // total
        line = f"{self.label} [{'#' * filled}{'-' * (self.WIDTH - filled)}] {percent:3d}% {done}/{total} {self.unit}"
        finished = done >= total
        if self.tty:
            self.stream.write(f"\r{line}", ending="\n" if finished else "")
            self.stream.flush()
        else:
            self.stream.write(line)


class Command(BaseCommand):
    help = (
        "Apply every agent's retention policy (see `manage.py retention`): delete completed and failed threads "
        "past their age, compact histories longer than the agent's limit, and collect blobs no checkpoint "
        "refers to. Threads running, waiting for approval, or with an open run or a pending approval are "
        "never touched."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--dry-run", action="store_true", help="Report what would be deleted or compacted; change nothing."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        dry_run: bool = options["dry_run"]
        progress = ProgressBar(self.stderr) if options["verbosity"] > 0 else None
        report = retention.prune(dry_run=dry_run, progress=progress, actor_name=cli_actor_name())
        for skipped in report.skipped:
            self.stderr.write(f"skipped thread {skipped.thread_id}: {skipped.reason}")
        if report.blob_error:
            self.stderr.write(f"collecting unreferenced blobs failed: {report.blob_error}")
        would = "would be " if dry_run else ""
        self.stdout.write("Dry run: nothing was changed." if dry_run else "Pruned.")
        self.stdout.write(f"  threads {would}deleted:     {report.threads_deleted:,}")
        self.stdout.write(f"  threads {would}compacted:   {report.threads_compacted:,}")
        self.stdout.write(f"  checkpoints {would}removed: {report.checkpoints_removed:,}")
        self.stdout.write(f"  bytes {would}freed:         {report.bytes_freed:,} (checkpoint payloads)")
        self.stdout.write(f"  blobs {would}collected:     {report.blobs_removed:,} ({report.blob_bytes_freed:,} bytes)")
        if report.skipped:
            self.stdout.write(f"  threads skipped:     {len(report.skipped):,} (see above)")
