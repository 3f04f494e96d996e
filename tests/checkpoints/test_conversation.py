"""Message lists in a state render as a conversation on the checkpoint page: bubbles by role, tool
calls with their arguments and tool results, in the shapes each agent framework stores, escaped."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client

from checkpoints import storage
from checkpoints.presentation.conversation import MAX_MESSAGES, Turn, conversations
from quicksave_agents.keys import get_or_create_agent
from tests.conftest import person, signed_in

OPENAI_CHAT = {
    "messages": [
        {"role": "system", "content": "You book trips."},
        {"role": "user", "content": "Book me a flight to Rome."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "search_fares", "arguments": '{"to": "FCO"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"cheapest": 120}'},
        {"role": "assistant", "content": "Cheapest: 120 EUR."},
    ],
    "phase": "quote",
}
# The OpenAI Agents SDK session (integrations/openai_agents/session.py): {"items": [...]}.
OPENAI_AGENTS = {
    "items": [
        {"role": "user", "content": "Refund order 7"},
        {"type": "function_call", "name": "refund", "arguments": '{"order": 7}', "call_id": "fc_1"},
        {"type": "function_call_output", "call_id": "fc_1", "output": "refunded"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Done: refunded."}]},
    ]
}
# Pydantic AI's ModelMessagesTypeAdapter JSON (integrations/pydantic_ai/threads.py).
PYDANTIC_AI = {
    "messages": [
        {
            "kind": "request",
            "parts": [
                {"part_kind": "system-prompt", "content": "Be brief."},
                {"part_kind": "user-prompt", "content": "Fares to Lisbon?"},
            ],
        },
        {
            "kind": "response",
            "parts": [
                {"part_kind": "tool-call", "tool_name": "search_fares", "args": {"to": "LIS"}, "tool_call_id": "s-1"},
            ],
        },
        {
            "kind": "request",
            "parts": [
                {
                    "part_kind": "tool-return",
                    "tool_name": "search_fares",
                    "content": {"price": 99},
                    "tool_call_id": "s-1",
                },
            ],
        },
        {"kind": "response", "parts": [{"part_kind": "text", "content": "All done: 99"}]},
    ]
}
# LangChain messages as JSON, plain and as messages_to_dict writes them (LangGraph states of dicts).
LANGCHAIN = {
    "channel_values": {
        "messages": [
            {"type": "human", "content": "What is the weather?"},
            {"type": "ai", "content": "", "tool_calls": [{"name": "weather", "args": {"city": "Oslo"}, "id": "t1"}]},
            {"type": "tool", "data": {"content": "rain", "tool_call_id": "t1", "name": "weather"}},
            {"type": "ai", "data": {"content": "It rains in Oslo."}},
        ]
    }
}
# An ADK checkpoint holds one event (integrations/adk/sessions.py).
ADK = {
    "state": {},
    "event": {"author": "agent", "content": {"role": "model", "parts": [
        {"function_call": {"name": "book_hotel", "args": {"nights": 3}, "id": "h1"}},
    ]}},
}  # fmt: skip


def roles(turns: list[Turn]) -> list[str]:
    return [turn.role for turn in turns]


def test_openai_chat_messages_read_as_a_conversation() -> None:
    [found] = conversations(OPENAI_CHAT)
    assert found.path == "/messages"
    assert roles(found.turns) == ["system", "user", "assistant", "tool", "assistant"]
    call = found.turns[2].tool_calls[0]
    assert (call.name, call.id) == ("search_fares", "call_1")
    assert '"to": "FCO"' in call.args  # the JSON string of arguments, parsed and indented
    assert found.turns[3].tool_results[0].content == '{"cheapest": 120}'
    assert found.turns[3].tool_results[0].name == "search_fares"  # named after its call
    assert found.turns[4].texts == ["Cheapest: 120 EUR."]


def test_openai_agents_items_read_as_a_conversation() -> None:
    [found] = conversations(OPENAI_AGENTS)
    assert found.path == "/items"
    assert roles(found.turns) == ["user", "assistant", "tool", "assistant"]
    assert found.turns[1].tool_calls[0].name == "refund"
    assert found.turns[2].tool_results[0].content == "refunded"
    assert found.turns[2].tool_results[0].name == "refund"
    assert found.turns[3].texts == ["Done: refunded."]


def test_pydantic_ai_messages_read_as_a_conversation() -> None:
    [found] = conversations(PYDANTIC_AI)
    assert roles(found.turns) == ["user", "assistant", "tool", "assistant"]
    assert found.turns[0].texts == ["Fares to Lisbon?"]
    assert found.turns[0].notes == ["System: Be brief."]
    assert found.turns[1].tool_calls[0].name == "search_fares"
    assert found.turns[2].tool_results[0].content == '{\n  "price": 99\n}'


def test_langchain_messages_nested_in_a_langgraph_state_read_as_a_conversation() -> None:
    [found] = conversations(LANGCHAIN)
    assert found.path == "/channel_values/messages"
    assert roles(found.turns) == ["user", "assistant", "tool", "assistant"]
    assert found.turns[1].tool_calls[0].name == "weather"
    assert found.turns[2].tool_results[0].name == "weather"
    assert found.turns[3].texts == ["It rains in Oslo."]


def test_an_adk_event_reads_as_one_message() -> None:
    [found] = conversations(ADK)
    assert found.path == "/event/content"
    assert found.turns[0].role == "assistant"
    assert found.turns[0].tool_calls[0].name == "book_hotel"


@pytest.mark.parametrize(
    "state",
    [
        {},
        {"messages": []},
        {"messages": [1, 2, 3]},
        {"items": [{"sku": "A", "qty": 2}, {"sku": "B", "qty": 1}]},
        {"role": "user", "content": "a top-level object is the state, not a message"},
        {"deep": {"er": {"still": {"deeper": {"messages": [{"role": "user", "content": "too deep"}]}}}}},
        {"messages": [{"role": "user"}]},
        {"messages": [{"role": "user", "content": "one of three"}, {"id": 1}, {"id": 2}]},
    ],
)
def test_what_is_not_a_conversation_is_left_to_the_tree(state: Any) -> None:
    assert conversations(state) == []


def test_a_long_conversation_shows_its_newest_messages() -> None:
    messages = [{"role": "user", "content": f"m{n}"} for n in range(MAX_MESSAGES + 5)]
    [found] = conversations({"messages": messages})
    assert (found.total, found.hidden, found.turns[0].texts) == (MAX_MESSAGES + 5, 5, ["m5"])


def test_odd_items_in_a_message_list_do_not_break_it() -> None:
    image = {"role": "assistant", "content": [{"type": "image_url", "image_url": {}}]}
    [found] = conversations({"messages": [{"role": "user", "content": "hi"}, "a bare string", None, image]})
    assert roles(found.turns) == ["user", "other", "other", "assistant"]
    assert found.turns[3].notes  # a part that is not text is shown as JSON, folded


def test_malformed_messages_are_shown_as_they_are_without_failing() -> None:
    messages = [
        {"role": "assistant", "content": {"not": "text"}, "parts": 5, "tool_calls": "x", "name": {"n": 1}},
        {"role": "tool", "content": None, "tool_call_id": 7},
        {"role": "user", "content": [1, {"type": "input_text"}, "plain"]},
        {"type": "function_call", "name": None, "arguments": "{not json"},
        {"kind": "response", "parts": ["x", {"part_kind": "tool-call", "args": None}]},
        {"role": "USER", "content": "shouting"},
        {"type": "HumanMessage", "data": "not a dict", "content": "x"},
    ]
    [found] = conversations({"messages": messages})
    assert roles(found.turns) == ["assistant", "tool", "user", "assistant", "assistant", "user", "user"]
    assert found.turns[0].texts == ['{\n  "not": "text"\n}'] and found.turns[0].tool_calls == []
    assert found.turns[3].tool_calls[0].args == "{not json"
    assert found.turns[0].who.startswith("Assistant · ")


# ---------------------------------------------------------------- the page


@pytest.fixture
def viewer_page(db: Any) -> Client:
    return signed_in(person("vera", "viewer"))


def page_for(state: dict[str, Any], client: Client) -> str:
    thread, _ = storage.create_thread(agent=get_or_create_agent(name="travel"))
    checkpoint = storage.append_checkpoint(thread=thread, parent=None, state=state)
    response = client.get(f"/checkpoints/{checkpoint.pk}/")
    assert response.status_code == 200
    return response.content.decode()


@pytest.mark.django_db
def test_the_checkpoint_page_shows_bubbles_above_the_state_tree(viewer_page: Client) -> None:
    body = page_for(OPENAI_CHAT, viewer_page)

    assert body.index('id="conversation"') < body.index('id="state-tree"')
    bubbles = re.findall(r'<li class="bubble bubble-(\w+)">', body)
    assert bubbles == ["system", "user", "assistant", "tool", "assistant"]
    assert 'id="toggle-conversation"' in body and "js/conversation.js" in body
    assert '<code class="tool-name">search_fares</code>' in body
    assert "Cheapest: 120 EUR." in body
    assert 'id="state-tree"' in body  # the tree is still there, for the toggle and the rest of the state


@pytest.mark.django_db
def test_message_text_is_escaped(viewer_page: Client) -> None:
    state = {"messages": [
        {"role": "user", "content": "<script>alert(1)</script>"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "x", "function": {"name": "<img src=x onerror=alert(2)>", "arguments": '{"a": "</pre><b>"}'}}]},
    ]}  # fmt: skip
    body = page_for(state, viewer_page)
    conversation = body[body.index('id="conversation"') : body.index('id="state-tree"')]
    assert "<script>alert(1)" not in conversation and "&lt;script&gt;alert(1)&lt;/script&gt;" in conversation
    assert "<img src=x" not in conversation and "&lt;img src=x onerror=alert(2)&gt;" in conversation
    assert "</pre><b>" not in conversation


@pytest.mark.django_db
def test_a_state_without_messages_shows_no_conversation(viewer_page: Client) -> None:
    body = page_for({"phase": "quote", "items": [{"sku": "A"}]}, viewer_page)
    assert 'id="conversation"' not in body and "conversation.js" not in body


def test_langchain_message_objects_packed_by_the_langgraph_saver_read_as_a_conversation() -> None:
    import base64

    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    serde = JsonPlusSerializer()

    def envelope(message: Any) -> dict[str, Any]:
        kind, data = serde.dumps_typed(message)
        return {"__lg_typed__": [kind, base64.b64encode(data).decode()]}

    state = {"channel_values": {"messages": [
        envelope(HumanMessage("Weather in Oslo?", id="m1")),
        envelope(AIMessage("", tool_calls=[{"name": "weather", "args": {"city": "Oslo"}, "id": "t1"}])),
        envelope(ToolMessage("rain, 4°C", tool_call_id="t1", name="weather")),
        envelope(AIMessage("It rains in Oslo: 4°C.")),
    ]}}  # fmt: skip

    [found] = conversations(state)

    assert roles(found.turns) == ["user", "assistant", "tool", "assistant"]
    assert found.turns[0].texts == ["Weather in Oslo?"]
    assert found.turns[1].tool_calls[0].name == "weather" and '"city": "Oslo"' in found.turns[1].tool_calls[0].args
    assert found.turns[2].tool_results[0].content == "rain, 4°C"
    assert found.turns[3].texts == ["It rains in Oslo: 4°C."]


@pytest.mark.parametrize(
    "envelope",
    [
        {"__lg_typed__": ["msgpack", "not base64!"]},
        {"__lg_typed__": ["msgpack", "gqFh"]},  # a map of two entries, cut short
        {"__lg_typed__": ["pickle", "gASVBQAAAAAAAACMAWGULg=="]},  # never unpickled
        {"__lg_typed__": ["msgpack"]},
    ],
)
def test_an_envelope_that_does_not_open_is_left_as_it_is(envelope: dict[str, Any]) -> None:
    from checkpoints.presentation.msgpack_view import unwrap

    assert unwrap(envelope) is envelope


@pytest.mark.django_db
def test_the_approval_page_shows_the_conversation_that_led_to_it(viewer_page: Client) -> None:
    from approvals.services import request_approval

    thread, _ = storage.create_thread(agent=get_or_create_agent(name="travel"))
    checkpoint = storage.append_checkpoint(thread=thread, parent=None, state=OPENAI_CHAT, status="waiting_for_approval")
    approval = request_approval(thread=thread, checkpoint=checkpoint, action="book_flight", args={"to": "FCO"})

    body = viewer_page.get(f"/inbox/{approval.pk}/").content.decode()

    assert re.findall(r'<li class="bubble bubble-(\w+)">', body) == ["system", "user", "assistant", "tool", "assistant"]
    assert body.index('id="conversation"') < body.index('id="state-tree"')
