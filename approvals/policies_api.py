"""REST API v1 for approval policies and auto-approve rules: people with a role read them, admins
change them. Agent keys get 403: an agent does not choose who approves it."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User
from django.http import Http404
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.exceptions import PermissionDenied
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from approvals import policies, rules, selectors
from approvals.models import ApprovalPolicy, AutoApproveRule
from approvals.policy_serializers import (
    PolicyCreateSerializer,
    PolicyDetailSchemaSerializer,
    PolicySchemaSerializer,
    RetireSerializer,
    RevokeSerializer,
    RuleCreateSerializer,
    RuleSchemaSerializer,
    SuggestionSchemaSerializer,
    SuggestQuerySerializer,
    TermsSerializer,
    policy_data,
    rule_data,
    suggestion_data,
)
from audit.trail import client_address
from quicksave.api import CursorPage

MANAGE = "approvals.manage_policies"


def _reader(request: Request) -> User:
    user = request.user
    if not isinstance(user, User) or not user.has_perm("checkpoints.view_thread"):
        raise PermissionDenied("Reading approval policies needs a role; agent keys cannot read them.")
    return user


def _manager(request: Request) -> User:
    user = request.user
    if not isinstance(user, User) or not user.has_perm(MANAGE):
        raise PermissionDenied("Changing approval policies and rules needs the admin role.")
    return user


def _policy(policy_id: int) -> ApprovalPolicy:
    policy = selectors.policies_listed().filter(pk=policy_id).first()
    if policy is None:
        raise Http404(f"Policy {policy_id} does not exist.")
    return policy


def _detail(policy_id: int) -> dict[str, Any]:
    policy = _policy(policy_id)
    versions = list(policy.versions.all())
    return policy_data(policy, versions[0], versions=versions)


def _rule(rule_id: int) -> AutoApproveRule:
    rule = selectors.rules_listed().filter(pk=rule_id).first()
    if rule is None:
        raise Http404(f"Rule {rule_id} does not exist.")
    return rule


def _page(schema: Any) -> Any:
    return inline_serializer(
        f"{schema.__name__.removesuffix('SchemaSerializer')}Page",
        {"results": schema(many=True), "next": serializers.URLField(allow_null=True)},
    )


class PolicyPagination(CursorPage):
    ordering = ("created_at", "id")


class PolicyListView(APIView):
    @extend_schema(operation_id="v1_policies_list", responses=_page(PolicySchemaSerializer))
    def get(self, request: Request) -> Response:
        """The approval policies: for an agent's action, how many approvals (or rejections) decide a
        request, who may decide and what happens at the deadline."""
        _reader(request)
        paginator = PolicyPagination()
        page = paginator.paginate_queryset(selectors.policies_listed(), request, view=self)
        return paginator.get_paginated_response(
            [policy_data(policy, selectors.current_version(policy)) for policy in page or []]
        )

    @extend_schema(request=PolicyCreateSerializer, responses={201: PolicyDetailSchemaSerializer})
    def post(self, request: Request) -> Response:
        """Create the approval policy of an agent's action (admins only); requests filed from now on follow
        it."""
        user = _manager(request)
        serializer = PolicyCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        version = policies.create_policy(agent=data["agent"], action=data["action"], terms=serializer.terms(),
                                         actor=user, address=client_address(request))  # fmt: skip
        return Response(_detail(version.policy_id), status=status.HTTP_201_CREATED)


class PolicyDetailView(APIView):
    @extend_schema(responses=PolicyDetailSchemaSerializer)
    def get(self, request: Request, policy_id: int) -> Response:
        """One approval policy with its current terms and its earlier versions."""
        _reader(request)
        return Response(_detail(policy_id))

    @extend_schema(request=TermsSerializer, responses=PolicyDetailSchemaSerializer)
    def put(self, request: Request, policy_id: int) -> Response:
        """Write the policy's next version (its agent and action stay); waiting requests keep theirs."""
        user = _manager(request)
        policy = _policy(policy_id)
        serializer = TermsSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        policies.change_policy(policy=policy, terms=serializer.terms(), actor=user, address=client_address(request))
        return Response(_detail(policy_id))

    @extend_schema(request=RetireSerializer, responses=PolicyDetailSchemaSerializer)
    def delete(self, request: Request, policy_id: int) -> Response:
        """Retire the policy: it governs no new request; its versions stay for those filed under them."""
        user = _manager(request)
        policy = _policy(policy_id)
        serializer = RetireSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        policies.retire_policy(policy=policy, actor=user, reason=serializer.validated_data["reason"],
                               address=client_address(request))  # fmt: skip
        return Response(_detail(policy_id))


class RulePagination(CursorPage):
    ordering = ("created_at", "id")


class RuleListView(APIView):
    @extend_schema(operation_id="v1_policies_rules_list", responses=_page(RuleSchemaSerializer))
    def get(self, request: Request) -> Response:
        """The auto-approve rules, with how many requests each has approved."""
        _reader(request)
        paginator = RulePagination()
        page = paginator.paginate_queryset(selectors.rules_listed(), request, view=self)
        listed = [rule_data(rule, approved=selectors.approved_count(rule)) for rule in page or []]
        return paginator.get_paginated_response(listed)

    @extend_schema(request=RuleCreateSerializer, responses={201: RuleSchemaSerializer})
    def post(self, request: Request) -> Response:
        """Create an auto-approve rule (admins only): a request for the rule's agent and action whose args
        meet every condition, at or below the risk ceiling, is approved without a person."""
        user = _manager(request)
        serializer = RuleCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        rule = rules.create_rule(
            name=data["name"], agent=data["agent"], action=data["action"], conditions=data["conditions"],
            args_schema=data["args_schema"], max_risk=data["max_risk"], expires_at=data["expires_at"], actor=user,
            address=client_address(request),
        )  # fmt: skip
        return Response(rule_data(_rule(rule.pk), approved=0), status=status.HTTP_201_CREATED)


class RuleDetailView(APIView):
    @extend_schema(responses=RuleSchemaSerializer)
    def get(self, request: Request, rule_id: int) -> Response:
        """One auto-approve rule, with how many requests it has approved."""
        _reader(request)
        rule = _rule(rule_id)
        return Response(rule_data(rule, approved=selectors.approved_count(rule)))


class RuleRevokeView(APIView):
    @extend_schema(request=RevokeSerializer, responses=RuleSchemaSerializer)
    def post(self, request: Request, rule_id: int) -> Response:
        """Revoke the rule: no request filed after this returns is approved by it."""
        user = _manager(request)
        rule = _rule(rule_id)
        serializer = RevokeSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        rules.revoke_rule(rule=rule, actor=user, reason=serializer.validated_data["reason"],
                          address=client_address(request))  # fmt: skip
        revoked = _rule(rule_id)
        return Response(rule_data(revoked, approved=selectors.approved_count(revoked)))


class RuleSuggestView(APIView):
    @extend_schema(parameters=[SuggestQuerySerializer], responses=SuggestionSchemaSerializer)
    def get(self, request: Request) -> Response:
        """A rule proposed from the last `last` human decisions on an agent's action, when they were
        all unedited approvals of identical args; else `reason` says why there is none."""
        _manager(request)
        query = SuggestQuerySerializer(data=request.query_params.dict())
        query.is_valid(raise_exception=True)
        data = query.validated_data
        return Response(suggestion_data(rules.suggest_rule(agent=data["agent"], action=data["action"],
                                                           last=data["last"])))  # fmt: skip
