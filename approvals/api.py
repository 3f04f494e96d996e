"""REST API v1 for approvals: agents request them, reviewers decide them."""

from __future__ import annotations

import uuid
from typing import Any

from django.contrib.auth.models import User
from django.http import Http404
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.exceptions import PermissionDenied, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from approvals import selectors, services
from approvals.models import ApprovalKind, ApprovalRequest
from approvals.serializers import (
    ApprovalCreateSerializer,
    ApprovalListQuerySerializer,
    ApprovalSchemaSerializer,
    DecisionSerializer,
    approval_data,
)
from audit.trail import client_address
from checkpoints.access import check_can_write, get_thread_for, visible_threads
from checkpoints.models import Checkpoint
from quicksave.api import CursorPage


def visible_approvals(principal: Any) -> Any:
    return (
        ApprovalRequest.objects.filter(thread__in=visible_threads(principal))
        .select_related("thread__agent", "decided_by", "tool_call", "policy", "rule")
        .prefetch_related("votes__user")
    )


def get_approval_for(principal: Any, approval_id: Any) -> ApprovalRequest:
    approval = visible_approvals(principal).filter(pk=approval_id).first()
    if approval is None:
        raise Http404(f"Approval {approval_id} does not exist.")
    return approval


class ApprovalPagination(CursorPage):
    ordering = ("created_at", "id")


class ThreadApprovalsView(APIView):
    @extend_schema(request=ApprovalCreateSerializer, responses={201: ApprovalSchemaSerializer})
    def post(self, request: Request, thread_id: uuid.UUID) -> Response:
        """Ask a person to approve an action at a checkpoint of the thread: the request waits in the inbox
        and the thread waits for approval until someone decides or it expires."""
        thread = get_thread_for(request.user, thread_id)
        check_can_write(request.user, thread)
        serializer = ApprovalCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        checkpoint = Checkpoint.objects.defer("payload").filter(pk=data["checkpoint"], thread=thread).first()
        if checkpoint is None:
            raise ValidationError({"checkpoint": "No such checkpoint in this thread."})
        approval = services.request_approval(
            thread=thread, checkpoint=checkpoint, action=data["action"], args=data["args"],
            message=data["message"], risk=data["risk"], expires_at=data["expires_at"], fence=data["fence"],
        )  # fmt: skip
        return Response(approval_data(get_approval_for(request.user, approval.pk)), status=status.HTTP_201_CREATED)


class ApprovalListView(APIView):
    @extend_schema(
        operation_id="v1_approvals_list",
        parameters=[ApprovalListQuerySerializer],
        responses=inline_serializer(
            "ApprovalPage",
            {"results": ApprovalSchemaSerializer(many=True), "next": serializers.URLField(allow_null=True)},
        ),
    )
    def get(self, request: Request) -> Response:
        """The approval and in-doubt requests on threads you may read, oldest first; filter by status,
        agent, or those assigned to you."""
        query = ApprovalListQuerySerializer(data=request.query_params.dict())
        query.is_valid(raise_exception=True)
        approvals = visible_approvals(request.user)
        if query.validated_data.get("status"):
            approvals = approvals.filter(status=query.validated_data["status"])
        if query.validated_data.get("agent"):
            approvals = approvals.filter(thread__agent__name=query.validated_data["agent"])
        if query.validated_data.get("assigned"):
            user = request.user
            approvals = selectors.assigned_to(approvals, user) if isinstance(user, User) else approvals.none()
        paginator = ApprovalPagination()
        page = paginator.paginate_queryset(approvals, request, view=self)
        return paginator.get_paginated_response([approval_data(approval) for approval in page or []])


class ApprovalDetailView(APIView):
    @extend_schema(responses=ApprovalSchemaSerializer)
    def get(self, request: Request, approval_id: uuid.UUID) -> Response:
        """One approval or in-doubt request, with its decision once it has one."""
        return Response(approval_data(get_approval_for(request.user, approval_id)))


class DecideView(APIView):
    @extend_schema(request=DecisionSerializer, responses={200: ApprovalSchemaSerializer})
    def post(self, request: Request, approval_id: uuid.UUID) -> Response:
        """Decide a request (reviewers and admins): approve, optionally with edited `args`, or reject with a
        comment; an in-doubt call is answered with whether it happened. Exactly one decision wins: a
        second gets 409 `already_decided` naming who decided and when."""
        approval = get_approval_for(request.user, approval_id)
        user = request.user
        if not isinstance(user, User) or not user.has_perm("checkpoints.decide_approval"):
            raise PermissionDenied("Deciding approvals needs the reviewer or admin role.")
        serializer = DecisionSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        if approval.kind == ApprovalKind.IN_DOUBT:
            if data["args"] is not None:
                raise ValidationError({"args": "An in-doubt call takes a `result`, not `args`."})
            decided = services.resolve_in_doubt(
                approval=approval, user=user, resolution=data["decision"], comment=data["comment"],
                address=client_address(request), **({"result": data["result"]} if "result" in data else {}),
            )  # fmt: skip
        else:
            if "result" in data:
                raise ValidationError({"result": "Only an in-doubt call takes a `result`."})
            decided = services.decide(
                approval=approval, user=user, decision=data["decision"], comment=data["comment"],
                args=data["args"], address=client_address(request),
            )  # fmt: skip
        return Response(approval_data(get_approval_for(request.user, decided.pk)))
