"""Show or set an agent's retention policy, which `manage.py prune` applies."""

from __future__ import annotations

import re
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from audit.trail import cli_actor_name
from checkpoints import retention
from quicksave_agents.models import Agent

# Each option, the setting it changes, and the word that clears the setting.
OPTIONS = {
    "completed_days": ("--completed-days", "forever"),
    "failed_days": ("--failed-days", "forever"),
    "compact_after": ("--compact-after", "never"),
    "keep_every": ("--keep-every", None),
}

DIGITS = re.compile(r"[0-9]+")
# More digits than any setting's limit (retention.MAX_COUNT has ten) can be refused unread.
MAX_DIGITS = 18


class Command(BaseCommand):
    help = (
        "Show an agent's retention policy, or change it: how many days completed and failed threads are kept "
        "after their last update, and how long histories are compacted. `manage.py prune` applies it."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("agent", help="Agent name")
        parser.add_argument(
            "--completed-days",
            metavar="N|forever",
            help="Delete completed threads N days after their last update ('forever': never).",
        )
        parser.add_argument(
            "--failed-days",
            metavar="M|forever",
            help="Delete failed threads M days after their last update ('forever': never).",
        )
        parser.add_argument(
            "--compact-after",
            metavar="K|never",
            help="Compact threads with more than K checkpoints ('never': turn compaction off).",
        )
        parser.add_argument("--keep-every", metavar="N",
                            help="When compacting, keep every Nth checkpoint of each branch (N >= 2), plus heads, "
                                 "fork points and checkpoints approvals and runs refer to.")  # fmt: skip

    def handle(self, *args: Any, **options: Any) -> None:
        name = options["agent"]
        agent = Agent.objects.filter(name=name).first()
        if agent is None:
            known = list(Agent.objects.order_by("name").values_list("name", flat=True)[:20])
            raise CommandError(f"No agent named '{name}'. Agents: {', '.join(known) or 'none yet'}.")
        changes = {
            setting: _parse(options[setting], option=option, clear=clear)
            for setting, (option, clear) in OPTIONS.items()
            if options[setting] is not None
        }
        if changes:
            try:
                policy = retention.set_policy(agent=agent, actor_name=cli_actor_name(), **changes)
            except retention.InvalidPolicy as exc:
                raise CommandError(exc.message) from None
            self.stdout.write(f"Retention policy of agent '{agent.name}' updated:")
        else:
            policy = retention.Policy.of(agent)
            self.stdout.write(f"Retention policy of agent '{agent.name}':")
        for line in policy.describe():
            self.stdout.write(f"  {line}")


def _parse(raw: str, *, option: str, clear: str | None) -> int | None:
    value = raw.strip().lower()
    if clear is not None and value == clear:
        return None
    # ASCII digits only: str.isdigit() also takes '²' (which int() refuses) and other scripts' digits.
    if not DIGITS.fullmatch(value):
        also = f", or '{clear}'" if clear else ""
        raise CommandError(f"{option} takes a whole number{also}; got '{raw}'.")
    if len(value.lstrip("0")) > MAX_DIGITS:  # far beyond any limit, and int() refuses 4,301 digits
        raise CommandError(f"{option} is out of range: got a number of {len(value)} digits.")
    return int(value)
