"""The checkpoint page: roles, 404s, the state tree and raw JSON, previous/next, tool results,
the integrity badge for an altered row, escaping, and a pinned query count."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client

from checkpoints import storage
from checkpoints.models import Checkpoint, Thread
from checkpoints.storage.tool_results import put_tool_result
from tests.conftest import person, signed_in

# Every round trip with nothing cached: session, user, two permission reads, the checkpoint, the
# thread, the replay's target row and its chain, previous/next, tool results, pending approvals,
# role and inbox count for the header. No spare: one more query (a replay more) fails the test,
# and the count does not grow with the thread.
CHECKPOINT_PAGE_QUERIES = 13

PLAN = "Fly from Berlin to Lisbon on Monday morning, check in near Alfama and take the train to Porto on Wednesday."


@pytest.fixture
def olivia(db: Any) -> User:
    """A viewer."""
    return person("olivia", "viewer")


@pytest.fixture
def page_client(olivia: User) -> Client:
    return signed_in(olivia)


@pytest.fixture
def trip(thread: Thread) -> list[Checkpoint]:
    """Three checkpoints of a travel agent: start, a flight search, a hotel search."""
    first = storage.append_checkpoint(
        thread=thread, parent=None, step=0, label="start",
        state={"messages": [{"role": "user", "content": "Lisbon next week"}], "facts": {"to": "LIS"}, "plan": PLAN},
        model={"name": "gpt-test", "version": "2025-01", "temperature": 0.2, "seed": 7},
        metadata={"trace_id": "t-123"},
    )  # fmt: skip
    second = storage.append_checkpoint(
        thread=thread, parent=first, step=1, label="search_flights",
        patch=[{"op": "add", "path": "/messages/-", "value": {"role": "tool", "content": {"flights": ["TP 541"]}}}],
        tool_results=[{"key": "flights-key", "tool": "search_flights", "result": {"flights": ["TP 541"]}}],
    )  # fmt: skip
    third = storage.append_checkpoint(
        thread=thread, parent=second, step=2, label="search_hotels", status="waiting_for_approval",
        patch=[{"op": "add", "path": "/facts/hotel", "value": "Memmo Alfama"}],
    )  # fmt: skip
    return [first, second, third]


def url(checkpoint: Checkpoint | str) -> str:
    return f"/checkpoints/{checkpoint.pk if isinstance(checkpoint, Checkpoint) else checkpoint}/"


def link(html: str, rel: str) -> str | None:
    found = re.search(rf'<a class="button" rel="{rel}" href="([^"]+)"', html)
    return found.group(1) if found else None


# --------------------------------------------------------------------------- who may see it


@pytest.mark.parametrize(("name", "role"), [("olivia", "viewer"), ("rex", "reviewer"), ("ada", "admin")])
def test_every_role_sees_the_checkpoint_page(name: str, role: str, trip: list[Checkpoint]) -> None:
    response = signed_in(person(name, role)).get(url(trip[1]))

    assert response.status_code == 200
    assert b'id="state-tree"' in response.content


def test_a_person_without_a_role_gets_403(trip: list[Checkpoint]) -> None:
    response = signed_in(person("sam", None)).get(url(trip[1]))

    assert response.status_code == 403
    assert b"Not allowed" in response.content


def test_anonymous_is_sent_to_sign_in(trip: list[Checkpoint]) -> None:
    response = Client().get(url(trip[1]))

    assert response.status_code == 302
    assert response["Location"].startswith("/login/?next=")


def test_an_unknown_checkpoint_is_a_404_page(page_client: Client) -> None:
    response = page_client.get(url("00000000-0000-0000-0000-000000000000"))

    assert response.status_code == 404
    assert response["Content-Type"].startswith("text/html")
    assert b"Not found" in response.content


def test_a_malformed_id_is_a_404_page(page_client: Client) -> None:
    response = page_client.get("/checkpoints/not-a-uuid/")

    assert response.status_code == 404
    assert response["Content-Type"].startswith("text/html")


# --------------------------------------------------------------------------- what it shows


def test_page_has_title_breadcrumbs_and_the_checkpoint_fields(page_client: Client, trip: list[Checkpoint]) -> None:
    html = page_client.get(url(trip[0])).content.decode()

    assert "<title>#1 start · trip-1 · Quicksave</title>" in html
    crumbs = re.search(r'<nav class="breadcrumbs".*?</nav>', html, re.S)
    assert crumbs is not None
    assert 'href="/"' in crumbs.group(0) and "Threads" in crumbs.group(0)
    assert f'href="/threads/{trip[0].thread_id}/"' in crumbs.group(0) and "trip-1" in crumbs.group(0)
    assert "#1 start" in crumbs.group(0)
    assert '<span id="integrity" class="badge verified"' in html
    assert "gpt-test" in html and "temperature" in html and "seed" in html
    assert "trace_id" in html and "t-123" in html
    assert "Schema version</dt><dd>1</dd>" in html
    assert f'href="/checkpoints/{trip[0].pk}/diff/"' in html  # "What changed"


def test_state_is_a_tree_with_copy_paths_and_a_hidden_raw_view(page_client: Client, trip: list[Checkpoint]) -> None:
    html = page_client.get(url(trip[1])).content.decode()

    tree = re.search(r'<div id="state-tree" class="json-tree">.*?</div>', html, re.S)
    assert tree is not None
    assert 'class="copy-path" data-path="/messages/1/content/flights/0"' in tree.group(0)
    assert 'data-path="/facts/to"' in tree.group(0)
    assert '<pre id="raw-json" class="raw" tabindex="0" aria-label="State as raw JSON" hidden>' in html
    assert '"TP 541"' in html
    assert 'id="toggle-raw" aria-pressed="false"' in html
    assert 'src="/static/js/checkpoint.js"' in html and 'type="module"' in html


def test_a_state_too_large_for_a_tree_is_shown_as_raw_json(page_client: Client, thread: Thread) -> None:
    checkpoint = storage.append_checkpoint(thread=thread, parent=None, state={"items": list(range(3_000))})

    html = page_client.get(url(checkpoint)).content.decode()

    assert 'id="state-tree"' not in html
    assert "too many to show as a tree" in html
    assert '<pre id="raw-json" class="raw" tabindex="0" aria-label="State as raw JSON">' in html


def test_state_values_are_escaped(page_client: Client, thread: Thread) -> None:
    checkpoint = storage.append_checkpoint(
        thread=thread, parent=None, label="<b>bold</b>", state={"note": "<script>alert(1)</script>"}
    )

    html = page_client.get(url(checkpoint)).content.decode()

    assert "<script>alert(1)</script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "<b>bold</b>" not in html


# --------------------------------------------------------------------------- previous and next


def test_previous_is_the_parent_and_next_the_following_checkpoint(page_client: Client, trip: list[Checkpoint]) -> None:
    middle = page_client.get(url(trip[1])).content.decode()
    first = page_client.get(url(trip[0])).content.decode()
    last = page_client.get(url(trip[2])).content.decode()

    assert link(middle, "prev") == url(trip[0])
    assert link(middle, "next") == url(trip[2])
    assert link(first, "prev") is None and 'aria-disabled="true" disabled title="This is the first checkpoint"' in first
    assert link(last, "next") is None and 'title="No later checkpoint on this branch"' in last


def test_on_a_branch_previous_is_the_fork_point_and_next_stays_on_the_branch(
    page_client: Client, thread: Thread, trip: list[Checkpoint]
) -> None:
    storage.start_branch(thread=thread, at=trip[1], name="cheaper-hotel")
    forked = storage.append_checkpoint(thread=thread, parent=trip[1], branch="cheaper-hotel", label="hostel",
                                     patch=[{"op": "add", "path": "/facts/hotel", "value": "hostel"}])  # fmt: skip
    after = storage.append_checkpoint(thread=thread, parent=forked, label="book",
                                    patch=[{"op": "add", "path": "/facts/booked", "value": True}])  # fmt: skip

    html = page_client.get(url(forked)).content.decode()

    assert link(html, "prev") == url(trip[1])  # the fork point, on main
    assert link(html, "next") == url(after)  # seq 2 of the branch, not main's seq 2
    assert "cheaper-hotel" in html


def test_next_skips_a_gap_left_by_compaction(page_client: Client, trip: list[Checkpoint]) -> None:
    later = storage.append_checkpoint(thread=trip[2].thread, parent=trip[2], label="pay",
                                    patch=[{"op": "add", "path": "/facts/paid", "value": True}])  # fmt: skip
    Checkpoint.objects.filter(pk=later.pk).update(seq=7)  # seqs 4-6 were compacted away

    assert link(page_client.get(url(trip[2])).content.decode(), "next") == url(later)


# --------------------------------------------------------------------------- live


def test_the_page_carries_where_its_live_feed_starts(
    page_client: Client, thread: Thread, trip: list[Checkpoint]
) -> None:
    html = page_client.get(url(trip[1])).content.decode()

    thread.refresh_from_db()
    assert thread.event_seq > 0
    body = f'<body data-thread="{thread.pk}" data-event-seq="{thread.event_seq}" data-branch="main" data-seq="2">'
    assert body in html
    assert 'id="step-nav"' in html and 'id="newer-checkpoints"' in html and 'id="checkpoint-attention"' in html
    assert "{#" not in html and "#}" not in html  # no template comment leaks onto the page


def test_the_newer_notice_names_next_and_the_branch_head_and_waits_hidden(
    page_client: Client, trip: list[Checkpoint]
) -> None:
    first = page_client.get(url(trip[0])).content.decode()
    middle = page_client.get(url(trip[1])).content.decode()
    last = page_client.get(url(trip[2])).content.decode()

    notice = re.search(r'<p class="notice newer" hidden>(.*?)</p>', first, re.S)
    assert notice is not None  # shown by checkpoint.js once the feed tells of a newer checkpoint
    text = " ".join(notice.group(1).split())
    assert f'#2 search_flights follows this one — <a href="{url(trip[1])}">open it</a>' in text
    assert f'<a href="{url(trip[2])}">open the head, #3 search_hotels</a>' in text
    assert 'class="notice newer"' in middle and "open the head" not in middle  # next is the head
    assert 'class="notice newer"' not in last


# --------------------------------------------------------------------------- tool results


# Committed transactions, as in production: the store stamps a tool result with the database
# clock of its transaction, which inside one long test transaction would predate every checkpoint.
@pytest.mark.django_db(transaction=True)
def test_tool_results_cached_up_to_the_checkpoint_are_listed(
    page_client: Client, thread: Thread, trip: list[Checkpoint]
) -> None:
    later = storage.append_checkpoint(thread=thread, parent=trip[2], label="book",
                                    patch=[{"op": "add", "path": "/booked", "value": True}])  # fmt: skip
    put_tool_result(thread=thread, key="booking-key", tool="book_flight", result={"pnr": "X7K2QP"}, checkpoint=later)

    before = page_client.get(url(trip[0])).content.decode()
    with_it = page_client.get(url(trip[1])).content.decode()
    after = page_client.get(url(trip[2])).content.decode()

    assert "search_flights</td>" not in before and "No tool results were cached" in before
    assert "search_flights</td>" in with_it and "this checkpoint" in with_it
    assert "search_flights</td>" in after and "#2 search_flights</a>" in after
    assert "book_flight" not in after  # cached after this checkpoint was written


def test_the_tool_results_table_is_capped_with_a_count(
    page_client: Client, thread: Thread, trip: list[Checkpoint]
) -> None:
    results = [{"key": f"k{i}", "tool": "lookup", "result": i} for i in range(60)]
    done = [{"op": "add", "path": "/done", "value": True}]
    later = storage.append_checkpoint(thread=thread, parent=trip[2], label="many", patch=done, tool_results=results)

    html = page_client.get(url(later)).content.decode()

    assert html.count("<td>lookup</td>") + html.count("<td>search_flights</td>") == 50
    assert "Newest 50 of 61" in html


# --------------------------------------------------------------------------- integrity


def test_an_altered_row_shows_the_failed_badge_not_a_500(page_client: Client, trip: list[Checkpoint]) -> None:
    with connection.cursor() as cursor:
        cursor.execute("UPDATE checkpoints_checkpoint SET label = 'x' WHERE id = %s", [trip[1].pk])
    storage.clear_caches()

    response = page_client.get(url(trip[1]))

    assert response.status_code == 200
    html = response.content.decode()
    assert '<span id="integrity" class="badge failed"' in html
    assert "fails its integrity check" in html
    assert 'id="state-tree"' not in html and 'id="raw-json"' not in html


# --------------------------------------------------------------------------- cost


def test_query_count_is_pinned_and_does_not_grow_with_the_thread(
    page_client: Client, thread: Thread, trip: list[Checkpoint], django_assert_max_num_queries: Any
) -> None:
    parent = trip[-1]
    for i in range(30):
        parent = storage.append_checkpoint(thread=thread, parent=parent, label=f"step {i}",
                                         patch=[{"op": "add", "path": "/messages/-", "value": f"m{i}"}],
                                         tool_results=[{"key": f"k{i}", "tool": "t", "result": i}])  # fmt: skip
    storage.clear_caches()

    with django_assert_max_num_queries(CHECKPOINT_PAGE_QUERIES):
        response = page_client.get(url(trip[1]))
    assert response.status_code == 200
    with django_assert_max_num_queries(CHECKPOINT_PAGE_QUERIES):
        response = page_client.get(url(parent))
    assert response.status_code == 200
