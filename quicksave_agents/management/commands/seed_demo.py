"""Start the demo agents' threads and drive them to interesting places, so a new dashboard has material."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from checkpoints.models import Checkpoint, Thread
from quicksave_agents import tool_calls
from quicksave_agents.demo import FILES, CodeReviewAgent, MigrationAgent, TravelAgent, seeders
from quicksave_agents.demo_threads import describe
from quicksave_agents.runtime import start_thread
from quicksave_agents.worker import Worker, load_agent_modules


class Command(BaseCommand):
    help = (
        "Create the demo threads (travel waiting for approval, a finished code review, a code review whose "
        "worker died while posting a review, a migration that failed at step 20) and drive their runs in this "
        "process, then say what each is doing. Safe to run again: existing demo threads stay as they are."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--no-run", action="store_true", help="Only queue the runs; let run_agents drive them")

    def handle(self, *args: Any, **options: Any) -> None:
        started = [
            start_thread(agent_class=TravelAgent, external_id="demo-trip-rome", destination="FCO"),
            start_thread(agent_class=TravelAgent, external_id="demo-trip-lisbon", destination="LIS", price_jump=True),
            start_thread(agent_class=CodeReviewAgent, external_id="demo-review-shop", repository="acme/shop"),
            start_thread(agent_class=MigrationAgent, external_id="demo-migration-orders"),
            _review_whose_worker_died(),
        ]
        load_agent_modules()  # the agent modules' own demos (an integration's) register as they load
        started += [seed() for seed in seeders()]
        if not options["no_run"]:
            worker = Worker(name="seed_demo")
            while worker.run_once():
                pass
        # What each thread is doing now, read back: on a second run some were decided, resumed or reset.
        rows = describe(Thread.objects.filter(pk__in=[thread.pk for thread in started]))
        width = max(len(row.name) for row in rows)
        self.stdout.write("Demo threads:")
        for row in rows:
            self.stdout.write(f"  {row.name.ljust(width)}  {row.doing}")
        waiting = sum(row.pending for row in rows)
        if waiting:
            self.stdout.write(f"{waiting} demo request(s) wait in the inbox.")
        else:
            self.stdout.write("No demo request waits in the inbox (python3 dev.py reset-demo starts the demo again).")


def _review_whose_worker_died() -> Thread:
    """A code review whose first review was started by a worker that died before recording whether it
    was posted: the intent such a worker leaves behind. Its run finds the call in doubt and asks."""
    thread = start_thread(agent_class=CodeReviewAgent, external_id="demo-review-crashed", repository="acme/shop")
    start = Checkpoint.objects.filter(thread=thread).order_by("seq").first()
    if start is not None and not thread.tool_calls.exists():
        key = tool_calls.call_key(thread_id=thread.pk, checkpoint_id=start.pk, position=0)
        tool_calls.begin(thread_id=thread.pk, key=key, tool="review_file",
                         args={"repository": "acme/shop", "path": FILES[0]})  # fmt: skip
    return thread
