"""Send the matching threads' trajectories as OpenTelemetry GenAI spans (checkpoints/genai.py) to an
OTLP/HTTP receiver, with a progress bar on stderr and a count of what was sent and skipped."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlparse

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from checkpoints import genai
from checkpoints.management.trajectory_options import add_filter_arguments, chosen, progress_bar
from checkpoints.models import Thread
from quicksave import telemetry


class Command(BaseCommand):
    help = (
        "Send the trajectories of the threads started in a time range as OpenTelemetry GenAI spans over "
        "OTLP/HTTP (to --endpoint, QUICKSAVE_GENAI_OTLP_ENDPOINT or the OTEL_EXPORTER_OTLP_* variables). "
        "Message content is left out unless --content is given."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        add_filter_arguments(parser)
        parser.add_argument("--endpoint", help="The OTLP/HTTP traces URL, e.g. http://collector:4318/v1/traces")
        parser.add_argument(
            "--content", action="store_true",
            help="Send message content too (gen_ai.input.messages, tool arguments and results)",
        )  # fmt: skip
        parser.add_argument("--timeout", type=float, default=10.0, help="Seconds to wait for the receiver per request")
        parser.add_argument("--no-progress", action="store_true", help="No progress bar")

    def handle(self, *args: Any, **options: Any) -> None:
        endpoint = options["endpoint"] or settings.QUICKSAVE_GENAI_OTLP_ENDPOINT
        if endpoint and (urlparse(endpoint).scheme not in ("http", "https") or not urlparse(endpoint).netloc):
            raise CommandError(f"--endpoint must be an http:// or https:// URL, got {endpoint!r}.")
        if not 0 < options["timeout"] <= 600:
            raise CommandError("--timeout must be more than 0 and at most 600 seconds.")
        threads = chosen(options).apply(Thread.objects.all())
        bar = progress_bar(self.stderr, threads.filter(head__isnull=False).count(), "threads")
        exporter = telemetry.span_exporter(endpoint or None, timeout=options["timeout"])

        def progress(sent: genai.Sent) -> None:
            bar(sent.threads + sent.skipped)

        try:
            sent = genai.export(genai.thread_pages(threads), exporter, content=options["content"],
                                progress=None if options["no_progress"] else progress)  # fmt: skip
        except genai.ExportFailed as exc:
            raise CommandError(
                f"The OTLP receiver at {_where(endpoint)} {exc}; the threads after them were not sent."
            ) from None
        finally:
            exporter.shutdown()
        if not options["no_progress"]:
            self.stderr.write("")
        self.stderr.write(
            f"Sent {sent.spans} span(s) from {sent.threads} thread(s); skipped {sent.skipped}"
            + (f" (e.g. {', '.join(sent.skipped_ids[:5])})" if sent.skipped else "")
            + " whose state is not chat-shaped or fails its integrity check."
        )


def _where(endpoint: str) -> str:
    return endpoint or "the OTEL_EXPORTER_OTLP_* endpoint"
