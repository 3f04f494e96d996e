"""The policy pages (admins make, change and retire policies; make and revoke rules, after a
confirmation), and what the inbox, the approval page and the thread's timeline show of them."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User

from approvals import rules
from approvals.models import ApprovalPolicy, AutoApproveRule, PolicyVersion
from approvals.services import decide
from audit.models import AuditEntry
from quicksave_agents.models import Agent
from tests.approvals.factories import group_of, policy, waiting
from tests.conftest import person, signed_in

pytestmark = pytest.mark.django_db


@pytest.fixture
def ada(agent: Agent) -> User:
    """An admin, with the travel agent registered."""
    return person("ada", "admin")


def text(response: Any) -> str:
    return str(response.content.decode())


def test_an_admin_makes_a_policy_on_the_page_and_its_change_is_version_2(ada: User, agent: Agent) -> None:
    page = signed_in(ada)
    finance = group_of("finance")

    form = {"agent": agent.pk, "action": "book_flight", "role": "", "groups": [finance.pk], "approvals_needed": 2,
            "rejections_needed": 1, "at_deadline": "reject"}  # fmt: skip
    made = page.post("/policies/new/", form)

    assert made.status_code == 302, text(made)
    created = ApprovalPolicy.objects.get()
    assert made["Location"] == f"/policies/{created.pk}/"
    shown = text(page.get(made["Location"]))
    assert "Version 1: members of finance decide" in shown
    changed = page.post(made["Location"], {"role": "admin", "approvals_needed": 1, "rejections_needed": 1,
                                           "at_deadline": "reject"})  # fmt: skip
    assert changed.status_code == 302
    assert list(PolicyVersion.objects.filter(policy=created).values_list("version", "role")) == [(2, "admin"),
                                                                                                 (1, "")]  # fmt: skip
    assert [entry.actor_name for entry in AuditEntry.objects.filter(target_type="approval_policy")] == ["ada", "ada"]


def test_a_policy_that_cannot_be_met_is_shown_again_with_the_reason_under_its_field(ada: User, agent: Agent) -> None:
    rita = person("rita", "reviewer")

    refused = signed_in(ada).post("/policies/new/", {"agent": agent.pk, "users": [rita.pk], "approvals_needed": 3,
                                                     "rejections_needed": 1, "at_deadline": "escalate"})  # fmt: skip

    assert refused.status_code == 400
    assert "3 approvals are needed but only 1 people may decide." in text(refused)
    assert not ApprovalPolicy.objects.exists()


def test_retiring_a_policy_asks_first_then_retires_it(ada: User) -> None:
    version = policy(actor=ada)
    page = signed_in(ada)
    url = f"/policies/{version.policy_id}/retire/"

    asked = page.get(url)
    assert "What will happen" in text(asked)
    assert ApprovalPolicy.objects.get().retired_at is None

    assert page.post(url, {"reason": "one default is enough"}).status_code == 302
    assert ApprovalPolicy.objects.get().retired_at is not None
    assert AuditEntry.objects.get(action="policy.retire").reason == "one default is enough"


def test_a_rule_with_bad_conditions_is_shown_again_with_the_error_under_the_field(ada: User) -> None:
    form = {"name": "Cheap", "action": "book_flight", "max_risk": "low",
            "conditions": '[{"path": "/p", "op": "below", "value": 1}]'}  # fmt: skip
    refused = signed_in(ada).post("/policies/rules/new/", form)

    assert refused.status_code == 400
    body = text(refused)
    assert 'id="field-conditions"' in body and "conditions[0].op must be one of" in body
    assert not AutoApproveRule.objects.exists()


def test_the_new_rule_page_fills_itself_in_from_a_suggestion(ada: User) -> None:
    rita = person("rita", "reviewer")
    for _ in range(3):
        decide(approval=waiting(args={"flight": "SK123"}), user=rita, decision="approve")

    page = text(signed_in(ada).get("/policies/rules/new/?suggest=1&agent=travel&action=book_flight&last=3"))

    assert "Suggested</strong> from the last 3 approvals" in page
    assert "&quot;/flight&quot;" in page and "&quot;SK123&quot;" in page
    too_many = text(signed_in(ada).get("/policies/rules/new/?suggest=1&agent=travel&action=book_flight&last=9"))
    assert "No rule to suggest" in too_many


def test_revoking_a_rule_asks_first_then_stops_it(ada: User) -> None:
    rule = rules.create_rule(name="Cheap", agent=None, action="book_flight", max_risk="high",
                             conditions=[{"path": "/price", "op": "lt", "value": 500}], actor=ada)  # fmt: skip
    page = signed_in(ada)
    url = f"/policies/rules/{rule.pk}/revoke/"

    asked = text(page.get(url))
    assert "No request filed after you confirm is approved by this rule" in asked
    assert AutoApproveRule.objects.get().revoked_at is None

    done = page.post(url, {"reason": "too broad"})

    assert (done.status_code, done["Location"]) == (302, f"/policies/rules/{rule.pk}/")
    assert "Revoked by ada" in text(page.get(done["Location"]))
    assert waiting().status == "pending"


@pytest.mark.parametrize("role", ["viewer", "reviewer"])
def test_the_policy_pages_need_the_admin_role(role: str) -> None:
    page = signed_in(person("pat", role))
    for url in ("/policies/", "/policies/new/", "/policies/rules/new/"):
        assert page.get(url).status_code == 403


def test_a_partial_quorum_shows_on_the_inbox_row_and_the_approval_page(agent: Agent) -> None:
    rita, ravi = person("rita", "reviewer"), person("ravi", "reviewer")
    policy(groups=(group_of("finance", rita, ravi),), approvals_needed=2)
    approval = waiting()
    decide(approval=approval, user=rita, decision="approve")

    inbox = text(signed_in(ravi).get("/inbox/"))
    assert "1 of 2 approvals: rita" in inbox
    mine = text(signed_in(rita).get(f"/inbox/{approval.pk}/"))
    assert "Approved so far by <strong>rita</strong> (1 of 2)" in mine
    assert 'id="voted"' in mine and 'id="approve-form"' not in mine
    theirs = text(signed_in(ravi).get(f"/inbox/{approval.pk}/"))
    assert 'id="approve-form"' in theirs and 'id="edit-approve"' not in theirs  # no edits where two approve


def test_the_approval_page_tells_a_reviewer_outside_the_policy_why_they_cannot_decide(agent: Agent) -> None:
    policy(groups=(group_of("finance"),))
    approval = waiting()

    page = text(signed_in(person("otto", "reviewer")).get(f"/inbox/{approval.pk}/"))

    assert "Only members of finance may decide this request." in page
    assert 'id="approve-form"' not in page and 'id="reject-form"' not in page


def test_the_starter_sees_they_may_only_reject(agent: Agent) -> None:
    rita = person("rita", "reviewer")
    policy()
    approval = waiting(started_by=rita)

    page = text(signed_in(rita).get(f"/inbox/{approval.pk}/"))

    assert "You may reject it." in page
    assert 'id="approve-form"' not in page and 'id="reject-form"' in page


def test_a_request_the_rule_approved_says_so_on_its_page_the_inbox_and_the_thread_timeline(ada: User) -> None:
    rules.create_rule(name="Cheap flights", agent=None, action="book_flight", max_risk="high",
                      conditions=[{"path": "/price", "op": "lt", "value": 500}], actor=ada)  # fmt: skip
    approval = waiting()
    page = signed_in(ada)

    assert "Approved at once by the auto-approve rule" in text(page.get(f"/inbox/{approval.pk}/"))
    assert "by rule “Cheap flights”" in text(page.get("/inbox/?status=approved"))
    timeline = text(page.get(f"/threads/{approval.thread_id}/"))
    assert f'href="/inbox/{approval.pk}/">approved by rule “Cheap flights”</a>' in timeline


def test_the_inbox_costs_the_same_queries_for_many_partial_quorums(
    agent: Agent, django_assert_max_num_queries: Any
) -> None:
    reviewers = [person(name, "reviewer") for name in ("rita", "ravi")]
    policy(groups=(group_of("finance", *reviewers),), approvals_needed=3)
    for _ in range(12):
        approval = waiting()
        for reviewer in reviewers:
            decide(approval=approval, user=reviewer, decision="approve")
    page = signed_in(reviewers[0])

    # Measured at 8 (a query per row would be 25 and more): the rows with their policy versions and
    # who voted in one query, the agents blocked in one more.
    with django_assert_max_num_queries(8):
        body = text(page.get("/inbox/"))
    assert body.count("2 of 3 approvals: rita, ravi") == 12
