"""Links in messages: the approval's link works once the person signs in, and a decision link
decides once, as the signed-in person, through approvals.services.decide, audited like any other."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.contrib.auth.models import User
from django.db import connections
from django.test import Client
from django.utils import timezone

from approvals.models import ApprovalRequest, ApprovalStatus
from audit.models import AuditEntry
from checkpoints.models import Thread
from notifications import dispatch, links
from notifications.endpoints import SubscriptionSpec, create_endpoint
from notifications.models import DecisionLink, Delivery
from quicksave.errors import DomainError
from tests.conftest import person
from tests.notifications.conftest import suspend

pytestmark = pytest.mark.django_db


def sign_in(client: Client, user: User, next_path: str) -> Any:
    """Sign in through the sign-in page as a person following a link would, with its `next`."""
    return client.post(f"/login/?next={next_path}", {"username": user.get_username(),
                                                     "password": f"{user.get_username()}-password-1",
                                                     "next": next_path})  # fmt: skip


@pytest.fixture
def decide_links(admin: User, thread: Thread) -> tuple[ApprovalRequest, dict[str, str]]:
    """A pending approval and the decision links of the message that announced it (their paths)."""
    create_endpoint(name="ops", kind="webhook", url="http://127.0.0.1:9/unused", decision_links=True,
                    subscriptions=[SubscriptionSpec(events=["approval.requested"])], actor=admin)  # fmt: skip
    approval = suspend(thread)
    dispatch.fan_out()
    decide = Delivery.objects.get().body["approval"]["decide"]
    return approval, {decision: urlsplit(decide[decision]).path for decision in ("approve", "reject")}


def test_the_approvals_link_keeps_working_through_the_sign_in_redirect(reviewer: User, thread: Thread) -> None:
    approval = suspend(thread)
    path = f"/inbox/{approval.pk}/"
    browser = Client()

    to_sign_in = browser.get(path)
    assert to_sign_in.status_code == 302
    assert to_sign_in["Location"] == f"/login/?next={path}"
    signed_in = sign_in(browser, reviewer, path)
    assert (signed_in.status_code, signed_in["Location"]) == (302, path)
    assert browser.get(path).status_code == 200


def test_a_decision_link_approves_as_the_person_who_signs_in_and_is_audited(
    reviewer: User, decide_links: tuple[ApprovalRequest, dict[str, str]]
) -> None:
    approval, paths = decide_links
    browser = Client()

    assert browser.get(paths["approve"])["Location"] == f"/login/?next={paths['approve']}"
    assert sign_in(browser, reviewer, paths["approve"])["Location"] == paths["approve"]
    page = browser.get(paths["approve"])
    assert page.status_code == 200
    assert b"Approve book_flight?" in page.content
    assert ApprovalRequest.objects.get(pk=approval.pk).status == ApprovalStatus.PENDING, "opening it decides nothing"

    decided = browser.post(paths["approve"], {"comment": "fine by me"})

    assert (decided.status_code, decided["Location"]) == (302, f"/inbox/{approval.pk}/")
    approval.refresh_from_db()
    assert (approval.status, approval.decided_by, approval.comment) == (ApprovalStatus.APPROVED, reviewer, "fine by me")
    entry = AuditEntry.objects.get(action="approval.approve")
    assert (entry.actor, entry.target_id) == (reviewer, str(approval.pk))
    used = AuditEntry.objects.get(action="decision_link.use")
    assert (used.actor, used.after["decision"], used.after["endpoint"]) == (reviewer, "approve", "ops")
    link = DecisionLink.objects.get(decision="approve")
    assert (link.used_by, link.used_at is not None) == (reviewer, True)


def test_a_used_link_is_refused(reviewer: User, decide_links: tuple[ApprovalRequest, dict[str, str]]) -> None:
    _, paths = decide_links
    browser = Client()
    browser.force_login(reviewer)
    browser.post(paths["approve"])

    again = browser.post(paths["approve"])

    assert again.status_code == 410
    assert b"This link was used by rita" in again.content
    assert AuditEntry.objects.filter(action="approval.approve").count() == 1


def test_an_expired_link_is_refused_and_the_approval_stays_pending(
    reviewer: User, decide_links: tuple[ApprovalRequest, dict[str, str]]
) -> None:
    approval, paths = decide_links
    DecisionLink.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    browser = Client()
    browser.force_login(reviewer)

    assert b"This link expired" in browser.get(paths["approve"]).content
    refused = browser.post(paths["approve"])

    assert refused.status_code == 410
    assert ApprovalRequest.objects.get(pk=approval.pk).status == ApprovalStatus.PENDING


def test_a_reject_link_needs_a_comment_and_stays_usable_without_one(
    reviewer: User, decide_links: tuple[ApprovalRequest, dict[str, str]]
) -> None:
    approval, paths = decide_links
    browser = Client()
    browser.force_login(reviewer)

    refused = browser.post(paths["reject"], {"comment": ""})
    assert refused.status_code == 422
    assert b"A rejection needs a" in refused.content
    assert DecisionLink.objects.get(decision="reject").used_at is None

    browser.post(paths["reject"], {"comment": "wrong dates"})
    approval.refresh_from_db()
    assert (approval.status, approval.comment) == (ApprovalStatus.REJECTED, "wrong dates")


def test_a_person_without_the_reviewer_role_cannot_use_a_link(
    viewer: User, decide_links: tuple[ApprovalRequest, dict[str, str]]
) -> None:
    approval, paths = decide_links
    browser = Client()
    browser.force_login(viewer)

    assert browser.get(paths["approve"]).status_code == 403
    assert browser.post(paths["approve"]).status_code == 403
    assert ApprovalRequest.objects.get(pk=approval.pk).status == ApprovalStatus.PENDING
    assert DecisionLink.objects.get(decision="approve").used_at is None


def test_a_link_to_an_overdue_approval_leaves_it_expired_and_the_link_unused(
    reviewer: User, decide_links: tuple[ApprovalRequest, dict[str, str]]
) -> None:
    approval, paths = decide_links
    # The deadline passed after the message went out, before anyone expired the request.
    ApprovalRequest.objects.filter(pk=approval.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    browser = Client()
    browser.force_login(reviewer)

    refused = browser.post(paths["approve"])

    assert refused.status_code == 409
    assert ApprovalRequest.objects.get(pk=approval.pk).status == ApprovalStatus.EXPIRED
    assert DecisionLink.objects.get(decision="approve").used_at is None


def test_an_unknown_token_is_a_404(reviewer: User) -> None:
    browser = Client()
    browser.force_login(reviewer)
    assert browser.get("/notifications/decide/not-a-token-we-made-at-all/").status_code == 404


@pytest.mark.django_db(transaction=True)
def test_two_people_using_one_link_at_once_decide_it_once(admin: User, thread: Thread) -> None:
    create_endpoint(name="ops", kind="webhook", url="http://127.0.0.1:9/unused", decision_links=True,
                    subscriptions=[SubscriptionSpec(events=["approval.requested"])], actor=admin)  # fmt: skip
    suspend(thread)
    dispatch.fan_out()
    token = Delivery.objects.get().body["approval"]["decide"]["approve"].rstrip("/").rpartition("/")[2]
    people = [person("rita", "reviewer"), person("rob", "reviewer")]
    start = threading.Barrier(len(people))
    outcomes: dict[str, str] = {}

    def use(user: User) -> None:
        try:
            start.wait()
            links.decide_with(token=token, user=user)
            outcomes[user.get_username()] = "decided"
        except DomainError as exc:
            outcomes[user.get_username()] = exc.code
        finally:
            connections.close_all()

    workers = [threading.Thread(target=use, args=(user,)) for user in people]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(30)

    assert sorted(outcomes.values()) == ["decided", "link_unusable"]
    assert AuditEntry.objects.filter(action="approval.approve").count() == 1


def test_under_a_quorum_a_link_casts_one_vote_and_the_message_says_who_decides(admin: User, thread: Thread) -> None:
    from django.contrib.auth.models import Group

    from approvals import policies
    from approvals.services import decide

    finance = Group.objects.create(name="finance")
    rita, rob = person("rita", "reviewer"), person("rob", "reviewer")
    finance.user_set.add(rita, rob)
    policies.create_policy(agent=thread.agent, action="book_flight", actor=admin,
                           terms=policies.Terms(groups=(finance,), approvals_needed=2))  # fmt: skip
    create_endpoint(name="ops", kind="webhook", url="http://127.0.0.1:9/unused", decision_links=True,
                    subscriptions=[SubscriptionSpec(events=["approval.requested"])], actor=admin)  # fmt: skip
    approval = suspend(thread)
    dispatch.fan_out()
    body = Delivery.objects.get().body["approval"]
    assert (body["who_may_decide"], body["approvals_needed"]) == ("members of finance", 2)
    browser = Client()
    browser.force_login(rita)

    voted = browser.post(urlsplit(body["decide"]["approve"]).path, follow=True)

    assert "Your approval of book_flight for travel is counted; it takes 1 more approval." in voted.content.decode()
    assert ApprovalRequest.objects.get(pk=approval.pk).status == ApprovalStatus.PENDING
    decide(approval=approval, user=rob, decision="approve")
    assert ApprovalRequest.objects.get(pk=approval.pk).status == ApprovalStatus.APPROVED


def test_a_reviewer_the_policy_does_not_name_is_refused_and_the_link_stays_usable(
    admin: User, reviewer: User, thread: Thread
) -> None:
    from django.contrib.auth.models import Group

    from approvals import policies

    policies.create_policy(agent=thread.agent, action="book_flight", actor=admin,
                           terms=policies.Terms(groups=(Group.objects.create(name="finance"),)))  # fmt: skip
    create_endpoint(name="ops", kind="webhook", url="http://127.0.0.1:9/unused", decision_links=True,
                    subscriptions=[SubscriptionSpec(events=["approval.requested"])], actor=admin)  # fmt: skip
    approval = suspend(thread)
    dispatch.fan_out()
    path = urlsplit(Delivery.objects.get().body["approval"]["decide"]["approve"]).path
    browser = Client()
    browser.force_login(reviewer)

    refused = browser.post(path)

    assert refused.status_code == 403
    assert b"members of finance" in refused.content
    assert ApprovalRequest.objects.get(pk=approval.pk).status == ApprovalStatus.PENDING
    assert DecisionLink.objects.get(decision="approve").used_at is None
