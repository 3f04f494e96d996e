"""Write a thread's trajectory as JSON Lines (the format is described in checkpoints/export.py)."""

from __future__ import annotations

import sys
from typing import Any, BinaryIO
from uuid import UUID

from django.core.management.base import BaseCommand, CommandError, CommandParser

from checkpoints.export import encode_line, trajectory
from checkpoints.models import Thread


class Command(BaseCommand):
    help = "Export a thread's checkpoints, branches and states as JSON Lines (stdout, or a file with -o)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("thread", help="Thread id")
        parser.add_argument("-o", "--output", help="Write to this file instead of stdout")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            thread_id = UUID(options["thread"])
        except ValueError:
            raise CommandError(f"{options['thread']!r} is not a thread id (a UUID).") from None
        thread = Thread.objects.select_related("agent").filter(pk=thread_id).first()
        if thread is None:
            raise CommandError(f"Thread {thread_id} does not exist.")
        path = options["output"]
        out = _opened(path) if path else sys.stdout.buffer
        written = 0
        try:
            for record in trajectory(thread):
                out.write(encode_line(record))
                if record["type"] == "error":
                    raise CommandError(f"Export stopped: {record['error']['message']}")
                if record["type"] == "checkpoint":
                    written += 1
        finally:
            if path:
                out.close()
            else:
                out.flush()
        if path:
            self.stderr.write(f"Exported {written} checkpoint(s) of thread {thread.pk} to {path}.")


def _opened(path: str) -> BinaryIO:
    """The output file, made or emptied; a path that cannot be written is named in a CommandError."""
    try:
        return open(path, "wb")
    except OSError as exc:
        raise CommandError(f"Cannot write the export to {path}: {exc.strerror or exc}.") from None
