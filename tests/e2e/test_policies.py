"""In Chromium: an admin makes an auto-approve rule that approves the next request at once and
revokes it after a confirmation; two reviewers make a quorum, the first watching the second's
approval arrive."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import Group

from approvals import policies
from approvals.models import ApprovalRequest, ApprovalStatus, AutoApproveRule
from approvals.services import decide, request_approval
from checkpoints import storage
from quicksave_agents.keys import get_or_create_agent
from tests.e2e.conftest import Pages, make_person
from tests.waiting import wait_until

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def ask(external_id: str, price: int) -> ApprovalRequest:
    thread, _ = storage.create_thread(agent=get_or_create_agent(name="travel"), external_id=external_id)
    checkpoint = storage.append_checkpoint(thread=thread, parent=None, state={"price": price}, label="book_flight",
                                           status="waiting_for_approval")  # fmt: skip
    return request_approval(thread=thread, checkpoint=checkpoint, action="book_flight", risk="low",
                            args={"flight": "SK123", "price": price})  # fmt: skip


def test_a_rule_made_on_the_page_approves_the_next_request_and_revoking_it_stops_it(tab: Pages, db: Any) -> None:
    make_person("ada", "admin")
    get_or_create_agent(name="travel")
    tab.login("ada")
    tab.goto("/policies/")
    assert tab.page.title() == "Policies · Quicksave"
    tab.shot("policies")

    tab.follow("#new-rule")
    tab.page.fill("#id_name", "Cheap flights")
    tab.page.select_option("#id_agent", label="travel")
    tab.page.fill("#id_action", "book_flight")
    tab.page.fill("#id_conditions", '[{"path": "/price", "op": "lt", "value": 500}]')
    tab.shot("new rule")
    tab.follow("#rule-form button[type=submit]")
    rule = AutoApproveRule.objects.get()
    assert tab.page.url.endswith(f"/policies/rules/{rule.pk}/")

    approved = ask("cheap", 420)
    assert approved.status == ApprovalStatus.APPROVED
    tab.goto(f"/threads/{approved.thread_id}/")
    assert "approved by rule “Cheap flights”" in tab.page.locator("#timeline").inner_text()
    tab.shot("timeline")

    tab.goto(f"/policies/rules/{rule.pk}/")
    assert "Approved 1 request" in tab.page.locator("main").inner_text()
    tab.follow("#revoke")
    assert "What will happen" in tab.page.locator("#action").inner_text()
    tab.shot("revoke")
    assert AutoApproveRule.objects.get().revoked_at is None  # asked, not done
    tab.page.fill("#id_reason", "fares went up")
    tab.follow("#confirm-revoke")
    assert "Revoked by ada" in tab.page.locator("#revoked").inner_text()

    assert ask("cheap-again", 420).status == ApprovalStatus.PENDING


def test_two_reviewers_make_a_quorum_and_the_first_sees_the_second_approve(tab: Pages, db: Any) -> None:
    rita, ravi = make_person("rita", "reviewer"), make_person("ravi", "reviewer")
    finance, _ = Group.objects.get_or_create(name="finance")
    finance.user_set.add(rita, ravi)
    ada = make_person("ada", "admin")
    policies.create_policy(agent=get_or_create_agent(name="travel"), action="book_flight", actor=ada,
                           terms=policies.Terms(groups=(finance,), approvals_needed=2))  # fmt: skip
    approval = ask("two-keys", 900)

    tab.login("rita")
    tab.goto(f"/inbox/{approval.pk}/")
    assert "members of finance may decide; 2 approvals are needed" in tab.page.locator("#policy").inner_text()
    tab.follow("#approve-form button[type=submit]")
    assert "Approved so far by rita (1 of 2)" in tab.page.locator("#quorum").inner_text()
    assert tab.page.locator("#voted").is_visible()
    tab.shot("one of two")
    tab.goto("/inbox/")
    assert "1 of 2 approvals: rita" in tab.page.locator(f"tr[data-approval='{approval.pk}']").inner_text()

    tab.goto(f"/inbox/{approval.pk}/")
    decide(approval=approval, user=ravi, decision="approve")

    wait_until(lambda: "ravi" in tab.page.locator("#decision").inner_text(), what="ravi's approval on rita's page")
    assert "Approved" in tab.page.locator("#decision").inner_text()
    tab.shot("two of two")
