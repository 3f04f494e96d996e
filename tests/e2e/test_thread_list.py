"""Signing in and finding a thread among many, in Chromium."""

from __future__ import annotations

from typing import Any

import pytest

from checkpoints import storage
from quicksave_agents.keys import get_or_create_agent
from tests.e2e.conftest import Pages, make_person

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def seed_threads() -> None:
    travel, review = get_or_create_agent(name="travel"), get_or_create_agent(name="code-review")
    for n in range(6):
        agent = travel if n % 2 == 0 else review
        thread, _ = storage.create_thread(
            agent=agent, external_id=f"run-{n}", metadata={"customer": "acme" if n < 3 else "globex"}
        )
        parent = storage.append_checkpoint(thread=thread, parent=None, state={"messages": []}, step=0, label="start")
        status = "completed" if n == 4 else "failed" if n == 5 else "running"
        ops = [{"op": "add", "path": "/messages/-", "value": "hi"}]
        storage.append_checkpoint(thread=thread, parent=parent, patch=ops, step=1, label="plan", status=status)


def test_signing_in_lands_on_the_thread_list_and_filters_narrow_it(tab: Pages, db: Any) -> None:
    make_person("vera", "viewer")
    seed_threads()

    tab.goto("/")
    assert "/login/" in tab.page.url  # every page needs a sign-in
    tab.shot("login")
    tab.login("vera")

    assert tab.page.title() == "Threads · Quicksave"
    rows = tab.page.locator("#threads tbody tr")
    assert rows.count() == 6
    tab.shot("thread list")

    tab.page.select_option("#f-agent", "travel")
    tab.page.fill("#f-q", "customer:acme")
    tab.page.click("form.filters button[type=submit]")
    tab.page.wait_for_load_state()
    names = tab.page.locator("#threads tbody tr td:first-child a").all_inner_texts()
    assert sorted(names) == ["run-0", "run-2"]
    tab.shot("filtered")

    tab.page.click("a.count:has-text('Failed')")
    tab.page.wait_for_load_state()
    assert tab.page.locator(".empty h2").inner_text() == "No threads match these filters"


def test_a_new_install_explains_how_to_connect_an_agent(tab: Pages, db: Any) -> None:
    make_person("vera", "viewer")
    tab.login("vera")
    empty = tab.page.locator(".empty")
    assert "createagentkey" in empty.inner_text()
    assert "/api/v1" in empty.inner_text()
    tab.shot("empty state")


def test_a_person_without_a_role_is_told_to_ask_for_one(tab: Pages, db: Any) -> None:
    make_person("sam", None)
    tab.login("sam")
    assert "grantrole" in tab.page.locator("main").inner_text()
    assert tab.page.title() == "Not allowed · Quicksave"
    tab.errors.clear()  # Chromium logs the 403 response itself as a console error; that is the point here


def test_the_thread_list_follows_new_threads_and_checkpoints_without_a_reload(tab: Pages, db: Any) -> None:
    make_person("vera", "viewer")
    seed_threads()
    tab.login("vera")
    loads: list[str] = []
    tab.page.on("load", lambda page: loads.append(page.url))
    tab.page.fill("#f-q", "customer:acme")  # half-typed filters survive the updates
    tab.page.wait_for_selector("#live-status[data-state='live']", timeout=15_000)

    thread, _ = storage.create_thread(agent=get_or_create_agent(name="travel"), external_id="run-live")
    first = storage.append_checkpoint(thread=thread, parent=None, state={}, step=0, label="start")
    tab.page.wait_for_selector("#threads tbody tr:has-text('run-live')", timeout=15_000)
    assert tab.page.locator("#threads tbody tr").first.inner_text().startswith("run-live")  # newest activity first

    storage.append_checkpoint(thread=thread, parent=first, state={"done": True}, step=1, label="finish",
                            status="completed")  # fmt: skip
    row = tab.page.locator("#threads tbody tr:has-text('run-live')")
    tab.page.wait_for_function(
        "() => document.querySelector('#threads tbody tr')?.innerText.includes('Completed')", timeout=15_000
    )
    assert "#2 finish" in row.inner_text()
    assert "All 7" in tab.page.locator("#thread-counts").inner_text().replace("\n", " ")
    assert loads == [] and tab.page.locator("#f-q").input_value() == "customer:acme"
    tab.shot("live list")
