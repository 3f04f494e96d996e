"""REST API v1 for runs: external agents claim resume jobs under a lease, like the worker does."""

from __future__ import annotations

import time
import uuid
from typing import Any

from django.db import connection
from django.http import Http404
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.exceptions import PermissionDenied
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from approvals.serializers import ApprovalSchemaSerializer, approval_data
from approvals.services import file_in_doubt
from checkpoints.access import check_can_write, get_thread_for
from checkpoints.models import Checkpoint, Thread
from checkpoints.storage.tool_results import MAX_KEY_LENGTH
from quicksave.api import FenceField, FiniteFloatField, StrictSerializer
from quicksave.errors import DomainError
from quicksave_agents import runs, tool_calls
from quicksave_agents.auth import AgentPrincipal
from quicksave_agents.fencing import Fence
from quicksave_agents.models import Agent, Run, RunStatus, ToolCall
from quicksave_agents.serializers import ToolCallSchemaSerializer, tool_call_data

MAX_WAIT_SECONDS = 30


def run_data(run: Run) -> dict[str, Any]:
    return {
        "id": str(run.pk),
        "thread": str(run.thread_id),
        "checkpoint": str(run.checkpoint_id),
        "reason": run.reason,
        "status": run.status,
        "attempts": run.attempts,
        "lease_expires_at": run.lease_expires_at.isoformat() if run.lease_expires_at else None,
        "fence": Fence(run.pk, run.attempts).token if run.attempts else None,
        "approval": approval_data(run.approval) if run.approval_id and run.approval else None,
        "trace_context": run.trace_context or {},
    }


def _agent_principal(request: Request) -> AgentPrincipal:
    if not isinstance(request.user, AgentPrincipal):
        raise PermissionDenied("Runs are claimed with an agent key.")
    return request.user


def _worker(principal: AgentPrincipal) -> str:
    return f"key:{principal.key.prefix}"


def _own_run(principal: AgentPrincipal, run_id: Any) -> Run:
    run = (
        Run.objects.select_related("approval__thread__agent", "approval__decided_by")
        .filter(pk=run_id, agent=principal.agent)
        .first()
    )
    if run is None:
        raise Http404(f"Run {run_id} does not exist.")
    return run


class RunSchemaSerializer(serializers.Serializer[Any]):
    """The schema of `run_data` for the OpenAPI document."""

    id = serializers.UUIDField()
    thread = serializers.UUIDField()
    checkpoint = serializers.UUIDField()
    reason = serializers.CharField()
    status = serializers.CharField()
    attempts = serializers.IntegerField()
    lease_expires_at = serializers.DateTimeField(allow_null=True)
    fence = serializers.CharField(
        allow_null=True, help_text="This claim's fence token: send it with every write the run makes."
    )
    approval = ApprovalSchemaSerializer(allow_null=True)
    trace_context = serializers.DictField(
        child=serializers.CharField(),
        help_text="The W3C trace context (traceparent, tracestate) of the request that queued the run, for the "
        "agent's resume to continue; empty when the server does not trace.",
    )


RUN_ENVELOPE = inline_serializer("RunEnvelope", {"run": RunSchemaSerializer()})


class ClaimSerializer(StrictSerializer):
    agent = serializers.SlugField(required=False, max_length=64)
    wait = FiniteFloatField(required=False, default=0, min_value=0, max_value=MAX_WAIT_SECONDS)


class FencedSerializer(StrictSerializer):
    fence = FenceField()


class FailSerializer(FencedSerializer):
    error = serializers.CharField(required=False, allow_blank=True, default="", max_length=10_000)


def _fence(request: Request) -> Fence | None:
    serializer = FencedSerializer(data=request.data if request.data else {})
    serializer.is_valid(raise_exception=True)
    fence: Fence | None = serializer.validated_data["fence"]
    return fence


class ClaimView(APIView):
    @extend_schema(request=ClaimSerializer, responses={200: RUN_ENVELOPE, 204: None})
    def post(self, request: Request) -> Response:
        """Claim the oldest queued run of your agent under a lease (agent keys only). With `wait`, the
        request waits up to that many seconds (at most 30) for a run to be queued; 204 when none came."""
        principal = _agent_principal(request)
        serializer = ClaimSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        name = serializer.validated_data.get("agent") or principal.agent.name
        if name != principal.agent.name:
            raise PermissionDenied(f"This key belongs to agent '{principal.agent.name}', not '{name}'.")
        agent: Agent = principal.agent
        deadline = time.monotonic() + serializer.validated_data["wait"]
        # Listen before looking, so a run queued in between still wakes this request.
        with runs.run_notifications() as notifications:
            while True:
                run = runs.claim_run(agents=[agent], worker=_worker(principal))
                remaining = deadline - time.monotonic()
                if run is not None or remaining <= 0:
                    break
                # Give the pooled connection back while waiting; the wait uses its own.
                connection.close()
                notifications.wait(remaining)
        if run is None:
            return Response(status=status.HTTP_204_NO_CONTENT)
        return Response({"run": run_data(_own_run(principal, run.pk))})


class HeartbeatView(APIView):
    @extend_schema(request=FencedSerializer, responses=RUN_ENVELOPE)
    def post(self, request: Request, run_id: uuid.UUID) -> Response:
        """Keep the lease of a run you hold; send the run's `fence`. A run whose lease was lost answers 409
        `lease_lost`: stop working on it."""
        principal = _agent_principal(request)
        run = runs.heartbeat(run=_own_run(principal, run_id), worker=_worker(principal), fence=_fence(request))
        return Response({"run": run_data(run)})


class CompleteView(APIView):
    @extend_schema(request=FencedSerializer, responses=RUN_ENVELOPE)
    def post(self, request: Request, run_id: uuid.UUID) -> Response:
        """Close a run you hold as completed; send the run's `fence`."""
        principal = _agent_principal(request)
        run = runs.finish_run(run=_own_run(principal, run_id), worker=_worker(principal), status=RunStatus.COMPLETED,
                              fence=_fence(request))  # fmt: skip
        return Response({"run": run_data(run)})


class FailView(APIView):
    @extend_schema(request=FailSerializer, responses=RUN_ENVELOPE)
    def post(self, request: Request, run_id: uuid.UUID) -> Response:
        """Close a run you hold as failed, with the `error` that a person will read; send the run's `fence`."""
        principal = _agent_principal(request)
        serializer = FailSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        run = runs.finish_run(
            run=_own_run(principal, run_id), worker=_worker(principal), status=RunStatus.FAILED,
            error=serializer.validated_data["error"], fence=serializer.validated_data["fence"],
        )  # fmt: skip
        return Response({"run": run_data(run)})


# --------------------------------------------------------------------------- tool calls


class CallInDoubt(DomainError):
    """The call was started by an attempt that recorded no result: a person decides whether it happened."""

    code = "in_doubt"
    status = 409


class ToolCallBegunSerializer(ToolCallSchemaSerializer):
    proceed = serializers.BooleanField(help_text="true: call the tool now, then PUT its result; false: use `result`.")


class ToolCallIntentSerializer(StrictSerializer):
    tool = serializers.CharField(max_length=200)
    args = serializers.JSONField(required=False, default=None)
    idempotent = serializers.BooleanField(required=False, default=False)
    fence = FenceField()


class ToolCallResultSerializer(StrictSerializer):
    result = serializers.JSONField(allow_null=True)  # a tool that returns nothing (None) did something too
    fence = FenceField()


def _key(key: str) -> str:
    if not 0 < len(key) <= MAX_KEY_LENGTH or "\x00" in key:
        raise serializers.ValidationError({"key": f"must be 1 to {MAX_KEY_LENGTH} characters, none of them NUL."})
    return key


def _thread(request: Request, thread_id: uuid.UUID, *, write: bool) -> Thread:
    thread = get_thread_for(request.user, thread_id)
    if write:
        check_can_write(request.user, thread)
    return thread


class ToolCallView(APIView):
    """A call's intent: PUT it before calling the tool, and call the tool only when told to proceed."""

    @extend_schema(responses=ToolCallSchemaSerializer)
    def get(self, request: Request, thread_id: uuid.UUID, key: str) -> Response:
        """The tool call recorded under this key: its intent, state (`pending`, `done` or `in_doubt`) and
        result."""
        thread = _thread(request, thread_id, write=False)
        call = ToolCall.objects.filter(thread=thread, key=_key(key)).first()
        if call is None:
            raise Http404(f"No call is recorded under '{key}' in thread {thread.pk}.")
        return Response(tool_call_data(call))

    @extend_schema(request=ToolCallIntentSerializer, responses={200: ToolCallBegunSerializer,
                                                                201: ToolCallBegunSerializer})  # fmt: skip
    def put(self, request: Request, thread_id: uuid.UUID, key: str) -> Response:
        """Record the intent of a tool call before making it. `proceed: true` says call the tool now; a call
        done before returns its recorded result; a call started by an attempt that recorded no result
        answers 409 `in_doubt` and goes to a person."""
        thread = _thread(request, thread_id, write=True)
        serializer = ToolCallIntentSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        begun = tool_calls.begin(thread_id=thread.pk, key=_key(key), tool=data["tool"], args=data["args"],
                                 idempotent=data["idempotent"], fence=data["fence"])  # fmt: skip
        if begun.outcome is tool_calls.Outcome.IN_DOUBT:
            raise self._in_doubt(thread, begun.call, data["fence"])
        body = {**tool_call_data(begun.call), "proceed": begun.outcome is tool_calls.Outcome.RUN}
        created = begun.recorded and begun.call.starts == 1
        return Response(body, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)

    @staticmethod
    def _in_doubt(thread: Thread, call: ToolCall, fence: Fence | None) -> CallInDoubt:
        head = Checkpoint.objects.defer("payload").filter(pk=thread.head_id).first() if thread.head_id else None
        approval = file_in_doubt(call=call, checkpoint=head, fence=fence) if head is not None else None
        return CallInDoubt(
            f"{call.tool} was started by an attempt that recorded no result; it is not run again until a person "
            "says whether it happened. Stop this run: the answer queues the next one.",
            detail={"tool_call": tool_call_data(call), "approval": str(approval.pk) if approval else None},
        )


class ToolCallResultView(APIView):
    @extend_schema(request=ToolCallResultSerializer, responses=ToolCallSchemaSerializer)
    def put(self, request: Request, thread_id: uuid.UUID, key: str) -> Response:
        """Record the result of a tool call whose intent was recorded, once the tool returned."""
        thread = _thread(request, thread_id, write=True)
        serializer = ToolCallResultSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        tool_calls.finish(thread_id=thread.pk, key=_key(key), result=data["result"], fence=data["fence"])
        return Response(tool_call_data(ToolCall.objects.get(thread=thread, key=key)))
