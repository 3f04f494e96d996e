"""The rewind story in Chromium: a migration fails at step 20 because of the batch size it chose at
step 15; an admin opens step 14, sets the batch size in the state editor, gives a reason, resumes,
confirms with the keyboard, and the agent completes on the new branch. The branch tree then shows
both branches and the diff between their heads shows the corrected setting and what followed."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from audit.models import AuditEntry
from checkpoints.models import Checkpoint, Thread, ThreadStatus
from quicksave_agents.demo import MigrationAgent
from quicksave_agents.models import Run, RunReason
from quicksave_agents.runtime import start_thread
from quicksave_agents.worker import Worker
from tests.e2e.conftest import Pages, make_person

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

REASON = "batch_size 5000 holds row locks too long on table_20; rerun from step 14 with 500"


def drain() -> None:
    worker = Worker(name="e2e-rewind")
    while worker.run_once():
        pass


@pytest.fixture
def story_tab(browser: Any, server_url: str) -> Iterator[Pages]:
    """One light tab for the long story; the next test shoots the other pages in both schemes."""
    context = browser.new_context(viewport={"width": 1280, "height": 900}, color_scheme="light")
    pages = Pages(context.new_page(), server_url, "test_rewind-light")
    yield pages
    context.close()
    assert pages.errors == [], f"console errors: {pages.errors}"


def test_an_admin_rewinds_a_failed_migration_fixes_the_batch_size_and_the_agent_completes(story_tab: Pages) -> None:
    tab = story_tab
    make_person("ada", "admin")
    thread = start_thread(agent_class=MigrationAgent, external_id="migrate-orders")
    drain()
    thread.refresh_from_db()
    assert (thread.status, thread.step) == (ThreadStatus.FAILED, 20)
    failed_head = thread.head_id

    tab.login("ada")
    tab.goto(f"/threads/{thread.pk}/")
    assert "Failed" in tab.page.locator(".thread-title").inner_text()
    tab.shot("failed thread")

    # The agent's step 14 is #15 (its step 0 is #1): the page numbers checkpoints one way only.
    row = tab.page.locator("#timeline tr[data-seq='15']")
    assert row.locator("td").nth(1).inner_text().startswith("migrate table_14")
    tab.follow("#timeline tr[data-seq='15'] a.mono")
    assert tab.page.title().startswith("#15 migrate table_14")
    card = tab.page.locator("#rewind")
    assert card.is_visible() and "Rewind & branch" in card.locator("h2").inner_text()

    tab.page.click("#state-editor summary")
    state = json.loads(tab.page.input_value("#fork-state"))
    assert state["settings"] == {} and len(state["migrated"]) == 14
    tab.page.fill("#fork-state", '{"settings": {"batch_size": 500}')  # checked in the browser as it is typed
    tab.page.wait_for_selector("#state-errors li")
    assert "not valid JSON" in tab.page.locator("#state-errors").inner_text()
    assert tab.page.get_attribute("#fork-state", "aria-invalid") == "true"
    state["settings"]["batch_size"] = 500
    tab.page.fill("#fork-state", json.dumps(state, indent=2))
    tab.page.wait_for_function("() => !document.getElementById('fork-state').hasAttribute('aria-invalid')")
    tab.page.fill("#fork-reason", REASON)
    tab.page.check("#fork-resume")
    assert tab.page.get_attribute("#fork-branch", "placeholder") == "fork-1"
    card.scroll_into_view_if_needed()
    tab.shot("rewind card")

    tab.follow("#fork-review")
    assert tab.page.title().startswith("Confirm the fork from #15")
    assert tab.page.locator("#summary-branch").inner_text() == "fork-1"
    assert "Resumes from the new checkpoint" in tab.page.locator("#summary-agent").inner_text()
    changes = tab.page.locator("#diff").inner_text()
    assert "/settings" in changes and "500" in changes
    assert Checkpoint.objects.filter(thread=thread).count() == 21  # nothing written before confirming
    tab.shot("confirm fork")

    # The Confirm button has the focus: Enter confirms, no mouse needed.
    assert tab.page.evaluate("document.activeElement.id") == "confirm-fork"
    tab.press("Enter")  # a resumed fork opens the thread's timeline, where the agent goes on
    assert tab.page.url.endswith(f"/threads/{thread.pk}/")
    assert "Branch fork-1 goes on from #15; the agent resumes there." in tab.page.inner_text("main")
    assert "fork: batch_size 5000" in tab.page.locator("#timeline").inner_text()
    tab.shot("new branch")

    thread.refresh_from_db()
    fork_checkpoint = Checkpoint.objects.get(pk=str(thread.head_id))
    assert [(run.reason, run.checkpoint_id) for run in Run.objects.filter(thread=thread, status="queued")] == [
        (RunReason.FORK, fork_checkpoint.pk)
    ]
    assert AuditEntry.objects.get(thread=thread, action="thread.fork").actor_name == "ada"

    drain()  # the worker picks the fork's run up and the agent finishes on the new branch
    thread.refresh_from_db()
    assert thread.status == ThreadStatus.COMPLETED
    new_head = Checkpoint.objects.select_related("branch").get(pk=str(thread.head_id))
    assert (new_head.branch.name, new_head.label, new_head.step) == ("fork-1", "migration complete", 21)

    tab.goto(f"/threads/{thread.pk}/")
    assert "Completed" in tab.page.locator(".thread-title").inner_text()
    tab.page.click("#drawings summary")  # folded below the timeline, drawn when opened
    tree = tab.page.locator("svg#branch-tree")
    tree.wait_for()
    assert tree.locator("g.lane[data-branch='main']").count() == 1
    assert tree.locator("g.lane[data-branch='fork-1']").count() == 1
    assert "fork-1 forks from main #15" in tree.inner_html()
    tab.shot("thread with both branches")

    tab.goto(f"/checkpoints/{new_head.pk}/diff/?base={failed_head}")
    diff = tab.page.locator("#diff")
    setting = diff.locator("section[aria-label='Changed /settings/batch_size']")
    assert "5000" in setting.locator("pre.old").inner_text() and "500" in setting.locator("pre.new").inner_text()
    migrated = diff.locator("section[aria-label='Added /migrated']")
    assert "+1 migrated item" in migrated.inner_text()
    assert "table_20" in migrated.inner_text()  # migrated this time: added values are shown open
    log = diff.locator("section[aria-label='Changed /log/19']").inner_text()
    assert "lock timeout" in log and "rows" in log
    pills = " ".join(tab.page.locator(".compared").inner_text().split())
    assert "base main #21 failed → target fork-1 #8 migration complete" in pills
    tab.shot("diff between branch heads")

    old_head = Thread.objects.get(pk=thread.pk).branches.get(name="main")
    assert Checkpoint.objects.filter(branch=old_head).count() == 21  # main kept every checkpoint


def test_errors_come_back_inline_and_cancel_and_resume_confirm_with_a_reason(
    tab: Pages, browser: Any, server_url: str
) -> None:
    make_person("ada", "admin")
    make_person("rita", "reviewer")
    thread = start_thread(agent_class=MigrationAgent, external_id="migrate-invoices")
    drain()
    step_14 = Checkpoint.objects.get(thread=thread, step=14)

    # A reviewer reads the checkpoint but is offered no way to rewind it.
    context = browser.new_context()
    reviewer = Pages(context.new_page(), server_url, "reviewer")
    reviewer.login("rita")
    reviewer.goto(f"/checkpoints/{step_14.pk}/")
    assert reviewer.page.locator("#rewind, #fork-form, #rerun").count() == 0
    assert reviewer.errors == []
    context.close()

    tab.login("ada")
    tab.goto(f"/checkpoints/{step_14.pk}/fork/")
    assert tab.page.title().startswith("Rewind & branch from #15")
    tab.page.fill("#fork-reason", "try a branch that exists")
    tab.page.fill("#fork-branch", "main")
    tab.follow("#fork-review")
    assert "already has a branch named 'main'" in tab.page.locator("#branch-errors").inner_text()
    assert tab.page.get_attribute("#fork-branch", "aria-invalid") == "true"
    assert tab.page.input_value("#fork-reason") == "try a branch that exists"  # what was typed is kept
    tab.errors.clear()  # Chromium logs the 409 answer itself as a console error
    tab.shot("fork form with an error")

    tab.goto(f"/threads/{thread.pk}/resume/")
    assert tab.page.title().startswith("Resume · migrate-invoices")
    assert tab.page.evaluate("document.activeElement.id") == "action-reason"
    tab.page.keyboard.type("the lock on table_20 is gone")
    tab.shot("resume confirmation")
    tab.page.keyboard.press("Tab")
    tab.press("Enter")
    assert tab.page.url.endswith(f"/threads/{thread.pk}/")
    assert Run.objects.filter(thread=thread, reason=RunReason.MANUAL, status="queued").count() == 1

    tab.goto(f"/threads/{thread.pk}/cancel/")
    assert "1 queued run is cancelled" in tab.page.locator(".consequences").inner_text()
    tab.shot("cancel confirmation")
    tab.page.click("#confirm-action")
    assert tab.page.evaluate("document.getElementById('action-reason').validity.valueMissing")  # not sent
    assert tab.page.url.endswith("/cancel/")
    tab.page.fill("#action-reason", "superseded by the new schema")
    tab.follow("#confirm-action")
    assert "Cancelled" in tab.page.locator(".thread-title").inner_text()
    assert AuditEntry.objects.filter(thread=thread, action__in=["thread.resume", "thread.cancel"]).count() == 2


def test_the_failure_banner_and_every_row_rewind_to_their_own_checkpoint(story_tab: Pages, browser: Any,
                                                                        server_url: str) -> None:  # fmt: skip
    tab = story_tab
    make_person("ada", "admin")
    make_person("vera", "viewer")
    thread = start_thread(agent_class=MigrationAgent, external_id="migrate-users")
    drain()
    thread.refresh_from_db()
    failed = Checkpoint.objects.get(pk=str(thread.head_id))
    assert (thread.status, failed.seq) == (ThreadStatus.FAILED, 21)

    tab.login("ada")
    tab.goto(f"/threads/{thread.pk}/")
    banner = tab.page.locator("#attention.failed")
    assert "lock wait timeout" in banner.inner_text()
    tab.follow("#attention a.rewind-link")
    assert tab.page.url.endswith(f"/checkpoints/{failed.pk}/fork/")
    assert tab.page.title().startswith("Rewind & branch from #21")
    state = json.loads(tab.page.input_value("#fork-state"))  # the failed step's state, ready to edit
    assert state["settings"] == {"batch_size": 5000} and len(state["migrated"]) == 19
    tab.shot("rewind from the failure banner")

    tab.goto(f"/threads/{thread.pk}/")
    tab.follow("#timeline tr[data-seq='16'] a.rewind-link")
    assert tab.page.title().startswith("Rewind & branch from #16")
    assert json.loads(tab.page.input_value("#fork-state"))["settings"] == {"batch_size": 5000}

    # A viewer may not fork: no rewind anywhere on the page.
    context = browser.new_context()
    viewer = Pages(context.new_page(), server_url, "viewer-rewind")
    viewer.login("vera")
    viewer.goto(f"/threads/{thread.pk}/")
    assert viewer.page.locator("#attention.failed").is_visible()
    assert viewer.page.locator("a.rewind-link").count() == 0
    assert viewer.errors == []
    context.close()
