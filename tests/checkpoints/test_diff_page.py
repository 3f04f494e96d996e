"""The diff page: roles, bad input as 400/404 pages, the default base, list-append summaries,
word diffs, unified and split views, the picker across branches, integrity and query counts."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client

from checkpoints import storage
from checkpoints.models import Checkpoint, Thread
from quicksave_agents.models import Agent
from tests.conftest import person, signed_in

# Every round trip with nothing cached: session, user, two permission reads, the target, the base,
# the thread, the picker's options, a replay's target row and chain for each of the two states,
# role and inbox count for the header. No spare: one more query (a replay more) fails the test,
# and the count does not grow with the thread or its branches.
DIFF_PAGE_QUERIES = 14

PLAN = (
    "Fly from Berlin to Lisbon on Monday morning with the cheapest direct flight, check in at a hotel near "
    "Alfama, then take the train to Porto on Wednesday and fly home on Friday evening."
)


@pytest.fixture
def olivia(db: Any) -> User:
    """A viewer."""
    return person("olivia", "viewer")


@pytest.fixture
def page_client(olivia: User) -> Client:
    return signed_in(olivia)


@pytest.fixture
def trip(thread: Thread) -> list[Checkpoint]:
    """start → three messages appended → the plan revised and a fact changed."""
    first = storage.append_checkpoint(
        thread=thread, parent=None, step=0, label="start",
        state={"messages": [{"role": "user", "content": "Lisbon next week"}], "facts": {"hotel": "Alfama", "n": 1},
               "plan": PLAN},
    )  # fmt: skip
    second = storage.append_checkpoint(
        thread=thread, parent=first, step=1, label="search",
        patch=[{"op": "add", "path": "/messages/-", "value": {"role": "assistant", "content": f"reply {i}"}}
               for i in range(3)],
    )  # fmt: skip
    third = storage.append_checkpoint(
        thread=thread, parent=second, step=2, label="revise",
        patch=[
            {"op": "replace", "path": "/plan", "value": PLAN.replace("Monday", "Tuesday")},
            {"op": "replace", "path": "/facts/hotel", "value": "Baixa"},
            {"op": "remove", "path": "/facts/n"},
        ],
    )  # fmt: skip
    return [first, second, third]


def url(target: Checkpoint | str, query: str = "") -> str:
    target_id = target.pk if isinstance(target, Checkpoint) else target
    return f"/checkpoints/{target_id}/diff/" + (f"?{query}" if query else "")


def diff_blocks(html: str) -> list[tuple[str, str]]:
    """(kind, path) of each block inside #diff."""
    return re.findall(r'<section class="diff-op (added|removed|changed)"[^>]*>\s*<div class="diff-path">'
                      r'<span class="op-kind">\w+</span> <code>([^<]*)</code>', html)  # fmt: skip


# --------------------------------------------------------------------------- who may see it


@pytest.mark.parametrize(("name", "role"), [("olivia", "viewer"), ("rex", "reviewer"), ("ada", "admin")])
def test_every_role_sees_the_diff_page(name: str, role: str, trip: list[Checkpoint]) -> None:
    response = signed_in(person(name, role)).get(url(trip[2]))

    assert response.status_code == 200
    assert b'<div id="diff"' in response.content


def test_a_person_without_a_role_gets_403(trip: list[Checkpoint]) -> None:
    assert signed_in(person("sam", None)).get(url(trip[2])).status_code == 403


def test_anonymous_is_sent_to_sign_in(trip: list[Checkpoint]) -> None:
    response = Client().get(url(trip[2]))

    assert response.status_code == 302
    assert response["Location"].startswith("/login/?next=")


# --------------------------------------------------------------------------- bad input


def test_an_unknown_target_is_a_404_page(page_client: Client) -> None:
    response = page_client.get(url("00000000-0000-0000-0000-000000000000"))

    assert response.status_code == 404
    assert response["Content-Type"].startswith("text/html")
    assert b"Not found" in response.content


def test_an_unknown_base_is_a_404_page(page_client: Client, trip: list[Checkpoint]) -> None:
    response = page_client.get(url(trip[2], "base=00000000-0000-0000-0000-000000000000"))

    assert response.status_code == 404
    assert b"Not found" in response.content


@pytest.mark.parametrize("query", ["base=abc", "base=1%27%3B--", "target=nope", "view=fancy", "base=" + "f" * 500])
def test_malformed_parameters_are_a_400_page(page_client: Client, trip: list[Checkpoint], query: str) -> None:
    response = page_client.get(url(trip[2], query))

    assert response.status_code == 400
    assert response["Content-Type"].startswith("text/html")
    assert b"Bad request" in response.content


def test_a_base_from_another_thread_is_a_400_page(page_client: Client, agent: Agent, trip: list[Checkpoint]) -> None:
    other_thread = storage.create_thread(agent=agent, external_id="trip-2")[0]
    other = storage.append_checkpoint(thread=other_thread, parent=None, state={"messages": []})

    for query in (f"base={other.pk}", f"target={other.pk}"):
        response = page_client.get(url(trip[2], query))
        assert response.status_code == 400, query
        assert b"same thread" in response.content


# --------------------------------------------------------------------------- what it shows


def test_the_default_base_is_the_parent(page_client: Client, trip: list[Checkpoint]) -> None:
    html = page_client.get(url(trip[2])).content.decode()

    assert "<title>Diff #2 → #3 · trip-1 · Quicksave</title>" in html
    assert diff_blocks(html) == [("removed", "/facts/n"), ("changed", "/facts/hotel"), ("changed", "/plan")]
    crumbs = re.search(r'<nav class="breadcrumbs".*?</nav>', html, re.S)
    assert crumbs is not None
    assert "Threads" in crumbs.group(0) and "trip-1" in crumbs.group(0) and "#3 revise" in crumbs.group(0)
    assert '<span class="count-changed"><strong>2</strong> changed</span>' in html


def test_appends_to_a_list_are_summarised_and_shown_open(page_client: Client, trip: list[Checkpoint]) -> None:
    html = page_client.get(url(trip[1])).content.decode()

    assert diff_blocks(html) == [("added", "/messages")]
    # Open: what was added (a failure message, say) is visible without a click.
    assert '<details class="run added" open>\n        <summary>+3 messages</summary>' in html
    assert "/messages/1" in html and "/messages/3" in html and "reply 2" in html


def test_a_long_run_of_appends_starts_folded(page_client: Client, thread: Thread) -> None:
    first = storage.append_checkpoint(thread=thread, parent=None, state={"log": []})
    appends = [{"op": "add", "path": "/log/-", "value": i} for i in range(25)]
    second = storage.append_checkpoint(thread=thread, parent=first, patch=appends)

    html = page_client.get(url(second)).content.decode()

    assert '<details class="run added">\n        <summary>+25 log items</summary>' in html


def test_values_show_up_to_a_size_and_longer_ones_fold_behind_a_preview(page_client: Client, thread: Thread) -> None:
    first = storage.append_checkpoint(thread=thread, parent=None, state={"report": {"status": "ok"}})
    second = storage.append_checkpoint(thread=thread, parent=first, patch=[
        {"op": "replace", "path": "/report/status", "value": "failed"},
        {"op": "add", "path": "/report/trace", "value": [f"frame {i}: in migrate()" for i in range(40)]},
    ])  # fmt: skip

    html = page_client.get(url(second)).content.decode()

    assert ('<pre class="value new"><span class="sign" aria-hidden="true">+</span><span class="sr-only">After: </span>'
            "&quot;failed&quot;</pre>") in html  # fmt: skip
    assert re.search(r'<details class="fold new"><summary><span class="sr-only">After: </span>'
                     r'<code class="preview">\[ &quot;frame 0: in migrate\(\)&quot;, &quot;frame 1', html)  # fmt: skip
    assert "42 lines · show all" in html
    assert "frame 39: in migrate()" in html  # the whole value is on the page, one click away


def test_side_by_side_rows_line_up_with_an_empty_cell_not_a_dash(page_client: Client, trip: list[Checkpoint]) -> None:
    html = page_client.get(url(trip[1], "view=split")).content.decode()

    shown = html[html.index('<div id="diff"') :]
    assert "—" not in shown
    rows = re.findall(
        r'<div class="split listed">\s*<div><div class="side-empty"><span class="sr-only">Not in the base'
        r'</span></div></div>\s*<div><code class="small muted">(/messages/\d)</code><pre class="value new">',
        shown,
    )
    assert rows == ["/messages/1", "/messages/2", "/messages/3"]


def test_side_by_side_long_values_fold_together(page_client: Client, thread: Thread) -> None:
    first = storage.append_checkpoint(thread=thread, parent=None, state={"rows": [{"n": i} for i in range(30)]})
    kept = [{"n": i} for i in range(30)]
    second = storage.append_checkpoint(thread=thread, parent=first, state={"rows": {"count": 30, "kept": kept}})

    html = page_client.get(url(second, "view=split")).content.decode()

    folded = re.search(
        r'<details class="fold split-fold">\s*<summary><span class="split"><span><code class="preview">'
        r'\[ \{.*?</span><span><code class="preview">\{ &quot;count&quot;.*?</summary>\s*<div class="split">'
        r'\s*<div><pre class="value old">.*?</pre></div>\s*<div><pre class="value new">',
        html,
        re.S,
    )
    assert folded is not None


def test_long_strings_are_marked_word_by_word(page_client: Client, trip: list[Checkpoint]) -> None:
    html = page_client.get(url(trip[2])).content.decode()

    assert "<del>Monday</del><ins>Tuesday</ins>" in html


def test_split_view_puts_base_and_target_side_by_side(page_client: Client, trip: list[Checkpoint]) -> None:
    html = page_client.get(url(trip[2], "view=split")).content.decode()

    assert '<div id="diff" class="diff diff-split">' in html
    assert '<div class="split"><pre class="text">' in html
    assert re.search(r'href="\?base=[^"]+&amp;view=split" aria-current="page">Side by side', html)
    assert re.search(r'<pre class="text">[^<]*<del>Monday</del>[^<]*</pre><pre class="text">[^<]*<ins>Tuesday</ins>',
                     html)  # fmt: skip
    unified = page_client.get(url(trip[2])).content.decode()
    assert re.search(r'view=unified" aria-current="page">Unified', unified)


def test_comparing_a_checkpoint_with_itself_says_the_states_match(page_client: Client, trip: list[Checkpoint]) -> None:
    html = page_client.get(url(trip[1], f"base={trip[1].pk}")).content.decode()

    assert "These two checkpoints have the same state." in html


def test_any_two_checkpoints_compare_in_either_direction(page_client: Client, trip: list[Checkpoint]) -> None:
    html = page_client.get(url(trip[0], f"base={trip[2].pk}")).content.decode()

    assert "<title>Diff #3 → #1 · trip-1 · Quicksave</title>" in html
    assert '<details class="run removed" open>\n        <summary>\u22123 messages</summary>' in html
    assert "<del>Tuesday</del><ins>Monday</ins>" in html


def test_the_first_checkpoint_gets_a_friendly_page_with_the_picker(page_client: Client, trip: list[Checkpoint]) -> None:
    response = page_client.get(url(trip[0]))

    assert response.status_code == 200
    html = response.content.decode()
    assert "#1 is the first checkpoint" in html
    assert '<form id="diff-picker"' in html
    assert '<input id="pick-base" name="base" list="checkpoint-options" value="" required' in html


def test_values_are_escaped(page_client: Client, thread: Thread) -> None:
    first = storage.append_checkpoint(thread=thread, parent=None, state={"note": "safe", "log": []})
    second = storage.append_checkpoint(
        thread=thread, parent=first, label="<img src=x onerror=alert(1)>",
        patch=[{"op": "replace", "path": "/note", "value": "<script>alert(1)</script>"},
               {"op": "add", "path": "/log/-", "value": "<script>alert(2)</script>"}],
    )  # fmt: skip

    html = page_client.get(url(second)).content.decode()

    assert "<script>alert(" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "<img src=x" not in html


# --------------------------------------------------------------------------- branches and the picker


@pytest.fixture
def forked(thread: Thread, trip: list[Checkpoint]) -> Checkpoint:
    """A branch from #2 where the hotel changes differently."""
    storage.start_branch(thread=thread, at=trip[1], name="cheaper-hotel")
    return storage.append_checkpoint(thread=thread, parent=trip[1], branch="cheaper-hotel", label="hostel",
                                   patch=[{"op": "replace", "path": "/facts/hotel", "value": "Hostel"}])  # fmt: skip


def test_checkpoints_on_different_branches_compare(
    page_client: Client, trip: list[Checkpoint], forked: Checkpoint
) -> None:
    html = page_client.get(url(forked, f"base={trip[2].pk}")).content.decode()

    assert diff_blocks(html) == [("changed", "/facts/hotel"), ("added", "/facts/n"), ("changed", "/plan")]
    assert '<span class="mono">cheaper-hotel</span> #1 hostel' in html
    assert '<span class="mono">main</span> #3 revise' in html


def test_the_picker_offers_every_branch(page_client: Client, trip: list[Checkpoint], forked: Checkpoint) -> None:
    html = page_client.get(url(trip[2])).content.decode()

    picker = re.search(r'<form id="diff-picker".*?</form>', html, re.S)
    assert picker is not None
    options = re.search(r'<datalist id="checkpoint-options">(.*?)</datalist>', picker.group(0), re.S)
    assert options is not None
    offered = re.findall(r'<option value="([^"]*)"></option>', options.group(1))
    assert offered == ["main #3 revise", "main #2 search", "main #1 start", "cheaper-hotel #1 hostel"]
    # Both ends are searchable text inputs over that one list, filled with the pair compared.
    assert '<input id="pick-base" name="base" list="checkpoint-options" value="main #2 search"' in html
    assert '<input id="pick-target" name="target" list="checkpoint-options" value="main #3 revise"' in html


@pytest.mark.parametrize(
    ("query", "base_seq"),
    [("base=main %232 search", 2), ("base=%231", 1), ("base=main %231", 1), ("base=  main  %232  ", 2)],
)
def test_a_checkpoint_is_picked_by_branch_and_number(
    page_client: Client, trip: list[Checkpoint], query: str, base_seq: int
) -> None:
    html = page_client.get(url(trip[2], query)).content.decode()

    assert f'<a class="pill" href="/checkpoints/{trip[base_seq - 1].pk}/"><span class="muted">base</span>' in html


def test_a_target_picked_by_text_on_another_branch_redirects_to_its_diff(
    page_client: Client, trip: list[Checkpoint], forked: Checkpoint
) -> None:
    response = page_client.get(url(trip[2], "base=main %231&target=cheaper-hotel %231 hostel&view=split"))

    assert response.status_code == 302
    assert response["Location"] == url(forked, f"base={trip[0].pk}&view=split")


@pytest.mark.parametrize(
    ("query", "message"),
    [("base=main %2399", b"no checkpoint #99 on a branch named"), ("base=nowhere %231", b"named &#x27;nowhere&#x27;"),
     ("base=plan", b"as the list offers it"), ("base=ma%00in %231", b"as the list offers it"),
     ("base=main %239999999999", b"as the list offers it")],
)  # fmt: skip
def test_a_picked_text_that_names_no_checkpoint_is_a_400_saying_so(
    page_client: Client, trip: list[Checkpoint], query: str, message: bytes
) -> None:
    response = page_client.get(url(trip[2], query))

    assert response.status_code == 400
    assert message in response.content


def test_picking_another_target_redirects_to_its_diff(
    page_client: Client, trip: list[Checkpoint], forked: Checkpoint
) -> None:
    response = page_client.get(url(trip[2], f"base={trip[0].pk}&target={forked.pk}&view=split"))

    assert response.status_code == 302
    assert response["Location"] == url(forked, f"base={trip[0].pk}&view=split")
    # The target in the path already: no redirect.
    assert page_client.get(url(trip[2], f"base={trip[0].pk}&target={trip[2].pk}")).status_code == 200


# --------------------------------------------------------------------------- integrity and cost


def test_an_altered_row_shows_the_failed_badge_not_a_500(page_client: Client, trip: list[Checkpoint]) -> None:
    with connection.cursor() as cursor:
        cursor.execute("UPDATE checkpoints_checkpoint SET label = 'x' WHERE id = %s", [trip[2].pk])
    storage.clear_caches()

    response = page_client.get(url(trip[2]))

    assert response.status_code == 200
    html = response.content.decode()
    assert '<span id="integrity" class="badge failed">' in html
    assert "fails its integrity check" in html
    assert 'id="diff"' not in html


def test_query_count_is_pinned_and_does_not_grow_with_the_thread(
    page_client: Client, thread: Thread, trip: list[Checkpoint], forked: Checkpoint,
    django_assert_max_num_queries: Any,
) -> None:  # fmt: skip
    parent = trip[2]
    for i in range(40):
        parent = storage.append_checkpoint(thread=thread, parent=parent, label=f"step {i}",
                                         patch=[{"op": "add", "path": "/messages/-", "value": f"m{i}"}])  # fmt: skip
    for name in ("b2", "b3"):
        storage.start_branch(thread=thread, at=trip[0], name=name)
        storage.append_checkpoint(thread=thread, parent=trip[0], branch=name, label=name,
                                patch=[{"op": "add", "path": "/b", "value": name}])  # fmt: skip
    storage.clear_caches()

    with django_assert_max_num_queries(DIFF_PAGE_QUERIES):
        response = page_client.get(url(trip[2]))
    assert response.status_code == 200
    with django_assert_max_num_queries(DIFF_PAGE_QUERIES):
        response = page_client.get(url(parent, f"base={forked.pk}&view=split"))
    assert response.status_code == 200
