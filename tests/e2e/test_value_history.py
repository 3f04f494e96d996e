"""A value's history in Chromium: opened from a node of the state tree (by mouse and by the "h"
key), each change's diff followed from it, and the diff page's searchable pickers."""

from __future__ import annotations

from typing import Any

import pytest

from checkpoints import storage
from checkpoints.models import Checkpoint
from quicksave_agents.keys import get_or_create_agent
from tests.e2e.conftest import Pages, make_person

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

BATCH = "/config/batch_size"


def migration_run() -> list[Checkpoint]:
    """#1 batch 32 → #2 a log line → #3 batch 64 ("tune") → #4 a log line."""
    thread, _ = storage.create_thread(agent=get_or_create_agent(name="migrate"), external_id="migration-e2e")
    first = storage.append_checkpoint(thread=thread, parent=None, label="start",
                                      state={"config": {"batch_size": 32, "lr": 0.1}, "log": []})  # fmt: skip
    copied = [{"op": "add", "path": "/log/-", "value": "copied 1,000 rows"}]
    second = storage.append_checkpoint(thread=thread, parent=first, label="copy", patch=copied)
    third = storage.append_checkpoint(thread=thread, parent=second, label="tune",
                                      patch=[{"op": "replace", "path": BATCH, "value": 64}])  # fmt: skip
    fourth = storage.append_checkpoint(thread=thread, parent=third, label="copy",
                                       patch=[{"op": "add", "path": "/log/-", "value": "out of memory"}])  # fmt: skip
    return [first, second, third, fourth]


def test_history_of_a_value_opens_from_the_state_tree_and_leads_to_the_diff(tab: Pages, db: Any) -> None:
    make_person("vera", "viewer")
    run = migration_run()
    tab.login("vera")
    tab.goto(f"/checkpoints/{run[3].pk}/")

    tab.follow(f"#state-tree a.value-history[aria-label='History of {BATCH}']")

    assert tab.page.locator("#history-path").inner_text() == BATCH
    rows = tab.page.locator("#history > li")
    assert rows.count() == 2
    newest = tab.page.locator(f"#change-{run[2].pk}")
    assert "main #3 tune" in newest.inner_text()
    assert newest.locator("pre.value.old").inner_text().endswith("32")
    assert newest.locator("pre.value.new").inner_text().endswith("64")
    tab.shot("history of batch_size")

    tab.follow(f"#change-{run[2].pk} a.diff-link")

    assert tab.page.url.endswith(f"/checkpoints/{run[2].pk}/diff/")
    block = tab.page.locator(f"section.diff-op.changed[aria-label='Changed {BATCH}']")
    assert block.is_visible()
    assert block.locator("pre.value.old").inner_text().endswith("32")
    assert block.locator("pre.value.new").inner_text().endswith("64")
    tab.shot("the diff that set it")


def test_the_h_key_opens_the_focused_nodes_history(tab: Pages, db: Any) -> None:
    make_person("vera", "viewer")
    run = migration_run()
    tab.login("vera")
    tab.goto(f"/checkpoints/{run[3].pk}/")

    tab.page.focus("#state-tree summary")  # config
    tab.page.keyboard.press("ArrowDown")  # batch_size
    tab.press("h")

    assert tab.page.locator("#history-path").inner_text() == BATCH
    assert tab.page.locator(f"nav.breadcrumbs a[href='/checkpoints/{run[3].pk}/']").count() == 1


def test_the_diff_pickers_take_a_typed_checkpoint(tab: Pages, db: Any) -> None:
    make_person("vera", "viewer")
    run = migration_run()
    tab.login("vera")
    tab.goto(f"/checkpoints/{run[3].pk}/diff/")
    options = tab.page.locator("#checkpoint-options option")
    assert options.count() == 4

    tab.page.fill("#pick-base", "#1")
    tab.follow("#diff-picker button[type=submit]")

    assert tab.page.locator("#pick-base").input_value() == "main #1 start"
    # Added values are open: the log lines appended since #1 show without a click.
    assert tab.page.get_by_text("out of memory").is_visible()
    tab.shot("diff from a typed base")
    tab.follow("nav.segmented a:has-text('Side by side')")
    assert tab.page.get_by_text("out of memory").is_visible()
    assert "—" not in tab.page.locator("#diff").inner_text()
    tab.shot("side by side")
