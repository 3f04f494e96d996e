"""Issue an API key for an agent (creating the agent if needed); prints the key once."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from audit.trail import cli_actor_name
from quicksave_agents.keys import issue_key


class Command(BaseCommand):
    help = "Create an API key for AGENT and print it once. The agent is created if it does not exist."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("agent", help="Agent name, e.g. travel")
        parser.add_argument("--label", default="", help="What the key is for, shown in key lists")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            key, plaintext = issue_key(agent_name=options["agent"], label=options["label"], actor_name=cli_actor_name())
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        self.stderr.write(f"Key {key.prefix} created for agent {key.agent.name}. It is shown once; store it now.")
        self.stdout.write(plaintext)
