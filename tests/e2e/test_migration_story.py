"""Issue 27's story in Chromium: a migration fails; from the failure banner the admin opens the
history of `/settings/batch_size`, which names the checkpoint that set it; rewinds from there,
edits the value, branches and resumes; the agent finishes. Three pages: the thread, the value's
history, the rewind."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest

from checkpoints.models import Checkpoint, Thread, ThreadStatus
from quicksave_agents.demo import MigrationAgent
from quicksave_agents.runtime import start_thread
from quicksave_agents.worker import Worker
from tests.e2e.conftest import Pages, make_person

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

BATCH = "/settings/batch_size"


def drain() -> None:
    worker = Worker(name="e2e-story")
    while worker.run_once():
        pass


@pytest.fixture
def story(browser: Any, server_url: str) -> Iterator[tuple[Pages, list[str]]]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    pages = Pages(page, server_url, "test_migration_story")
    seen: list[str] = []
    page.on("framenavigated", lambda frame: seen.append(urlsplit(frame.url).path) if frame == page.main_frame else None)
    yield pages, seen
    context.close()
    assert pages.errors == [], f"console errors: {pages.errors}"


def test_from_the_failure_banner_to_a_finished_migration_in_three_pages(story: tuple[Pages, list[str]]) -> None:
    tab, seen = story
    make_person("ada", "admin")
    thread = start_thread(agent_class=MigrationAgent, external_id="migrate-invoices")
    drain()
    thread.refresh_from_db()
    assert thread.status == ThreadStatus.FAILED
    setter = Checkpoint.objects.get(thread=thread, seq=16)  # step 15 picked batch_size 5000
    tab.login("ada")
    seen.clear()

    # 1. The thread: the failure banner asks which value to trace.
    tab.goto(f"/threads/{thread.pk}/")
    banner = tab.page.locator("#attention.failed")
    assert "batch_size 5000 is too large" in banner.inner_text()
    banner.locator("input[name='path']").fill(BATCH)
    tab.follow("#attention .value-history-form button[type='submit']")

    # 2. The value's history: set once, at #16; rewind from there.
    assert tab.page.locator("#history-path").inner_text() == BATCH
    change = tab.page.locator(f"#change-{setter.pk}")
    assert "#16" in change.inner_text() and "5000" in change.inner_text()
    assert tab.page.locator("#history > li").count() == 1
    tab.follow(f"#change-{setter.pk} a.rewind-link")

    # 3. The rewind: edit the value, name the branch, resume, confirm.
    assert tab.page.title().startswith("Rewind & branch from #16")
    state = json.loads(tab.page.input_value("#fork-state"))
    assert state["settings"] == {"batch_size": 5000}
    state["settings"]["batch_size"] = 500
    tab.page.fill("#fork-state", json.dumps(state, indent=2))
    tab.page.wait_for_function("() => !document.getElementById('fork-state').hasAttribute('aria-invalid')")
    tab.page.fill("#fork-branch", "smaller-batches")
    tab.page.fill("#fork-reason", "5000 rows a batch held locks too long")
    tab.page.check("#fork-resume")
    tab.follow("#fork-review")
    tab.press("Enter")

    drain()  # the fork's run: the agent goes on from #16 with 500 and finishes
    thread.refresh_from_db()
    assert thread.status == ThreadStatus.COMPLETED
    head = Checkpoint.objects.select_related("branch").get(pk=str(thread.head_id))
    assert (head.branch.name, head.label) == ("smaller-batches", "migration complete")
    assert Thread.objects.filter(pk=thread.pk, status=ThreadStatus.COMPLETED).exists()
    pages = {re.sub(r"[0-9a-f]{8}-[0-9a-f-]{27}", "{id}", path) for path in seen}
    assert pages == {"/threads/{id}/", "/threads/{id}/history/", "/checkpoints/{id}/fork/"}, seen
