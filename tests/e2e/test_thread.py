"""Finding a thread, reading its timeline, walking checkpoints with the keyboard and opening a diff,
then watching a new checkpoint arrive on the open page — in Chromium."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from checkpoints import storage
from checkpoints.models import Checkpoint, Thread
from quicksave_agents.keys import create_agent_key, get_or_create_agent
from tests.e2e.conftest import Pages, make_person

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def seed_conversation(steps: int = 60) -> Thread:
    thread, _ = storage.create_thread(agent=get_or_create_agent(name="travel"), external_id="trip-kyoto",
                                    metadata={"customer": "acme"})  # fmt: skip
    parent = storage.append_checkpoint(thread=thread, parent=None, state={"messages": [], "city": "Kyoto"}, step=0,
                                     label="start")  # fmt: skip
    for step in range(1, steps + 1):
        note = f"Step {step}: compared ryokan prices near Gion and Arashiyama for the second week of April."
        ops: list[dict[str, Any]] = [
            {"op": "add", "path": "/messages/-", "value": {"role": "assistant", "content": note}}
        ]
        if step == 30:
            ops.append({"op": "replace", "path": "/city", "value": "Osaka"})
        parent = storage.append_checkpoint(thread=thread, parent=parent, patch=ops, step=step, label=f"plan {step}",
                                         model={"name": "planner-large", "temperature": 0.2})  # fmt: skip
    if steps < 20:
        return thread
    fork_point = Checkpoint.objects.get(thread=thread, seq=20)
    storage.start_branch(thread=thread, at=fork_point, name="cheaper-hotels")
    budget = [{"op": "add", "path": "/budget", "value": 900}]
    storage.append_checkpoint(thread=thread, parent=fork_point, branch="cheaper-hotels", patch=budget, step=20,
                            label="retry cheaper")  # fmt: skip
    return thread


def test_a_viewer_finds_a_thread_walks_its_timeline_and_reads_a_diff(tab: Pages) -> None:
    make_person("vera", "viewer")
    thread = seed_conversation()
    tab.login("vera")

    tab.page.fill("#f-q", "customer:acme")
    tab.follow("form.filters button[type=submit]")
    tab.follow("#threads a:has-text('trip-kyoto')")
    assert tab.page.title() == "trip-kyoto · travel · Quicksave"
    assert tab.page.locator("#timeline tbody tr[data-seq]").count() == 50  # the newest page
    assert tab.page.locator("#timeline tbody tr[data-seq]").first.get_attribute("data-seq") == "61"
    assert tab.page.locator(".tree-wrap svg").count() == 0  # folded below the timeline, not drawn yet
    tab.page.click("#drawings summary")
    tab.page.locator(".tree-wrap svg").wait_for()
    assert "cheaper-hotels" in tab.page.locator(".tree-wrap svg").inner_html()
    tab.shot("thread")

    tab.follow("a[rel=next]")  # older
    assert tab.page.locator("#timeline tbody tr[data-seq]").first.get_attribute("data-seq") == "11"

    tab.goto(f"/threads/{thread.pk}/")
    tab.follow("#timeline tbody tr[data-seq='31'] a >> nth=0")
    assert tab.page.title().startswith("#31")
    tab.press("k")  # the previous checkpoint
    assert tab.page.title().startswith("#30")
    tab.press("j")
    assert tab.page.title().startswith("#31")
    tab.shot("checkpoint")

    tab.follow("text=What changed")
    diff = tab.page.locator("#diff").inner_text()
    assert "+1 message" in diff
    assert "/city" in diff and "Osaka" in diff
    tab.shot("diff")
    tab.follow("a:has-text('Side by side')")
    assert tab.page.locator("#diff .split").count() >= 1
    tab.shot("diff side by side")


def test_a_checkpoint_written_through_the_api_appears_on_the_open_page(tab: Pages, server_url: str) -> None:
    make_person("vera", "viewer")
    thread = seed_conversation(steps=5)
    _, key = create_agent_key(agent=get_or_create_agent(name="travel"))
    tab.login("vera")
    tab.goto(f"/threads/{thread.pk}/")
    tab.page.wait_for_selector("#live-status[data-state='live']", timeout=15_000)
    assert tab.page.locator("#timeline tbody tr[data-seq]").first.get_attribute("data-seq") == "6"

    head, _ = storage.latest_state(thread=thread)
    with httpx.Client(base_url=server_url, headers={"Authorization": f"Bearer {key}"}) as api:
        written = api.post(f"/api/v1/threads/{thread.pk}/checkpoints/", json={
            "parent": str(head), "label": "booked", "status": "completed",
            "patch": [{"op": "add", "path": "/booking", "value": {"hotel": "Gion Inn"}}],
        })  # fmt: skip
    assert written.status_code == 201, written.text

    tab.page.wait_for_selector("#timeline tbody tr[data-seq='7']", timeout=15_000)  # no reload
    assert "booked" in tab.page.locator("#timeline tbody tr[data-seq='7']").inner_text()
    assert "Completed" in tab.page.locator(".thread-title .badge").inner_text()
    tab.shot("live row")


def test_an_approval_asked_through_the_api_appears_in_the_open_timeline(tab: Pages, server_url: str) -> None:
    make_person("vera", "viewer")
    thread = seed_conversation(steps=5)
    _, key = create_agent_key(agent=get_or_create_agent(name="travel"))
    tab.login("vera")
    tab.goto(f"/threads/{thread.pk}/")
    tab.page.wait_for_selector("#live-status[data-state='live']", timeout=15_000)
    assert tab.page.locator("#timeline tr[data-type='approval.requested']").count() == 0

    head, _ = storage.latest_state(thread=thread)
    with httpx.Client(base_url=server_url, headers={"Authorization": f"Bearer {key}"}) as api:
        asked = api.post(f"/api/v1/threads/{thread.pk}/approvals/",
                         json={"checkpoint": str(head), "action": "book_ryokan", "args": {"nights": 3}})  # fmt: skip
    assert asked.status_code == 201, asked.text

    row = tab.page.locator("#timeline tr[data-type='approval.requested']")
    row.wait_for(timeout=15_000)  # no reload
    assert "Approval asked: book_ryokan" in row.inner_text()
    # Newest first: the event sits above the checkpoint it was asked at.
    kinds = tab.page.eval_on_selector_all(
        "#timeline tbody tr", "rows => rows.map(r => r.dataset.type || r.dataset.seq)"
    )
    assert kinds.index("approval.requested") < kinds.index("6")
    tab.shot("live event")
