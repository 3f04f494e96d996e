"""Put the demo back as it was first seeded: delete every demo thread, then seed them again."""

from __future__ import annotations

import sys
from typing import Any

from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser

from audit.trail import cli_actor_name
from quicksave_agents.demo_threads import DemoBusy, count_by_agent, delete_demo_threads, reset_refusal


class Command(BaseCommand):
    help = (
        "Delete every thread of the demo agents (those named demo-*) with their checkpoints, approvals and "
        "runs, and start the demo threads again. Your own agents' threads stay. Asks first unless --yes."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--yes", action="store_true", help="Do not ask for confirmation")
        parser.add_argument("--no-run", action="store_true", help="Only queue the new threads' runs")

    def handle(self, *args: Any, **options: Any) -> None:
        counts = count_by_agent()
        if refusal := reset_refusal():
            raise CommandError(refusal)
        if counts:
            listed = ", ".join(f"{agent}: {count}" for agent, count in counts.items())
            self.stdout.write(
                f"This deletes the {sum(counts.values())} threads of the demo agents ({listed}) with their "
                "checkpoints, approvals and runs, and seeds the demo again. Threads of other agents stay."
            )
            if not options["yes"]:
                self._confirm()
            try:
                deleted = delete_demo_threads(actor_name=cli_actor_name())
            except DemoBusy as busy:
                raise CommandError(str(busy)) from None
            self.stdout.write(f"Deleted {deleted} demo thread(s).")
        else:
            self.stdout.write("There are no demo threads to delete; seeding the demo.")
        call_command("seed_demo", *(["--no-run"] if options["no_run"] else []), stdout=self.stdout)

    def _confirm(self) -> None:
        if not sys.stdin.isatty():
            raise CommandError("Not resetting: confirm on a terminal, or pass --yes.")
        try:
            answer = input("Type yes to reset the demo: ")
        except EOFError:
            answer = ""
        if answer.strip().lower() != "yes":
            raise CommandError("Not resetting: nothing was deleted.")
