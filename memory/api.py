"""REST API v1 for long-term memory and blackboards. Thin views: check the request, call one
function of memory.store, memory.boards, memory.sharing or memory.selectors, shape the answer.

Namespaces are dotted in paths (`users.alice`: a label holds no `.`); keys are the rest of the
path before the last `/` (so they may hold `/`). Lists are cursor pages `{"results", "next"}`.
Agent keys see and write only the namespaces their agent may use (memory.access); a namespace
they may not use answers as one that does not exist.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any
from uuid import UUID

from django.contrib.auth.models import User
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.utils.urls import replace_query_param
from rest_framework.views import APIView

from audit.trail import client_address
from checkpoints.access import visible_threads
from checkpoints.models import Checkpoint
from memory import boards, reads, selectors, sharing, store
from memory.access import check_can_share, scope_for_reading, scope_for_writing
from memory.errors import InvalidNamespace
from memory.models import Namespace, NamespaceGrant
from memory.paths import Path, dotted, item_key, namespace_path, parse_dotted
from memory.serializers import (
    BoardCreateSerializer,
    BoardEventSerializer,
    BoardSerializer,
    DeleteQuery,
    EventsQuery,
    GrantCreateSerializer,
    GrantRevokeSerializer,
    GrantSerializer,
    HeldKeySerializer,
    HistoryQuery,
    ItemPutSerializer,
    ItemQuery,
    ItemSerializer,
    LeaseAcquireSerializer,
    LeaseReleaseSerializer,
    LeaseRenewSerializer,
    LeaseSerializer,
    NamespaceListQuery,
    NamespaceSerializer,
    SearchQuery,
    VersionSerializer,
    WrittenSerializer,
    page_of,
)
from memory.texts import check_fields, index_texts
from quicksave_agents.auth import AgentPrincipal
from quicksave_agents.models import Agent, AgentKey

MAX_OFFSET = 10_000
# One component for both item lists (two made under one name would be two schemas, one lost).
ITEM_PAGE = page_of("MemoryItemPage", ItemSerializer(many=True))
NAMESPACE_PARAM = OpenApiParameter("namespace", str, OpenApiParameter.PATH, description="Dotted labels: `users.alice`.")
KEY_PARAM = OpenApiParameter("key", str, OpenApiParameter.PATH, description="The item's key (may hold `/`).")


def _query(serializer_class: type[serializers.Serializer[Any]], request: Request) -> dict[str, Any]:
    serializer = serializer_class(data={key: request.query_params.get(key) for key in request.query_params})
    serializer.is_valid(raise_exception=True)
    return dict(serializer.validated_data)


def _body(serializer_class: type[serializers.Serializer[Any]], request: Request) -> dict[str, Any]:
    if not isinstance(request.data, dict):
        raise ValidationError({"body": "must be a JSON object."})
    serializer = serializer_class(data=request.data)
    serializer.is_valid(raise_exception=True)
    return dict(serializer.validated_data)


def _path(text: str, field: str = "namespace") -> Path:
    return parse_dotted(text, field=field)


def _author(principal: Any) -> store.Author:
    if isinstance(principal, AgentPrincipal):
        return store.Author.agent(principal.agent.pk, key_id=principal.key.pk)
    return store.Author.person(principal.pk)


# Cursors: base64 of a small JSON object; anything else is a 400 naming `cursor`.


def _cursor_out(value: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(value, separators=(",", ":")).encode()).decode().rstrip("=")


def _cursor_in(raw: str | None, name: str) -> Any:
    if raw is None:
        return None
    try:
        decoded = json.loads(base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)))
    except (ValueError, binascii.Error, RecursionError):
        decoded = None
    if not isinstance(decoded, dict) or name not in decoded:
        raise _bad_cursor()
    return decoded[name]


def _next(request: Request, cursor: dict[str, Any] | None) -> str | None:
    url = request.build_absolute_uri()
    return replace_query_param(url, "cursor", _cursor_out(cursor)) if cursor is not None else None


def _bad_cursor() -> ValidationError:
    return ValidationError({"cursor": "is not a cursor this list handed out: follow `next` or leave it out."})


def _item(found: selectors.Found) -> dict[str, Any]:
    return {
        "namespace": list(found.namespace), "key": found.key, "value": found.value, "version": found.version,
        "created_at": found.created_at, "updated_at": found.updated_at, "expires_at": found.expires_at,
        "score": found.score,
    }  # fmt: skip


def _written(written: store.Written) -> dict[str, Any]:
    return {
        "namespace": list(written.namespace), "key": written.key, "version": written.version,
        "created": written.created, "deleted": written.deleted, "created_at": written.created_at,
        "updated_at": written.updated_at, "expires_at": written.expires_at,
    }  # fmt: skip


class NamespaceListView(APIView):
    @extend_schema(
        operation_id="v1_memory_namespaces_list",
        parameters=[NamespaceListQuery],
        responses=page_of("MemoryNamespacePage", NamespaceSerializer(many=True)),
    )
    def get(self, request: Request) -> Response:
        """Namespaces holding at least one item that the caller may use, in path order."""
        scope = scope_for_reading(request.user)
        params = _query(NamespaceListQuery, request)
        after = _cursor_in(params.get("cursor"), "after")
        if after is not None:
            try:
                after = namespace_path(after, field="cursor")
            except InvalidNamespace:
                raise _bad_cursor() from None
        limit = params["limit"]
        prefix, suffix = _pattern(params.get("prefix"), "prefix"), _pattern(params.get("suffix"), "suffix")
        found = selectors.list_namespaces(
            scope=scope, prefix=prefix, suffix=suffix, max_depth=params.get("max_depth"), limit=limit + 1, after=after
        )
        more = len(found) > limit
        found = found[:limit]
        results = [{"namespace": list(path)} for path in found]
        return Response({"results": results, "next": _next(request, {"after": list(found[-1])} if more else None)})


def _pattern(text: str | None, field: str) -> Path:
    if not text:
        return ()
    return namespace_path(text.split("."), field=field, allow_empty=True)


def _search(request: Request, prefix: Path) -> Response:
    scope = scope_for_reading(request.user)
    params = _query(SearchQuery, request)
    offset = _cursor_in(params.get("cursor"), "offset") or 0
    if isinstance(offset, bool) or not isinstance(offset, int) or not 0 <= offset <= MAX_OFFSET:
        raise _bad_cursor()
    limit = params["limit"]
    reader = _reader(_origin(request.user, params.get("thread"), params.get("checkpoint")))
    found = selectors.search_items(
        scope=scope, prefix=prefix, filter=params.get("filter"), query=params.get("query"), limit=limit + 1,
        offset=offset, reader=reader,
    )  # fmt: skip
    more = len(found) > limit and offset + limit <= MAX_OFFSET
    results = [_item(item) for item in found[:limit]]
    return Response({"results": results, "next": _next(request, {"offset": offset + limit} if more else None)})


SEARCH_DOC = (
    "Items matching `filter` (and with `query`, those whose indexed fields hold its words first, best "
    "first), newest first. A page may repeat or miss an item written while you page through."
)


class SearchView(APIView):
    @extend_schema(
        operation_id="v1_memory_items_search", description=SEARCH_DOC, parameters=[SearchQuery],
        responses=ITEM_PAGE,
    )  # fmt: skip
    def get(self, request: Request) -> Response:
        prefix = request.query_params.get("prefix")
        return _search(request, _path(prefix, "prefix") if prefix else ())


class NamespaceItemsView(APIView):
    @extend_schema(
        operation_id="v1_memory_namespace_items_search", description=SEARCH_DOC + " Under this namespace.",
        parameters=[NAMESPACE_PARAM, SearchQuery], responses=ITEM_PAGE,
    )  # fmt: skip
    def get(self, request: Request, namespace: str) -> Response:
        if "prefix" in request.query_params:
            raise ValidationError({"prefix": "is the namespace in the path here: leave it out."})
        return _search(request, _path(namespace))


def _origin(principal: Any, thread: UUID | None, checkpoint: UUID | None) -> store.Origin:
    """Where a write comes from: a thread the caller may read, and a checkpoint in it."""
    if checkpoint is not None:
        owner = Checkpoint.objects.filter(pk=checkpoint, thread__in=visible_threads(principal)).values_list(
            "thread_id", flat=True
        )
        found = owner.first()
        if found is None:
            raise ValidationError({"checkpoint": f"No checkpoint {checkpoint} is in a thread you can read."})
        if thread is not None and found != thread:
            raise ValidationError({"checkpoint": f"Checkpoint {checkpoint} is not in thread {thread}."})
        return store.Origin(thread_id=found, checkpoint_id=checkpoint)
    if thread is not None:
        if not visible_threads(principal).filter(pk=thread).exists():
            raise ValidationError({"thread": f"No thread {thread} is one you can read."})
        return store.Origin(thread_id=thread)
    return store.NOWHERE


def _reader(origin: store.Origin) -> reads.Reader | None:
    """Who reads, when the request names a thread (checked by `_origin`): its reads are recorded."""
    if origin.thread_id is None:
        return None
    return reads.Reader(thread_id=origin.thread_id, checkpoint_id=origin.checkpoint_id)


def _key(key: str) -> str:
    return item_key(key)


class ItemView(APIView):
    @extend_schema(
        operation_id="v1_memory_item_get", parameters=[NAMESPACE_PARAM, KEY_PARAM, ItemQuery],
        responses=ItemSerializer,
    )  # fmt: skip
    def get(self, request: Request, namespace: str, key: str) -> Response:
        """The item now, or as it was at `as_of`; 404 when there is none (or it is not yours to read). A read
        naming its `thread` (and `checkpoint`) is recorded in the item's history of readers."""
        scope = scope_for_reading(request.user)
        params = _query(ItemQuery, request)
        path, key = _path(namespace), _key(key)
        reader = _reader(_origin(request.user, params.get("thread"), params.get("checkpoint")))
        if params.get("as_of") is not None:
            found = selectors.item_as_of(namespace=path, key=key, scope=scope, at=params["as_of"], reader=reader)
        else:
            found = selectors.get_item(namespace=path, key=key, scope=scope, refresh_ttl=True, reader=reader)
        if found is None:
            raise NotFound(f"There is no item {key!r} in {dotted(path)}.")
        return Response(_item(found))

    @extend_schema(
        operation_id="v1_memory_item_put", parameters=[NAMESPACE_PARAM, KEY_PARAM], request=ItemPutSerializer,
        responses={201: WrittenSerializer, 200: WrittenSerializer},
    )  # fmt: skip
    def put(self, request: Request, namespace: str, key: str) -> Response:
        """Write a new version of the item (201 when it did not exist). With `expected_version`, only if the
        item is at that version (409 version_conflict naming the current one); on a blackboard, only under
        your lease (`fencing_token`) or while nobody holds the key (409 lease_held / lease_lost)."""
        scope = scope_for_writing(request.user)
        path, key = _path(namespace), _key(key)
        data = _body(ItemPutSerializer, request)
        fields = data.get("index")
        texts = None
        if fields:
            store.check_value(data["value"])  # its depth and size, before its texts are taken
            texts = index_texts(data["value"], check_fields(fields))
        written = store.put_item(
            namespace=path, key=key, value=data["value"], author=_author(request.user), scope=scope,
            origin=_origin(request.user, data.get("thread"), data.get("checkpoint")),
            ttl_minutes=data.get("ttl_minutes"), index=texts, expected_version=data.get("expected_version"),
            fencing_token=data.get("fencing_token"),
        )  # fmt: skip
        return Response(_written(written), status=status.HTTP_201_CREATED if written.created else status.HTTP_200_OK)

    @extend_schema(
        operation_id="v1_memory_item_delete", parameters=[NAMESPACE_PARAM, KEY_PARAM, DeleteQuery],
        responses=WrittenSerializer,
    )  # fmt: skip
    def delete(self, request: Request, namespace: str, key: str) -> Response:
        """Write a deletion as the item's next version (its history stays readable); 404 when there is no item."""
        scope = scope_for_writing(request.user)
        params = _query(DeleteQuery, request)
        path, key = _path(namespace), _key(key)
        written = store.delete_item(
            namespace=path, key=key, author=_author(request.user), scope=scope,
            expected_version=params.get("expected_version"), fencing_token=params.get("fencing_token"),
        )  # fmt: skip
        if written is None:
            raise NotFound(f"There is no item {key!r} in {dotted(path)}.")
        return Response(_written(written))


def _versions(versions: list[selectors.Version]) -> list[dict[str, Any]]:
    agents = dict(Agent.objects.filter(pk__in={v.agent_id for v in versions if v.agent_id}).values_list("pk", "name"))
    keys = dict(
        AgentKey.objects.filter(pk__in={v.agent_key_id for v in versions if v.agent_key_id}).values_list("pk", "prefix")
    )
    users = dict(User.objects.filter(pk__in={v.user_id for v in versions if v.user_id}).values_list("pk", "username"))
    return [
        {
            "version": v.version,
            "deleted": v.deleted,
            "value": v.value,
            "created_at": v.created_at,
            "writer": v.writer,
            "agent": agents.get(v.agent_id) if v.agent_id else None,
            "agent_key": keys.get(v.agent_key_id) if v.agent_key_id else None,
            "user": users.get(v.user_id) if v.user_id else None,
            "rule": v.rule,
            "thread": v.thread_id,
            "checkpoint": v.checkpoint_id,
            "value_bytes": v.value_bytes,
        }
        for v in versions
    ]


class HistoryView(APIView):
    @extend_schema(
        operation_id="v1_memory_item_history", parameters=[NAMESPACE_PARAM, KEY_PARAM, HistoryQuery],
        responses=page_of("MemoryVersionPage", VersionSerializer(many=True)),
    )  # fmt: skip
    def get(self, request: Request, namespace: str, key: str) -> Response:
        """Every version of the item, newest first, each integrity-checked: its value, who wrote it (agent and
        key, person, rule), from which thread and checkpoint, when."""
        scope = scope_for_reading(request.user)
        params = _query(HistoryQuery, request)
        before = _cursor_in(params.get("cursor"), "before")
        if before is not None and (isinstance(before, bool) or not isinstance(before, int) or before < 2):
            raise _bad_cursor()
        path, key = _path(namespace), _key(key)
        limit = params["limit"]
        versions = selectors.item_history(namespace=path, key=key, scope=scope, limit=limit, before=before)
        if versions is None:
            raise NotFound(f"There is no item {key!r} in {dotted(path)}.")
        more = len(versions) == limit and versions[-1].version > 1
        cursor = {"before": versions[-1].version} if more else None
        return Response({"results": _versions(versions), "next": _next(request, cursor)})


# Blackboards


def _board_body(space: Any, created: bool) -> dict[str, Any]:
    seq = Namespace.objects.filter(pk=space.id).values_list("board_seq", flat=True).first() or 0
    return {"namespace": list(space.path), "created": created, "seq": seq}


class BoardListView(APIView):
    @extend_schema(
        operation_id="v1_memory_boards_create", request=BoardCreateSerializer,
        responses={201: BoardSerializer, 200: BoardSerializer},
    )  # fmt: skip
    def post(self, request: Request) -> Response:
        """Make a blackboard at a new namespace (200 with it when it is a board already; 409 not_a_board when the
        namespace holds plain memory)."""
        scope = scope_for_writing(request.user)
        data = _body(BoardCreateSerializer, request)
        user = request.user if isinstance(request.user, User) else None
        space, created = boards.make_board(
            namespace=data["namespace"], scope=scope, user=user, address=client_address(request)
        )
        return Response(_board_body(space, created), status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)


class BoardView(APIView):
    @extend_schema(operation_id="v1_memory_board_get", parameters=[NAMESPACE_PARAM], responses=BoardSerializer)
    def get(self, request: Request, namespace: str) -> Response:
        """The blackboard at this namespace: its latest event number and the keys held now, with their holders."""
        space = boards.board_for(_path(namespace), scope_for_reading(request.user))
        return Response(_board_body(space, False))


class BoardEventsView(APIView):
    @extend_schema(
        operation_id="v1_memory_board_events", parameters=[NAMESPACE_PARAM, EventsQuery],
        responses=page_of("MemoryBoardEventPage", BoardEventSerializer(many=True)),
    )  # fmt: skip
    def get(self, request: Request, namespace: str) -> Response:
        """The board's events after `after_seq`, oldest first: what the websocket replays, for clients that poll."""
        space = boards.board_for(_path(namespace), scope_for_reading(request.user))
        params = _query(EventsQuery, request)
        events = boards.events_after(space=space, seq=params["after_seq"], limit=params["limit"])
        url = None
        if len(events) == params["limit"]:
            url = replace_query_param(request.build_absolute_uri(), "after_seq", events[-1]["seq"])
        return Response({"results": events, "next": url})


def _lease(lease: boards.Lease) -> dict[str, Any]:
    return {
        "key": lease.key, "holder": lease.holder, "fencing_token": lease.token, "expires_at": lease.expires_at,
        "took_over_from": lease.took_over_from,
    }  # fmt: skip


class LeaseListView(APIView):
    @extend_schema(
        operation_id="v1_memory_board_leases", parameters=[NAMESPACE_PARAM],
        responses=page_of("MemoryLeasePage", HeldKeySerializer(many=True)),
    )  # fmt: skip
    def get(self, request: Request, namespace: str) -> Response:
        """The board's keys held now (their tokens are their holders' alone)."""
        held = boards.live_leases(namespace=_path(namespace), scope=scope_for_reading(request.user))
        agents = dict(Agent.objects.filter(pk__in={h.agent_id for h in held if h.agent_id}).values_list("pk", "name"))
        results = [
            {
                "key": h.key,
                "holder": h.holder,
                "agent": agents.get(h.agent_id) if h.agent_id else None,
                "acquired_at": h.acquired_at,
                "expires_at": h.expires_at,
            }
            for h in held
        ]
        return Response({"results": results, "next": None})

    @extend_schema(
        operation_id="v1_memory_lease_acquire", parameters=[NAMESPACE_PARAM], request=LeaseAcquireSerializer,
        responses={201: LeaseSerializer},
    )  # fmt: skip
    def post(self, request: Request, namespace: str) -> Response:
        """Take a key for `ttl_seconds`; 409 lease_held while someone else holds it. Keep `fencing_token`: your
        writes name it, and a write under a lease that ended is refused."""
        scope = scope_for_writing(request.user)
        data = _body(LeaseAcquireSerializer, request)
        lease = boards.acquire_lease(
            namespace=_path(namespace), key=data["key"], holder=data["holder"], ttl_seconds=data["ttl_seconds"],
            scope=scope,
        )  # fmt: skip
        return Response(_lease(lease), status=status.HTTP_201_CREATED)


class LeaseRenewView(APIView):
    @extend_schema(
        operation_id="v1_memory_lease_renew", parameters=[NAMESPACE_PARAM], request=LeaseRenewSerializer,
        responses=LeaseSerializer,
    )  # fmt: skip
    def post(self, request: Request, namespace: str) -> Response:
        """Hold the key `ttl_seconds` from now; 409 lease_lost when the lease already ended."""
        scope = scope_for_writing(request.user)
        data = _body(LeaseRenewSerializer, request)
        lease = boards.renew_lease(
            namespace=_path(namespace), key=data["key"], fencing_token=data["fencing_token"],
            ttl_seconds=data["ttl_seconds"], scope=scope,
        )  # fmt: skip
        return Response(_lease(lease))


class LeaseReleaseView(APIView):
    @extend_schema(
        operation_id="v1_memory_lease_release", parameters=[NAMESPACE_PARAM], request=LeaseReleaseSerializer,
        responses={204: None},
    )  # fmt: skip
    def post(self, request: Request, namespace: str) -> Response:
        """Give the key up now; 409 lease_lost when the lease already ended."""
        scope = scope_for_writing(request.user)
        data = _body(LeaseReleaseSerializer, request)
        boards.release_lease(
            namespace=_path(namespace), key=data["key"], fencing_token=data["fencing_token"], scope=scope
        )
        return Response(status=status.HTTP_204_NO_CONTENT)


# Sharing between agents


def _grant(grant: NamespaceGrant) -> dict[str, Any]:
    return {
        "id": grant.pk, "prefix": grant.prefix, "agent": grant.agent.name, "reason": grant.reason,
        "granted_by": grant.granted_by.username if grant.granted_by else None, "created_at": grant.created_at,
        "revoked_at": grant.revoked_at, "revoked_by": grant.revoked_by.username if grant.revoked_by else None,
        "revoke_reason": grant.revoke_reason,
    }  # fmt: skip


class GrantListView(APIView):
    @extend_schema(
        operation_id="v1_memory_grants_list", responses=page_of("MemoryGrantPage", GrantSerializer(many=True))
    )
    def get(self, request: Request) -> Response:
        """Every grant, newest first (people with the viewer role; an agent sees its own)."""
        scope = scope_for_reading(request.user)
        grants = NamespaceGrant.objects.select_related("agent", "granted_by", "revoked_by")
        if scope.agent_id is not None:
            grants = grants.filter(agent_id=scope.agent_id)
        return Response({"results": [_grant(g) for g in grants[:500]], "next": None})

    @extend_schema(
        operation_id="v1_memory_grants_create", request=GrantCreateSerializer, responses={201: GrantSerializer}
    )
    def post(self, request: Request) -> Response:
        """Let an agent read and write every namespace under `prefix` (admins; audited with the reason)."""
        user = check_can_share(request.user)
        data = _body(GrantCreateSerializer, request)
        agent = Agent.objects.filter(name=data["agent"]).first()
        if agent is None:
            raise ValidationError({"agent": f"No agent is named {data['agent']!r}."})
        grant = sharing.grant_namespace(
            prefix=data["prefix"], agent=agent, user=user, reason=data["reason"], address=client_address(request)
        )
        grant = NamespaceGrant.objects.select_related("agent", "granted_by", "revoked_by").get(pk=grant.pk)
        return Response(_grant(grant), status=status.HTTP_201_CREATED)


class GrantRevokeView(APIView):
    @extend_schema(operation_id="v1_memory_grant_revoke", request=GrantRevokeSerializer, responses=GrantSerializer)
    def post(self, request: Request, grant_id: int) -> Response:
        """End a grant at once (admins; audited with the reason); 409 already_revoked."""
        user = check_can_share(request.user)
        data = _body(GrantRevokeSerializer, request)
        grant = NamespaceGrant.objects.filter(pk=grant_id).first() if grant_id < 2**31 else None
        if grant is None:
            raise NotFound(f"There is no grant {grant_id}.")
        sharing.revoke_grant(grant=grant, user=user, reason=data["reason"], address=client_address(request))
        grant = NamespaceGrant.objects.select_related("agent", "granted_by", "revoked_by").get(pk=grant_id)
        return Response(_grant(grant))
