"""The checkpoint page's conversation in Chromium: bubbles above the state tree, and a toggle to
the same messages in the tree."""

from __future__ import annotations

import pytest

from checkpoints import storage
from quicksave_agents.keys import get_or_create_agent
from tests.e2e.conftest import Pages, make_person

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

STATE = {
    "phase": "quote",
    "messages": [
        {"role": "user", "content": "Book me a flight to Rome."},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "search_fares", "arguments": '{"to": "FCO"}'}},
        ]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"cheapest": 120}'},
        {"role": "assistant", "content": "Cheapest: 120 EUR."},
    ] + [{"role": "user", "content": f"and {n}?"} for n in range(25)],
}  # fmt: skip


def test_messages_read_as_a_conversation_with_a_toggle_to_the_tree(tab: Pages) -> None:
    make_person("vera", "viewer")
    thread, _ = storage.create_thread(agent=get_or_create_agent(name="travel"), external_id="rome")
    checkpoint = storage.append_checkpoint(thread=thread, parent=None, state=STATE, label="quote")
    tab.login("vera")
    tab.goto(f"/checkpoints/{checkpoint.pk}/")

    assert tab.page.locator("#conversation .bubble").count() == 29
    assert '"cheapest": 120' in tab.page.inner_text("#conversation .bubble-tool")
    assert "search_fares" in tab.page.inner_text("#conversation .bubble-assistant >> nth=0")
    tab.shot("conversation")
    # The messages list has 29 items, so the tree starts with it folded.
    messages = tab.page.locator('#state-tree details:has(> summary > button.copy-path[data-path="/messages"])')
    assert not messages.evaluate("node => node.open")

    tab.page.click("#toggle-conversation")

    assert tab.page.locator("#conversation-body").is_hidden()
    assert messages.evaluate("node => node.open")
    assert tab.page.get_attribute("#toggle-conversation", "aria-pressed") == "true"
    tab.shot("as json tree")
    tab.page.click("#toggle-conversation")
    assert tab.page.locator("#conversation-body").is_visible()
