"""The checkpoint page, live in Chromium: a checkpoint written after the one shown, or an approval
asked and decided in its thread, reaches the open page without a reload, and leaves the state tree
and a half-typed fork reason alone."""

from __future__ import annotations

from typing import Any

import pytest

from approvals.services import decide, request_approval
from checkpoints import storage
from checkpoints.models import Checkpoint, Thread
from quicksave_agents.keys import get_or_create_agent
from tests.e2e.conftest import Pages, make_person

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

LIVE = "#live-status[data-state='live']"


def trip() -> tuple[Thread, list[Checkpoint]]:
    thread, _ = storage.create_thread(agent=get_or_create_agent(name="travel"), external_id="trip-porto")
    first = storage.append_checkpoint(thread=thread, parent=None, step=0, label="start",
                                    state={"city": "Porto", "nights": 2})  # fmt: skip
    second = storage.append_checkpoint(thread=thread, parent=first, step=1, label="search_hotels",
                                     patch=[{"op": "add", "path": "/hotel", "value": "Ribeira"}])  # fmt: skip
    return thread, [first, second]


def open_live(pages: Pages, checkpoint: Checkpoint) -> list[str]:
    """Open a checkpoint page once its feed is live; returns the page loads seen from then on."""
    loads: list[str] = []
    pages.page.on("load", lambda page: loads.append(page.url))
    pages.goto(f"/checkpoints/{checkpoint.pk}/")
    pages.page.wait_for_selector(LIVE, timeout=15_000)
    return loads


def test_a_checkpoint_written_after_the_head_shows_a_notice_and_enables_next(tab: Pages) -> None:
    make_person("ada", "admin")
    thread, (_, head) = trip()
    tab.login("ada")
    loads = open_live(tab, head)
    assert tab.page.locator("a[rel=next]").count() == 0
    assert tab.page.locator("#step-nav button:has-text('Next')").is_disabled()
    assert tab.page.locator("#newer-checkpoints .newer").count() == 0
    # What the reader has open or typed must survive the update.
    tab.page.evaluate("window.shownTree = document.getElementById('state-tree')")
    tab.page.fill("#fork-reason", "Try the hotel across the river")

    booked = storage.append_checkpoint(thread=thread, parent=head, step=2, label="book_hotel",
                                     patch=[{"op": "add", "path": "/booked", "value": True}])  # fmt: skip

    tab.page.wait_for_selector("a[rel=next]", timeout=15_000)
    notice = tab.page.locator("#newer-checkpoints .newer")
    notice.wait_for(state="visible")
    assert "#3 book_hotel follows this one" in notice.inner_text()
    assert tab.page.get_attribute("a[rel=next]", "href") == f"/checkpoints/{booked.pk}/"
    assert notice.locator("a", has_text="open it").get_attribute("href") == f"/checkpoints/{booked.pk}/"
    assert notice.locator("a", has_text="open the head").count() == 0  # #3 is the head

    # Another one: Next still goes one step on, and the notice offers the head too.
    paid = storage.append_checkpoint(thread=thread, parent=booked, step=3, label="pay",
                                   patch=[{"op": "add", "path": "/paid", "value": True}])  # fmt: skip
    to_head = notice.locator("a", has_text="open the head")
    to_head.wait_for(timeout=15_000)
    assert to_head.get_attribute("href") == f"/checkpoints/{paid.pk}/"
    assert "#4 pay" in to_head.inner_text()
    assert tab.page.get_attribute("a[rel=next]", "href") == f"/checkpoints/{booked.pk}/"

    assert len(loads) == 1, loads  # no reload
    assert tab.page.evaluate("window.shownTree === document.getElementById('state-tree')")
    assert tab.page.input_value("#fork-reason") == "Try the hotel across the river"
    assert tab.page.title().startswith("#2 search_hotels")
    assert tab.errors == []
    tab.page.wait_for_timeout(2_600)  # past the glow, for a screenshot of the settled page
    tab.shot("newer checkpoints")

    tab.page.locator("body").click(position={"x": 5, "y": 300})  # out of the fork reason
    tab.press("j")  # the swapped-in Next works from the keyboard
    assert tab.page.title().startswith("#3 book_hotel")


def test_an_approval_asked_and_decided_in_the_thread_shows_and_leaves_the_banner(browser: Any, server_url: str) -> None:
    make_person("vera", "viewer")
    rex = make_person("rex", "reviewer")
    thread, (_, head) = trip()
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    vera = Pages(context.new_page(), server_url, "checkpoint-approval")
    vera.login("vera")
    loads = open_live(vera, head)
    assert vera.page.locator("#attention").count() == 0

    approval = request_approval(thread=thread, checkpoint=head, action="book_hotel", args={"hotel": "Ribeira"},
                                message="Two nights at the Ribeira")  # fmt: skip
    banner = vera.page.locator("#attention")
    banner.wait_for(timeout=15_000)
    assert "book_hotel" in banner.inner_text()
    assert banner.locator("a", has_text="Review the request").get_attribute("href") == f"/inbox/{approval.pk}/"
    vera.shot("waiting for a decision")

    decide(approval=approval, user=rex, decision="reject", comment="Too dear")
    banner.wait_for(state="detached", timeout=15_000)
    assert len(loads) == 1, loads
    assert vera.page.locator("#newer-checkpoints .newer").count() == 0  # no checkpoint came
    assert vera.errors == []
    context.close()
