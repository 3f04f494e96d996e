"""REST API v1 for threads, checkpoints, diffs and the tool-result cache. Thin views:
validate, call the store or a selector, serialize."""

from __future__ import annotations

import json
import uuid
from typing import Any
from urllib.parse import urlencode

from django.contrib.auth.models import User
from django.http import StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.exceptions import NotFound, PermissionDenied, ValidationError
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from audit.trail import client_address
from checkpoints import export, forks, selectors, storage
from checkpoints.access import (
    check_can_cancel,
    check_can_delete,
    check_can_fork,
    check_can_write,
    get_checkpoint_for,
    get_thread_for,
    thread_for_write,
    visible_threads,
)
from checkpoints.models import Branch, Checkpoint, Thread
from checkpoints.serializers import (
    CheckpointCreateSerializer,
    CheckpointDetailSerializer,
    CheckpointListQuerySerializer,
    CheckpointSummarySerializer,
    DiffQuerySerializer,
    ForkResultSerializer,
    ForkSerializer,
    ThreadActionResultSerializer,
    ThreadActionSerializer,
    ThreadCreateSerializer,
    ThreadDetailSerializer,
    ThreadListQuerySerializer,
    ThreadSerializer,
    ToolResultPutSerializer,
    ToolResultSerializer,
    ValueChangeSerializer,
    ValueHistoryQuerySerializer,
    checkpoint_summary,
    parse_checkpoint_body,
)
from checkpoints.storage.tool_results import get_tool_result, put_tool_result
from quicksave import metrics
from quicksave.api import CursorPage
from quicksave_agents.auth import AgentPrincipal
from quicksave_agents.models import Agent, Run


def _query(serializer_class: type, request: Request) -> dict[str, Any]:
    data: dict[str, Any] = {key: request.query_params.get(key) for key in request.query_params}
    if "q" in request.query_params:
        data["q"] = request.query_params.getlist("q")
    serializer = serializer_class(data=data)
    serializer.is_valid(raise_exception=True)
    return dict(serializer.validated_data)


class ThreadPagination(CursorPage):
    ordering = ("-updated_at", "-id")


class ThreadListView(APIView):
    @extend_schema(
        operation_id="v1_threads_list",
        parameters=[ThreadListQuerySerializer],
        responses=inline_serializer(
            "ThreadPage", {"results": ThreadSerializer(many=True), "next": serializers.URLField(allow_null=True)}
        ),
    )
    def get(self, request: Request) -> Response:
        """List the threads you may read, most recently updated first; filter by agent, status, step, update
        time and metadata."""
        params = _query(ThreadListQuerySerializer, request)
        try:
            contained = [selectors.parse_metadata_query(raw) for raw in params.get("q", [])]
        except ValueError as exc:
            raise ValidationError({"q": f"must be {exc}"}) from None
        threads = selectors.filter_threads(
            visible_threads(request.user).select_related("agent", "active_branch", "head"),
            agent=params.get("agent"), status=params.get("status"), step=params.get("step"),
            since=params.get("since"), until=params.get("until"), metadata=contained,
        )  # fmt: skip
        paginator = ThreadPagination()
        page = paginator.paginate_queryset(threads.defer("head__payload", "head__integrity"), request, view=self)
        return paginator.get_paginated_response(ThreadSerializer(page, many=True).data)

    @extend_schema(request=ThreadCreateSerializer, responses={201: ThreadDetailSerializer, 200: ThreadDetailSerializer})
    def post(self, request: Request) -> Response:
        """Create a thread for an agent (an agent key creates threads for its own agent only). With an
        `external_id` that the agent already has, the existing thread is returned with 200 instead of a
        new one with 201."""
        serializer = ThreadCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        agent = _agent_for_new_thread(request.user, data.get("agent"))
        thread, created = storage.create_thread(
            agent=agent, external_id=data.get("external_id"), metadata=data.get("metadata"),
            started_by=_starter(request.user, data.get("started_by")),
        )  # fmt: skip
        return Response(_thread_detail(thread.pk), status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)


def _agent_for_new_thread(principal: Any, name: str | None) -> Agent:
    if isinstance(principal, AgentPrincipal):
        if name and name != principal.agent.name:
            raise PermissionDenied(f"This key belongs to agent '{principal.agent.name}', not '{name}'.")
        return principal.agent
    if not principal.has_perm("checkpoints.add_thread"):
        raise PermissionDenied("Creating threads needs an agent key or the admin role.")
    if not name:
        raise ValidationError({"agent": "This field is required."})
    agent = Agent.objects.filter(name=name).first()
    if agent is None:
        raise ValidationError({"agent": f"No agent is named '{name}'."})
    return agent


def _starter(principal: Any, name: str | None) -> User | None:
    """Who a new thread runs for: the person creating it, or the person its agent names."""
    if isinstance(principal, User):
        if name is not None and name != principal.get_username():
            raise ValidationError({"started_by": "A person starts a thread as themselves: leave `started_by` out."})
        return principal
    if name is None:
        return None
    starter = User.objects.filter(username=name).first()
    if starter is None:
        raise ValidationError({"started_by": f"No user is named '{name}'."})
    return starter


def _thread_detail(thread_id: Any) -> dict[str, Any]:
    thread = (
        Thread.objects.select_related("agent", "active_branch", "head")
        .prefetch_related("branches")
        .defer("head__payload", "head__integrity")
        .get(pk=thread_id)
    )
    heads = selectors.branch_heads(thread)
    selectors.correct_head(thread, heads)
    return dict(ThreadDetailSerializer(thread, context={"heads": heads}).data)


class ThreadDetailView(APIView):
    @extend_schema(responses=ThreadDetailSerializer)
    def get(self, request: Request, thread_id: uuid.UUID) -> Response:
        """The thread with its head checkpoint (a summary, or null before the first checkpoint) and its
        branches."""
        thread = get_thread_for(request.user, thread_id)
        return Response(_thread_detail(thread.pk))

    @extend_schema(request=ThreadActionSerializer, responses={204: None})
    def delete(self, request: Request, thread_id: uuid.UUID) -> Response:
        """Delete the thread with everything in it and destroy its data key (admins only; a reason is required)."""
        thread = get_thread_for(request.user, thread_id)
        user = check_can_delete(request.user)
        data = _body(ThreadActionSerializer, request)
        forks.delete(thread=thread, user=user, reason=data["reason"], address=client_address(request))
        return Response(status=status.HTTP_204_NO_CONTENT)


class JSONLinesRenderer(JSONRenderer):
    """Lets a client ask for `application/x-ndjson`; an error still goes out as one JSON line."""

    media_type = export.CONTENT_TYPE
    format = "jsonl"

    def render(self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None) -> bytes:
        return super().render(data, accepted_media_type, renderer_context) + b"\n"


class ThreadExportView(APIView):
    """The thread's trajectory as JSON Lines, streamed; the format is described in checkpoints/export.py."""

    renderer_classes = [JSONRenderer, JSONLinesRenderer]

    @extend_schema(
        responses={
            (200, export.CONTENT_TYPE): OpenApiResponse(
                OpenApiTypes.STR,
                description="JSON Lines: a `thread` header, one `checkpoint` line per checkpoint (parents first, "
                "with `state` for a stored snapshot or `patch` for a stored delta), then `end`. A row that fails "
                "its integrity check ends the stream with an `error` line instead of `end`.",
            )
        },
    )
    def get(self, request: Request, thread_id: uuid.UUID) -> StreamingHttpResponse:
        thread = get_thread_for(request.user, thread_id)
        response = StreamingHttpResponse(export.export_lines(thread), content_type=export.CONTENT_TYPE)
        response["Content-Disposition"] = f'attachment; filename="{export.filename(thread)}"'
        return response


class CheckpointListView(APIView):
    @extend_schema(
        parameters=[CheckpointListQuerySerializer],
        responses=inline_serializer(
            "CheckpointPage",
            {"results": CheckpointSummarySerializer(many=True), "next": serializers.URLField(allow_null=True)},
        ),
    )
    def get(self, request: Request, thread_id: uuid.UUID) -> Response:
        """The checkpoints of one branch (the active one unless `branch` names another), oldest first, as
        summaries without state; `next` pages on."""
        thread = get_thread_for(request.user, thread_id)
        params = _query(CheckpointListQuerySerializer, request)
        branch = _branch(thread, params.get("branch"))
        limit = params["limit"]
        rows = selectors.timeline(thread=thread, branch=branch, after_seq=params["after_seq"], limit=limit)
        next_url = None
        if len(rows) == limit:
            query = urlencode({"branch": branch.name, "after_seq": rows[-1].seq, "limit": limit})
            next_url = request.build_absolute_uri(f"{request.path}?{query}")
        return Response({"results": [checkpoint_summary(row, branch.name) for row in rows], "next": next_url})

    @extend_schema(request=CheckpointCreateSerializer, responses={201: CheckpointSummarySerializer})
    def post(self, request: Request, thread_id: uuid.UUID) -> Response:
        """Append a checkpoint: a full `state`, or a `patch` (RFC 6902) against the parent's state. `parent`
        must be the head of its branch (null for the thread's first checkpoint), else 409 `stale_parent`
        names the head."""
        thread = thread_for_write(request.user, thread_id)
        data = parse_checkpoint_body(request.data)
        checkpoint = storage.append_checkpoint(
            thread=thread,
            parent=data["parent"],
            state=data.get("state"),
            patch=data.get("patch"),
            branch=data.get("branch"),
            step=data.get("step"),
            label=data.get("label", ""),
            status=data.get("status", "running"),
            model=data.get("model"),
            metadata=data.get("metadata"),
            schema_version=data.get("schema_version", 1),
            tool_results=data.get("tool_results") or None,
            fence=data["fence"],
        )
        metrics.checkpoint_payload_bytes_total.inc(len(checkpoint.payload))
        summary = checkpoint_summary(checkpoint, data.get("branch") or storage.get_branch_name(checkpoint.branch_id))
        return Response(summary, status=status.HTTP_201_CREATED)


def _branch(thread: Thread, name: str | None) -> Branch:
    if name is None:
        branch = thread.active_branch
        if branch is None:
            raise NotFound(f"Thread {thread.pk} has no active branch.")
        return branch
    found = Branch.objects.filter(thread=thread, name=name).first()
    if found is None:
        raise NotFound(f"Thread {thread.pk} has no branch named '{name}'.")
    return found


class CheckpointDetailView(APIView):
    @extend_schema(responses=CheckpointDetailSerializer)
    def get(self, request: Request, checkpoint_id: uuid.UUID) -> Response:
        """One checkpoint: its summary and its full state, materialised and checked against its integrity
        MAC."""
        checkpoint = get_checkpoint_for(request.user, checkpoint_id)
        node = storage.load_node(checkpoint.pk)  # raises IntegrityFailure if a replayed row was altered
        detail = checkpoint_summary(checkpoint, checkpoint.branch.name)
        detail["state"] = node.state
        detail["integrity"] = {"status": "verified", "mac": bytes(checkpoint.integrity).hex()}
        return Response(detail)


class CheckpointDiffView(APIView):
    @extend_schema(
        parameters=[OpenApiParameter("base", str, description="Checkpoint id to diff from (default: the parent).")],
        responses=inline_serializer(
            "Diff",
            {
                "base": serializers.UUIDField(),
                "target": serializers.UUIDField(),
                "patch": serializers.ListField(child=serializers.DictField(), help_text="RFC 6902 ops"),
            },
        ),
    )
    def get(self, request: Request, checkpoint_id: uuid.UUID) -> Response:
        """What changed between two checkpoints of a thread, as RFC 6902 operations: applying `patch` to the
        base's state gives the target's."""
        target = get_checkpoint_for(request.user, checkpoint_id)
        params = _query(DiffQuerySerializer, request)
        base_id = params.get("base") or target.parent_id
        if base_id is None:
            raise ValidationError({"base": "This checkpoint has no parent; name a `base` checkpoint."})
        base = get_checkpoint_for(request.user, base_id)
        if base.thread_id != target.thread_id:
            raise ValidationError({"base": "The base checkpoint must be in the same thread."})
        patch = storage.diff(base=base.pk, target=target.pk)
        return Response({"base": str(base.pk), "target": str(target.pk), "patch": patch})


# A value in a history's page larger than this (characters of JSON) is left out, so that the
# history of a growing list is not a page of megabytes; the checkpoint's state has it.
HISTORY_VALUE_CHARS = 64 * 1024
_VALUE_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


class ValueHistoryView(APIView):
    @extend_schema(
        operation_id="v1_threads_history",
        summary="A value's history",
        description="The checkpoints, on every branch of the thread, where the value at `path` changed, newest "
        "first, each with the value before (in its parent's state) and after. Read from the stored changes, "
        "integrity-checked; the dashboard's diff of each is `/checkpoints/{checkpoint}/diff/`.",
        parameters=[ValueHistoryQuerySerializer],
        responses=inline_serializer(
            "ValueHistoryPage",
            {"results": ValueChangeSerializer(many=True), "next": serializers.URLField(allow_null=True)},
        ),
    )
    def get(self, request: Request, thread_id: uuid.UUID) -> Response:
        thread = get_thread_for(request.user, thread_id)
        params = _query(ValueHistoryQuerySerializer, request)
        limit = params["limit"]
        try:
            after = storage.decode_history_cursor(params["cursor"]) if params.get("cursor") is not None else None
            changes = storage.value_history(thread, params["path"], after=after, limit=limit + 1)
        except storage.InvalidPath as exc:
            raise ValidationError({exc.detail.get("field", "path"): exc.message}) from None
        next_url = None
        if len(changes) > limit:
            changes = changes[:limit]
            query = urlencode({
                "path": params["path"], "limit": limit, "cursor": storage.encode_history_cursor(changes[-1].position),
            })  # fmt: skip
            next_url = request.build_absolute_uri(f"{request.path}?{query}")
        return Response({"results": [_value_change(change) for change in changes], "next": next_url})


def _value_change(change: storage.ValueChange) -> dict[str, Any]:
    body: dict[str, Any] = {
        "checkpoint": str(change.checkpoint_id),
        "parent": str(change.parent_id) if change.parent_id else None,
        "branch": change.branch, "seq": change.seq, "step": change.step, "label": change.label,
        "status": change.status, "created_at": change.created_at.isoformat().replace("+00:00", "Z"),
        "change": change.change, "omitted": [],
    }  # fmt: skip
    for side, value in (("old", change.old), ("new", change.new)):
        if value is storage.ABSENT:
            body[side] = None
        elif _small(value):
            body[side] = value
        else:
            body[side] = None
            body["omitted"].append(side)
    return body


def _small(value: Any) -> bool:
    """Whether a value's JSON has at most HISTORY_VALUE_CHARS characters (encoding stops past them)."""
    size = 0
    for chunk in _VALUE_ENCODER.iterencode(value):
        size += len(chunk)
        if size > HISTORY_VALUE_CHARS:
            return False
    return True


class ToolResultView(APIView):
    @extend_schema(responses=ToolResultSerializer)
    def get(self, request: Request, thread_id: uuid.UUID, key: str) -> Response:
        """The tool result cached under this key in the thread, so a resumed agent does not call the tool
        again."""
        thread = get_thread_for(request.user, thread_id)
        found = get_tool_result(thread=thread, key=key)
        if found is None:
            raise NotFound(f"No tool result is cached under '{key}' in thread {thread.pk}.")
        return Response(ToolResultSerializer(found).data)

    @extend_schema(request=ToolResultPutSerializer, responses={201: ToolResultSerializer, 200: ToolResultSerializer})
    def put(self, request: Request, thread_id: uuid.UUID, key: str) -> Response:
        """Cache a tool result under this key. Idempotent: when the key holds a result already, that first
        result is returned (200) and kept."""
        thread = get_thread_for(request.user, thread_id)
        check_can_write(request.user, thread)
        serializer = ToolResultPutSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        checkpoint = None
        if data.get("checkpoint"):
            checkpoint = Checkpoint.objects.defer("payload").filter(pk=data["checkpoint"], thread=thread).first()
            if checkpoint is None:
                raise ValidationError({"checkpoint": "No such checkpoint in this thread."})
        stored, created = put_tool_result(
            thread=thread, key=key, result=data["result"], tool=data.get("tool", ""), checkpoint=checkpoint
        )
        return Response(ToolResultSerializer(stored).data, status=status.HTTP_201_CREATED if created else 200)


def _body(serializer_class: type, request: Request) -> dict[str, Any]:
    serializer = serializer_class(data=request.data)
    serializer.is_valid(raise_exception=True)
    return dict(serializer.validated_data)


class ForkView(APIView):
    """Rewind to a checkpoint and branch from it, the state edited by `patch` (admins only)."""

    @extend_schema(request=ForkSerializer, responses={201: ForkResultSerializer})
    def post(self, request: Request, checkpoint_id: uuid.UUID) -> Response:
        source = get_checkpoint_for(request.user, checkpoint_id)
        user = check_can_fork(request.user)
        data = _body(ForkSerializer, request)
        created = forks.fork(
            checkpoint=source, user=user, reason=data["reason"], patch=data.get("patch"), branch=data.get("branch"),
            resume=data["resume"], carry_approval=data.get("carry_approval"), address=client_address(request),
        )  # fmt: skip
        body = checkpoint_summary(created, storage.get_branch_name(created.branch_id))
        # Filtered by thread too: runs are indexed by thread, not by checkpoint.
        runs = Run.objects.filter(thread_id=created.thread_id, checkpoint_id=created.pk)
        run_id = runs.values_list("pk", flat=True).first()
        body["run"] = str(run_id) if run_id else None
        return Response(body, status=status.HTTP_201_CREATED)


class ThreadCancelView(APIView):
    """Cancel a thread with its pending approvals and queued runs (admins only)."""

    @extend_schema(request=ThreadActionSerializer, responses={200: ThreadDetailSerializer})
    def post(self, request: Request, thread_id: uuid.UUID) -> Response:
        thread = get_thread_for(request.user, thread_id)
        user = check_can_cancel(request.user)
        data = _body(ThreadActionSerializer, request)
        forks.cancel(thread=thread, user=user, reason=data["reason"], address=client_address(request))
        return Response(_thread_detail(thread.pk))


class ThreadResumeView(APIView):
    """Resume a failed (or paused) thread from its head (admins only)."""

    @extend_schema(request=ThreadActionSerializer, responses={200: ThreadActionResultSerializer})
    def post(self, request: Request, thread_id: uuid.UUID) -> Response:
        thread = get_thread_for(request.user, thread_id)
        user = check_can_cancel(request.user)
        data = _body(ThreadActionSerializer, request)
        run = forks.resume_failed(thread=thread, user=user, reason=data["reason"], address=client_address(request))
        return Response({**_thread_detail(thread.pk), "run": str(run.pk)})
