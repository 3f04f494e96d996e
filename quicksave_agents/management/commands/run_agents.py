"""The agent worker: claims resume runs and drives the in-process agents."""

from __future__ import annotations

import contextlib
import signal
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from prometheus_client import start_http_server

from quicksave import background
from quicksave_agents.worker import Worker


class Command(BaseCommand):
    help = (
        "Run in-process agents: claim queued runs (woken by NOTIFY), drive each agent, repeat; and beside them the "
        "background services apps register (the notifications dispatcher)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--agent", action="append", dest="agents", help="Only these agents (repeatable)")
        parser.add_argument("--lease", type=int, default=None, help="Lease seconds (QUICKSAVE_RUN_LEASE_SECONDS)")
        parser.add_argument("--poll", type=float, default=5.0, help="Seconds between polls when no NOTIFY comes")
        parser.add_argument("--once", action="store_true", help="Drive queued runs until none is left, then exit")
        parser.add_argument("--name", default=None, help="Worker name shown on claimed runs")
        parser.add_argument(
            "--metrics-port",
            type=int,
            default=None,
            help="Serve this worker's Prometheus metrics on this port (internal scraping only)",
        )
        parser.add_argument("--metrics-address", default="127.0.0.1",
                            help="Address the metrics port binds (default 127.0.0.1)")  # fmt: skip
        parser.add_argument(
            "--no-services", action="store_true", help="Run no background service (the notifications dispatcher)"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            worker = Worker(agent_names=options["agents"], lease_seconds=options["lease"], poll_seconds=options["poll"],
                            name=options["name"])  # fmt: skip
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        self.stderr.write(f"worker {worker.name} serving {', '.join(worker.agent_names)}")
        if options["metrics_port"] is not None:
            # No token here: bind it where only the scraper reaches (a pod or container network).
            start_http_server(options["metrics_port"], addr=options["metrics_address"])
        if options["once"]:
            while worker.run_once():
                pass
            return
        signal.signal(signal.SIGTERM, lambda *_: worker.stopping.set())
        if not options["no_services"]:
            background.start_all(worker.stopping)
        with contextlib.suppress(KeyboardInterrupt):
            worker.run_forever()
