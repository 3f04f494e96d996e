"""Reads the policy pages and the policies API share: policies with their versions, rules with
how many requests each approved."""

from __future__ import annotations

from django.db.models import Count, Prefetch, QuerySet

from approvals.models import ApprovalPolicy, AutoApproveRule, PolicyVersion


def policies_listed() -> QuerySet[ApprovalPolicy]:
    """Policies with every version prefetched newest first (`current_version` reads the first):
    four queries however many there are."""
    versions = (
        PolicyVersion.objects.order_by("-version")
        .select_related("created_by", "escalate_to", "policy__agent")
        .prefetch_related("groups", "users")
    )
    return ApprovalPolicy.objects.select_related("agent").prefetch_related(Prefetch("versions", queryset=versions))


def current_version(policy: ApprovalPolicy) -> PolicyVersion:
    """The version in force (of a policy from `policies_listed`)."""
    return next(iter(policy.versions.all()))


def rules_listed() -> QuerySet[AutoApproveRule]:
    """Rules with their people and how many requests each approved (`approved_count`)."""
    return AutoApproveRule.objects.select_related("agent", "created_by", "revoked_by").annotate(
        approved=Count("approvals")
    )


def approved_count(rule: AutoApproveRule) -> int:
    """How many requests a rule from `rules_listed` approved."""
    return int(getattr(rule, "approved", 0))
