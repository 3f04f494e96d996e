"""Triage in the inbox: what is assigned to me, deciding from the row, approve-and-next, bulk
approval of low-risk requests after one confirmation, who is blocked, and what the agent did next."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.contrib.messages import get_messages
from django.utils import timezone
from rest_framework.test import APIClient

from approvals.models import ApprovalRequest, ApprovalStatus, AtDeadline
from approvals.selectors import assigned_to
from approvals.services import decide, expire_due
from checkpoints import storage
from tests.approvals.factories import group_of, policy, waiting
from tests.conftest import person, signed_in

pytestmark = pytest.mark.django_db


def pending() -> Any:
    return ApprovalRequest.objects.filter(status=ApprovalStatus.PENDING)


def said(response: Any) -> list[str]:
    return [str(message) for message in get_messages(response.wsgi_request)]


@pytest.fixture
def rita() -> User:
    return person("rita", "reviewer")


def test_assigned_to_me_is_what_my_policies_let_me_decide_and_i_have_not_voted_on(rita: User) -> None:
    ravi, otto = person("ravi", "reviewer"), person("otto", "reviewer")
    policy(groups=(group_of("finance", rita, ravi),), approvals_needed=2)
    theirs = waiting()
    anyones = waiting(action="book_hotel")  # no policy: every reviewer's

    assert set(assigned_to(pending(), rita)) == {theirs, anyones}
    assert set(assigned_to(pending(), otto)) == {anyones}
    decide(approval=theirs, user=rita, decision="approve")
    assert set(assigned_to(pending(), rita)) == {anyones}  # voted: off my list, still on ravi's
    assert set(assigned_to(pending(), ravi)) == {theirs, anyones}
    assert not assigned_to(pending(), person("vera", "viewer")).exists()


def test_an_escalated_request_is_assigned_to_the_escalation_group(rita: User) -> None:
    max_ = person("max", "reviewer")
    policy(users=(rita,), deadline_minutes=5, at_deadline=AtDeadline.ESCALATE,
           escalate_to=group_of("managers", max_))  # fmt: skip
    approval = waiting()
    assert not assigned_to(pending(), max_).exists()
    assert approval.expires_at is not None

    expire_due(now=approval.expires_at)

    assert list(assigned_to(pending(), max_)) == [approval]


def test_roles_assign_by_rank(rita: User) -> None:
    ada = person("ada", "admin")
    policy(role="admin", actor=ada)
    approval = waiting()

    assert not assigned_to(pending(), rita).exists()
    assert list(assigned_to(pending(), ada)) == [approval]


def test_a_reviewers_policy_is_assigned_to_reviewers_admins_and_superusers(rita: User) -> None:
    ada, vera = person("ada", "admin"), person("vera", "viewer")
    root = User.objects.create_superuser("root", password="root-password-1")
    policy(role="reviewer", actor=ada)
    approval = waiting()

    for decider in (rita, ada, root):
        assert list(assigned_to(pending(), decider)) == [approval]
    assert not assigned_to(pending(), vera).exists()


def test_the_inbox_and_the_api_filter_to_what_is_assigned_to_me(rita: User) -> None:
    policy(groups=(group_of("finance"),))
    waiting()
    mine = waiting(action="book_hotel")
    client = APIClient()
    client.force_authenticate(rita)

    listed = client.get("/api/v1/approvals/?assigned=me").json()["results"]
    page = signed_in(rita).get("/inbox/?view=mine").content.decode()

    assert [item["id"] for item in listed] == [str(mine.pk)]
    assert page.count("<tr data-approval=") == 1 and str(mine.pk) in page
    assert client.get("/api/v1/approvals/?assigned=you").status_code == 400


def test_approving_from_the_row_goes_back_to_the_same_inbox_page(rita: User) -> None:
    approval = waiting(risk="low")

    back = signed_in(rita).post(f"/inbox/{approval.pk}/", {"decision": "approve", "next": "/inbox/?agent=travel"})

    assert (back.status_code, back["Location"]) == (302, "/inbox/?agent=travel")
    assert said(back) == ["Approved: book_flight of travel."]
    assert ApprovalRequest.objects.get(pk=approval.pk).status == ApprovalStatus.APPROVED


def test_a_refused_decision_from_the_row_goes_back_saying_why_and_changes_nothing(rita: User) -> None:
    approval = waiting()

    back = signed_in(rita).post(f"/inbox/{approval.pk}/", {"decision": "reject", "comment": "", "next": "/inbox/"})

    assert back["Location"] == "/inbox/"
    assert said(back) == ["book_flight: A rejection needs a `comment` saying why."]
    assert ApprovalRequest.objects.get(pk=approval.pk).status == ApprovalStatus.PENDING


@pytest.mark.parametrize("elsewhere", ["https://evil.example/inbox/", "/threads/", "//evil.example/inbox/"])
def test_a_next_that_is_not_an_inbox_page_is_not_followed(rita: User, elsewhere: str) -> None:
    approval = waiting(risk="low")

    decided = signed_in(rita).post(f"/inbox/{approval.pk}/", {"decision": "approve", "next": elsewhere})

    assert decided["Location"] == f"/inbox/{approval.pk}/"


def test_approve_and_next_opens_the_next_request_waiting_for_me(rita: User) -> None:
    first, second = waiting(), waiting()
    page = signed_in(rita)

    onward = page.post(f"/inbox/{first.pk}/", {"decision": "approve", "then": "next"})
    assert onward["Location"] == f"/inbox/{second.pk}/"
    done = page.post(f"/inbox/{second.pk}/", {"decision": "approve", "then": "next"})
    assert done["Location"] == "/inbox/"


def test_bulk_approval_lists_the_low_risk_requests_first_then_approves_each(rita: User) -> None:
    low = [waiting(risk="low") for _ in range(3)]
    high = waiting(risk="high")
    page = signed_in(rita)
    chosen = [str(item.pk) for item in [*low, high]]

    asked = page.get("/inbox/bulk/", {"approval": chosen, "next": "/inbox/?agent=travel"})

    body = asked.content.decode()
    assert asked.status_code == 200
    assert body.count("<tr data-approval=") == 3 and "Left out: book_flight (high risk)" in body
    assert pending().count() == 4  # asked, not done

    done = page.post("/inbox/bulk/", {"approval": chosen, "next": "/inbox/?agent=travel"})

    assert done["Location"] == "/inbox/?agent=travel"
    assert said(done) == ["Approved 3 low-risk requests."]
    assert list(pending()) == [high]
    assert set(ApprovalRequest.objects.filter(decided_by=rita).values_list("pk", flat=True)) == {i.pk for i in low}


def test_bulk_approval_reports_what_a_policy_refused(rita: User) -> None:
    policy(groups=(group_of("finance"),))
    refused = waiting(risk="low")
    allowed = waiting(action="book_hotel", risk="low")

    done = signed_in(rita).post("/inbox/bulk/", {"approval": [str(refused.pk), str(allowed.pk)]})

    assert said(done) == ["Approved 1 low-risk request.",
                          "book_flight of travel: Only members of finance may decide this request."]  # fmt: skip
    assert list(pending()) == [refused]


def test_bulk_approval_needs_the_reviewer_role() -> None:
    approval = waiting(risk="low")
    assert signed_in(person("vera", "viewer")).post("/inbox/bulk/", {"approval": [str(approval.pk)]}).status_code == 403
    assert pending().count() == 1


def test_the_inbox_counts_the_agents_blocked_on_a_person_and_for_how_long(rita: User) -> None:
    old = waiting()
    ApprovalRequest.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(hours=3))
    waiting()
    waiting(agent="code-review", action="merge")

    strip = signed_in(rita).get("/inbox/").content.decode()

    assert "2 agents blocked on a person:" in strip
    travel = strip.index('<span class="mono">travel</span> 2 threads, waiting <time')
    assert ">3\xa0hours</time>" in strip[travel:]
    assert travel < strip.index('<span class="mono">code-review</span> 1 thread,')  # longest wait first


def test_the_inbox_nav_counts_everything_pending_whatever_the_list_shows(rita: User) -> None:
    policy(groups=(group_of("finance"),))
    waiting()
    waiting(agent="code-review", action="merge")
    decide(approval=waiting(agent="code-review", action="deploy"), user=rita, decision="approve")
    page = signed_in(rita)

    for shown in ("/inbox/", "/inbox/?view=mine", "/inbox/?agent=code-review", "/inbox/?status=approved"):
        assert '<span class="nav-count" aria-label="2 pending">2</span>' in page.get(shown).content.decode()


def test_newest_first_reverses_the_waiting_longest_order(rita: User) -> None:
    first, second = waiting(), waiting()
    page = signed_in(rita)

    oldest = page.get("/inbox/").content.decode()
    newest = page.get("/inbox/?sort=newest").content.decode()

    assert oldest.index(str(first.pk)) < oldest.index(str(second.pk))
    assert newest.index(str(second.pk)) < newest.index(str(first.pk))


def test_a_decided_approval_links_to_what_the_agent_did_next(rita: User) -> None:
    approval = waiting()
    decide(approval=approval, user=rita, decision="approve")
    page = signed_in(rita)

    assert "nothing yet: its resume run is queued" in page.get(f"/inbox/{approval.pk}/").content.decode()
    thread = approval.thread
    booked = storage.append_checkpoint(thread=thread, parent=approval.checkpoint_id, state={"booked": True},
                                       label="booked")  # fmt: skip

    shown = page.get(f"/inbox/{approval.pk}/").content.decode()
    assert f'href="/checkpoints/{booked.pk}/">checkpoint #2 booked</a>' in shown
