"""Approval policies: who may decide, N of M approvals, the thread's starter, versions, deadlines."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone
from rest_framework.test import APIClient

from approvals import policies
from approvals.models import ApprovalPolicy, ApprovalRequest, ApprovalStatus, ApprovalVote, AtDeadline
from approvals.services import expire_due
from audit.models import AuditEntry
from checkpoints.models import Event
from quicksave_agents.models import Run
from tests.approvals.factories import group_of, policy, waiting
from tests.conftest import person

pytestmark = pytest.mark.django_db


def api_as(user: User) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def vote(user: User, approval: ApprovalRequest, decision: str = "approve", **body: Any) -> Any:
    body = {"decision": decision, **body}
    return api_as(user).post(f"/api/v1/approvals/{approval.pk}/decide/", data=json.dumps(body),
                             content_type="application/json")  # fmt: skip


@pytest.fixture
def rita() -> User:
    return person("rita", "reviewer")


@pytest.fixture
def ravi() -> User:
    return person("ravi", "reviewer")


@pytest.fixture
def rosa() -> User:
    return person("rosa", "reviewer")


@pytest.fixture
def finance(rita: User, ravi: User, rosa: User) -> Any:
    return group_of("finance", rita, ravi, rosa)


def test_two_approvals_are_needed_and_the_first_shows_as_a_partial_quorum(finance: Any, rita: User, ravi: User) -> None:
    policy(groups=(finance,), approvals_needed=2)
    approval = waiting()

    first = vote(rita, approval)

    assert first.status_code == 200, first.content
    body = first.json()
    assert (body["status"], body["decision"]) == ("pending", None)
    assert body["quorum"] == {"approvals_needed": 2, "rejections_needed": 1, "approved_by": ["rita"],
                              "rejected_by": []}  # fmt: skip
    assert Run.objects.filter(approval=approval).count() == 0
    voted = Event.objects.get(thread=approval.thread, type="approval.voted")
    assert voted.data["approved_by"] == ["rita"]
    assert AuditEntry.objects.filter(action="approval.vote", actor_name="rita", target_id=str(approval.pk)).exists()

    second = vote(ravi, approval)

    assert second.status_code == 200, second.content
    assert (second.json()["status"], second.json()["decision"]["decided_by"]) == ("approved", "ravi")
    assert second.json()["quorum"]["approved_by"] == ["rita", "ravi"]
    assert Run.objects.filter(approval=approval).count() == 1
    assert AuditEntry.objects.get(action="approval.approve", target_id=str(approval.pk)).after["approved_by"] == [
        "rita", "ravi"]  # fmt: skip


def test_any_rejection_rejects_by_default(finance: Any, rita: User, ravi: User) -> None:
    policy(groups=(finance,), approvals_needed=2)
    approval = waiting()
    vote(rita, approval)

    rejected = vote(ravi, approval, "reject", comment="too expensive")

    assert rejected.status_code == 200
    assert (rejected.json()["status"], rejected.json()["decision"]["decided_by"]) == ("rejected", "ravi")
    assert Run.objects.filter(approval=approval).count() == 1  # the agent learns it was refused


def test_with_two_rejections_needed_one_objection_does_not_reject(
    finance: Any, rita: User, ravi: User, rosa: User
) -> None:
    policy(groups=(finance,), approvals_needed=2, rejections_needed=2)
    approval = waiting()

    assert vote(rita, approval, "reject", comment="hm").json()["status"] == "pending"
    assert vote(ravi, approval).json()["status"] == "pending"
    settled = vote(rosa, approval).json()

    assert settled["status"] == "approved"
    assert settled["quorum"] | {} == {"approvals_needed": 2, "rejections_needed": 2, "approved_by": ["ravi", "rosa"],
                                      "rejected_by": ["rita"]}  # fmt: skip


def test_a_second_vote_by_the_same_person_gets_409(finance: Any, rita: User) -> None:
    policy(groups=(finance,), approvals_needed=2)
    approval = waiting()
    vote(rita, approval)

    again = vote(rita, approval)

    assert again.status_code == 409
    assert (again.json()["error"]["code"], again.json()["error"]["detail"]["vote"]) == ("already_voted", "approve")
    assert ApprovalVote.objects.filter(approval=approval).count() == 1


def test_a_reviewer_the_policy_does_not_name_gets_403_and_changes_nothing(finance: Any) -> None:
    policy(groups=(finance,))
    approval = waiting()
    outsider = person("otto", "reviewer")

    refused = vote(outsider, approval)

    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "not_eligible"
    assert "members of finance" in refused.json()["error"]["message"]
    assert ApprovalRequest.objects.get(pk=approval.pk).status == ApprovalStatus.PENDING
    assert not ApprovalVote.objects.exists()


def test_a_role_or_a_named_person_may_decide_and_the_reviewer_role_is_still_needed(rita: User) -> None:
    viewer = person("vera", "viewer")
    policy(role="admin", users=(rita, viewer))
    approval = waiting()

    assert vote(viewer, approval).status_code == 403  # named, but without the reviewer role
    assert vote(person("ravi", "reviewer"), approval).status_code == 403  # a reviewer, not named
    assert vote(User.objects.get(username="ada"), approval).json()["status"] == "approved"  # an admin by role
    assert approval.policy is not None
    assert policies.is_decider(approval.policy, rita)


def test_the_starter_may_not_approve_their_own_agents_request_but_may_reject_it(rita: User) -> None:
    policy()
    approval = waiting(started_by=rita)

    refused = vote(rita, approval)

    assert refused.status_code == 403
    assert refused.json()["error"]["detail"]["reason"] == "starter"
    assert vote(rita, approval, "reject", comment="I changed my mind").json()["status"] == "rejected"


def test_the_starter_may_approve_when_the_policy_allows_it(rita: User) -> None:
    policy(starter_may_approve=True)
    assert vote(rita, waiting(started_by=rita)).json()["status"] == "approved"


def test_a_thread_started_through_the_api_knows_its_starter(agent_key: str, rita: User) -> None:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {agent_key}")

    made = client.post("/api/v1/threads/", {"external_id": "for-rita", "started_by": "rita"}, format="json")
    unknown = client.post("/api/v1/threads/", {"external_id": "x", "started_by": "nobody"}, format="json")

    assert made.status_code == 201
    from checkpoints.models import Thread

    assert Thread.objects.get(pk=made.json()["id"]).started_by == rita
    assert (unknown.status_code, list(unknown.json()["error"]["detail"]["fields"])) == (400, ["started_by"])


def test_edited_args_are_refused_where_several_approvals_are_needed(finance: Any, rita: User) -> None:
    policy(groups=(finance,), approvals_needed=2)
    approval = waiting()

    edited = vote(rita, approval, args={"flight": "SK125", "price": 380})

    assert edited.status_code == 422
    assert edited.json()["error"]["detail"]["field"] == "args"
    assert not ApprovalVote.objects.exists()


def test_a_change_is_a_new_version_and_waiting_requests_keep_the_one_they_were_filed_under(
    finance: Any, rita: User
) -> None:
    first = policy(groups=(finance,), approvals_needed=2)
    before = waiting()
    changed = policies.change_policy(policy=first.policy, terms=policies.Terms(groups=(finance,)),
                                     actor=User.objects.get(username="ada"))  # fmt: skip
    after = waiting()

    assert (changed.version, changed.policy_id) == (2, first.policy_id)
    assert (before.policy, after.policy) == (first, changed)
    assert vote(rita, before).json()["status"] == "pending"  # still needs two
    assert vote(rita, after).json()["status"] == "approved"  # needs one now


def test_the_most_specific_live_policy_governs_a_new_request() -> None:
    default_any = policy(agent=None, action="")
    default_action = policy(agent=None, action="book_flight")
    agent_any = policy(action="")

    assert waiting(agent="code-review", action="merge").policy == default_any
    assert waiting(agent="code-review", action="book_flight").policy == default_action
    assert waiting(action="book_hotel").policy == agent_any
    exact = policy()
    assert waiting().policy == exact
    policies.retire_policy(policy=exact.policy, actor=User.objects.get(username="ada"))
    assert waiting().policy == agent_any


def test_every_policy_write_is_audited_with_before_and_after(finance: Any) -> None:
    version = policy(groups=(finance,))
    ada = User.objects.get(username="ada")
    policies.change_policy(policy=version.policy, terms=policies.Terms(approvals_needed=2, groups=(finance,)),
                           actor=ada)  # fmt: skip
    policies.retire_policy(policy=version.policy, actor=ada, reason="moved to the default")

    entries = list(AuditEntry.objects.filter(target_type="approval_policy").order_by("created_at", "id"))
    assert [entry.action for entry in entries] == ["policy.create", "policy.change", "policy.retire"]
    assert entries[1].before["approvals_needed"] == 1
    assert (entries[1].after["approvals_needed"], entries[1].after["version"]) == (2, 2)
    assert entries[2].reason == "moved to the default"


def test_a_second_live_policy_for_the_same_agent_and_action_is_refused() -> None:
    policy()
    with pytest.raises(policies.PolicyExists):
        policy()
    assert ApprovalPolicy.objects.count() == 1


def test_at_the_deadline_a_request_escalates_and_the_group_may_then_decide(rita: User) -> None:
    managers = group_of("managers", person("max", "reviewer"))
    policy(users=(rita,), deadline_minutes=30, at_deadline=AtDeadline.ESCALATE, escalate_to=managers,
           escalation_minutes=60)  # fmt: skip
    approval = waiting()
    assert approval.expires_at is not None
    assert vote(User.objects.get(username="max"), approval).status_code == 403  # not yet

    later = approval.expires_at + timedelta(seconds=1)
    assert expire_due(now=later) == 1

    escalated = ApprovalRequest.objects.get(pk=approval.pk)
    assert (escalated.status, escalated.escalated_at) == (ApprovalStatus.PENDING, later)
    assert escalated.expires_at == later + timedelta(minutes=60)
    event = Event.objects.get(thread=approval.thread, type="approval.escalated")
    assert (event.data["approval"], event.data["escalated_to"]) == (str(approval.pk), "managers")
    entry = AuditEntry.objects.get(action="approval.escalate", target_id=str(approval.pk))
    assert (entry.actor_name, entry.after["escalated_to"]) == ("quicksave", "managers")
    assert vote(User.objects.get(username="max"), approval).json()["status"] == "approved"


def test_an_escalated_request_nobody_decides_is_rejected_at_the_escalation_deadline() -> None:
    managers = group_of("managers")
    policy(deadline_minutes=5, at_deadline=AtDeadline.ESCALATE, escalate_to=managers, escalation_minutes=10)
    approval = waiting()
    assert approval.expires_at is not None
    expire_due(now=approval.expires_at)
    expire_due(now=approval.expires_at + timedelta(minutes=10))

    closed = ApprovalRequest.objects.get(pk=approval.pk)
    assert (closed.status, closed.decided_args) == (ApprovalStatus.EXPIRED, None)
    assert "escalation to managers" in closed.comment
    assert Run.objects.filter(approval=approval).count() == 1


@pytest.mark.parametrize(("risk", "approved"), [("low", True), ("medium", False), ("high", False)])
def test_at_the_deadline_only_low_risk_is_approved_under_approve_low_risk(risk: str, approved: bool) -> None:
    policy(deadline_minutes=5, at_deadline=AtDeadline.APPROVE_LOW_RISK)
    approval = waiting(risk=risk)
    assert approval.expires_at is not None
    expire_due(now=approval.expires_at)

    closed = ApprovalRequest.objects.get(pk=approval.pk)
    assert closed.status == ApprovalStatus.EXPIRED
    assert (closed.decided_args is not None) is approved
    assert Run.objects.filter(approval=approval).count() == 1


def test_the_policy_deadline_shortens_the_agents_own_and_never_lengthens_it() -> None:
    policy(deadline_minutes=30)
    soon = timezone.now() + timedelta(minutes=5)
    late = timezone.now() + timedelta(hours=5)

    assert waiting(expires_at=soon).expires_at == soon
    shortened = waiting(expires_at=late).expires_at
    assert shortened is not None and shortened < late


def test_a_vote_after_the_deadline_first_escalates_then_counts_if_the_voter_may_decide(rita: User) -> None:
    managers = group_of("managers", person("max", "reviewer"))
    policy(users=(rita,), deadline_minutes=30, at_deadline=AtDeadline.ESCALATE, escalate_to=managers)
    approval = waiting()
    ApprovalRequest.objects.filter(pk=approval.pk).update(expires_at=timezone.now() - timedelta(seconds=1))

    decided = vote(User.objects.get(username="max"), approval)

    assert decided.status_code == 200, decided.content
    assert decided.json()["status"] == "approved"
    assert decided.json()["escalated_at"] is not None


def test_impossible_or_contradictory_terms_name_their_field(rita: User) -> None:
    with pytest.raises(policies.InvalidPolicy) as impossible:
        policy(users=(rita,), approvals_needed=2)
    with pytest.raises(policies.InvalidPolicy) as nowhere:
        policy(at_deadline=AtDeadline.ESCALATE)

    assert list(impossible.value.detail["fields"]) == ["approvals_needed"]
    assert list(nowhere.value.detail["fields"]) == ["escalate_to"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("approvals_needed", "decisions", "statuses", "outcome"),
    [
        (2, ["approve", "approve", "approve"], [200, 200, 409], "approved"),
        (1, ["approve", "reject", "approve"], [200, 409, 409], None),  # whoever is first decides
        (3, ["approve", "approve", "approve"], [200, 200, 200], "approved"),  # all three count; the last settles it
    ],
)
def test_three_reviewers_voting_at_once_end_in_exactly_one_outcome(
    live_server: Any, approvals_needed: int, decisions: list[str], statuses: list[int], outcome: str | None
) -> None:
    import threading

    import httpx
    from django.test import Client

    reviewers = [person(name, "reviewer") for name in ("rita", "ravi", "rosa")]
    policy(groups=(group_of("finance", *reviewers),), approvals_needed=approvals_needed)
    approval = waiting()
    sessions = []
    for reviewer in reviewers:
        browser = Client()
        browser.force_login(reviewer)
        http = httpx.Client(base_url=live_server.url, cookies={"sessionid": browser.cookies["sessionid"].value})
        assert http.get("/").status_code == 200  # a page with a form sets the CSRF cookie
        sessions.append(http)
    barrier = threading.Barrier(len(sessions))
    results: list[httpx.Response] = []

    def cast(http: httpx.Client, decision: str) -> None:
        barrier.wait()
        results.append(http.post(f"/api/v1/approvals/{approval.pk}/decide/",
                                 json={"decision": decision, "comment": "no" if decision == "reject" else ""},
                                 headers={"X-CSRFToken": http.cookies["csrftoken"]}))  # fmt: skip

    racers = [threading.Thread(target=cast, args=pair) for pair in zip(sessions, decisions, strict=True)]
    for racer in racers:
        racer.start()
    for racer in racers:
        racer.join()

    assert sorted(response.status_code for response in results) == statuses
    closed = ApprovalRequest.objects.select_related("decided_by").get(pk=approval.pk)
    assert closed.status != ApprovalStatus.PENDING
    assert closed.decided_by is not None
    winner = closed.decided_by.get_username()
    if outcome:
        assert closed.status == outcome
    settling = [response.json() for response in results if response.status_code == 200
                and response.json()["status"] != "pending"]  # fmt: skip
    assert len(settling) == 1  # one response reports the outcome; the others saw it pending or decided
    assert settling[0]["decision"]["decided_by"] == winner
    for loser in (response.json()["error"] for response in results if response.status_code == 409):
        assert (loser["code"], loser["detail"]["decided_by"]) == ("already_decided", winner)
    assert Run.objects.filter(approval=approval).count() == 1
    decided = ["approval.approve", "approval.reject"]
    decisions_audited = AuditEntry.objects.filter(target_id=str(approval.pk), action__in=decided)
    assert decisions_audited.count() == 1
    votes = ApprovalVote.objects.filter(approval=approval).count()
    assert votes == statuses.count(200)
