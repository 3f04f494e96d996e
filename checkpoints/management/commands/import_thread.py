"""Restore a thread exported with export_thread (or the API) into this installation, with new ids."""

from __future__ import annotations

import sys
import tempfile
from typing import IO, Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from checkpoints.export import InvalidTrajectory, import_thread, raw_lines
from quicksave.errors import DomainError
from quicksave_agents.models import Agent


class Command(BaseCommand):
    help = (
        "Import a JSON Lines trajectory as a new thread (new ids; the file is checked whole before anything "
        "is written). FILE may be - for stdin."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file", help="A .jsonl file from export_thread or GET /api/v1/threads/{id}/export/")
        parser.add_argument("--agent", help="Import under this agent instead of the one the file names")
        parser.add_argument("--external-id", help="Give the thread this external_id instead of the file's")

    def handle(self, *args: Any, **options: Any) -> None:
        for option, limit in (("agent", 64), ("external_id", 255)):
            given = options[option]
            # A byte that is not UTF-8 arrives from the shell as a lone surrogate: not printable either.
            if given is not None and (len(given) > limit or not given.isprintable()):
                raise CommandError(f"--{option.replace('_', '-')} takes at most {limit} printable characters.")
        agent = None
        if options["agent"]:
            agent = Agent.objects.filter(name=options["agent"]).first()
            if agent is None:
                raise CommandError(f"No agent is named '{options['agent']}' (manage.py createagentkey makes one).")
        path: str = options["file"]
        try:
            with self._open(path) as file:
                thread = import_thread(
                    file=file, agent=agent, external_id=options["external_id"], progress=self._progress
                )
        except OSError as exc:
            raise CommandError(f"Cannot read {path}: {exc.strerror or exc}") from None
        except (InvalidTrajectory, DomainError) as exc:  # the store's own refusals too (the header's metadata)
            message = exc.message if exc.message.endswith((".", "?")) else f"{exc.message}."
            raise CommandError(f"{path}: {message} Nothing was imported.") from None
        self.stdout.write(f"Imported thread {thread.pk} (agent {thread.agent.name}, status {thread.status}).")

    def _open(self, path: str) -> IO[bytes]:
        if path != "-":
            return open(path, "rb")
        # The file is read twice (checked, then written), so stdin is spooled first, a line at a
        # time, so that an endless line stops at the limit here too.
        spool = tempfile.TemporaryFile()  # noqa: SIM115 (closed by the caller's with)
        try:
            for _, raw in raw_lines(sys.stdin.buffer):
                spool.write(raw)
        except BaseException:
            spool.close()
            raise
        spool.seek(0)
        return spool

    def _progress(self, done: int, total: int) -> None:
        every = max(1, total // 20)
        if done % every == 0 or done == total:
            self.stderr.write(f"Imported {done}/{total} checkpoints ({done * 100 // max(total, 1)}%)")
