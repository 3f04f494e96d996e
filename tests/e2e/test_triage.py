"""In Chromium: a reviewer clears five approvals from the inbox by keyboard alone, and approves
low-risk requests together after one confirmation."""

from __future__ import annotations

from typing import Any

import pytest

from approvals.models import ApprovalRequest, ApprovalStatus
from approvals.services import request_approval
from checkpoints import storage
from quicksave_agents.keys import get_or_create_agent
from tests.e2e.conftest import Pages, make_person

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def ask(index: int, risk: str = "medium") -> ApprovalRequest:
    thread, _ = storage.create_thread(agent=get_or_create_agent(name="travel"), external_id=f"trip-{index}")
    checkpoint = storage.append_checkpoint(thread=thread, parent=None, state={"n": index}, label="book_flight",
                                           status="waiting_for_approval")  # fmt: skip
    return request_approval(thread=thread, checkpoint=checkpoint, action="book_flight", risk=risk,
                            args={"flight": f"SK{100 + index}"})  # fmt: skip


def selected(tab: Pages) -> str:
    return str(tab.page.locator("#inbox-body tr.selected").get_attribute("data-approval"))


def test_a_reviewer_clears_five_approvals_by_keyboard_alone(tab: Pages, db: Any) -> None:
    make_person("rita", "reviewer")
    asked = [ask(index) for index in range(5)]
    tab.login("rita")
    tab.goto("/inbox/")
    assert selected(tab) == str(asked[0].pk)

    tab.page.keyboard.press("?")
    assert tab.page.locator("#shortcuts").is_visible()
    tab.shot("shortcuts")
    tab.page.keyboard.press("j")
    tab.page.keyboard.press("j")
    assert selected(tab) == str(asked[2].pk)
    tab.page.keyboard.press("k")
    assert selected(tab) == str(asked[1].pk)

    tab.press("a")  # approves the second; the same place now holds the third
    assert "Approved: book_flight of travel." in tab.page.locator(".flash").inner_text()
    assert selected(tab) == str(asked[2].pk)

    tab.page.keyboard.press("r")
    assert tab.page.locator("#reject-dialog").is_visible()
    tab.page.keyboard.type("Too expensive")
    tab.press("Enter")  # rejects the third
    assert selected(tab) == str(asked[3].pk)

    tab.page.keyboard.press("k")
    tab.press("a")  # the first
    tab.press("a")  # the fourth, now first
    tab.shot("one left")
    tab.press("a")  # the fifth

    assert "Nothing is waiting for you" in tab.page.locator("main").inner_text()
    decided = dict(ApprovalRequest.objects.values_list("pk", "status"))
    assert decided == {approval.pk: ApprovalStatus.REJECTED if approval == asked[2] else ApprovalStatus.APPROVED
                       for approval in asked}  # fmt: skip
    assert ApprovalRequest.objects.get(pk=asked[2].pk).comment == "Too expensive"


def test_selected_low_risk_requests_are_approved_together_after_one_confirmation(tab: Pages, db: Any) -> None:
    make_person("rita", "reviewer")
    low = [ask(index, "low") for index in range(3)]
    high = ask(3, "high")
    tab.login("rita")
    tab.goto("/inbox/")

    tab.page.keyboard.press("x")
    tab.page.keyboard.press("j")
    tab.page.keyboard.press("x")
    tab.page.check(f"tr[data-approval='{low[2].pk}'] input[type=checkbox]")
    assert tab.page.locator(f"tr[data-approval='{high.pk}'] input[type=checkbox]").count() == 0
    tab.follow("#bulk-approve")

    assert tab.page.locator("#bulk-list tbody tr").count() == 3
    tab.shot("confirm")
    assert ApprovalRequest.objects.filter(status=ApprovalStatus.PENDING).count() == 4  # asked, not done
    tab.follow("#confirm-bulk")

    assert "Approved 3 low-risk requests." in tab.page.locator(".flash").inner_text()
    assert list(ApprovalRequest.objects.filter(status=ApprovalStatus.PENDING)) == [high]
    assert tab.page.locator("#inbox-body tr").count() == 1
