"""The memory browser in Chromium: an admin finds an item through the namespace tree, sees what an
agent's last write changed, edits the value with a reason, then goes back to the first version."""

from __future__ import annotations

import pytest

from audit.models import AuditEntry
from memory import selectors, store
from memory.access import EVERYTHING
from tests.e2e.conftest import Pages, make_person

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# Its own namespace: the live server process caches namespaces across tests (another test makes users.alice).
NS = ("customers", "alice")


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
