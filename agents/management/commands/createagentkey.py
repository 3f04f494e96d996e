"""Issue an API key for an agent (creating the agent if needed); prints the key once."""

from __future__ import annotations

import re
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from agents.keys import create_agent_key, get_or_create_agent
from agents.models import AgentKey
from approvals.audit import cli_actor_name

AGENT_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
LABEL_MAX_CHARS: int = AgentKey._meta.get_field("label").max_length or 100


class Command(BaseCommand):
    help = "Create an API key for AGENT and print it once. The agent is created if it does not exist."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("agent", help="Agent name, e.g. travel")
        parser.add_argument("--label", default="", help="What the key is for, shown in key lists")

    def handle(self, *args: Any, **options: Any) -> None:
        name: str = options["agent"]
        if not AGENT_NAME.fullmatch(name):
            raise CommandError(
                f"Agent names are 1 to 64 lowercase letters, digits, '-' or '_', starting with a letter or digit; "
                f"got {name!r}"
            )
        label: str = options["label"]
        if len(label) > LABEL_MAX_CHARS or not label.isprintable():
            raise CommandError(f"A label is at most {LABEL_MAX_CHARS} printable characters; got {label!r}")
        with transaction.atomic():  # no agent is left behind without the key it was created for
            agent = get_or_create_agent(name=name)
            key, plaintext = create_agent_key(agent=agent, label=label, actor_name=cli_actor_name())
        self.stderr.write(f"Key {key.prefix} created for agent {agent.name}. It is shown once; store it now.")
        self.stdout.write(plaintext)
