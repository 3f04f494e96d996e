"""What happened after a decision: the thread list shows what each thread waits on or how its
latest approval ended (not "Completed" for a rejected trip and a booked one alike), and a decided
approval links to the checkpoint its agent wrote next, on the inbox and on its own page."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from approvals import services
from approvals.models import ApprovalRequest
from approvals.services import file_in_doubt, resolve_in_doubt
from checkpoints import forks, storage
from checkpoints.models import Checkpoint, Thread
from quicksave_agents import tool_calls
from quicksave_agents.keys import get_or_create_agent
from tests.approvals.factories import waiting
from tests.conftest import person, signed_in

pytestmark = pytest.mark.django_db


@pytest.fixture
def rita(db: Any) -> User:
    return person("rita", "reviewer")


@pytest.fixture
def rita_page(rita: User) -> Client:
    return signed_in(rita)


def finish(approval: ApprovalRequest, label: str) -> Checkpoint:
    """The agent's next checkpoint after the decision: it completes the thread."""
    return storage.append_checkpoint(thread=approval.thread, parent=approval.checkpoint_id, state={"done": label},
                                     label=label, status="completed")  # fmt: skip


def row_of(body: str, thread: Thread) -> str:
    found = re.search(rf'<tr>\s*<td><a href="/threads/{thread.pk}/".*?</tr>', body, re.S)
    assert found, f"no row for {thread.pk}"
    return found.group(0)


def outcome_cell(body: str, thread: Thread) -> str:
    found = re.search(r'<td class="outcome">(.*?)</td>', row_of(body, thread), re.S)
    assert found
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", found.group(1))).strip()


# ---------------------------------------------------------------- the thread list


def test_a_rejected_trip_and_a_booked_one_read_differently_on_the_list(rita: User, rita_page: Client) -> None:
    booked = waiting(action="book_flight")
    refused = waiting(action="book_flight")
    services.decide(approval=booked, user=rita, decision="approve")
    services.decide(approval=refused, user=rita, decision="reject", comment="too dear")
    finish(booked, "booked")
    finish(refused, "not booked")

    body = rita_page.get("/").content.decode()

    assert "Completed" in row_of(body, booked.thread) and "Completed" in row_of(body, refused.thread)
    assert outcome_cell(body, booked.thread) == "Approved book_flight · rita"
    assert outcome_cell(body, refused.thread) == "Rejected book_flight · rita"
    assert "too dear" in row_of(body, refused.thread)  # the reason, in the badge's title
    assert f'href="/inbox/{refused.pk}/"' in row_of(body, refused.thread)


def test_the_list_shows_what_a_thread_waits_on(rita_page: Client) -> None:
    pending = waiting(action="pay_invoice")
    body = rita_page.get("/").content.decode()
    cell = outcome_cell(body, pending.thread)
    assert cell.startswith("Awaiting approval pay_invoice, waiting")
    assert f'href="/inbox/{pending.pk}/"' in row_of(body, pending.thread)


def test_expired_edited_and_in_doubt_outcomes_are_named(rita: User, rita_page: Client) -> None:
    expired = waiting(action="book_hotel")
    ApprovalRequest.objects.filter(pk=expired.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    services.expire_due()
    edited = waiting(action="book_car")
    services.decide(approval=edited, user=rita, decision="approve", args={"flight": "SK124", "price": 380})
    thread, _ = storage.create_thread(agent=get_or_create_agent(name="travel"))
    head = storage.append_checkpoint(thread=thread, parent=None, state={"n": 1})
    call = tool_calls.begin(thread_id=thread.pk, key="charge-1", tool="charge_card", args={"cents": 500}).call
    doubt = file_in_doubt(call=call, checkpoint=head)
    assert doubt is not None
    resolved_thread, _ = storage.create_thread(agent=get_or_create_agent(name="travel"))
    resolved_head = storage.append_checkpoint(thread=resolved_thread, parent=None, state={"n": 1})
    resolved_call = tool_calls.begin(thread_id=resolved_thread.pk, key="c", tool="refund", args={}).call
    resolved = file_in_doubt(call=resolved_call, checkpoint=resolved_head)
    assert resolved is not None
    resolve_in_doubt(approval=resolved, user=rita, resolution="not_happened")

    body = rita_page.get("/").content.decode()

    assert outcome_cell(body, expired.thread).startswith("Expired book_hotel")
    assert outcome_cell(body, edited.thread) == "Approved with edits book_car · rita"
    assert outcome_cell(body, thread).startswith("In doubt charge_card, waiting")
    assert outcome_cell(body, resolved_thread) == "In doubt: it did not happen refund · rita"


def test_the_newest_approval_of_a_thread_is_the_one_shown(rita: User, rita_page: Client) -> None:
    first = waiting(action="search")
    services.decide(approval=first, user=rita, decision="approve")
    second_head = finish(first, "searched")
    services.request_approval(thread=first.thread, checkpoint=second_head, action="book_flight", args={})
    cell = outcome_cell(rita_page.get("/").content.decode(), first.thread)
    assert cell.startswith("Awaiting approval book_flight")


def test_a_thread_without_approvals_shows_none(rita_page: Client) -> None:
    thread, _ = storage.create_thread(agent=get_or_create_agent(name="travel"))
    storage.append_checkpoint(thread=thread, parent=None, state={"n": 1})
    assert outcome_cell(rita_page.get("/").content.decode(), thread) == "—"


def test_the_lists_queries_do_not_grow_with_approvals_on_every_row(
    rita: User, rita_page: Client, django_assert_max_num_queries: Any
) -> None:
    for n in range(60):
        approval = waiting(action=f"act-{n}")
        if n % 3:
            services.decide(approval=approval, user=rita, decision="approve" if n % 3 == 1 else "reject",
                            comment="no")  # fmt: skip
    # As many as the list reads without approvals (tests/checkpoints/test_thread_list_page.py).
    with django_assert_max_num_queries(9):
        response = rita_page.get("/")
    body = response.content.decode()
    assert body.count('<td class="outcome">') == 50
    assert body.count(">Awaiting approval<") + body.count(">Approved<") + body.count(">Rejected<") == 50


# ---------------------------------------------------------------- the agent's next checkpoint


def test_a_decided_approval_links_to_the_agents_next_checkpoint(rita: User, rita_page: Client) -> None:
    approval = waiting(action="book_flight")
    services.decide(approval=approval, user=rita, decision="approve")
    assert "nothing yet" in rita_page.get(f"/inbox/{approval.pk}/").content.decode()
    following = finish(approval, "booked")

    page = rita_page.get(f"/inbox/{approval.pk}/").content.decode()
    inbox = rita_page.get("/inbox/?status=approved").content.decode()

    link = f'href="/checkpoints/{following.pk}/"'
    assert link in re.search(r'<p id="next-step">.*?</p>', page, re.S).group(0)  # type: ignore[union-attr]
    row = re.search(rf'<tr data-approval="{approval.pk}">.*?</tr>', inbox, re.S).group(0)  # type: ignore[union-attr]
    assert link in row and f"#{following.seq} booked" in row


def test_a_checkpoint_written_before_the_decision_is_not_what_came_after(rita: User, rita_page: Client) -> None:
    approval = waiting(action="book_flight")
    early = storage.append_checkpoint(thread=approval.thread, parent=approval.checkpoint_id, state={"n": 2},
                                      label="meanwhile")  # fmt: skip
    services.decide(approval=approval, user=rita, decision="reject", comment="no")
    later = storage.append_checkpoint(thread=approval.thread, parent=early.pk, state={"n": 3}, label="told no")

    inbox = rita_page.get("/inbox/?status=rejected").content.decode()
    page = rita_page.get(f"/inbox/{approval.pk}/").content.decode()
    row = re.search(rf'<tr data-approval="{approval.pk}">.*?</tr>', inbox, re.S).group(0)  # type: ignore[union-attr]
    said = re.search(r'<p id="next-step">.*?</p>', page, re.S).group(0)  # type: ignore[union-attr]

    assert f'href="/checkpoints/{later.pk}/"' in row and f'href="/checkpoints/{later.pk}/"' in said
    assert f'href="/checkpoints/{early.pk}/"' not in row + said


def test_a_fork_from_the_approval_checkpoint_is_not_the_agents_next_step(rita: User, rita_page: Client) -> None:
    approval = waiting(action="book_flight")
    services.decide(approval=approval, user=rita, decision="approve")
    forks.fork(checkpoint=approval.checkpoint, user=person("ada", "admin"), reason="try another")

    inbox = rita_page.get("/inbox/?status=approved").content.decode()
    page = rita_page.get(f"/inbox/{approval.pk}/").content.decode()
    row = re.search(rf'<tr data-approval="{approval.pk}">.*?</tr>', inbox, re.S).group(0)  # type: ignore[union-attr]

    assert "nothing yet" in row
    assert "nothing yet" in re.search(r'<p id="next-step">.*?</p>', page, re.S).group(0)  # type: ignore[union-attr]


def test_pending_rows_have_no_next_step_column(rita_page: Client) -> None:
    waiting(action="book_flight")
    assert "Agent's next step" not in rita_page.get("/inbox/").content.decode()


def test_the_decided_inbox_reads_no_query_per_row(
    rita: User, rita_page: Client, django_assert_max_num_queries: Any
) -> None:
    for n in range(30):
        approval = waiting(action=f"act-{n}")
        services.decide(approval=approval, user=rita, decision="approve")
        finish(approval, f"done {n}")
    # 30 rows, each with its next checkpoint and its voters, in one query (with the session, the
    # person, their permissions and roles, the agents' counts and the runs no worker claimed: 8).
    with django_assert_max_num_queries(8):
        response = rita_page.get("/inbox/?status=approved")
    assert response.content.decode().count('href="/checkpoints/') == 30
