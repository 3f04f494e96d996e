"""Request shapes and response bodies of the memory API (no domain logic here): what the views
check before they call memory.store, memory.boards or memory.selectors, and what /api/schema/ shows."""

from __future__ import annotations

import json
from typing import Any

from rest_framework import serializers

from memory.boards import MAX_HOLDER, MAX_TTL_SECONDS, MIN_TTL_SECONDS
from memory.paths import MAX_KEY
from quicksave.api import FiniteFloatField, StrictSerializer

MAX_LIMIT = 200
MAX_QUERY = 1000
MAX_FILTER = 10_000
MAX_FILTER_DEPTH = 16
MAX_SEQ = 2**62
MAX_VERSION = 2**31 - 1


class JSONObjectParam(serializers.CharField):
    """A query parameter holding a JSON object (a search filter)."""

    def to_internal_value(self, data: Any) -> dict[str, Any]:  # type: ignore[override]  # a JSON object, not str
        text = super().to_internal_value(data)
        try:
            value = json.loads(text)
        except ValueError as exc:
            raise serializers.ValidationError(f"is not JSON: {exc}.") from None
        except RecursionError:
            value = None
        if not isinstance(value, dict):
            raise serializers.ValidationError('is a JSON object of field names and values, e.g. {"status": "open"}.')
        if _depth(value) > MAX_FILTER_DEPTH:
            raise serializers.ValidationError(f"nests deeper than {MAX_FILTER_DEPTH} levels.")
        return value


def _depth(value: Any) -> int:
    """How deeply `value` nests (without recursion: a filter comes from outside)."""
    deepest, pending = 0, [(value, 1)]
    while pending:
        node, level = pending.pop()
        deepest = max(deepest, level)
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        pending.extend((child, level + 1) for child in children)
    return deepest


class StrictQuery(StrictSerializer):
    """Query parameters: an unknown one is a 400 naming it."""


def _page_limit(default: int) -> serializers.IntegerField:
    return serializers.IntegerField(
        required=False, min_value=1, max_value=MAX_LIMIT, default=default, help_text="How many at most in one page."
    )


class PageQuery(StrictQuery):
    """Query parameters of a cursor-paginated list: `limit` (each list's own default) and `cursor`."""

    limit = _page_limit(50)
    cursor = serializers.CharField(
        required=False,
        help_text="Where the page goes on: the `next` link's cursor, as the previous page handed it out.",
    )


class NamespaceListQuery(PageQuery):
    prefix = serializers.CharField(required=False, help_text="Dotted labels the namespaces start with; `*` is any.")
    suffix = serializers.CharField(required=False, help_text="Dotted labels the namespaces end with; `*` is any.")
    max_depth = serializers.IntegerField(
        required=False,
        min_value=1,
        max_value=32,
        help_text="Cut each namespace to this many labels (1 to 32); each shorter namespace is listed once.",
    )
    limit = _page_limit(100)


class SearchQuery(PageQuery):
    prefix = serializers.CharField(required=False, help_text="Dotted namespace prefix (only on /memory/items/).")
    query = serializers.CharField(required=False, max_length=MAX_QUERY, help_text="Words to find in indexed fields.")
    filter = JSONObjectParam(
        required=False, max_length=MAX_FILTER,
        help_text='A JSON object: `{"status": "open", "score": {"$gte": 3}}` ($eq $ne $gt $gte $lt $lte).',
    )  # fmt: skip
    limit = _page_limit(20)
    thread = serializers.UUIDField(
        required=False, help_text="The thread this search is made from: each item found names it among its readers."
    )
    checkpoint = serializers.UUIDField(required=False, help_text="The checkpoint of that thread it is made from.")


class ItemQuery(StrictQuery):
    as_of = serializers.DateTimeField(required=False, help_text="The item as it was at this time (ISO 8601).")
    thread = serializers.UUIDField(
        required=False, help_text="The thread this read is made from: the item's history names it among its readers."
    )
    checkpoint = serializers.UUIDField(required=False, help_text="The checkpoint of that thread it is made from.")


class DeleteQuery(StrictQuery):
    expected_version = serializers.IntegerField(
        required=False,
        min_value=0,
        max_value=MAX_VERSION,
        help_text="Delete only if the item is at this version (0: it must not exist); else 409 with the current one.",
    )
    fencing_token = serializers.IntegerField(
        required=False,
        min_value=1,
        max_value=MAX_SEQ,
        help_text="On a blackboard, the token of your lease on the key: a lost lease's write is refused.",
    )


class HistoryQuery(PageQuery):
    """An item's versions, newest first (`limit` 50 unless given)."""


class EventsQuery(StrictQuery):
    after_seq = serializers.IntegerField(
        required=False,
        min_value=0,
        max_value=MAX_SEQ,
        default=0,
        help_text="Events after this number (0: from the first).",
    )
    limit = serializers.IntegerField(
        required=False, min_value=1, max_value=500, default=200, help_text="How many at most in one page."
    )


class ItemPutSerializer(StrictSerializer):
    value = serializers.JSONField(help_text="Any JSON value.")
    index = serializers.ListField(
        child=serializers.CharField(max_length=300), required=False, allow_null=True, max_length=32,
        help_text='Field paths whose text full-text search finds ("text", "notes[*].body", "$" for all).',
    )  # fmt: skip
    ttl_minutes = FiniteFloatField(required=False, allow_null=True, min_value=0.001, max_value=10**7)
    expected_version = serializers.IntegerField(
        required=False, allow_null=True, min_value=0, max_value=MAX_VERSION,
        help_text="Write only if the item is at this version (0: only if it does not exist); else 409 "
        "version_conflict with detail.current_version.",
    )  # fmt: skip
    fencing_token = serializers.IntegerField(
        required=False, allow_null=True, min_value=1, max_value=MAX_SEQ,
        help_text="On a blackboard: the token of your lease on this key; 409 lease_lost unless it is the live lease.",
    )  # fmt: skip
    thread = serializers.UUIDField(required=False, allow_null=True, help_text="The thread this write is made from.")
    checkpoint = serializers.UUIDField(required=False, allow_null=True, help_text="The checkpoint it is made from.")


class BoardCreateSerializer(StrictSerializer):
    namespace = serializers.JSONField(help_text='The board\'s namespace path, a list of labels: ["team", "tasks"].')


class _LeaseSerializer(StrictSerializer):
    key = serializers.CharField(max_length=MAX_KEY, trim_whitespace=False)


class LeaseAcquireSerializer(_LeaseSerializer):
    holder = serializers.CharField(max_length=MAX_HOLDER, help_text="Who takes the lease (a worker's name).")
    ttl_seconds = FiniteFloatField(min_value=MIN_TTL_SECONDS, max_value=MAX_TTL_SECONDS)


class LeaseReleaseSerializer(_LeaseSerializer):
    fencing_token = serializers.IntegerField(
        min_value=1,
        max_value=MAX_SEQ,
        help_text="On a blackboard, the token of your lease on the key: a lost lease's write is refused.",
    )


class LeaseRenewSerializer(LeaseReleaseSerializer):
    ttl_seconds = FiniteFloatField(min_value=MIN_TTL_SECONDS, max_value=MAX_TTL_SECONDS)


class GrantCreateSerializer(StrictSerializer):
    prefix = serializers.JSONField(help_text="The namespace prefix to share, a list of labels.")
    agent = serializers.CharField(max_length=200)
    reason = serializers.CharField(max_length=2000)


class GrantRevokeSerializer(StrictSerializer):
    reason = serializers.CharField(max_length=2000)


# Response bodies, for the schema (the views build them as plain dicts).


class ItemSerializer(serializers.Serializer[Any]):
    namespace = serializers.ListField(child=serializers.CharField())
    key = serializers.CharField()
    value = serializers.JSONField()
    version = serializers.IntegerField()
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()
    expires_at = serializers.DateTimeField(allow_null=True)
    score = serializers.FloatField(allow_null=True, required=False)


class WrittenSerializer(serializers.Serializer[Any]):
    namespace = serializers.ListField(child=serializers.CharField())
    key = serializers.CharField()
    version = serializers.IntegerField()
    created = serializers.BooleanField()
    deleted = serializers.BooleanField()
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()
    expires_at = serializers.DateTimeField(allow_null=True)


class VersionSerializer(serializers.Serializer[Any]):
    version = serializers.IntegerField()
    deleted = serializers.BooleanField()
    value = serializers.JSONField(allow_null=True)
    created_at = serializers.DateTimeField()
    writer = serializers.ChoiceField(choices=["agent", "person", "rule", "system"])
    agent = serializers.CharField(allow_null=True)
    agent_key = serializers.CharField(allow_null=True, help_text="The prefix of the agent key that wrote it.")
    user = serializers.CharField(allow_null=True)
    rule = serializers.CharField()
    thread = serializers.UUIDField(allow_null=True)
    checkpoint = serializers.UUIDField(allow_null=True)
    value_bytes = serializers.IntegerField()


class NamespaceSerializer(serializers.Serializer[Any]):
    namespace = serializers.ListField(child=serializers.CharField())


class BoardSerializer(serializers.Serializer[Any]):
    namespace = serializers.ListField(child=serializers.CharField())
    created = serializers.BooleanField()
    seq = serializers.IntegerField(help_text="The number of the board's last event.")


class LeaseSerializer(serializers.Serializer[Any]):
    key = serializers.CharField()
    holder = serializers.CharField()
    fencing_token = serializers.IntegerField(
        help_text="On a blackboard, the token of your lease on the key: a lost lease's write is refused."
    )
    expires_at = serializers.DateTimeField()
    took_over_from = serializers.CharField(allow_null=True, required=False)


class HeldKeySerializer(serializers.Serializer[Any]):
    key = serializers.CharField()
    holder = serializers.CharField()
    agent = serializers.CharField(allow_null=True)
    acquired_at = serializers.DateTimeField()
    expires_at = serializers.DateTimeField()


class BoardEventSerializer(serializers.Serializer[Any]):
    type = serializers.ChoiceField(choices=["item.written", "item.deleted", "lease.acquired", "lease.released"])
    seq = serializers.IntegerField()
    board = serializers.CharField()
    key = serializers.CharField()
    data = serializers.JSONField()  # type: ignore[assignment]  # the event's field, not Serializer.data


class GrantSerializer(serializers.Serializer[Any]):
    id = serializers.IntegerField()
    prefix = serializers.ListField(child=serializers.CharField())
    agent = serializers.CharField()
    reason = serializers.CharField()
    granted_by = serializers.CharField(allow_null=True)
    created_at = serializers.DateTimeField()
    revoked_at = serializers.DateTimeField(allow_null=True)
    revoked_by = serializers.CharField(allow_null=True)
    revoke_reason = serializers.CharField()


def page_of(name: str, item: serializers.Serializer[Any]) -> Any:
    from drf_spectacular.utils import inline_serializer

    return inline_serializer(name, {"results": item, "next": serializers.URLField(allow_null=True)})
