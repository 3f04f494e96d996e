"""REST API v1 for notifications: admins configure endpoints and read and resend their deliveries."""

from __future__ import annotations

import uuid
from typing import Any

from django.db.models import QuerySet
from django.http import Http404
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from audit.trail import client_address
from notifications import dispatch, endpoints
from notifications.access import check_can_manage
from notifications.models import Delivery, Endpoint
from notifications.serializers import (
    DeliveryListQuerySerializer,
    DeliverySchemaSerializer,
    EndpointSchemaSerializer,
    EndpointWriteSerializer,
    delivery_data,
    endpoint_data,
)
from quicksave.api import CursorPage


class EndpointPagination(CursorPage):
    ordering = ("created_at", "id")


class DeliveryPagination(CursorPage):
    ordering = ("-id",)


def _endpoints() -> QuerySet[Endpoint]:
    return Endpoint.objects.prefetch_related("subscriptions")


def _endpoint(endpoint_id: Any) -> Endpoint:
    endpoint = _endpoints().filter(pk=endpoint_id).first()
    if endpoint is None:
        raise Http404(f"Endpoint {endpoint_id} does not exist.")
    return endpoint


def _delivery(delivery_id: int) -> Delivery:
    # The path takes any digits; PostgreSQL's bigint does not.
    delivery = Delivery.objects.filter(pk=delivery_id).first() if delivery_id < 2**63 else None
    if delivery is None:
        raise Http404(f"Delivery {delivery_id} does not exist.")
    return delivery


def _specs(items: list[dict[str, Any]]) -> list[endpoints.SubscriptionSpec]:
    return [endpoints.SubscriptionSpec(**item) for item in items]


def _field_errors(exc: endpoints.InvalidEndpoint) -> ValidationError:
    return ValidationError(exc.detail.get("fields") or {exc.detail.get("field", "non_field_errors"): exc.message})


def _page(name: str, item: Any) -> Any:
    return inline_serializer(name, {"results": item(many=True), "next": serializers.URLField(allow_null=True)})


class EndpointListView(APIView):
    @extend_schema(
        operation_id="v1_notification_endpoints_list", responses=_page("EndpointPage", EndpointSchemaSerializer)
    )
    def get(self, request: Request) -> Response:
        """The notification endpoints (webhooks and email) with their subscriptions (admins only)."""
        check_can_manage(request.user)
        paginator = EndpointPagination()
        page = paginator.paginate_queryset(_endpoints(), request, view=self)
        return paginator.get_paginated_response([endpoint_data(endpoint) for endpoint in page or []])

    @extend_schema(request=EndpointWriteSerializer, responses={201: EndpointSchemaSerializer})
    def post(self, request: Request) -> Response:
        """Create a notification endpoint with its subscriptions (admins only); a webhook's signing secret
        is in this response only."""
        user = check_can_manage(request.user)
        serializer = EndpointWriteSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        try:
            endpoint, secret = endpoints.create_endpoint(
                name=data["name"], kind=data["kind"], url=data["url"], recipients=data["recipients"],
                enabled=data["enabled"], decision_links=data["decision_links"],
                subscriptions=_specs(data["subscriptions"]), actor=user, address=client_address(request),
            )  # fmt: skip
        except endpoints.InvalidEndpoint as exc:
            raise _field_errors(exc) from None
        return Response(endpoint_data(_endpoint(endpoint.pk), secret=secret), status=status.HTTP_201_CREATED)


class EndpointDetailView(APIView):
    @extend_schema(responses=EndpointSchemaSerializer)
    def get(self, request: Request, endpoint_id: uuid.UUID) -> Response:
        """One notification endpoint with its subscriptions (admins only)."""
        check_can_manage(request.user)
        return Response(endpoint_data(_endpoint(endpoint_id)))

    @extend_schema(request=EndpointWriteSerializer(partial=True), responses=EndpointSchemaSerializer)
    def patch(self, request: Request, endpoint_id: uuid.UUID) -> Response:
        """Change an endpoint's name, address, recipients, subscriptions or whether it is enabled (admins
        only); its kind stays."""
        user = check_can_manage(request.user)
        endpoint = _endpoint(endpoint_id)
        serializer = EndpointWriteSerializer(data=request.data, partial=True, endpoint=endpoint)
        serializer.is_valid(raise_exception=True)
        changes = {key: value for key, value in serializer.validated_data.items() if key != "kind"}
        if "subscriptions" in changes:
            changes["subscriptions"] = _specs(changes["subscriptions"])
        try:
            endpoints.update_endpoint(endpoint=endpoint, actor=user, address=client_address(request), **changes)
        except endpoints.InvalidEndpoint as exc:
            raise _field_errors(exc) from None
        return Response(endpoint_data(_endpoint(endpoint_id)))

    @extend_schema(responses={204: None})
    def delete(self, request: Request, endpoint_id: uuid.UUID) -> Response:
        """Delete a notification endpoint and its subscriptions (admins only); its past deliveries stay
        readable in the audit trail."""
        user = check_can_manage(request.user)
        endpoints.delete_endpoint(endpoint=_endpoint(endpoint_id), actor=user, address=client_address(request))
        return Response(status=status.HTTP_204_NO_CONTENT)


class RotateSecretView(APIView):
    @extend_schema(request=None, responses=EndpointSchemaSerializer)
    def post(self, request: Request, endpoint_id: uuid.UUID) -> Response:
        """Give a webhook endpoint a new signing secret, shown in this response only (admins only); the old
        one stops signing at once."""
        user = check_can_manage(request.user)
        secret = endpoints.rotate_secret(endpoint=_endpoint(endpoint_id), actor=user, address=client_address(request))
        return Response(endpoint_data(_endpoint(endpoint_id), secret=secret))


class DeliveryListView(APIView):
    @extend_schema(operation_id="v1_notification_deliveries_list", parameters=[DeliveryListQuerySerializer],
                   responses=_page("DeliveryPage", DeliverySchemaSerializer))  # fmt: skip
    def get(self, request: Request) -> Response:
        """The notification deliveries, newest first, filterable by endpoint and status (admins only)."""
        check_can_manage(request.user)
        query = DeliveryListQuerySerializer(data=request.query_params.dict())
        query.is_valid(raise_exception=True)
        deliveries = Delivery.objects.all()
        if query.validated_data.get("endpoint"):
            deliveries = deliveries.filter(endpoint_id=query.validated_data["endpoint"])
        if query.validated_data.get("status"):
            deliveries = deliveries.filter(status=query.validated_data["status"])
        paginator = DeliveryPagination()
        page = paginator.paginate_queryset(deliveries, request, view=self)
        return paginator.get_paginated_response([delivery_data(delivery) for delivery in page or []])


class DeliveryDetailView(APIView):
    @extend_schema(responses=DeliverySchemaSerializer)
    def get(self, request: Request, delivery_id: int) -> Response:
        """One delivery with each attempt to send it (admins only)."""
        check_can_manage(request.user)
        return Response(delivery_data(_delivery(delivery_id), attempts=True))


class RedeliverView(APIView):
    @extend_schema(request=None, responses={201: DeliverySchemaSerializer})
    def post(self, request: Request, delivery_id: int) -> Response:
        """Send a delivery again as a new delivery of the same message (admins only)."""
        user = check_can_manage(request.user)
        again = dispatch.resend(delivery=_delivery(delivery_id), actor=user, address=client_address(request))
        return Response(delivery_data(again, attempts=True), status=status.HTTP_201_CREATED)
