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

from agents import runs
from agents.auth import AgentPrincipal
from agents.models import Agent, Run, RunStatus
from approvals.serializers import ApprovalSchemaSerializer, approval_data
from quicksave.api import FiniteFloatField, StrictSerializer

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
        "approval": approval_data(run.approval) if run.approval_id and run.approval else None,
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
    approval = ApprovalSchemaSerializer(allow_null=True)


RUN_ENVELOPE = inline_serializer("RunEnvelope", {"run": RunSchemaSerializer()})


class ClaimSerializer(StrictSerializer):
    agent = serializers.SlugField(required=False, max_length=64)
    wait = FiniteFloatField(required=False, default=0, min_value=0, max_value=MAX_WAIT_SECONDS)


class FailSerializer(StrictSerializer):
    error = serializers.CharField(required=False, allow_blank=True, default="", max_length=10_000)


class ClaimView(APIView):
    @extend_schema(request=ClaimSerializer, responses={200: RUN_ENVELOPE, 204: None})
    def post(self, request: Request) -> Response:
        principal = _agent_principal(request)
        serializer = ClaimSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        name = serializer.validated_data.get("agent") or principal.agent.name
        if name != principal.agent.name:
            raise PermissionDenied(f"This key belongs to agent '{principal.agent.name}', not '{name}'.")
        agent: Agent = principal.agent
        deadline = time.monotonic() + serializer.validated_data["wait"]
        # Listen before looking, so a run queued in between still wakes this request.
        with runs.RunNotifications() as notifications:
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
    @extend_schema(request=None, responses=RUN_ENVELOPE)
    def post(self, request: Request, run_id: uuid.UUID) -> Response:
        principal = _agent_principal(request)
        run = runs.heartbeat(run=_own_run(principal, run_id), worker=_worker(principal))
        return Response({"run": run_data(run)})


class CompleteView(APIView):
    @extend_schema(request=None, responses=RUN_ENVELOPE)
    def post(self, request: Request, run_id: uuid.UUID) -> Response:
        principal = _agent_principal(request)
        run = runs.finish_run(run=_own_run(principal, run_id), worker=_worker(principal), status=RunStatus.COMPLETED)
        return Response({"run": run_data(run)})


class FailView(APIView):
    @extend_schema(request=FailSerializer, responses=RUN_ENVELOPE)
    def post(self, request: Request, run_id: uuid.UUID) -> Response:
        principal = _agent_principal(request)
        serializer = FailSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        run = runs.finish_run(
            run=_own_run(principal, run_id), worker=_worker(principal), status=RunStatus.FAILED,
            error=serializer.validated_data["error"],
        )  # fmt: skip
        return Response({"run": run_data(run)})
