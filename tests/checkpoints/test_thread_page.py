"""The thread page: roles, bad input as 4xx pages, keyset timeline pages, the branch tree and the
chart, and a query count that does not grow with the thread."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.template.defaultfilters import filesizeformat
from django.test import Client
from django.test.utils import CaptureQueriesContext

from checkpoints import storage
from checkpoints.models import Checkpoint, Thread
from checkpoints.presentation import timeline
from quicksave_agents.models import Agent
from tests.conftest import person

# Measured at 14 (session, user, two permission reads, thread, branches, heads, timeline page, the
# events between its checkpoints, the approvals asked on it or named by its events, a pending
# approval, runs no worker claimed, role and inbox count for the header); one spare for a harmless
# extra read. The branch tree and chart are drawn only when asked for (two more: landmarks, samples).
THREAD_PAGE_QUERIES = 15


def grow(thread: Thread, steps: int, *, parent: Checkpoint | None = None, branch: str | None = None,
         label: str = "step") -> list[Checkpoint]:  # fmt: skip
    """Append `steps` checkpoints, each adding one item to the state (the first one from nothing)."""
    written = []
    if parent is None:
        parent = storage.append_checkpoint(thread=thread, parent=None, state={"items": []}, step=0, label="start",
                                         model={"name": "gpt-test", "version": "1"})  # fmt: skip
        written.append(parent)
        steps -= 1
    for i in range(steps):
        parent = storage.append_checkpoint(
            thread=thread, parent=parent, branch=branch, step=parent.seq, label=f"{label} {i}",
            patch=[{"op": "add", "path": "/items/-", "value": f"item {i} " + "x" * 40}],
        )  # fmt: skip
        written.append(parent)
    return written


@pytest.fixture
def olivia(db: Any) -> User:
    """A viewer."""
    return person("olivia", "viewer")


@pytest.fixture
def page_client(olivia: User) -> Client:
    client = Client()
    client.force_login(olivia)
    return client


def url(thread: Thread, query: str = "") -> str:
    return f"/threads/{thread.pk}/" + (f"?{query}" if query else "")


def timeline_seqs(html: str) -> list[int]:
    return [int(seq) for seq in re.findall(r'<tr data-seq="(\d+)"', html)]


def svg(html: str, svg_id: str) -> str:
    found = re.search(rf'<svg id="{svg_id}".*?</svg>', html, re.S)
    assert found, f"no <svg id={svg_id}> on the page"
    return found.group(0)


# --------------------------------------------------------------------------- who may see it


@pytest.mark.parametrize(("name", "role"), [("olivia", "viewer"), ("rex", "reviewer"), ("ada", "admin")])
def test_every_role_sees_the_thread_page(name: str, role: str, thread: Thread) -> None:
    grow(thread, 3)
    client = Client()
    client.force_login(person(name, role))
    response = client.get(url(thread))
    assert response.status_code == 200
    html = response.content.decode()
    assert "<title>trip-1 · travel · Quicksave</title>" in html
    assert timeline_seqs(html) == [3, 2, 1]


def test_a_person_without_a_role_gets_403(thread: Thread) -> None:
    client = Client()
    client.force_login(person("sam", None))
    response = client.get(url(thread))
    assert response.status_code == 403
    assert "grantrole" in response.content.decode()


def test_anonymous_is_sent_to_the_login_page(thread: Thread) -> None:
    response = Client().get(url(thread))
    assert response.status_code == 302
    assert response["Location"].startswith("/login/?next=")


# --------------------------------------------------------------------------- bad input


def test_unknown_thread_is_a_404_page(page_client: Client) -> None:
    response = page_client.get("/threads/01890000-0000-7000-8000-000000000000/")
    assert response.status_code == 404
    assert response["Content-Type"].startswith("text/html")
    assert "<h1>Not found</h1>" in response.content.decode()


def test_a_malformed_thread_id_is_a_404_page(page_client: Client) -> None:
    response = page_client.get("/threads/not-a-uuid/")
    assert response.status_code == 404
    assert response["Content-Type"].startswith("text/html")


@pytest.mark.parametrize(
    ("query", "named"),
    [
        ("before_seq=abc", "before_seq"),
        ("after_seq=-1", "after_seq"),
        ("before_seq=99999999999", "before_seq"),
        ("before_seq=5&after_seq=2", "not both"),
        ("branch=" + "b" * 101, "branch"),
        ("branch=a%00b", "branch"),
    ],
)
def test_malformed_query_is_a_400_page_naming_the_parameter(
    query: str, named: str, page_client: Client, thread: Thread
) -> None:
    grow(thread, 2)
    response = page_client.get(url(thread, query))
    assert response.status_code == 400
    html = response.content.decode()
    assert "<h1>Bad request</h1>" in html
    assert named in html


def test_unknown_branch_is_a_404_page_naming_it(page_client: Client, thread: Thread) -> None:
    grow(thread, 2)
    response = page_client.get(url(thread, "branch=nope"))
    assert response.status_code == 404
    assert "no branch named &#x27;nope&#x27;" in response.content.decode()


def test_a_cursor_past_the_end_is_an_empty_page_not_an_error(page_client: Client, thread: Thread) -> None:
    grow(thread, 3)
    response = page_client.get(url(thread, "after_seq=500"))
    assert response.status_code == 200
    html = response.content.decode()
    assert timeline_seqs(html) == []
    assert "No checkpoints on this page" in html


# --------------------------------------------------------------------------- timeline pages


def test_newest_page_shows_the_newest_fifty_and_links_to_older(page_client: Client, thread: Thread) -> None:
    grow(thread, 120)
    html = page_client.get(url(thread)).content.decode()
    assert timeline_seqs(html) == list(range(120, 70, -1))
    assert 'href="?before_seq=71" rel="next"' in html
    assert 'rel="prev"' not in html


def test_older_and_newer_links_walk_the_whole_branch(page_client: Client, thread: Thread) -> None:
    written = grow(thread, 120)
    middle = page_client.get(url(thread, "before_seq=71")).content.decode()
    assert timeline_seqs(middle) == list(range(70, 20, -1))
    assert 'href="?after_seq=70" rel="prev"' in middle
    assert 'href="?before_seq=21" rel="next"' in middle
    assert "« Newest" in middle

    oldest = page_client.get(url(thread, "before_seq=21")).content.decode()
    assert timeline_seqs(oldest) == list(range(20, 0, -1))
    assert 'rel="next"' not in oldest
    # The first checkpoint of main has no parent to compare with; the others link to their diff.
    assert re.search(r'<tr data-seq="1".*?<span class="muted">first</span>', oldest, re.S)
    assert f'href="/checkpoints/{written[1].pk}/diff/">what changed' in oldest

    newer = page_client.get(url(thread, "after_seq=70")).content.decode()
    assert timeline_seqs(newer) == list(range(120, 70, -1))


def test_rows_show_label_status_model_size_and_links(page_client: Client, thread: Thread) -> None:
    written = grow(thread, 2)
    html = page_client.get(url(thread)).content.decode()
    row = re.search(r'<tr data-seq="1".*?</tr>', html, re.S)
    assert row is not None
    text = row.group(0)
    assert f'href="/checkpoints/{written[0].pk}/"' in text
    assert '<span class="badge status-saved">Saved</span>' in text  # a step saved, not the thread running
    assert "gpt-test" in text
    assert f'<time datetime="{written[0].created_at.isoformat()}' in text
    assert "bytes" in text


def test_labels_and_branch_names_are_escaped(page_client: Client, thread: Thread) -> None:
    first = grow(thread, 2, label="<script>alert(1)</script>")
    storage.start_branch(thread=thread, at=first[0], name='"><b>x')
    html = page_client.get(url(thread)).content.decode()
    assert "<script>alert" not in html
    assert "<b>x" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_a_thread_without_checkpoints_shows_the_empty_state(page_client: Client, thread: Thread) -> None:
    html = page_client.get(url(thread)).content.decode()
    assert "No checkpoints yet" in html
    assert 'id="timeline"' not in html


# --------------------------------------------------------------------------- branch tree and chart


def test_a_fork_draws_both_lanes_and_highlights_the_selected_one(page_client: Client, thread: Thread) -> None:
    main = grow(thread, 8)
    storage.start_branch(thread=thread, at=main[3], name="retry")
    retry = grow(thread, 3, parent=main[3], branch="retry", label="retry")

    tree = svg(page_client.get(url(thread, "drawings=1")).content.decode(), "branch-tree")
    assert 'role="img"' in tree and "aria-label=" in tree
    assert '<g class="lane lane-selected" data-branch="main"' in tree
    assert '<g class="lane" data-branch="retry"' in tree
    assert '<path class="connector"' in tree
    assert f'href="/checkpoints/{retry[-1].pk}/"' in tree  # the other branch's head
    assert f'href="/checkpoints/{main[3].pk}/"' in tree  # the fork point
    assert 'href="?branch=retry"' in tree

    html = page_client.get(url(thread, "branch=retry&drawings=1")).content.decode()
    tree = svg(html, "branch-tree")
    assert '<g class="lane lane-selected" data-branch="retry"' in tree
    assert '<g class="lane" data-branch="main"' in tree
    assert '<path class="connector connector-selected"' in tree
    assert timeline_seqs(html) == [3, 2, 1]
    # A branch's first checkpoint compares with its fork point, so it has a diff link.
    assert f'href="/checkpoints/{retry[0].pk}/diff/">what changed' in html
    assert "Forked from" in html


def test_a_long_branch_is_folded_not_drawn_node_by_node(page_client: Client, thread: Thread) -> None:
    grow(thread, 300)
    tree = svg(page_client.get(url(thread, "drawings=1")).content.decode(), "branch-tree")
    nodes = tree.count('<a class="node')
    assert 50 <= nodes <= 52  # the page's fifty, plus the first checkpoint
    assert '<g class="lane-gap"><title>249 checkpoints folded</title>' in tree


def test_chart_samples_at_most_120_points_of_a_long_branch(page_client: Client, thread: Thread) -> None:
    grow(thread, 300)
    chart = svg(page_client.get(url(thread, "drawings=1")).content.decode(), "state-chart")
    assert 'role="img"' in chart and "sampled from 300 checkpoints" in chart
    points = chart.count('class="chart-point"')
    assert points == int(re.search(r'data-points="(\d+)"', chart).group(1))  # type: ignore[union-attr]
    assert 100 <= points <= 120
    assert "#1:" in chart and "#300:" in chart  # both ends are always sampled


def test_an_empty_branch_is_drawn_as_a_stub_and_its_timeline_says_so(page_client: Client, thread: Thread) -> None:
    main = grow(thread, 4)
    storage.start_branch(thread=thread, at=main[1], name="later")
    html = page_client.get(url(thread, "branch=later&drawings=1")).content.decode()
    assert '<g class="node node-empty"><title>No checkpoint on later yet</title>' in svg(html, "branch-tree")
    assert "No checkpoints on later yet" in html
    assert timeline_seqs(html) == []


def test_more_branches_than_lanes_are_listed_but_not_drawn(page_client: Client, thread: Thread) -> None:
    main = grow(thread, 3)
    for i in range(timeline.MAX_LANES + 2):
        storage.start_branch(thread=thread, at=main[1], name=f"try-{i}")
    html = page_client.get(url(thread, f"branch=try-{timeline.MAX_LANES + 1}&drawings=1")).content.decode()
    tree = svg(html, "branch-tree")
    assert tree.count('<g class="lane') == timeline.MAX_LANES
    assert '<g class="lane lane-selected" data-branch="try-13"' in tree  # the selected one is always drawn
    assert "3 more branches not drawn" in tree
    assert html.count('class="count"') == timeline.MAX_LANES + 3  # the picker lists all of them


def test_chart_of_a_short_branch_has_every_checkpoint(page_client: Client, thread: Thread) -> None:
    grow(thread, 10)
    chart = svg(page_client.get(url(thread, "drawings=1")).content.decode(), "state-chart")
    assert chart.count('class="chart-point"') == 10
    assert chart.count('class="chart-gap"') == 9 + 1  # nine intervals and the legend swatch


# --------------------------------------------------------------------------- cost


def test_pages_are_keyset_ranges_and_the_chart_reads_only_its_samples(page_client: Client, thread: Thread) -> None:
    grow(thread, 300)
    with CaptureQueriesContext(connection) as queries:
        page_client.get(url(thread, "before_seq=200&drawings=1"))
    sql = [query["sql"] for query in queries.captured_queries]
    assert not any("OFFSET" in statement for statement in sql)
    # Fifty rows and #200 itself, the newer neighbour whose time ends the page's span of events.
    assert any('"seq" <= 200' in statement and "LIMIT 51" in statement for statement in sql)
    assert any("unnest" in statement and "LIMIT 1" in statement for statement in sql)  # one probe per sample


def test_sampled_seqs_keep_both_ends_and_at_most_the_limit() -> None:
    assert timeline.sampled_seqs(7) == [1, 2, 3, 4, 5, 6, 7]
    for length in (121, 300, 10_000, 123_457):
        seqs = timeline.sampled_seqs(length)
        assert seqs[0] == 1 and seqs[-1] == length
        assert 100 <= len(seqs) <= timeline.CHART_POINTS
        assert seqs == sorted(set(seqs))


@pytest.mark.parametrize("size", [0, 1, 2, 1023, 1024, 1536, 10**6, 2**20, 2**30 - 1, 2**30, 5 * 2**40])
def test_human_bytes_reads_like_filesizeformat(size: int) -> None:
    assert timeline.human_bytes(size) == filesizeformat(size)


@pytest.mark.parametrize("length", [10, 300])
def test_query_count_does_not_grow_with_the_thread(
    length: int, page_client: Client, thread: Thread, agent: Agent, django_assert_max_num_queries: Any
) -> None:
    main = grow(thread, length // 2)
    for i in range(length // 2):  # as many events of the thread's story as checkpoints, interleaved
        storage.record_event(thread=thread, type="run.claimed", data={"worker": f"w{i}", "attempt": 1})
        main += grow(thread, 1, parent=main[-1])
    storage.start_branch(thread=thread, at=main[length // 2], name="retry")
    grow(thread, 5, parent=main[length // 2], branch="retry")
    for query in ("", "before_seq=5", "branch=retry", "kind=runs", "kind=runs&before_event=20"):
        with django_assert_max_num_queries(THREAD_PAGE_QUERIES):
            response = page_client.get(url(thread, query))
        assert response.status_code == 200
    # Drawing the branch tree and the chart reads their landmarks and samples: two more.
    with django_assert_max_num_queries(THREAD_PAGE_QUERIES + 2):
        assert page_client.get(url(thread, "drawings=1")).status_code == 200


def test_a_thread_waiting_for_a_decision_leads_to_the_request_from_its_pages(
    page_client: Client, thread: Thread
) -> None:
    from approvals.services import request_approval

    first, second = grow(thread, 2)
    approval = request_approval(thread=thread, checkpoint=second, action="book_flight", args={"flight": "AZ611"},
                                message="Book AZ611 for 492 EUR?")  # fmt: skip
    review = f'<a class="button primary" href="/inbox/{approval.pk}/">Review the request</a>'

    for page in (url(thread), f"/checkpoints/{second.pk}/", f"/checkpoints/{first.pk}/"):
        body = page_client.get(page).content.decode()
        assert "Waiting for a decision:" in body and "book_flight" in body, page
        assert review in body, page


@pytest.mark.parametrize(("role", "resume"), [("viewer", False), ("admin", True)])
def test_a_failed_thread_says_why_on_its_page(thread: Thread, role: str, resume: bool) -> None:
    (first,) = grow(thread, 1)
    storage.append_checkpoint(thread=thread, parent=first, state={"n": 1}, status="failed", label="migrate orders",
                            metadata={"error": "lock wait timeout on <orders>"})  # fmt: skip
    client = Client()
    client.force_login(person("pat", role))

    body = client.get(url(thread)).content.decode()

    assert "This thread failed</strong>: " in body
    assert '<span class="mono failure-reason">lock wait timeout on &lt;orders&gt;</span>' in body
    assert (f'<a class="button primary" href="/threads/{thread.pk}/resume/">Resume…</a>' in body) is resume


def test_a_running_thread_has_nothing_to_call_attention_to(page_client: Client, thread: Thread) -> None:
    grow(thread, 2)
    assert 'id="attention"' not in page_client.get(url(thread)).content.decode()
