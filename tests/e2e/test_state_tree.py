"""The state tree by keyboard in Chromium: one Tab stop, arrow keys inside, "c" copies a path."""

from __future__ import annotations

from typing import Any

import pytest

from approvals.models import ApprovalRequest
from checkpoints import storage
from quicksave_agents.demo import TravelAgent
from quicksave_agents.keys import get_or_create_agent
from quicksave_agents.runtime import start_thread
from quicksave_agents.worker import Worker
from tests.e2e.conftest import Pages, make_person

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

TAB_STOPS = """() => [...document.querySelectorAll('#state-tree summary, #state-tree li.leaf, #state-tree button')]
    .filter((element) => element.tabIndex >= 0).length"""
FOCUSED = "() => document.activeElement.closest('summary, li.leaf')?.innerText.split(':')[0].trim() ?? null"


def test_the_state_tree_is_one_tab_stop_walked_with_arrow_keys(tab: Pages, db: Any) -> None:
    make_person("vera", "viewer")
    thread, _ = storage.create_thread(agent=get_or_create_agent(name="travel"), external_id="trip-keys")
    state = {"booking": {"flight": "AZ611", "seats": [12, 13]}, "city": "Rome", "nights": 2}
    checkpoint = storage.append_checkpoint(thread=thread, parent=None, state=state)
    tab.login("vera")
    tab.goto(f"/checkpoints/{checkpoint.pk}/")

    assert tab.page.evaluate(TAB_STOPS) == 1  # it was one per node and one per copy button
    tab.page.focus("#state-tree summary")
    assert tab.page.evaluate(FOCUSED) == "booking"
    tab.page.keyboard.press("ArrowDown")
    assert tab.page.evaluate(FOCUSED) == "flight"
    tab.page.keyboard.press("c")  # copies /booking/flight through its button
    copy = tab.page.locator("#state-tree button[data-path='/booking/flight']")
    assert copy.inner_text() in ("copied", "copy failed")  # the clipboard may be refused headless
    tab.page.keyboard.press("ArrowLeft")  # a leaf goes to its parent
    assert tab.page.evaluate(FOCUSED) == "booking"
    tab.page.keyboard.press("ArrowLeft")  # an open node closes
    tab.page.keyboard.press("ArrowDown")  # its children are skipped now
    assert tab.page.evaluate(FOCUSED) == "city"
    assert tab.page.evaluate(TAB_STOPS) == 1
    tab.page.keyboard.press("Tab")  # out of the tree in one step
    assert tab.page.evaluate("() => document.getElementById('state-tree').contains(document.activeElement)") is False
    tab.shot("tree by keyboard")


def test_the_approval_pages_state_tree_copies_paths_too(tab: Pages, db: Any) -> None:
    make_person("rita", "reviewer")
    thread = start_thread(agent_class=TravelAgent, external_id="trip-copy", destination="FCO")
    worker = Worker(name="e2e")
    while worker.run_once():
        pass
    approval = ApprovalRequest.objects.get(thread=thread)
    tab.login("rita")
    tab.goto(f"/inbox/{approval.pk}/")

    button = tab.page.locator("#state-tree button[data-path='/phase']")
    button.click()  # this page loaded no copy handler before: the button did nothing
    assert button.inner_text() in ("copied", "copy failed")
    assert tab.page.evaluate(TAB_STOPS) == 1
