"""Recompute every checkpoint's integrity MAC and report rows altered outside Quicksave."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from django.core.management.base import BaseCommand, CommandError, CommandParser

from checkpoints.models import Thread
from checkpoints.storage.verify import Problem, verify_thread


class Command(BaseCommand):
    help = (
        "Check the integrity MAC chain of every checkpoint (or of one thread), and that each thread's data key "
        "unwraps. Reports every failure, then exits 1 if there was any."
    )

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
        failed_threads = 0
        for index, thread in enumerate(threads.iterator(), start=1):
            problems = 0
            try:
                for problem in verify_thread(thread):
                    problems += 1
                    if problem.checkpoint_id is not None:
                        failures += 1
                    self.stdout.write(_line(problem))
            except Exception as exc:  # one thread that cannot be read must not leave the rest unchecked
                problems += 1
                self.stdout.write(f"FAILED thread {thread.pk}: could not be checked: {type(exc).__name__}: {exc}")
            failed_threads += problems > 0
            if options["verbosity"] > 1:
                self.stderr.write(f"[{index}/{total}] thread {thread.pk}")
        if failed_threads:
            raise CommandError(
                f"{failures} checkpoint(s) failed their integrity check; {failed_threads} of {total} thread(s) "
                "failed a check (see the lines above)."
            )
        self.stdout.write(f"OK: every checkpoint in {total} thread(s) matches its integrity MAC.")


def _line(problem: Problem) -> str:
    if problem.checkpoint_id is None:
        return f"FAILED thread {problem.thread_id}: {problem.reason}"
    return (
        f"FAILED thread {problem.thread_id} branch {problem.branch} seq {problem.seq} "
        f"checkpoint {problem.checkpoint_id}: {problem.reason}"
    )
