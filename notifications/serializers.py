"""Request shapes and response bodies of the notifications API."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from approvals.models import Risk
from notifications.endpoints import (
    MAX_RECIPIENTS,
    MAX_SUBSCRIPTIONS,
    NAME_MAX,
    URL_MAX,
    SubscriptionSpec,
    name_problem,
    subscription_problems,
)
from notifications.models import Delivery, DeliveryStatus, Endpoint, Kind, Notice, Subscription
from quicksave.api import StrictSerializer


def subscription_data(subscription: Subscription) -> dict[str, Any]:
    return {
        "id": subscription.pk,
        "events": list(subscription.events),
        "agents": list(subscription.agents),
        "actions": list(subscription.actions),
        "risks": list(subscription.risks),
    }


def endpoint_data(endpoint: Endpoint, *, secret: str | None = None) -> dict[str, Any]:
    """An endpoint as the API returns it; `secret` only in the answer that made it (create, rotate)."""
    data = {
        "id": str(endpoint.pk),
        "name": endpoint.name,
        "kind": endpoint.kind,
        "url": endpoint.url_hint or None,
        "recipients": list(endpoint.recipients),
        "enabled": endpoint.enabled,
        "decision_links": endpoint.decision_links,
        "subscriptions": [subscription_data(subscription) for subscription in endpoint.subscriptions.all()],
        "created_at": endpoint.created_at.isoformat(),
        "updated_at": endpoint.updated_at.isoformat(),
    }
    if secret is not None:
        data["secret"] = secret
    return data


def delivery_data(delivery: Delivery, *, attempts: bool = False) -> dict[str, Any]:
    data: dict[str, Any] = {
        "id": delivery.pk,
        "endpoint": str(delivery.endpoint_id),
        "event": delivery.notice,
        "thread": str(delivery.thread_id),
        "approval": str(delivery.approval_id) if delivery.approval_id else None,
        "status": delivery.status,
        "attempts": delivery.attempts,
        "next_attempt_at": delivery.next_attempt_at.isoformat() if delivery.status == DeliveryStatus.PENDING else None,
        "last_attempt_at": delivery.last_attempt_at.isoformat() if delivery.last_attempt_at else None,
        "response_code": delivery.response_code,
        "error": delivery.error,
        "body_digest": delivery.body_digest or None,
        "delivered_at": delivery.delivered_at.isoformat() if delivery.delivered_at else None,
        "resend_of": delivery.resend_of_id,
        "created_at": delivery.created_at.isoformat(),
    }
    if attempts:
        data["attempt_log"] = [
            {
                "number": attempt.number,
                "started_at": attempt.started_at.isoformat(),
                "duration_ms": attempt.duration_ms,
                "response_code": attempt.response_code,
                "error": attempt.error,
            }
            for attempt in delivery.attempt_log.all()
        ]
    return data


class SubscriptionSerializer(serializers.Serializer[Any]):
    """One subscription in an endpoint's list; an unknown key is refused, as StrictSerializer does
    at the top level (a nested serializer has no `initial_data` of its own)."""

    events = serializers.ListField(
        child=serializers.ChoiceField(choices=Notice.choices), min_length=1, max_length=len(Notice.values)
    )
    agents = serializers.ListField(child=serializers.CharField(max_length=64), required=False, default=list,
                                   max_length=100, help_text="Only these agents (empty: any).")  # fmt: skip
    actions = serializers.ListField(child=serializers.CharField(max_length=200), required=False, default=list,
                                    max_length=100, help_text="Only these actions (empty: any).")  # fmt: skip
    risks = serializers.ListField(child=serializers.ChoiceField(choices=Risk.choices), required=False, default=list,
                                  max_length=len(Risk.values), help_text="Only these risks (empty: any).")  # fmt: skip

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict) and (unknown := sorted(set(data) - set(self.fields))):
            raise serializers.ValidationError(
                {unknown[0]: f"is not a field here; the fields are {', '.join(self.fields)}."}
            )
        return super().to_internal_value(data)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        # A PATCH's `partial` reaches the subscriptions in it too, but each one given is given whole.
        if "events" not in attrs:
            raise serializers.ValidationError({"events": ["This field is required."]})
        problems = subscription_problems(SubscriptionSpec(**attrs))
        if problems:
            raise serializers.ValidationError(problems)
        return attrs


class SubscriptionSchemaSerializer(serializers.Serializer[Any]):
    id = serializers.IntegerField()
    events = serializers.ListField(child=serializers.ChoiceField(choices=Notice.choices))
    agents = serializers.ListField(child=serializers.CharField())
    actions = serializers.ListField(child=serializers.CharField())
    risks = serializers.ListField(child=serializers.ChoiceField(choices=Risk.choices))


class EndpointSchemaSerializer(serializers.Serializer[Any]):
    """The schema of `endpoint_data` for the OpenAPI document."""

    id = serializers.UUIDField()
    name = serializers.CharField()
    kind = serializers.ChoiceField(choices=Kind.choices)
    url = serializers.CharField(allow_null=True, help_text="Scheme, host and port only: the rest may be a secret.")
    recipients = serializers.ListField(child=serializers.EmailField())
    enabled = serializers.BooleanField()
    decision_links = serializers.BooleanField()
    subscriptions = SubscriptionSchemaSerializer(many=True)
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()
    secret = serializers.CharField(required=False, help_text="A webhook's signing secret: in the answer that made it.")


class EndpointWriteSerializer(StrictSerializer):
    """An endpoint to create (every required field) or change (`partial`: only what is given)."""

    name = serializers.CharField(max_length=NAME_MAX)
    kind = serializers.ChoiceField(choices=Kind.choices)
    url = serializers.CharField(required=False, allow_blank=True, default="", max_length=URL_MAX, trim_whitespace=False)
    recipients = serializers.ListField(child=serializers.EmailField(), required=False, default=list,
                                       max_length=MAX_RECIPIENTS)  # fmt: skip
    enabled = serializers.BooleanField(required=False, default=True)
    decision_links = serializers.BooleanField(
        required=False, default=False, help_text="Messages carry single-use links to approve or reject from them."
    )
    # `many=True` makes a ListSerializer, which takes max_length (the stubs know only the child's arguments).
    subscriptions = SubscriptionSerializer(  # type: ignore[call-arg]
        many=True, required=False, default=list, max_length=MAX_SUBSCRIPTIONS
    )

    def __init__(self, *args: Any, endpoint: Endpoint | None = None, **kwargs: Any) -> None:
        self.endpoint = endpoint
        super().__init__(*args, **kwargs)

    def validate_name(self, value: str) -> str:
        if problem := name_problem(value):
            raise serializers.ValidationError(problem)
        return value

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        """The shape only: where a channel sends is checked by `notifications.endpoints`, whose
        InvalidEndpoint the API answers as a field error too."""
        attrs = super().validate(attrs)
        if self.endpoint is not None and "kind" in attrs and attrs["kind"] != self.endpoint.kind:
            raise serializers.ValidationError({"kind": "A channel's kind cannot change; make a new channel."})
        return attrs


class DeliveryAttemptSchemaSerializer(serializers.Serializer[Any]):
    number = serializers.IntegerField()
    started_at = serializers.DateTimeField()
    duration_ms = serializers.IntegerField()
    response_code = serializers.IntegerField(allow_null=True)
    error = serializers.CharField(allow_blank=True)


class DeliverySchemaSerializer(serializers.Serializer[Any]):
    """The schema of `delivery_data`."""

    id = serializers.IntegerField()
    endpoint = serializers.UUIDField()
    event = serializers.ChoiceField(choices=Notice.choices)
    thread = serializers.UUIDField()
    approval = serializers.UUIDField(allow_null=True)
    status = serializers.ChoiceField(choices=DeliveryStatus.choices)
    attempts = serializers.IntegerField()
    next_attempt_at = serializers.DateTimeField(allow_null=True)
    last_attempt_at = serializers.DateTimeField(allow_null=True)
    response_code = serializers.IntegerField(allow_null=True)
    error = serializers.CharField(allow_blank=True)
    body_digest = serializers.CharField(allow_null=True, help_text="SHA-256 of the bytes last sent.")
    delivered_at = serializers.DateTimeField(allow_null=True)
    resend_of = serializers.IntegerField(allow_null=True)
    created_at = serializers.DateTimeField()
    attempt_log = DeliveryAttemptSchemaSerializer(many=True, required=False)


class DeliveryListQuerySerializer(serializers.Serializer[Any]):
    endpoint = serializers.UUIDField(required=False, help_text="Only the deliveries to this endpoint (its id).")
    status = serializers.ChoiceField(choices=DeliveryStatus.choices, required=False,
                                     help_text="Only the deliveries with this status.")  # fmt: skip
    cursor = serializers.CharField(
        required=False, help_text="The `next` URL's cursor: the page after the previous one."
    )
    limit = serializers.IntegerField(
        required=False, min_value=1, max_value=200, help_text="How many results a page holds, 1 to 200 (default 50)."
    )
