"""The inbox page pages through approvals by (time, id): every one once, in order, however many."""

from __future__ import annotations

import base64
import html
import re
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from approvals.models import ApprovalRequest, ApprovalStatus
from approvals.services import request_approval
from checkpoints import storage
from quicksave_agents.models import Agent
from tests.conftest import person, signed_in

pytestmark = pytest.mark.django_db


@pytest.fixture
def reviewer_page(db: Any) -> Client:
    return signed_in(person("rita", "reviewer"))


def file_approvals(agent: Agent, count: int, *, first: int = 0) -> list[ApprovalRequest]:
    """One pending approval on each of `count` new threads (trip-`first` on); two at a time share
    a timestamp."""
    filed = []
    start = timezone.now() - timedelta(hours=1)
    for index in range(first, first + count):
        thread = storage.create_thread(agent=agent, external_id=f"trip-{index}")[0]
        head = storage.append_checkpoint(thread=thread, parent=None, state={})
        approval = request_approval(thread=thread, checkpoint=head, action="book_flight", args={"n": index})
        ApprovalRequest.objects.filter(pk=approval.pk).update(created_at=start + timedelta(minutes=index // 2))
        filed.append(approval)
    return filed


def walk(client: Client, query: str) -> list[str]:
    """The approval ids of every page from `query` on, following the Next links."""
    seen: list[str] = []
    url: str | None = f"/inbox/?{query}"
    while url is not None:
        page = client.get(url)
        assert page.status_code == 200
        body = page.content.decode()
        seen += re.findall(r'<tr data-approval="([0-9a-f-]+)">', body)
        following = re.search(r'<a class="button" rel="next" href="\?([^"]+)">', body)
        url = f"/inbox/?{following.group(1).replace('&amp;', '&')}" if following else None
    return seen


def test_pending_approvals_page_oldest_first_without_gaps_or_repeats(
    reviewer_page: Client, agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("approvals.views.INBOX_SIZE", 3)
    filed = file_approvals(agent, 8)
    expected = [str(a.pk) for a in sorted(ApprovalRequest.objects.all(), key=lambda a: (a.created_at, a.pk))]

    assert walk(reviewer_page, "") == expected
    assert len(expected) == len(filed) == 8


def test_decided_approvals_page_newest_first_without_gaps_or_repeats(
    reviewer_page: Client, agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("approvals.views.INBOX_SIZE", 3)
    filed = file_approvals(agent, 7)
    decided_at = timezone.now() - timedelta(minutes=30)
    for index, approval in enumerate(filed):
        ApprovalRequest.objects.filter(pk=approval.pk).update(
            status=ApprovalStatus.REJECTED, comment="no", decided_at=decided_at + timedelta(minutes=index // 2)
        )
    expected = [str(a.pk) for a in sorted(ApprovalRequest.objects.all(), key=lambda a: (a.decided_at, a.pk))][::-1]

    first = reviewer_page.get("/inbox/?status=rejected").content.decode()
    assert re.findall(r'<tr data-approval="([0-9a-f-]+)">', first) == expected[:3]
    assert "First page" not in first and "Next 3" in first
    assert walk(reviewer_page, "status=rejected") == expected


@pytest.mark.parametrize(
    "position",
    [
        None,  # not base64 of JSON at all
        '["2025-01-01T00:00:00", "00000000-0000-0000-0000-000000000000"]',  # no offset
        '["0001-01-01T00:00:00+01:00", "00000000-0000-0000-0000-000000000000"]',  # year 0 in UTC
        "[1, 2]",
    ],
)
def test_a_broken_page_link_is_a_400_naming_it(reviewer_page: Client, position: str | None) -> None:
    after = "garbage" if position is None else base64.urlsafe_b64encode(position.encode()).decode()
    response = reviewer_page.get("/inbox/", {"after": after})
    assert response.status_code == 400
    assert "Page link: This page link is broken" in response.content.decode()


@pytest.mark.parametrize("offset", ["+23:59", "-16:00", "+05:30:00.5"])
@pytest.mark.parametrize("status", ["pending", "rejected"])
def test_a_page_link_with_an_offset_postgresql_refuses_is_read_in_utc(
    reviewer_page: Client, agent: Agent, offset: str, status: str
) -> None:
    """Python reads offsets up to a day and with seconds; PostgreSQL refused them (a 500)."""
    file_approvals(agent, 1)
    position = f'["2025-01-01T00:00:00{offset}", "00000000-0000-0000-0000-000000000000"]'
    after = base64.urlsafe_b64encode(position.encode()).decode()
    assert reviewer_page.get("/inbox/", {"after": after, "status": status}).status_code == 200


def test_the_inbox_page_makes_as_many_queries_for_forty_rows_as_for_two(reviewer_page: Client, agent: Agent) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert reviewer_page.get("/inbox/?view=mine").status_code == 200
        return len(captured.captured_queries)

    file_approvals(agent, 2)
    reviewer_page.get("/inbox/?view=mine")  # the session and permissions, read once
    few = queries()
    file_approvals(agent, 38, first=2)

    assert queries() == few
    # The session, the person, their permissions (2) and roles; the rows, with the page's ids and
    # who voted found in the same query; every agent's pending count (the blocked list, the
    # filter's names and the nav's count); the runs no worker claimed.
    assert few <= 8


def test_a_long_argument_list_is_cut_to_the_row_with_an_ellipsis(reviewer_page: Client, agent: Agent) -> None:
    thread = storage.create_thread(agent=agent, external_id="long-args")[0]
    head = storage.append_checkpoint(thread=thread, parent=None, state={})
    request_approval(thread=thread, checkpoint=head, action="send_email", args={"body": "x" * 500})

    body = reviewer_page.get("/inbox/").content.decode()

    shown = re.search(r'<code class="small">([^<]*)</code>', body)
    assert shown is not None
    text = html.unescape(shown.group(1))
    assert len(text) == 80 and text.endswith("…")
    assert text.startswith('{"body": "xxx')
