"""Fine-tuning JSONL and preference pairs: every line checked against a JSON Schema of the published
formats kept here, a thread not in chat shape skipped and counted, the finished branch exported
rather than the abandoned one, and an agent key seeing only its own agent's threads."""

from __future__ import annotations

import html
import io
import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient

from approvals.services import decide, request_approval
from checkpoints import storage, trajectories
from checkpoints.models import Checkpoint, Thread, ThreadStatus
from quicksave_agents.models import Agent
from tests.conftest import person, signed_in

TOOL_CALL = {
    "type": "object", "additionalProperties": False, "required": ["id", "type", "function"],
    "properties": {
        "id": {"type": "string"}, "type": {"const": "function"},
        "function": {"type": "object", "additionalProperties": False, "required": ["name", "arguments"],
                     "properties": {"name": {"type": "string"}, "arguments": {"type": "string"}}},
    },
}  # fmt: skip
CONTENT = {"anyOf": [{"type": "string"}, {"type": "array"}]}
MESSAGE = {
    "oneOf": [
        {"type": "object", "additionalProperties": False, "required": ["role", "content"],
         "properties": {"role": {"enum": ["system", "user"]}, "content": CONTENT, "name": {"type": "string"}}},
        {"type": "object", "additionalProperties": False, "required": ["role", "content"],
         "properties": {"role": {"const": "assistant"}, "content": {"anyOf": [CONTENT, {"type": "null"}]},
                        "name": {"type": "string"},
                        "tool_calls": {"type": "array", "minItems": 1, "items": TOOL_CALL}}},
        {"type": "object", "additionalProperties": False, "required": ["role", "content", "tool_call_id"],
         "properties": {"role": {"const": "tool"}, "content": CONTENT, "tool_call_id": {"type": "string"}}},
    ]
}  # fmt: skip
TOOL = {
    "type": "object", "additionalProperties": False, "required": ["type", "function"],
    "properties": {"type": {"const": "function"},
                   "function": {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}}},
}  # fmt: skip
FINE_TUNING_SCHEMA = {
    "type": "object", "additionalProperties": False, "required": ["messages", "tools"],
    "properties": {"messages": {"type": "array", "minItems": 1, "items": MESSAGE},
                   "tools": {"type": "array", "items": TOOL}},
}  # fmt: skip
ASSISTANT_TURNS = {
    "type": "array",
    "minItems": 1,
    "items": {"allOf": [MESSAGE, {"properties": {"role": {"const": "assistant"}}}]},
}
PREFERENCE_SCHEMA = {
    "type": "object", "additionalProperties": False, "required": ["input", "preferred_output", "non_preferred_output"],
    "properties": {
        "input": {"type": "object", "additionalProperties": False, "required": ["messages"],
                  "properties": {"messages": {"type": "array", "minItems": 1, "items": MESSAGE}}},
        "preferred_output": ASSISTANT_TURNS, "non_preferred_output": ASSISTANT_TURNS,
    },
}  # fmt: skip


def valid_lines(data: bytes, schema: dict[str, Any]) -> list[dict[str, Any]]:
    records = [json.loads(line) for line in data.decode().splitlines()]
    for record in records:
        jsonschema.validate(record, schema)
    return records


def call(call_id: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


def chat_thread(agent: Agent, external_id: str, *, status: str = ThreadStatus.COMPLETED) -> list[Checkpoint]:
    """A thread whose `messages` grow by one a step: a question, a tool call, its result, the answer."""
    thread = storage.create_thread(agent=agent, external_id=external_id)[0]
    steps = [
        {"role": "system", "content": "You book trips."},
        {"role": "user", "content": "A flight to Lisbon, please."},
        {"role": "assistant", "content": None, "tool_calls": [call("c1", "search_flights", {"to": "LIS"})]},
        {"role": "tool", "tool_call_id": "c1", "content": "TP123 at 09:00", "internal": "not for export"},
        {"role": "assistant", "content": "TP123 leaves at 09:00."},
    ]
    tools = [{"type": "function", "function": {"name": "search_flights", "parameters": {"type": "object"}}}]
    written = [storage.append_checkpoint(thread=thread, parent=None, state={"messages": [], "tools": tools}, step=0)]
    for i, message in enumerate(steps, start=1):
        written.append(storage.append_checkpoint(
            thread=thread, parent=written[-1], step=i, status=status if i == len(steps) else ThreadStatus.RUNNING,
            patch=[{"op": "add", "path": "/messages/-", "value": message}],
        ))  # fmt: skip
    return written


def fine_tuning(threads: Any, tally: trajectories.Tally | None = None) -> list[dict[str, Any]]:
    data = b"".join(trajectories.lines(trajectories.fine_tuning_records(threads, tally=tally)))
    return valid_lines(data, FINE_TUNING_SCHEMA)


def test_fine_tuning_line_has_tool_calls_and_results_in_order(agent: Agent) -> None:
    chat_thread(agent, "trip-1")
    [record] = fine_tuning(Thread.objects.all())
    assert [m["role"] for m in record["messages"]] == ["system", "user", "assistant", "tool", "assistant"]
    assert record["messages"][2]["tool_calls"][0]["function"] == {
        "name": "search_flights",
        "arguments": '{"to": "LIS"}',
    }
    assert record["messages"][3] == {"role": "tool", "content": "TP123 at 09:00", "tool_call_id": "c1"}
    assert record["tools"][0]["function"]["name"] == "search_flights"


def test_thread_without_chat_state_is_skipped_and_counted(agent: Agent) -> None:
    chat_thread(agent, "trip-1")
    odd = storage.create_thread(agent=agent, external_id="odd")[0]
    storage.append_checkpoint(thread=odd, parent=None, state={"messages": [{"speaker": "bot", "text": "hi"}]})
    orphan = storage.create_thread(agent=agent, external_id="orphan")[0]
    storage.append_checkpoint(thread=orphan, parent=None, state={"messages": [
        {"role": "user", "content": "hi"}, {"role": "tool", "tool_call_id": "never-called", "content": "x"},
    ]})  # fmt: skip
    tally = trajectories.Tally()
    assert len(fine_tuning(Thread.objects.all(), tally)) == 1
    assert (tally.seen, tally.written, tally.skipped) == (3, 1, 2)
    assert set(tally.skipped_ids) == {str(odd.pk), str(orphan.pk)}


def test_thread_with_an_altered_row_is_skipped_and_the_rest_still_written(agent: Agent) -> None:
    chat_thread(agent, "trip-1")
    altered = chat_thread(agent, "trip-2")
    Checkpoint.objects.filter(pk=altered[-1].pk).update(label="edited behind Quicksave's back")
    storage.clear_caches()
    tally = trajectories.Tally()
    assert len(fine_tuning(Thread.objects.all(), tally)) == 1
    assert tally.skipped_ids == [str(altered[0].thread_id)]


def test_filter_picks_agent_and_outcome(agent: Agent, other_agent: Agent) -> None:
    chat_thread(agent, "done")
    chat_thread(agent, "failed", status=ThreadStatus.FAILED)
    chat_thread(other_agent, "theirs")
    chosen = trajectories.Filter(agent=agent.name, outcome=ThreadStatus.COMPLETED).apply(Thread.objects.all())
    assert len(fine_tuning(chosen)) == 1


def test_finished_branch_is_exported_not_the_abandoned_one(agent: Agent) -> None:
    written = chat_thread(agent, "trip-1")
    thread = written[0].thread
    branch = storage.start_branch(thread=thread, at=written[3], name="retry")
    thread.active_branch = branch
    thread.save(update_fields=["active_branch"])
    storage.append_checkpoint(thread=thread, parent=written[3], branch="retry", patch=[
        {"op": "add", "path": "/messages/-", "value": {"role": "tool", "tool_call_id": "c1", "content": "no flights"}},
    ])  # fmt: skip
    [record] = fine_tuning(Thread.objects.all())
    assert record["messages"][-1]["content"] == "no flights"


def streamed(response: Any) -> bytes:
    assert response.status_code == 200
    return b"".join(response.streaming_content)


def approval_at(checkpoint: Checkpoint, args: dict[str, Any]) -> Any:
    return request_approval(thread=checkpoint.thread, checkpoint=checkpoint, action="book_flight", args=args)


def preferences(threads: Any, **kwargs: Any) -> list[dict[str, Any]]:
    data = b"".join(trajectories.lines(trajectories.preference_records(threads, **kwargs)))
    return valid_lines(data, PREFERENCE_SCHEMA)


def test_edited_approval_is_a_pair_of_the_persons_call_over_the_agents(agent: Agent) -> None:
    written = chat_thread(agent, "trip-1")
    reviewer = person("rita", "reviewer")
    proposal = storage.append_checkpoint(thread=written[0].thread, parent=written[-1], patch=[
        {"op": "add", "path": "/messages/-", "value": {"role": "assistant", "content": None,
                                                      "tool_calls": [call("c2", "book_flight", {"seat": "1A"})]}},
    ])  # fmt: skip
    decide(approval=approval_at(proposal, {"seat": "1A"}), user=reviewer, decision="approve", args={"seat": "12C"})
    decide(approval=approval_at(proposal, {"seat": "2B"}), user=reviewer, decision="approve")  # not edited: no pair
    [pair] = preferences(Thread.objects.all())
    assert pair["input"]["messages"][-1]["content"] == "TP123 leaves at 09:00."
    assert json.loads(pair["preferred_output"][0]["tool_calls"][0]["function"]["arguments"]) == {"seat": "12C"}
    assert json.loads(pair["non_preferred_output"][0]["tool_calls"][0]["function"]["arguments"]) == {"seat": "1A"}


def test_rejection_comment_is_the_preferred_turn_only_when_asked(agent: Agent) -> None:
    written = chat_thread(agent, "trip-1")
    decide(approval=approval_at(written[-1], {"seat": "1A"}), user=person("rita", "reviewer"), decision="reject",
           comment="Ask the traveller which seat first.")  # fmt: skip
    tally = trajectories.Tally()
    assert preferences(Thread.objects.all(), tally=tally) == []
    assert tally.skipped == 1
    [pair] = preferences(Thread.objects.all(), rejections="comment")
    assert pair["preferred_output"] == [{"role": "assistant", "content": "Ask the traveller which seat first."}]


@pytest.mark.parametrize("kind", ["fine-tuning", "preferences"])
def test_agent_key_exports_only_its_own_agents_threads(
    kind: str, agent: Agent, other_agent: Agent, owner_client: APIClient, viewer_client: APIClient
) -> None:
    mine = chat_thread(agent, "mine")
    theirs = chat_thread(other_agent, "theirs")
    reviewer = person("rita", "reviewer")
    for written in (mine, theirs):
        decide(approval=approval_at(written[-1], {"seat": "1A"}), user=reviewer, decision="approve", args={"seat": "2"})
    schema = FINE_TUNING_SCHEMA if kind == "fine-tuning" else PREFERENCE_SCHEMA
    response = owner_client.get(f"/api/v1/exports/{kind}/", {"agent": other_agent.name})
    assert response.status_code == 200
    assert valid_lines(streamed(response), schema) == []
    response = owner_client.get(f"/api/v1/exports/{kind}/")
    assert len(valid_lines(streamed(response), schema)) == 1
    response = viewer_client.get(f"/api/v1/exports/{kind}/")
    assert len(valid_lines(streamed(response), schema)) == 2


def test_anonymous_export_is_refused(anonymous_client: APIClient) -> None:
    assert anonymous_client.get("/api/v1/exports/fine-tuning/").status_code in {401, 403}


def test_command_writes_valid_lines_with_a_progress_bar_and_counts(agent: Agent, tmp_path: Path) -> None:
    chat_thread(agent, "trip-1")
    odd = storage.create_thread(agent=agent, external_id="odd")[0]
    storage.append_checkpoint(thread=odd, parent=None, state={"notes": "not a conversation"})
    out, err = tmp_path / "sft.jsonl", io.StringIO()
    call_command("export_training", "fine-tuning", "--agent", agent.name, "-o", str(out), stderr=err)
    assert len(valid_lines(out.read_bytes(), FINE_TUNING_SCHEMA)) == 1
    assert "2/2 threads" in err.getvalue()
    assert "Wrote 1 line(s) from 2 threads; skipped 1" in err.getvalue()


def test_command_refuses_a_time_that_is_not_iso_8601(db: Any) -> None:
    with pytest.raises(CommandError, match="--since 'yesterday'"):
        call_command("export_training", "preferences", "--since", "yesterday")


def test_training_data_page_counts_and_links_the_download_for_admins(agent: Agent) -> None:
    written = chat_thread(agent, "trip-1")
    decide(approval=approval_at(written[-1], {"seat": "1A"}), user=person("rita", "reviewer"), decision="approve",
           args={"seat": "2B"})  # fmt: skip
    admin = signed_in(person("ada", "admin"))
    page = admin.get("/training-data/", {"format": "preferences", "agent": agent.name})
    assert page.status_code == 200
    assert "1 edited approval," in page.content.decode()
    download = re.search(r'id="export-download" href="([^"]+)"', page.content.decode())
    assert download is not None
    response = admin.get(html.unescape(download.group(1)))
    assert len(valid_lines(streamed(response), PREFERENCE_SCHEMA)) == 1


def test_training_data_page_is_for_admins_only(db: Any) -> None:
    assert signed_in(person("rita", "reviewer")).get("/training-data/").status_code == 403
