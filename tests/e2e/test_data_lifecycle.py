"""Data lifecycle pages in Chromium: a large value shown by its preview and downloaded, and an
admin deleting a thread after a confirmation that says what will be destroyed."""

from __future__ import annotations

from pathlib import Path

import pytest

from checkpoints import storage
from checkpoints.models import Thread, ThreadKey
from quicksave_agents.keys import get_or_create_agent
from tests.e2e.conftest import Pages, make_person

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# Above the default QUICKSAVE_OFFLOAD_BYTES (256 KiB), so it lives in blob storage.
CONTRACT = "".join(f"Clause {n}: the supplier delivers on time or pays a penalty. " for n in range(6000))


def test_a_viewer_sees_a_large_value_by_its_preview_and_downloads_it(tab: Pages, tmp_path: Path) -> None:
    make_person("vic", "viewer")
    thread, _ = storage.create_thread(agent=get_or_create_agent(name="travel"), external_id="contract-review")
    head = storage.append_checkpoint(thread=thread, parent=None, label="read contract",
                                   state={"contract": CONTRACT, "summary": "standard terms"})  # fmt: skip

    tab.login("vic")
    tab.goto(f"/checkpoints/{head.pk}/")
    section = tab.page.locator("#large-values")
    assert "/contract" in section.inner_text() and "Clause 0: the supplier" in section.inner_text()
    assert CONTRACT[:2000] not in tab.page.content()  # a placeholder stands in for the value
    tab.shot("large value")
    with tab.page.expect_download() as download:
        section.locator("a", has_text="Download").click()
    saved = tmp_path / "contract.txt"
    download.value.save_as(saved)
    assert saved.read_text() == CONTRACT


def test_an_admin_deletes_a_thread_after_confirming(tab: Pages) -> None:
    make_person("ada", "admin")
    thread, _ = storage.create_thread(agent=get_or_create_agent(name="travel"), external_id="to-erase")
    first = storage.append_checkpoint(thread=thread, parent=None, state={"guest": "Ms Example"}, label="book")
    storage.append_checkpoint(thread=thread, parent=first, state={"guest": "Ms Example", "paid": True}, label="pay")

    tab.login("ada")
    tab.goto(f"/threads/{thread.pk}/")
    tab.follow("#delete-thread")
    heading = tab.page.locator("h1").inner_text()
    assert heading == "Delete this thread for good?"
    assert "All 2 checkpoints" in tab.page.locator("#action").inner_text()
    tab.shot("confirm delete")
    tab.page.fill("#action-reason", "guest asked for erasure")
    tab.follow("#confirm-action")

    assert tab.page.url.rstrip("/") == tab.base_url
    assert "to-erase was deleted and its data key destroyed" in tab.page.locator(".flash").inner_text()
    tab.shot("after delete")
    assert not Thread.objects.filter(pk=thread.pk).exists()
    assert not ThreadKey.objects.filter(thread_id=thread.pk).exists()
