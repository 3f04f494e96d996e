"""The value-history page and the state tree's way to it: each change with old → new and its
diff, bad input as a 400 naming it, an empty state, escaping, paging and the query count."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote

import pytest
from django.test import Client

from checkpoints import storage
from checkpoints.models import Checkpoint, Thread
from checkpoints.views import history as history_view
from tests.conftest import person, signed_in

BATCH = "/config/batch_size"
# Session, user, two permission reads, the thread, its branches with their index marks, the changed
# checkpoints' rows, role and inbox count for the header: none grows with the thread or the history.
HISTORY_PAGE_QUERIES = 9


@pytest.fixture
def page_client(db: Any) -> Client:
    return signed_in(person("olivia", "viewer"))


@pytest.fixture
def run(thread: Thread) -> list[Checkpoint]:
    first = storage.append_checkpoint(thread=thread, parent=None, label="start",
                                      state={"config": {"batch_size": 32}, "log": []})  # fmt: skip
    second = storage.append_checkpoint(thread=thread, parent=first, label="warm",
                                       patch=[{"op": "add", "path": "/log/-", "value": "x"}])  # fmt: skip
    third = storage.append_checkpoint(thread=thread, parent=second, label="tune",
                                      patch=[{"op": "replace", "path": BATCH, "value": 64}])  # fmt: skip
    return [first, second, third]


def page(thread: Thread, query: str) -> str:
    return f"/threads/{thread.pk}/history/?{query}"


def change_rows(html: str) -> list[tuple[str, str]]:
    """(kind, checkpoint id) of each change listed."""
    return re.findall(r'<li class="history-change (\w+)" id="change-([0-9a-f-]+)">', html)


def test_each_change_shows_old_and_new_and_links_its_diff(
    page_client: Client, thread: Thread, run: list[Checkpoint]
) -> None:
    response = page_client.get(page(thread, f"path={BATCH}&from={run[1].pk}"))

    assert response.status_code == 200
    html = response.content.decode()
    assert change_rows(html) == [("changed", str(run[2].pk)), ("added", str(run[0].pk))]
    newest = html[html.index(f'id="change-{run[2].pk}"') : html.index(f'id="change-{run[0].pk}"')]
    assert f'href="/checkpoints/{run[2].pk}/diff/"' in newest
    assert re.search(r'<pre class="value old"><span class="sr-only">Before: </span>32</pre>', newest)
    assert re.search(r'<pre class="value new"><span class="sr-only">After: </span>64</pre>', newest)
    first = html[html.index(f'id="change-{run[0].pk}"') :]
    assert '<p class="absent">not set</p>' in first and "first checkpoint" in first
    # The way back to the checkpoint the reader came from.
    assert f'<li><a href="/checkpoints/{run[1].pk}/">#2 warm</a></li>' in html
    assert f'<code id="history-path">{BATCH}</code>' in html


def test_a_bad_pointer_is_a_400_naming_it_with_the_form_to_fix_it(
    page_client: Client, thread: Thread, run: list[Checkpoint]
) -> None:
    response = page_client.get(page(thread, "path=config/batch_size"))

    assert response.status_code == 400
    html = response.content.decode()
    assert 'id="history-error" role="alert">`path` must be a JSON pointer' in html
    assert 'value="config/batch_size"' in html and 'aria-invalid="true"' in html


@pytest.mark.parametrize("query", ["path=/x&from=nope", "path=/x&cursor=bad"])
def test_other_bad_parameters_are_400s(page_client: Client, thread: Thread, run: list[Checkpoint], query: str) -> None:
    assert page_client.get(page(thread, query)).status_code == 400


def test_a_path_never_set_says_so(page_client: Client, thread: Thread, run: list[Checkpoint]) -> None:
    html = page_client.get(page(thread, "path=/config/Batch_size")).content.decode()

    assert 'id="history-empty"' in html and "Never set" in html
    assert change_rows(html) == []


def test_without_a_path_the_page_asks_for_one(page_client: Client, thread: Thread, run: list[Checkpoint]) -> None:
    html = page_client.get(page(thread, "")).content.decode()

    assert 'id="history-start"' in html and 'name="path"' in html


def test_a_foreign_or_unknown_thread_is_a_404(page_client: Client, run: list[Checkpoint]) -> None:
    assert page_client.get("/threads/00000000-0000-0000-0000-000000000000/history/?path=/a").status_code == 404


def test_values_and_labels_are_escaped(page_client: Client, thread: Thread) -> None:
    first = storage.append_checkpoint(thread=thread, parent=None, state={"note": "<b>safe</b>"},
                                      label="<img src=x onerror=alert(1)>")  # fmt: skip
    storage.append_checkpoint(thread=thread, parent=first, patch=[{"op": "replace", "path": "/note",
                                                                   "value": "<script>alert(1)</script>"}])  # fmt: skip

    html = page_client.get(page(thread, "path=/note")).content.decode()

    assert "<script>alert(" not in html and "<img src=x" not in html and "<b>safe" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_long_values_fold_behind_a_preview(page_client: Client, thread: Thread) -> None:
    first = storage.append_checkpoint(thread=thread, parent=None, state={"rows": []})
    appends = [{"op": "add", "path": "/rows/-", "value": {"n": i}} for i in range(40)]
    storage.append_checkpoint(thread=thread, parent=first, patch=appends)

    html = page_client.get(page(thread, "path=/rows")).content.decode()

    assert re.search(r'<details class="fold new"><summary>.*?<code class="preview">\[ \{ &quot;n&quot;: 0 \}, \{', html)


def test_pages_follow_on_with_older_changes(
    page_client: Client, thread: Thread, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(history_view, "PAGE", 2)
    parent = storage.append_checkpoint(thread=thread, parent=None, state={"n": 0})
    for i in range(1, 5):
        parent = storage.append_checkpoint(thread=thread, parent=parent,
                                           patch=[{"op": "replace", "path": "/n", "value": i}])  # fmt: skip

    html = page_client.get(page(thread, "path=/n")).content.decode()
    assert len(change_rows(html)) == 2
    older = re.search(r'<a class="button" rel="next" href="\?([^"]+)">', html)
    assert older is not None
    html = page_client.get(page(thread, older.group(1).replace("&amp;", "&"))).content.decode()
    assert len(change_rows(html)) == 2
    older = re.search(r'rel="next" href="\?([^"]+)"', html)
    assert older is not None
    html = page_client.get(page(thread, older.group(1).replace("&amp;", "&"))).content.decode()
    assert len(change_rows(html)) == 1 and 'rel="next"' not in html


def test_every_node_of_the_state_tree_links_its_history(
    page_client: Client, thread: Thread, run: list[Checkpoint]
) -> None:
    html = page_client.get(f"/checkpoints/{run[2].pk}/").content.decode()

    base = f"/threads/{thread.pk}/history/?from={run[2].pk}&amp;path="
    for path in ("/config", BATCH, "/log"):
        assert f'<a class="value-history" href="{base}{quote(path, safe="")}"' in html
    assert html.count('class="value-history"') == html.count('class="copy-path"')


def test_the_history_page_costs_a_fixed_number_of_queries(
    page_client: Client, thread: Thread, run: list[Checkpoint], django_assert_max_num_queries: Any
) -> None:
    parent = run[2]
    for i in range(30):
        parent = storage.append_checkpoint(thread=thread, parent=parent,
                                           patch=[{"op": "replace", "path": BATCH, "value": i}])  # fmt: skip
    page_client.get(page(thread, f"path={BATCH}"))  # indexes the thread
    storage.clear_caches()

    with django_assert_max_num_queries(HISTORY_PAGE_QUERIES):
        response = page_client.get(page(thread, f"path={BATCH}"))
    assert response.status_code == 200
    assert len(change_rows(response.content.decode())) == 32
