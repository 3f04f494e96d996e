"""Recompute every checkpoint's integrity MAC and report rows altered outside Quicksave."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from django.core.management.base import BaseCommand, CommandError, CommandParser

from checkpoints.models import Thread
from checkpoints.verify import verify_thread


class Command(BaseCommand):
    help = "Check the integrity MAC chain of every checkpoint (or of one thread). Exits 1 when a row fails."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--thread", help="Only this thread id")

    def handle(self, *args: Any, **options: Any) -> None:
        threads = Thread.objects.order_by("created_at")
        if options["thread"]:
            try:
                thread_id = UUID(options["thread"])
            except ValueError:
                raise CommandError(f"--thread takes a thread id (a UUID); got {options['thread']!r}") from None
            threads = threads.filter(pk=thread_id)
            if not threads.exists():
                raise CommandError(f"No thread has the id {thread_id}.")
        total = threads.count()
        failures = 0
        for index, thread in enumerate(threads.iterator(), start=1):
            for problem in verify_thread(thread):
                failures += 1
                self.stdout.write(
                    f"FAILED thread {problem.thread_id} branch {problem.branch} seq {problem.seq} "
                    f"checkpoint {problem.checkpoint_id}: {problem.reason}"
                )
            if options["verbosity"] > 1:
                self.stderr.write(f"[{index}/{total}] thread {thread.pk}")
        if failures:
            raise CommandError(f"{failures} checkpoint(s) failed their integrity check in {total} thread(s).")
        self.stdout.write(f"OK: every checkpoint in {total} thread(s) matches its integrity MAC.")
