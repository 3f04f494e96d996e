"""GET /metrics: this process's metrics (or, with PROMETHEUS_MULTIPROC_DIR, every process's on the
host) in Prometheus' text format, plus gauges read from the database when scraped.

Only a scraper holding QUICKSAVE_METRICS_TOKEN (`Authorization: Bearer ...`) gets an answer;
without the setting the route answers 404, as if it did not exist. The database gauges cost two
indexed aggregate queries per scrape and nothing on the write path.
"""

from __future__ import annotations

import hmac
import logging
import os
from collections.abc import Iterator
from typing import Any

from django.conf import settings
from django.db.models import Count, Min
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest, multiprocess
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)


class DatabaseCollector(Collector):
    """Gauges of what waits in the database: approvals and in-doubt calls pending (and the oldest's
    age), runs queued and running (and the oldest queued run's age)."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        from approvals.models import ApprovalKind, ApprovalRequest, ApprovalStatus
        from quicksave_agents.models import Run, RunStatus

        try:
            pending = {
                row["kind"]: row
                for row in ApprovalRequest.objects.filter(status=ApprovalStatus.PENDING)
                .values("kind").annotate(count=Count("pk"), oldest=Min("created_at")).order_by()
            }  # fmt: skip
            runs = {
                row["status"]: row
                for row in Run.objects.filter(status__in=[RunStatus.QUEUED, RunStatus.RUNNING])
                .values("status").annotate(count=Count("pk"), oldest=Min("created_at")).order_by()
            }  # fmt: skip
        except Exception:  # the database is down: the scrape still shows the process's own metrics
            log.warning("metrics: reading the database gauges failed", exc_info=True)
            return
        now = timezone.now()

        def age(row: dict[str, Any] | None) -> float:
            return max(0.0, (now - row["oldest"]).total_seconds()) if row and row["oldest"] else 0.0

        approvals = pending.get(ApprovalKind.APPROVAL)
        in_doubt = pending.get(ApprovalKind.IN_DOUBT)
        yield GaugeMetricFamily("quicksave_approvals_pending", "Approvals waiting for a decision.",
                                value=approvals["count"] if approvals else 0)  # fmt: skip
        yield GaugeMetricFamily("quicksave_approval_oldest_pending_age_seconds",
                                "Age of the oldest approval waiting for a decision (0 when none waits).",
                                value=age(approvals))  # fmt: skip
        yield GaugeMetricFamily("quicksave_in_doubt_calls_pending",
                                "Tool calls in doubt (they may have run without a result) waiting for a person.",
                                value=in_doubt["count"] if in_doubt else 0)  # fmt: skip
        by_status = GaugeMetricFamily("quicksave_runs", "Open runs (resume jobs), by status.", labels=["status"])
        for status in (RunStatus.QUEUED, RunStatus.RUNNING):
            by_status.add_metric([status], runs[status]["count"] if status in runs else 0)
        yield by_status
        yield GaugeMetricFamily("quicksave_run_queue_oldest_age_seconds",
                                "Age of the oldest queued run nobody has claimed yet (0 when none is queued).",
                                value=age(runs.get(RunStatus.QUEUED)))  # fmt: skip


_database = CollectorRegistry()  # no describe: registering it must not query the database
_database.register(DatabaseCollector())


def exposition() -> bytes:
    """Every metric of this process (or of all the host's processes in multiprocess mode), then the
    database gauges."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        processes = CollectorRegistry()
        multiprocess.MultiProcessCollector(processes)  # type: ignore[no-untyped-call]
        own = generate_latest(processes)
    else:
        own = generate_latest(REGISTRY)
    return own + generate_latest(_database)


def authorized(request: HttpRequest) -> bool:
    token: str = settings.QUICKSAVE_METRICS_TOKEN
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    return bool(token) and scheme == "Bearer" and hmac.compare_digest(given.strip().encode(), token.encode())


@never_cache
@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    if not settings.QUICKSAVE_METRICS_TOKEN:
        return HttpResponse("Metrics are off: set QUICKSAVE_METRICS_TOKEN.\n", status=404, content_type="text/plain")
    if not authorized(request):
        response = HttpResponse("A bearer token is required.\n", status=401, content_type="text/plain")
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    return HttpResponse(exposition(), content_type=CONTENT_TYPE_LATEST)
