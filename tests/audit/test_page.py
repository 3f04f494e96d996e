"""The audit page: admins only, newest first, filters, keyset pages, read-only, a pinned query count."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from approvals.services import request_approval
from audit.models import AuditEntry
from checkpoints import storage
from checkpoints.models import Thread
from tests.conftest import person, signed_in

pytestmark = pytest.mark.django_db

URL = "/audit/"
T0 = datetime(2025, 3, 1, 12, 0, tzinfo=timezone.get_current_timezone())


@pytest.fixture
def admin() -> User:
    # A superuser counts as admin; granting the role would itself leave an audit entry on the page.
    return User.objects.create_superuser("ada", password="ada-password-1")


def entry(
    *, minutes: int, action: str = "thread.cancel", actor: str = "ada", thread: Thread | None = None, **fields: Any
) -> AuditEntry:
    """An entry `minutes` after T0 (the app writes them through trail.record, always at `now`)."""
    defaults: dict[str, Any] = {"target_type": "thread", "target_id": str(thread.pk) if thread else "x"}
    return AuditEntry.objects.create(
        actor=None, actor_name=actor, action=action, thread=thread, created_at=T0 + timedelta(minutes=minutes),
        **{**defaults, **fields},
    )  # fmt: skip


def shown(response: Any) -> list[int]:
    return [row.pk for row, _, _ in response.context["entries"]]


@pytest.mark.parametrize("role", ["viewer", "reviewer", None])
def test_people_who_are_not_admins_get_403(role: str | None) -> None:
    response = signed_in(person("pat", role)).get(URL)
    assert response.status_code == 403


def test_anonymous_is_sent_to_the_login_page(client: Any) -> None:
    response = client.get(URL)
    assert response.status_code == 302
    assert response["Location"].startswith("/login/?next=/audit/")


def test_admin_sees_every_column_newest_first_with_links_to_our_pages(admin: User, thread: Thread) -> None:
    checkpoint = storage.append_checkpoint(thread=thread, parent=None, state={"a": 1})
    approval = request_approval(thread=thread, checkpoint=checkpoint, action="deploy", args={})
    oldest = entry(minutes=1, thread=thread, reason="stuck in a loop", address="10.0.0.7",
                   before={"status": "running"}, after={"status": "cancelled"})  # fmt: skip
    forked = entry(minutes=2, action="checkpoint.fork", thread=thread, target_type="checkpoint",
                   target_id=str(checkpoint.pk))  # fmt: skip
    decided = entry(minutes=3, action="approval.reject", target_type="approval", target_id=str(approval.pk))

    response = signed_in(admin).get(URL)

    assert response.status_code == 200
    assert shown(response) == [decided.pk, forked.pk, oldest.pk]
    html = response.content.decode()
    assert f'href="/threads/{thread.pk}/"' in html
    assert f'href="/checkpoints/{checkpoint.pk}/"' in html
    assert f'href="/inbox/{approval.pk}/"' in html
    assert "stuck in a loop" in html and "10.0.0.7" in html
    assert "{&quot;status&quot;:&quot;running&quot;} → {&quot;status&quot;:&quot;cancelled&quot;}" in html


def test_a_long_before_after_summary_is_truncated(admin: User) -> None:
    entry(minutes=1, before={"notes": "x" * 5000}, after={})
    (_, _, summary), *_ = signed_in(admin).get(URL).context["entries"]
    assert len(summary) == 160 and summary.endswith("…")


def test_a_target_that_is_not_ours_is_shown_without_a_link(admin: User) -> None:
    entry(minutes=1, target_type="key", target_id="qs_abc")
    (_, url, _), *_ = signed_in(admin).get(URL).context["entries"]
    assert url is None


def test_filters_narrow_by_actor_action_thread_and_time(admin: User, thread: Thread) -> None:
    other, _ = storage.create_thread(agent=thread.agent, external_id="trip-2")
    a = entry(minutes=1, actor="ada", action="thread.cancel", thread=thread)
    b = entry(minutes=2, actor="rita", action="approval.approve", thread=thread)
    c = entry(minutes=3, actor="rita", action="thread.cancel", thread=other)
    client = signed_in(admin)

    def ids(**query: str) -> list[int]:
        response = client.get(URL, query)
        assert response.status_code == 200
        return shown(response)

    assert ids(actor="rita") == [c.pk, b.pk]
    assert ids(action="thread.cancel") == [c.pk, a.pk]
    assert ids(thread=str(thread.pk)) == [b.pk, a.pk]
    assert ids(since=(T0 + timedelta(minutes=2)).isoformat()) == [c.pk, b.pk]
    assert ids(until=(T0 + timedelta(minutes=2)).isoformat()) == [a.pk]
    assert ids(actor="rita", action="thread.cancel", thread=str(other.pk)) == [c.pk]


def test_the_action_filter_offers_the_actions_that_occur(admin: User) -> None:
    entry(minutes=1, action="thread.resume")
    entry(minutes=2, action="approval.approve")
    entry(minutes=3, action="thread.resume")
    assert signed_in(admin).get(URL).context["actions"] == ["approval.approve", "thread.resume"]


@pytest.mark.parametrize(
    "query",
    [
        {"thread": "not-a-uuid"},
        {"action": "thread.explode"},
        {"since": "yesterday-ish"},
        {"until": "2025-13-45"},
        {"older": "garbage!"},
        {"actor": "x" * 151},
    ],
)
def test_malformed_filters_get_the_400_page(admin: User, query: dict[str, str]) -> None:
    entry(minutes=1)
    response = signed_in(admin).get(URL, query)
    assert response.status_code == 400
    assert "Those filters do not work" in response.content.decode()


def test_pages_of_100_go_older_by_time_then_id_without_gaps_or_repeats(admin: User) -> None:
    # Two entries share each timestamp, so the page boundary must break ties by id.
    created = [entry(minutes=i // 2) for i in range(230)]
    expected = [e.pk for e in sorted(created, key=lambda e: (e.created_at, e.pk), reverse=True)]
    client = signed_in(admin)

    seen: list[int] = []
    response = client.get(URL)
    pages = 1
    while True:
        assert len(shown(response)) <= 100
        seen += shown(response)
        if response.context["older_query"] is None:
            break
        response = client.get(f"{URL}?{response.context['older_query']}")
        pages += 1
    assert pages == 3
    assert seen == expected


def test_older_pages_keep_the_filters(admin: User) -> None:
    for i in range(105):
        entry(minutes=i, actor="rita")
    entry(minutes=200, actor="ada")
    client = signed_in(admin)
    first = client.get(URL, {"actor": "rita"})
    second = client.get(f"{URL}?{first.context['older_query']}")
    assert len(shown(first)) == 100
    assert len(shown(second)) == 5
    assert second.context["older_query"] is None


def test_the_page_is_read_only(admin: User) -> None:
    entry(minutes=1)
    client = signed_in(admin)
    html = client.get(URL).content.decode()
    forms = html.count("<form")
    assert forms == 2  # the filters and the sign-out button
    assert 'method="post" action="/logout/"' in html
    assert client.post(URL, {"delete": "1"}).status_code == 405


def test_the_query_count_does_not_grow_with_the_page(
    admin: User, thread: Thread, django_assert_max_num_queries: Any
) -> None:
    for i in range(150):
        entry(minutes=i, thread=thread, action=f"action.{i % 5}")
    client = signed_in(admin)
    client.get(URL)  # warm the session
    with django_assert_max_num_queries(9):
        response = client.get(URL, {"thread": str(thread.pk)})
    assert len(shown(response)) == 100


def test_a_malformed_filter_is_named_as_the_page_labels_it_and_the_400_page_leads_back(admin: User) -> None:
    response = signed_in(admin).get(URL, {"until": "2025-13-45", "actor": "ada"})

    assert response.status_code == 400
    body = response.content.decode()
    assert "Those filters do not work: Before: Enter a valid date/time." in body
    assert f'<a class="button primary" href="{URL}">Start again without filters</a>' in body
