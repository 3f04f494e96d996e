"""Approval policies: who may decide an agent's requests for an action, how many must agree,
whether the thread's starter may approve, and what happens at the deadline.

The one way in for policy writes (`create_policy`, `change_policy`, `retire_policy`: each audited,
each change a new version), and the reads `approvals.services` and the pages share: the version
in force for a new request, whether a person may decide a request, and its quorum so far.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth.models import Group, User
from django.db import IntegrityError, transaction
from django.db.models import Case, IntegerField, Q, Value, When
from django.utils import timezone

from approvals.models import (
    ApprovalPolicy,
    ApprovalRequest,
    AtDeadline,
    DeciderRole,
    PolicyVersion,
    VoteDecision,
)
from audit import trail
from quicksave.errors import DomainError
from quicksave.roles import ADMIN, REVIEWER, role_of
from quicksave_agents.models import Agent

# A quorum larger than this is a typo, not a policy.
MAX_QUORUM = 20
# A deadline is at most a year away.
MAX_MINUTES = 366 * 24 * 60


class InvalidPolicy(DomainError):
    """A policy that cannot be: `detail.fields` names each field and what is wrong with it, in the
    shape the API gives its other field errors."""

    code = "invalid"
    status = 400


class PolicyExists(DomainError):
    code = "policy_exists"
    status = 409


class PolicyRetired(DomainError):
    code = "policy_retired"
    status = 409


class NotEligible(DomainError):
    """The person holds the reviewer role, but the request's policy does not let them decide it."""

    code = "not_eligible"
    status = 403


def _invalid(name: str, message: str) -> InvalidPolicy:
    return InvalidPolicy(message, detail={"fields": {name: [message]}})


@dataclass(frozen=True)
class Terms:
    """What a policy says: who may decide (`role`, `groups`, `users`: any of them; none: any
    reviewer), how many distinct approvals make it approved and rejections make it rejected,
    whether the thread's starter may approve, and the deadline with what happens at it."""

    role: str = ""
    groups: tuple[Group, ...] = ()
    users: tuple[User, ...] = ()
    approvals_needed: int = 1
    rejections_needed: int = 1
    starter_may_approve: bool = False
    deadline_minutes: int | None = None
    at_deadline: str = AtDeadline.REJECT
    escalate_to: Group | None = None
    escalation_minutes: int | None = None

    @classmethod
    def of(cls, version: PolicyVersion) -> Terms:
        return cls(
            role=version.role, groups=tuple(version.groups.all()), users=tuple(version.users.all()),
            approvals_needed=version.approvals_needed, rejections_needed=version.rejections_needed,
            starter_may_approve=version.starter_may_approve, deadline_minutes=version.deadline_minutes,
            at_deadline=version.at_deadline, escalate_to=version.escalate_to,
            escalation_minutes=version.escalation_minutes,
        )  # fmt: skip


def check_terms(terms: Terms) -> None:
    """Raise InvalidPolicy naming the first field that makes `terms` impossible or contradictory."""
    if terms.role not in ("", *DeciderRole.values):
        raise _invalid("role", f"`role` must be empty (any reviewer) or one of {', '.join(DeciderRole.values)}.")
    for name in ("approvals_needed", "rejections_needed"):
        value = getattr(terms, name)
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_QUORUM:
            raise _invalid(name, f"`{name}` must be a whole number from 1 to {MAX_QUORUM}.")
    if terms.users and not terms.role and not terms.groups and terms.approvals_needed > len(terms.users):
        raise _invalid("approvals_needed", f"{terms.approvals_needed} approvals are needed but only "
                                           f"{len(terms.users)} people may decide.")  # fmt: skip
    for name in ("deadline_minutes", "escalation_minutes"):
        value = getattr(terms, name)
        whole = isinstance(value, int) and not isinstance(value, bool)
        if value is not None and not (whole and 1 <= value <= MAX_MINUTES):
            raise _invalid(name, f"`{name}` must be empty or a whole number of minutes from 1 to {MAX_MINUTES}.")
    if terms.at_deadline not in AtDeadline.values:
        raise _invalid("at_deadline", f"`at_deadline` must be one of {', '.join(AtDeadline.values)}.")
    escalates = terms.at_deadline == AtDeadline.ESCALATE
    if escalates and terms.escalate_to is None:
        raise _invalid("escalate_to", "Escalating needs the group to escalate to.")
    if not escalates and terms.escalate_to is not None:
        raise _invalid("escalate_to", "A group to escalate to only goes with `at_deadline: escalate`.")
    if not escalates and terms.escalation_minutes is not None:
        raise _invalid("escalation_minutes", "`escalation_minutes` only goes with `at_deadline: escalate`.")


def _checked_action(action: str) -> str:
    action = (action or "").strip()
    if len(action) > 200 or "\x00" in action:
        raise _invalid("action", "`action` must be at most 200 characters, without NUL.")
    return action


def create_policy(
    *, agent: Agent | None, action: str, terms: Terms, actor: User, address: str | None = None
) -> PolicyVersion:
    """A new policy for `agent`'s requests (None: every agent's) for `action` ("": any action),
    as its version 1; PolicyExists when a live one already covers the same pair."""
    action = _checked_action(action)
    check_terms(terms)
    with transaction.atomic():
        try:
            with transaction.atomic():
                policy = ApprovalPolicy.objects.create(agent=agent, action=action)
        except IntegrityError:
            existing = ApprovalPolicy.objects.filter(agent=agent, action=action, retired_at__isnull=True).first()
            raise PolicyExists(
                f"A policy for {_scope(agent, action)} exists already: change it instead.",
                detail={"policy": existing.pk if existing else None},
            ) from None
        version = _write_version(policy, 1, terms, actor)
        trail.record(actor=actor, action="policy.create", target_type="approval_policy", target_id=policy.pk,
                     after=describe(version), address=address)  # fmt: skip
    return version


def change_policy(*, policy: ApprovalPolicy, terms: Terms, actor: User, address: str | None = None) -> PolicyVersion:
    """Write `terms` as the policy's next version. Requests already waiting keep the version they
    were filed under; new ones get this one."""
    check_terms(terms)
    with transaction.atomic():
        locked = ApprovalPolicy.objects.select_for_update(of=("self",)).select_related("agent").get(pk=policy.pk)
        if locked.retired_at is not None:
            raise PolicyRetired(f"The policy for {_scope(locked.agent, locked.action)} was retired; create a new one.")
        current = locked.versions.order_by("-version").first()
        number = current.version + 1 if current else 1
        version = _write_version(locked, number, terms, actor)
        trail.record(actor=actor, action="policy.change", target_type="approval_policy", target_id=locked.pk,
                     before=describe(current) if current else {}, after=describe(version),
                     address=address)  # fmt: skip
    return version


def retire_policy(*, policy: ApprovalPolicy, actor: User, reason: str = "", address: str | None = None) -> None:
    """Stop the policy governing new requests (those waiting keep theirs); audited."""
    with transaction.atomic():
        locked = ApprovalPolicy.objects.select_for_update(of=("self",)).select_related("agent").get(pk=policy.pk)
        if locked.retired_at is not None:
            raise PolicyRetired(f"The policy for {_scope(locked.agent, locked.action)} was retired already.")
        locked.retired_at = timezone.now()
        locked.save(update_fields=["retired_at"])
        current = locked.versions.order_by("-version").first()
        trail.record(actor=actor, action="policy.retire", target_type="approval_policy", target_id=locked.pk,
                     reason=reason, before=describe(current) if current else {}, after={"retired": True},
                     address=address)  # fmt: skip


def _write_version(policy: ApprovalPolicy, number: int, terms: Terms, actor: User) -> PolicyVersion:
    version = PolicyVersion.objects.create(
        policy=policy, version=number, role=terms.role, approvals_needed=terms.approvals_needed,
        rejections_needed=terms.rejections_needed, starter_may_approve=terms.starter_may_approve,
        deadline_minutes=terms.deadline_minutes, at_deadline=terms.at_deadline, escalate_to=terms.escalate_to,
        escalation_minutes=terms.escalation_minutes, created_by=actor,
    )  # fmt: skip
    version.groups.set(terms.groups)
    version.users.set(terms.users)
    return version


def _scope(agent: Agent | None, action: str) -> str:
    return f"{agent.name if agent else 'any agent'} · {action or 'any action'}"


def describe(version: PolicyVersion) -> dict[str, Any]:
    """A version as the audit trail and the API show it."""
    policy = version.policy
    return {
        "version": version.version,
        "agent": policy.agent.name if policy.agent_id and policy.agent else None,
        "action": policy.action,
        "role": version.role or None,
        "groups": sorted(group.name for group in version.groups.all()),
        "users": sorted(user.get_username() for user in version.users.all()),
        "approvals_needed": version.approvals_needed,
        "rejections_needed": version.rejections_needed,
        "starter_may_approve": version.starter_may_approve,
        "deadline_minutes": version.deadline_minutes,
        "at_deadline": version.at_deadline,
        "escalate_to": version.escalate_to.name if version.escalate_to_id and version.escalate_to else None,
        "escalation_minutes": version.escalation_minutes,
    }


def policy_in_force(*, agent_id: int, action: str) -> PolicyVersion | None:
    """The newest version of the most specific live policy for a request: the agent's for the
    action, else the agent's for any action, else the default for the action, else the default
    for any action. One query."""
    specific = Case(
        When(policy__agent__isnull=False, policy__action__gt="", then=Value(0)),
        When(policy__agent__isnull=False, then=Value(1)),
        When(policy__action__gt="", then=Value(2)),
        default=Value(3),
        output_field=IntegerField(),
    )
    return (
        PolicyVersion.objects.filter(policy__retired_at__isnull=True)
        .filter(Q(policy__agent_id=agent_id) | Q(policy__agent__isnull=True))
        .filter(Q(policy__action=action) | Q(policy__action=""))
        .select_related("policy", "escalate_to")
        .order_by(specific, "-version")
        .first()
    )


def deadline_for(version: PolicyVersion | None, *, asked: datetime | None, now: datetime) -> datetime | None:
    """A new request's deadline: the agent's own `expires_at` or the policy's, whichever is sooner."""
    if version is None or version.deadline_minutes is None:
        return asked
    policy_deadline = now + timedelta(minutes=version.deadline_minutes)
    return min(asked, policy_deadline) if asked is not None else policy_deadline


def check_may_decide(*, approval: ApprovalRequest, user: User, decision: str) -> None:
    """Raise NotEligible unless the request's policy lets `user` cast `decision` on it. The reviewer
    role, which every decision needs, is the caller's check (the API and the pages make it)."""
    version = approval.policy
    if version is None:
        return
    starter = approval.thread.started_by_id
    if decision == VoteDecision.APPROVE and not version.starter_may_approve and starter == user.pk:
        raise NotEligible("You started this thread, and its policy does not let the starter approve its requests.",
                          detail={"reason": "starter"})  # fmt: skip
    if not is_decider(version, user, escalated=approval.escalated_at is not None):
        raise NotEligible(f"Only {who_may_decide(version, escalated=approval.escalated_at is not None)} "
                          "may decide this request.", detail={"reason": "not_named"})  # fmt: skip


def is_decider(version: PolicyVersion, user: User, *, escalated: bool = False) -> bool:
    """Whether the policy names `user` among who may decide (its escalation group too, once escalated)."""
    group_ids = {group.pk for group in version.groups.all()}
    if escalated and version.escalate_to_id is not None:
        group_ids.add(version.escalate_to_id)
    names_anyone = bool(version.role or version.groups.all() or version.users.all())
    if not names_anyone:
        return True
    role = role_of(user)
    if version.role == DeciderRole.ADMIN and role == ADMIN:
        return True
    if version.role == DeciderRole.REVIEWER and role in (REVIEWER, ADMIN):
        return True
    if any(named.pk == user.pk for named in version.users.all()):
        return True
    return bool(group_ids) and user.groups.filter(pk__in=group_ids).exists()


def who_may_decide(version: PolicyVersion, *, escalated: bool = False) -> str:
    """The policy's deciders in words: "admins, members of finance or alice"."""
    parts: list[str] = []
    if version.role == DeciderRole.ADMIN:
        parts.append("admins")
    elif version.role == DeciderRole.REVIEWER:
        parts.append("reviewers")
    groups = sorted(group.name for group in version.groups.all())
    if escalated and version.escalate_to_id and version.escalate_to and version.escalate_to.name not in groups:
        groups.append(version.escalate_to.name)
    if groups:
        parts.append("members of " + ", ".join(groups))
    parts.extend(sorted(user.get_username() for user in version.users.all()))
    if not parts:
        return "reviewers"
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " or " + parts[-1]


@dataclass(frozen=True)
class Eligibility:
    """What the approval page offers a reviewer: whether they may approve and reject, why not, and
    how they voted already (None when they have not)."""

    may_approve: bool
    may_reject: bool
    why_not: str = ""
    voted: str | None = None


def eligibility(*, approval: ApprovalRequest, user: User) -> Eligibility:
    """`check_may_decide` for both decisions, as the page shows it (reads `approval.votes`)."""
    voted = next((vote.decision for vote in approval.votes.all() if vote.user_id == user.pk), None)
    reasons = {}
    for decision in (VoteDecision.APPROVE, VoteDecision.REJECT):
        try:
            check_may_decide(approval=approval, user=user, decision=decision)
        except NotEligible as exc:
            reasons[decision] = exc.message
    why = reasons.get(VoteDecision.REJECT) or reasons.get(VoteDecision.APPROVE, "")
    return Eligibility(may_approve=VoteDecision.APPROVE not in reasons, may_reject=VoteDecision.REJECT not in reasons,
                       why_not=why, voted=voted)  # fmt: skip
