"""The nav's Inbox count follows the requests live on every page, not only on the inbox's own."""

from __future__ import annotations

import pytest

from approvals.services import decide, request_approval
from checkpoints import storage
from quicksave_agents.keys import get_or_create_agent
from tests.e2e.conftest import Pages, make_person

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

COUNT = "#nav-inbox .nav-count"


@pytest.mark.parametrize("path", ["/", "/audit/", "/threads/{thread}/"])
def test_the_inbox_count_in_the_nav_changes_without_a_reload(tab: Pages, path: str) -> None:
    ada = make_person("ada", "admin")
    trips = [
        storage.create_thread(agent=get_or_create_agent(name="travel"), external_id=f"trip-{n}")[0] for n in (1, 2)
    ]
    heads = [storage.append_checkpoint(thread=trip, parent=None, state={"n": 1}) for trip in trips]
    loads: list[str] = []
    tab.login("ada")
    tab.page.on("load", lambda page: loads.append(page.url))
    tab.goto(path.format(thread=trips[0].pk))
    assert tab.page.locator(COUNT).count() == 0

    first = request_approval(thread=trips[0], checkpoint=heads[0], action="book_flight", args={"flight": "SK401"})
    tab.page.wait_for_selector(f"{COUNT}:text-is('1')", timeout=15_000)
    second = request_approval(thread=trips[1], checkpoint=heads[1], action="book_hotel", args={"nights": 2})
    tab.page.wait_for_selector(f"{COUNT}:text-is('2')", timeout=15_000)
    assert tab.page.locator(COUNT).get_attribute("aria-label") == "2 pending"

    decide(approval=first, user=ada, decision="approve")
    tab.page.wait_for_selector(f"{COUNT}:text-is('1')", timeout=15_000)
    decide(approval=second, user=ada, decision="reject", comment="not now")
    tab.page.wait_for_selector(COUNT, state="detached", timeout=15_000)

    assert len(loads) == 1, f"the page reloaded: {loads}"
    tab.shot(f"nav count on {path}")
