"""An in-doubt call in Chromium: it appears in an open inbox without a reload, its page says what is
known about the call, and a reviewer's answer resumes the agent."""

from __future__ import annotations

from typing import Any

import pytest

from approvals.models import ApprovalKind, ApprovalRequest
from checkpoints.models import Checkpoint, Thread, ThreadStatus
from quicksave_agents import tool_calls
from quicksave_agents.demo import FILES, CodeReviewAgent
from quicksave_agents.models import ToolCallState
from quicksave_agents.runtime import start_thread
from quicksave_agents.worker import Worker
from tests.e2e.conftest import Pages, make_person

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def drain() -> None:
    worker = Worker(agent_names=[CodeReviewAgent.name], name="e2e")
    while worker.run_once():
        pass


def test_an_in_doubt_call_appears_live_and_its_answer_resumes_the_agent(browser: Any, server_url: str) -> None:
    make_person("rita", "reviewer")
    thread = start_thread(agent_class=CodeReviewAgent, external_id="review-in-doubt")
    start = Checkpoint.objects.get(thread=thread, seq=1)
    # An attempt recorded its intent to post the first review, then died: nobody knows if it posted.
    key = tool_calls.call_key(thread_id=thread.pk, checkpoint_id=start.pk, position=0)
    tool_calls.begin(thread_id=thread.pk, key=key, tool="review_file",
                     args={"repository": "acme/shop", "path": FILES[0]})  # fmt: skip

    context = browser.new_context(viewport={"width": 1280, "height": 900})
    pages = Pages(context.new_page(), server_url, "in-doubt")
    pages.login("rita")
    pages.goto("/inbox/")
    pages.page.wait_for_selector("#live-status[data-state='live']", timeout=15_000)

    drain()  # the replay finds the call in doubt and stops
    item = ApprovalRequest.objects.get(thread=thread, kind=ApprovalKind.IN_DOUBT)
    row = pages.page.wait_for_selector(f"tr[data-approval='{item.pk}']", timeout=15_000)
    assert row is not None and "In doubt" in row.inner_text()
    pages.shot("inbox")

    pages.follow(f"tr[data-approval='{item.pk}'] a >> text=review_file")
    assert "In doubt: review_file" in pages.page.inner_text("h1")
    facts = pages.page.inner_text("#call-facts")
    assert key in facts and "a write outside any run" in facts
    assert FILES[0] in pages.page.inner_text("#proposed-args")
    pages.shot("page")

    pages.follow("#not-happened")
    assert "It did not happen" in pages.page.inner_text("#resolution")
    pages.shot("answered")
    drain()

    thread.refresh_from_db()
    assert thread.status == ThreadStatus.COMPLETED
    assert not Thread.objects.get(pk=thread.pk).tool_calls.exclude(state=ToolCallState.DONE).exists()
    assert pages.errors == []
    context.close()
