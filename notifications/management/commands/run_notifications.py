"""The notifications dispatcher on its own (`run_agents` and the embedded server run one too)."""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from typing import Any

import httpx
from django.core.management.base import BaseCommand, CommandError, CommandParser

from notifications import dispatch, endpoints


class Command(BaseCommand):
    help = "Send notifications: fan out queued events, send due deliveries, retry failed ones (woken by NOTIFY)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--poll", type=float, default=5.0, help="Seconds between polls when no NOTIFY comes")
        parser.add_argument("--concurrency", type=int, default=None,
                            help="Deliveries sent at once (QUICKSAVE_NOTIFY_CONCURRENCY)")  # fmt: skip
        parser.add_argument("--once", action="store_true", help="Send what is due now, then exit")

    def handle(self, *args: Any, **options: Any) -> None:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        if options["once"]:
            endpoints.reseal_stale()
            with httpx.Client(follow_redirects=False) as client:
                while dispatch.fan_out() + dispatch.notice_expiring():
                    pass
                while dispatch.send_due(client=client):
                    pass
            return
        if options["concurrency"] is not None and options["concurrency"] < 1:
            raise CommandError("--concurrency must be at least 1")
        try:
            dispatcher = dispatch.Dispatcher(poll_seconds=options["poll"], concurrency=options["concurrency"])
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        stopping = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stopping.set())
        self.stderr.write("notifications dispatcher running")
        with contextlib.suppress(KeyboardInterrupt):
            dispatcher.run_forever(stopping)
