"""Reads the notifications pages and the API share: channels with how their deliveries stand, and
an endpoint's delivery log."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from django.db.models import Count, Prefetch, Q, QuerySet
from django.utils import timezone

from notifications.models import Delivery, DeliveryStatus, Endpoint, Subscription

LOG_PAGE = 50


@dataclass(frozen=True)
class EndpointRow:
    endpoint: Endpoint
    pending: int
    failed_today: int
    last: Delivery | None


def endpoint_rows() -> list[EndpointRow]:
    """Every channel with its subscriptions, its pending deliveries, those given up in the last
    day, and its latest delivery: three queries however many channels there are."""
    since = timezone.now() - timedelta(days=1)
    endpoints = list(
        Endpoint.objects.prefetch_related(Prefetch("subscriptions", queryset=Subscription.objects.order_by("id")))
        .annotate(
            pending=Count("deliveries", filter=Q(deliveries__status=DeliveryStatus.PENDING)),
            failed_today=Count("deliveries", filter=Q(deliveries__status=DeliveryStatus.FAILED,
                                                      deliveries__created_at__gte=since)),
        )
        .order_by("name")
    )  # fmt: skip
    latest = {
        delivery.endpoint_id: delivery
        for delivery in Delivery.objects.filter(endpoint__in=endpoints).order_by("endpoint_id", "-id")
        .distinct("endpoint_id").defer("body")
    }  # fmt: skip
    return [
        EndpointRow(endpoint=endpoint, pending=endpoint.pending, failed_today=endpoint.failed_today,
                    last=latest.get(endpoint.pk))
        for endpoint in endpoints
    ]  # fmt: skip


def delivery_log(
    endpoint: Endpoint, *, before: int | None = None, size: int = LOG_PAGE
) -> tuple[list[Delivery], int | None]:
    """A page of the endpoint's deliveries, newest first, and the id the next page starts before."""
    deliveries: QuerySet[Delivery] = Delivery.objects.filter(endpoint=endpoint).defer("body").order_by("-id")
    if before is not None:
        deliveries = deliveries.filter(id__lt=before)
    rows = list(deliveries[: size + 1])
    return rows[:size], rows[size - 1].pk if len(rows) > size else None
