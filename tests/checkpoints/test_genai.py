"""The GenAI export: a thread's trajectory as OpenTelemetry spans following the GenAI semantic
conventions, sent over OTLP/HTTP to a receiver this test runs on loopback, in batch
(`manage.py export_genai`) and live as checkpoints are appended (QUICKSAVE_GENAI_LIVE_AGENTS).
Span names, parentage and attributes are checked as the receiver decoded them; message content
is absent unless asked for."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings
from django.utils import timezone

from approvals.services import decide, request_approval
from checkpoints import forks, genai_live, storage
from checkpoints.models import Checkpoint, Thread
from quicksave_agents.keys import get_or_create_agent
from quicksave_agents.models import Agent, Run, RunReason, RunStatus
from quicksave_agents.runs import claim_run, enqueue_run, finish_run
from tests.conftest import person
from tests.otlp import Receiver, Span
from tests.processes import ROOT, free_port
from tests.waiting import wait_until

CONTENT_KEYS = {"gen_ai.input.messages", "gen_ai.output.messages", "gen_ai.tool.call.arguments",
                "gen_ai.tool.call.result", "quicksave.approval.args"}  # fmt: skip


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver() as running:
        yield running


def call(call_id: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


MODEL = {"name": "gpt-4o", "temperature": 0.2, "top_p": 0.9, "seed": 7}
TOOLS = [{"type": "function", "function": {"name": "search_hotels", "description": "Find hotels in a city",
                                           "parameters": {"type": "object"}}}]  # fmt: skip
STEPS: list[tuple[dict[str, Any], dict[str, Any] | None]] = [
    ({"role": "user", "content": "Find me a hotel in Porto."}, None),
    ({"role": "assistant", "content": None, "tool_calls": [call("call_1", "search_hotels", {"city": "Porto"})]}, MODEL),
    ({"role": "tool", "tool_call_id": "call_1", "content": "Hotel Infante, 120 EUR"}, None),
    ({"role": "assistant", "content": "Hotel Infante is free for 120 EUR a night."}, MODEL),
]


Steps = list[tuple[dict[str, Any], dict[str, Any] | None]]


def chat_thread(
    agent: Agent, *, steps: Steps = STEPS, status_last: str = "completed", before_each: Any = None
) -> tuple[Thread, list[Checkpoint]]:
    """A thread whose `messages` grow by one message a checkpoint (with model parameters on the
    checkpoints that record a model's answer)."""
    thread, _ = storage.create_thread(agent=agent)
    written: list[Checkpoint] = []
    for number, (message, model) in enumerate(steps):
        if before_each is not None:
            before_each(number, thread, written)
        status = status_last if number == len(steps) - 1 else "running"
        if not written:
            state = {"messages": [message], "tools": TOOLS}
            head = storage.append_checkpoint(thread=thread, parent=None, state=state, model=model, status=status)
        else:
            patch = [{"op": "add", "path": "/messages/-", "value": message}]
            head = storage.append_checkpoint(thread=thread, parent=written[-1], model=model, status=status, patch=patch)
        written.append(head)
    return Thread.objects.get(pk=thread.pk), written


def export(receiver: Receiver, *options: str, **kwargs: Any) -> str:
    err = io.StringIO()
    call_command("export_genai", "--endpoint", receiver.traces_url, "--no-progress", *options, stderr=err, **kwargs)
    return err.getvalue()


def only(spans: list[Span]) -> Span:
    assert len(spans) == 1, spans
    return spans[0]


# --------------------------------------------------------------------------- batch


@pytest.mark.django_db
def test_a_thread_is_an_invoke_agent_span_with_its_model_calls_and_tool_calls_as_children(
    agent: Agent, receiver: Receiver
) -> None:
    thread, written = chat_thread(agent)
    summary = export(receiver)
    assert "Sent 4 span(s) from 1 thread(s); skipped 0" in summary
    assert receiver.paths == ["/v1/traces"]
    root = only(receiver.named("invoke_agent"))
    assert root.name == "invoke_agent travel"
    assert root.parent_id == ""
    assert root.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert root.attributes["gen_ai.agent.name"] == "travel"
    assert root.attributes["gen_ai.conversation.id"] == str(thread.pk)
    chats = sorted(receiver.named("chat"), key=lambda span: span.end)
    assert [span.name for span in chats] == ["chat gpt-4o", "chat gpt-4o"]
    tool = only(receiver.named("execute_tool"))
    assert tool.name == "execute_tool search_hotels"
    for child in [*chats, tool]:
        assert child.parent_id == root.span_id and child.trace_id == root.trace_id
        assert child.attributes["gen_ai.conversation.id"] == str(thread.pk)
        assert root.start <= child.start <= child.end <= root.end
    assert tool.attributes["gen_ai.operation.name"] == "execute_tool"
    assert tool.attributes["gen_ai.tool.name"] == "search_hotels"
    assert tool.attributes["gen_ai.tool.call.id"] == "call_1"
    assert tool.attributes["gen_ai.tool.type"] == "function"
    assert tool.attributes["gen_ai.tool.description"] == "Find hotels in a city"
    assert tool.kind == "internal"
    # The call ran from the checkpoint that recorded it to the one that recorded its result.
    assert (tool.start, tool.end) == (_ns(written[1]), _ns(written[2]))
    first, last = chats
    assert first.kind == "client"
    assert first.attributes["gen_ai.operation.name"] == "chat"
    assert first.attributes["gen_ai.request.model"] == "gpt-4o"
    assert first.attributes["gen_ai.request.temperature"] == 0.2
    assert first.attributes["gen_ai.request.top_p"] == 0.9
    assert first.attributes["gen_ai.request.seed"] == 7
    assert first.attributes["gen_ai.response.finish_reasons"] == ["tool_call"]
    assert last.attributes["gen_ai.response.finish_reasons"] == ["stop"]
    # A model call runs from the checkpoint before it (its input) to the one that recorded its answer.
    assert (first.start, first.end) == (_ns(written[0]), _ns(written[1]))
    assert "gen_ai.provider.name" not in first.attributes  # never guessed from the model's name
    for span in receiver.spans:
        assert not CONTENT_KEYS & set(span.attributes), span.name


def _ns(checkpoint: Checkpoint) -> int:
    return int(checkpoint.created_at.timestamp() * 1_000_000) * 1000


@pytest.mark.django_db
def test_message_content_goes_only_when_asked_for_and_round_trips_the_conversation(
    agent: Agent, receiver: Receiver
) -> None:
    chat_thread(agent)
    export(receiver, "--content")
    last = max(receiver.named("chat"), key=lambda span: span.end)
    sent = json.loads(last.attributes["gen_ai.input.messages"]) + json.loads(last.attributes["gen_ai.output.messages"])
    # The conversation comes back whole and in order from the conventions' parts.
    assert sent == [
        {"role": "user", "parts": [{"type": "text", "content": "Find me a hotel in Porto."}]},
        {"role": "assistant", "parts": [{"type": "tool_call", "id": "call_1", "name": "search_hotels",
                                         "arguments": {"city": "Porto"}}]},
        {"role": "tool",
         "parts": [{"type": "tool_call_response", "id": "call_1", "response": "Hotel Infante, 120 EUR"}]},
        {"role": "assistant", "parts": [{"type": "text", "content": "Hotel Infante is free for 120 EUR a night."}],
         "finish_reason": "stop"},
    ]  # fmt: skip
    tool = only(receiver.named("execute_tool"))
    assert json.loads(tool.attributes["gen_ai.tool.call.arguments"]) == {"city": "Porto"}
    assert tool.attributes["gen_ai.tool.call.result"] == "Hotel Infante, 120 EUR"
    root = only(receiver.named("invoke_agent"))
    assert json.loads(root.attributes["gen_ai.output.messages"])[0]["parts"][0]["content"].startswith("Hotel Infante")


@pytest.mark.django_db
def test_each_run_is_its_own_invoke_agent_trace_holding_the_calls_made_during_it(
    agent: Agent, receiver: Receiver
) -> None:
    runs: list[Run] = []

    def run_starts(number: int, thread: Thread, written: list[Checkpoint]) -> None:
        if number in (1, 3):  # a run starts before the first model call, another before the last
            if runs:
                runs[-1].finished_at = timezone.now()
                runs[-1].status = RunStatus.FAILED
                runs[-1].save()
            runs.append(Run.objects.create(agent=agent, thread=thread, checkpoint=written[-1], reason=RunReason.START,
                                           status=RunStatus.RUNNING, started_at=timezone.now()))  # fmt: skip

    thread, _ = chat_thread(agent, before_each=run_starts)
    export(receiver)
    roots = {span.attributes.get("quicksave.run.id", "thread"): span for span in receiver.named("invoke_agent")}
    assert set(roots) == {"thread", str(runs[0].pk), str(runs[1].pk)}
    assert len({span.trace_id for span in roots.values()}) == 3
    assert {span.attributes["gen_ai.conversation.id"] for span in roots.values()} == {str(thread.pk)}
    failed = roots[str(runs[0].pk)]
    assert failed.attributes["error.type"] == "run_failed" and failed.status == 2  # STATUS_CODE_ERROR
    assert "error.type" not in roots[str(runs[1].pk)].attributes
    first_chat, last_chat = sorted(receiver.named("chat"), key=lambda span: span.end)
    tool = only(receiver.named("execute_tool"))
    assert first_chat.parent_id == roots[str(runs[0].pk)].span_id == tool.parent_id
    assert last_chat.parent_id == roots[str(runs[1].pk)].span_id
    assert last_chat.trace_id == roots[str(runs[1].pk)].trace_id


@pytest.mark.django_db
def test_an_approval_is_a_span_with_the_decision_the_reviewer_and_the_comment(agent: Agent, receiver: Receiver) -> None:
    thread, written = chat_thread(agent)
    approval = request_approval(thread=thread, checkpoint=written[1], action="search_hotels", args={"city": "Porto"})
    decide(approval=approval, user=person("rita", "reviewer"), decision="reject", comment="Ask for the budget first.")
    export(receiver)
    span = only(receiver.named("approval"))
    assert span.name == "approval search_hotels"
    assert span.parent_id == only(receiver.named("invoke_agent")).span_id
    assert span.attributes["quicksave.approval.decision"] == "reject"
    assert span.attributes["quicksave.approval.reviewer"] == "rita"
    assert span.attributes["quicksave.approval.comment"] == "Ask for the budget first."
    assert "quicksave.approval.args" not in span.attributes
    (name, attributes), = span.events  # fmt: skip
    assert name == "quicksave.approval.decided"
    assert attributes == {"quicksave.approval.decision": "reject", "quicksave.approval.reviewer": "rita",
                          "quicksave.approval.comment": "Ask for the budget first."}  # fmt: skip


@pytest.mark.django_db
def test_a_thread_not_in_chat_shape_is_skipped_and_counted_and_the_time_range_filters(
    agent: Agent, receiver: Receiver
) -> None:
    chat_thread(agent)
    odd, _ = storage.create_thread(agent=agent)
    storage.append_checkpoint(thread=odd, parent=None, state={"messages": [{"role": "robot", "content": "beep"}]})
    summary = export(receiver)
    assert "from 1 thread(s); skipped 1" in summary and str(odd.pk) in summary
    receiver.spans.clear()
    later = (timezone.now() + timedelta(hours=1)).isoformat()
    assert "Sent 0 span(s) from 0 thread(s)" in export(receiver, "--since", later)
    assert receiver.spans == []


@pytest.mark.django_db
def test_bad_options_and_an_unreachable_receiver_are_refused_with_a_clear_error(agent: Agent) -> None:
    chat_thread(agent)
    with pytest.raises(CommandError, match="--endpoint must be an http"):
        call_command("export_genai", "--endpoint", "ftp://example.com/v1/traces", "--no-progress")
    with pytest.raises(CommandError, match="--since 'yesterday' is not an ISO 8601 time"):
        call_command("export_genai", "--endpoint", "http://127.0.0.1:9/v1/traces", "--since", "yesterday")
    with pytest.raises(CommandError, match="--timeout must be"):
        call_command("export_genai", "--endpoint", "http://127.0.0.1:9/v1/traces", "--timeout", "0")
    closed = f"http://127.0.0.1:{free_port()}/v1/traces"
    with pytest.raises(CommandError, match=f"The OTLP receiver at {closed} did not take 4 span"):
        call_command("export_genai", "--endpoint", closed, "--timeout", "1", "--no-progress", stderr=io.StringIO())


# --------------------------------------------------------------------------- live


@pytest.mark.django_db(transaction=True)
def test_live_export_sends_an_agents_spans_as_its_checkpoints_are_appended_and_the_batch_names_the_same_spans(
    receiver: Receiver,
) -> None:
    listed, unlisted = get_or_create_agent(name="travel"), get_or_create_agent(name="code-review")
    with override_settings(
        QUICKSAVE_GENAI_LIVE_AGENTS=frozenset({"travel"}), QUICKSAVE_GENAI_OTLP_ENDPOINT=receiver.traces_url
    ):
        chat_thread(unlisted)
        thread, written = chat_thread(listed, steps=STEPS[:3], status_last="running")
        assert genai_live.flush()
        wait_until(lambda: receiver.named("execute_tool"), what="the tool call's span", timeout=10)
        chat, tool = only(receiver.named("chat")), only(receiver.named("execute_tool"))
        assert receiver.named("invoke_agent") == []  # the thread is still going
        storage.append_checkpoint(thread=thread, parent=written[-1], model=MODEL, status="completed",
                                  patch=[{"op": "add", "path": "/messages/-", "value": STEPS[3][0]}])  # fmt: skip
        assert genai_live.flush()
        wait_until(
            lambda: receiver.named("invoke_agent"), what="the agent's span once the thread completed", timeout=10
        )
    root = only(receiver.named("invoke_agent"))
    assert {span.attributes["gen_ai.conversation.id"] for span in receiver.spans} == {str(thread.pk)}
    assert chat.parent_id == tool.parent_id == root.span_id
    assert tool.attributes["gen_ai.tool.call.id"] == "call_1"
    assert (tool.start, tool.end) == (_ns(written[1]), _ns(written[2]))
    assert not any(CONTENT_KEYS & set(span.attributes) for span in receiver.spans)
    live = {(span.name, span.span_id, span.parent_id, span.trace_id, span.start, span.end) for span in receiver.spans}
    receiver.spans.clear()
    export(receiver, "--agent", "travel")
    batch = {(span.name, span.span_id, span.parent_id, span.trace_id, span.start, span.end) for span in receiver.spans}
    assert live == batch


@pytest.mark.django_db(transaction=True)
def test_live_export_sends_content_only_when_switched_on(receiver: Receiver) -> None:
    agent = get_or_create_agent(name="travel")
    live = {"QUICKSAVE_GENAI_LIVE_AGENTS": frozenset({"travel"}), "QUICKSAVE_GENAI_OTLP_ENDPOINT": receiver.traces_url}
    with override_settings(**live, QUICKSAVE_GENAI_CAPTURE_CONTENT=True):
        chat_thread(agent, steps=STEPS[:3], status_last="running")
        assert genai_live.flush()
        wait_until(lambda: receiver.named("execute_tool"), what="the tool call's span", timeout=10)
    tool = only(receiver.named("execute_tool"))
    assert tool.attributes["gen_ai.tool.call.result"] == "Hotel Infante, 120 EUR"
    chat = only(receiver.named("chat"))
    assert json.loads(chat.attributes["gen_ai.input.messages"])[0]["role"] == "user"


@pytest.mark.django_db(transaction=True)
def test_a_stuck_export_does_not_hold_up_the_writer(receiver: Receiver, monkeypatch: pytest.MonkeyPatch) -> None:
    agent = get_or_create_agent(name="travel")
    entered, release = threading.Event(), threading.Event()
    calls: list[str] = []

    def stuck(self: Any, event: dict[str, Any]) -> list[Any]:
        calls.append(threading.current_thread().name)
        entered.set()
        release.wait(timeout=20)
        return []

    monkeypatch.setattr(genai_live._Exporter, "_spans", stuck)
    try:
        with override_settings(QUICKSAVE_GENAI_LIVE_AGENTS=frozenset({"travel"}),
                               QUICKSAVE_GENAI_OTLP_ENDPOINT=receiver.traces_url):  # fmt: skip
            thread, written = chat_thread(agent)  # four appends, each committed and handed over
            assert entered.wait(timeout=10)
            # Every write went through while the export thread is still stuck on the first event.
            assert calls == ["genai-export"]
            assert Thread.objects.get(pk=thread.pk).head_id == written[-1].pk
    finally:
        release.set()
        genai_live.flush()


@pytest.mark.parametrize(
    ("variable", "value", "error"),
    [
        ("QUICKSAVE_GENAI_LIVE_AGENTS", "travel,not an agent!", "QUICKSAVE_GENAI_LIVE_AGENTS must list agent names"),
        ("QUICKSAVE_GENAI_OTLP_ENDPOINT", "collector:4318", "QUICKSAVE_GENAI_OTLP_ENDPOINT must be an http"),
        ("QUICKSAVE_GENAI_CAPTURE_CONTENT", "maybe", "QUICKSAVE_GENAI_CAPTURE_CONTENT must be one of"),
    ],
)
def test_a_bad_genai_setting_stops_the_process_naming_it(tmp_path: Any, variable: str, value: str, error: str) -> None:
    environment = {**os.environ, "DATABASE_URL": "postgresql://127.0.0.1/unused", "QUICKSAVE_VAR_DIR": str(tmp_path),
                   "DJANGO_SETTINGS_MODULE": "quicksave.settings", variable: value}  # fmt: skip
    code = "import django.conf; django.conf.settings.SECRET_KEY; print('STARTED')"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=environment, capture_output=True, text=True,
                            timeout=60)  # fmt: skip
    assert "STARTED" not in result.stdout
    assert f"ConfigError: {error}" in result.stderr


@pytest.mark.django_db(transaction=True)
def test_live_export_sends_a_runs_span_when_it_ends_and_an_approvals_span_when_it_is_decided(
    receiver: Receiver,
) -> None:
    agent = get_or_create_agent(name="travel")
    live = {"QUICKSAVE_GENAI_LIVE_AGENTS": frozenset({"travel"}), "QUICKSAVE_GENAI_OTLP_ENDPOINT": receiver.traces_url}
    with override_settings(**live):
        claimed: list[Run] = []

        def run_starts(number: int, thread: Thread, written: list[Checkpoint]) -> None:
            if number == 1:
                enqueue_run(thread=thread, checkpoint=written[-1], reason=RunReason.START)
                claimed.append(claim_run(agents=[agent], worker="w1"))  # type: ignore[arg-type]

        thread, written = chat_thread(agent, status_last="running", before_each=run_starts)
        approval = request_approval(thread=thread, checkpoint=written[1], action="search_hotels", args={"city": "X"})
        decide(approval=approval, user=person("rita", "reviewer"), decision="approve", args={"city": "Porto"})
        finish_run(run=claimed[0], worker="w1", status=RunStatus.COMPLETED)
        storage.set_thread_status(thread=thread, status="completed")
        assert genai_live.flush()
        wait_until(
            lambda: len(receiver.named("invoke_agent")) == 2, what="the run's and the thread's spans", timeout=10
        )
    roots = {span.attributes.get("quicksave.run.id", "thread"): span for span in receiver.named("invoke_agent")}
    assert set(roots) == {"thread", str(claimed[0].pk)}
    run_root = roots[str(claimed[0].pk)]
    assert run_root.attributes["quicksave.run.status"] == "completed"
    decided = only(receiver.named("approval"))
    assert decided.parent_id == run_root.span_id  # asked for during the run
    assert decided.attributes["quicksave.approval.decision"] == "approve_edited"
    assert decided.attributes["quicksave.approval.reviewer"] == "rita"
    assert {span.parent_id for span in receiver.named("chat") + receiver.named("execute_tool")} == {run_root.span_id}
    live_spans = {(span.name, span.span_id, span.parent_id, span.trace_id, span.start, span.end)
                  for span in receiver.spans}  # fmt: skip
    receiver.spans.clear()
    export(receiver, "--agent", "travel")
    assert live_spans == {(span.name, span.span_id, span.parent_id, span.trace_id, span.start, span.end)
                          for span in receiver.spans}  # fmt: skip


@pytest.mark.django_db
def test_a_forked_thread_is_exported_along_its_active_branch_only(agent: Agent, receiver: Receiver) -> None:
    thread, written = chat_thread(agent, steps=STEPS[:3], status_last="running")  # the abandoned result: Infante
    better = {"role": "tool", "tool_call_id": "call_1", "content": "Hotel Porto Bay, 95 EUR"}
    fork = forks.fork(checkpoint=written[1], user=person("ada", "admin"), reason="a cheaper hotel",
                      patch=[{"op": "add", "path": "/messages/-", "value": better}])  # fmt: skip
    answer = {"op": "add", "path": "/messages/-", "value": {"role": "assistant", "content": "Porto Bay it is."}}
    storage.append_checkpoint(thread=thread, parent=fork, branch=fork.branch.name, model=MODEL, patch=[answer])
    export(receiver, "--content")
    tool = only(receiver.named("execute_tool"))
    assert tool.attributes["gen_ai.tool.call.result"] == "Hotel Porto Bay, 95 EUR"
    assert (tool.start, tool.end) == (_ns(written[1]), _ns(fork))
    assert len(receiver.named("chat")) == 2
    assert not any("Infante" in json.dumps(span.attributes) for span in receiver.spans)
