"""The memory browser in Chromium: an admin finds an item through the namespace tree, sees what an
agent's last write changed, edits the value with a reason, then goes back to the first version;
and open item and namespace pages show an agent's writes as they happen."""

from __future__ import annotations

import httpx
import pytest

from audit.models import AuditEntry
from memory import selectors, store
from memory.access import EVERYTHING
from quicksave_agents.keys import create_agent_key, get_or_create_agent
from tests.e2e.conftest import Pages, make_person

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# Its own namespace: the live server process caches namespaces across tests (another test makes users.alice).
NS = ("customers", "alice")
LIVE_NS = ("customers", "bob")


def test_an_admin_edits_a_remembered_preference_and_goes_back_to_the_first_version(tab: Pages) -> None:
    make_person("ada", "admin")
    system = store.Author.system("tests")
    store.put_item(namespace=NS, key="prefs", value={"seat": "aisle", "meal": "any"}, author=system, scope=EVERYTHING)
    store.put_item(namespace=NS, key="prefs", value={"seat": "window", "meal": "any"}, author=system, scope=EVERYTHING)

    tab.login("ada")
    tab.goto("/memory/")
    tab.follow(".memory-tree a:text-is('alice')")
    tab.follow("#memory-items a:text-is('prefs')")
    newest = tab.page.locator("#memory-history tr[data-version='2']")
    assert "/seat" in newest.inner_text() and "window" in newest.locator("ins").inner_text()
    tab.shot("item")

    tab.page.fill("#id_value", '{"seat": "window", "meal": "vegetarian"}')
    tab.page.fill("#id_reason", "she told support")
    tab.follow("#save-item")
    assert "Saved as version 3" in tab.page.inner_text("main")
    assert "vegetarian" in tab.page.inner_text("#memory-value")

    tab.follow("#memory-history tr[data-version='1'] a.button")
    tab.page.fill("#id_reason", "the edits were a mistake")
    tab.follow("#confirm-rollback")

    current = selectors.get_item(namespace=NS, key="prefs", scope=EVERYTHING)
    assert current is not None and (current.version, current.value) == (4, {"seat": "aisle", "meal": "any"})
    assert "Version 1 is back, as version 4" in tab.page.inner_text("main")
    audited = AuditEntry.objects.filter(action__startswith="memory.").order_by("created_at")
    assert list(audited.values_list("action", flat=True)) == [
        "memory.item_edited", "memory.item_rolled_back",
    ]  # fmt: skip
    tab.shot("rolled back")


def test_open_memory_pages_show_an_agents_writes_without_a_reload(tab: Pages, server_url: str) -> None:
    make_person("ada", "admin")
    _, raw_key = create_agent_key(agent=get_or_create_agent(name="travel"))
    agent = httpx.Client(base_url=server_url, headers={"Authorization": f"Bearer {raw_key}"}, timeout=10)

    def remember(key: str, value: dict[str, str]) -> None:
        response = agent.put(f"/api/v1/memory/namespaces/{'.'.join(LIVE_NS)}/items/{key}/", json={"value": value})
        assert response.status_code in (200, 201), response.text

    remember("prefs", {"seat": "aisle"})
    tab.login("ada")
    tab.goto(f"/memory/item/?ns={LIVE_NS[0]}&ns={LIVE_NS[1]}&key=prefs")
    tab.page.wait_for_selector("#live-status[data-state='live']", timeout=15_000)
    assert tab.page.locator("#edit-stale").is_hidden()

    remember("prefs", {"seat": "window"})

    tab.page.wait_for_selector("#memory-history tr[data-version='2']", timeout=15_000)  # no reload
    assert "window" in tab.page.inner_text("#memory-value")
    assert "agent travel" in tab.page.inner_text("#memory-history tr[data-version='2']")
    assert tab.page.locator("#edit-stale").is_visible()  # its form was opened on version 1
    tab.shot("item written meanwhile")

    tab.goto(f"/memory/?ns={LIVE_NS[0]}&ns={LIVE_NS[1]}")
    tab.page.wait_for_selector("#live-status[data-state='live']", timeout=15_000)
    tab.page.fill("#id_q", "half-typed")
    remember("seat-map", {"row": "12"})

    tab.page.wait_for_selector("#memory-items tr[data-key='seat-map']", timeout=15_000)
    assert tab.page.input_value("#id_q") == "half-typed"  # the search form is left alone
    tab.shot("namespace written meanwhile")
    agent.close()
