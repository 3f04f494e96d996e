"""Start the demo agents' threads and drive them to interesting places, so a new dashboard has material."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from agents.demo import CodeReviewAgent, MigrationAgent, TravelAgent
from agents.runtime import start_thread
from agents.worker import Worker


class Command(BaseCommand):
    help = (
        "Create the demo threads (travel waiting for approval, a finished code review, a migration that "
        "failed at step 20) and drive their runs in this process. Safe to run again: existing demo threads stay."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--no-run", action="store_true", help="Only queue the runs; let run_agents drive them")

    def handle(self, *args: Any, **options: Any) -> None:
        started = [
            start_thread(agent_class=TravelAgent, external_id="demo-trip-rome", destination="FCO"),
            start_thread(agent_class=TravelAgent, external_id="demo-trip-lisbon", destination="LIS", price_jump=True),
            start_thread(agent_class=CodeReviewAgent, external_id="demo-review-shop", repository="acme/shop"),
            start_thread(agent_class=MigrationAgent, external_id="demo-migration-orders"),
        ]
        self.stdout.write(f"Demo threads: {', '.join(thread.external_id or str(thread.pk) for thread in started)}")
        if options["no_run"]:
            return
        worker = Worker(name="seed_demo")
        driven = 0
        while worker.run_once():
            driven += 1
        self.stdout.write(f"Drove {driven} run(s); the travel threads now wait for approval in the inbox.")
