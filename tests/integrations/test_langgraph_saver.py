"""A compiled LangGraph graph checkpointing into Quicksave: history, deltas and time travel."""

from __future__ import annotations

import json
import operator
import os
import random
import subprocess
import sys
from collections.abc import Callable
from typing import Annotated, Any, TypedDict, TypeVar

import pytest
from django.db import connection, transaction
from django.db.models import signals
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.base.id import uuid6
from langgraph.checkpoint.serde.types import INTERRUPT
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import Command, interrupt

from checkpoints import storage
from checkpoints.models import Branch, Checkpoint, PayloadKind, Thread, ToolResult
from integrations.langgraph import values
from integrations.langgraph.saver import QuicksaveSaver
from integrations.langgraph.tables import WRITE_TOOL
from integrations.langgraph.values import TYPED
from tests.conftest import message
from tests.processes import ROOT, database_url

T = TypeVar("T")

pytestmark = pytest.mark.django_db(transaction=True)


class ChatState(TypedDict):
    messages: Annotated[list[dict[str, Any]], operator.add]


def respond(state: ChatState) -> dict[str, Any]:
    return {"messages": [message(len(state["messages"]))]}


def one_node_graph(state: type, node: Any, saver: QuicksaveSaver) -> Any:
    """START -> node -> END, checkpointed by `saver`."""
    builder: Any = StateGraph(state)
    builder.add_node(node.__name__, node)
    builder.add_edge(START, node.__name__)
    builder.add_edge(node.__name__, END)
    return builder.compile(checkpointer=saver)


def chat_graph(saver: QuicksaveSaver) -> Any:
    return one_node_graph(ChatState, respond, saver)


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def quicksave_thread(thread_id: str) -> Thread:
    return Thread.objects.get(agent__name="langgraph", external_id=thread_id)


def test_graph_state_and_history_come_from_quicksave() -> None:
    graph = chat_graph(QuicksaveSaver())
    config: RunnableConfig = {"configurable": {"thread_id": "chat-1"}}
    for turn in range(5):
        graph.invoke({"messages": [user(f"turn {turn}")]}, config)

    state = graph.get_state(config)
    assert len(state.values["messages"]) == 10
    assert state.values["messages"][-2] == user("turn 4")

    history = list(graph.get_state_history(config))
    thread = quicksave_thread("chat-1")
    rows = list(Checkpoint.objects.filter(thread=thread).order_by("seq"))
    # Each invoke writes an input checkpoint, the loop's first step and the step after `respond`.
    assert len(history) == len(rows) == 15
    assert history[0].config["configurable"]["checkpoint_id"] == state.config["configurable"]["checkpoint_id"]
    assert [h.config["configurable"]["checkpoint_id"] for h in history] == [r.metadata["lg_id"] for r in rows][::-1]
    assert [len(h.values.get("messages", [])) for h in history][:3] == [10, 9, 8]


def test_a_growing_message_list_is_stored_as_deltas() -> None:
    graph = chat_graph(QuicksaveSaver())
    config: RunnableConfig = {"configurable": {"thread_id": "chat-deltas"}}
    for turn in range(20):
        graph.invoke({"messages": [user(f"turn {turn}")]}, config)

    rows = list(Checkpoint.objects.filter(thread=quicksave_thread("chat-deltas")).order_by("seq"))
    deltas = [row for row in rows if row.kind == PayloadKind.DELTA]
    assert len(rows) == 60
    assert rows[0].kind == PayloadKind.SNAPSHOT
    assert len(deltas) > len(rows) / 2
    # A delta holds the change (at most the new message), never the 40-message list.
    one_message = len(json.dumps(message(0)))
    assert max(len(bytes(row.payload)) for row in deltas) < 2 * one_message
    stored = sum(len(bytes(row.payload)) for row in rows)
    assert stored < sum(row.state_bytes for row in rows) / 10


class PlanState(TypedDict):
    turn: int
    plan: dict[str, Any]


def replan(state: PlanState) -> dict[str, Any]:
    turn = state["turn"]
    return {"plan": {"turn": turn, "city": f"city {turn}", "nights": turn % 5, "budget": 1000 + turn}}


def test_a_flat_dict_a_node_returns_anew_is_written_as_one_replace(monkeypatch: pytest.MonkeyPatch) -> None:
    patches: list[list[dict[str, Any]]] = []
    append = storage.append_checkpoint_id

    def spy(**fields: Any) -> Any:
        if fields.get("patch") is not None:
            patches.append(fields["patch"])
        return append(**fields)

    monkeypatch.setattr(storage, "append_checkpoint_id", spy)
    graph = one_node_graph(PlanState, replan, QuicksaveSaver())
    config: RunnableConfig = {"configurable": {"thread_id": "plan-replaced"}}
    for turn in (1, 2, 3):
        graph.invoke({"turn": turn}, config)

    # The last put: every member of the plan changed, and most channel versions: one op each.
    ops = patches[-1]
    plan = replan({"turn": 3, "plan": {}})["plan"]
    assert [op for op in ops if op["path"].startswith("/channel_values/plan")] == [
        {"op": "replace", "path": "/channel_values/plan", "value": plan}
    ]
    assert [op["path"] for op in ops if op["path"].startswith("/channel_versions")] == ["/channel_versions"]
    assert graph.get_state(config).values == {"turn": 3, "plan": plan}


def test_update_state_on_an_old_checkpoint_forks_a_quicksave_branch() -> None:
    graph = chat_graph(QuicksaveSaver())
    config: RunnableConfig = {"configurable": {"thread_id": "chat-fork"}}
    for turn in range(3):
        graph.invoke({"messages": [user(f"turn {turn}")]}, config)
    # Rewind to the second turn, just before `respond` answered it.
    old = next(h for h in graph.get_state_history(config) if h.next == ("respond",) and len(h.values["messages"]) == 3)
    old_id = old.config["configurable"]["checkpoint_id"]

    forked_config = graph.update_state(old.config, {"messages": [user("a different question")]})
    graph.invoke(None, forked_config)

    thread = quicksave_thread("chat-fork")
    fork = Branch.objects.get(thread=thread, fork_point__isnull=False)
    assert fork.fork_point is not None
    assert fork.fork_point.metadata["lg_id"] == old_id
    forked = list(Checkpoint.objects.filter(branch=fork).order_by("seq"))
    assert [row.metadata["lg_metadata"]["source"] for row in forked] == ["update", "loop"]
    assert forked[0].metadata["lg_parent"] == old_id

    state = graph.get_state(config)
    assert state.config["configurable"]["checkpoint_id"] == forked[-1].metadata["lg_id"]
    assert state.values["messages"] == [user("turn 0"), message(1), user("turn 1"), user("a different question"),
                                        message(4)]  # fmt: skip
    history = list(graph.get_state_history(config))
    assert [h.config["configurable"]["checkpoint_id"] for h in history[:2]] == [r.metadata["lg_id"] for r in forked][
        ::-1
    ]
    assert len(history) == Checkpoint.objects.filter(thread=thread).count() == 9 + 2
    # The main branch is untouched: its head is still the third turn's answer.
    main_head = Checkpoint.objects.filter(thread=thread, branch__name="main").order_by("-seq").first()
    assert main_head is not None
    at_main_head: RunnableConfig = {
        "configurable": {**config["configurable"], "checkpoint_id": main_head.metadata["lg_id"]}
    }
    assert graph.get_state(at_main_head).values["messages"][-1] == message(5)


class MessagesState(TypedDict):
    messages: Annotated[list[Any], add_messages]


def test_langchain_messages_round_trip_through_typed_envelopes() -> None:
    def answer(state: MessagesState) -> dict[str, Any]:
        return {"messages": [AIMessage(content=f"answer {len(state['messages'])}")]}

    graph = one_node_graph(MessagesState, answer, QuicksaveSaver())
    config: RunnableConfig = {"configurable": {"thread_id": "chat-messages"}}
    for turn in range(3):
        graph.invoke(MessagesState(messages=[HumanMessage(content=f"question {turn}")]), config)

    messages = graph.get_state(config).values["messages"]
    assert [type(m) for m in messages] == [HumanMessage, AIMessage] * 3
    assert messages[-1].content == "answer 5"
    # Each message is its own typed envelope inside a plain list, so a step appends one.
    rows = list(Checkpoint.objects.filter(thread=quicksave_thread("chat-messages")).order_by("seq"))
    appended = [op for row in rows if row.kind == PayloadKind.DELTA for op in storage.decode_payload(row)
                if op["path"] == "/channel_values/messages/-"]  # fmt: skip
    assert appended and all(TYPED in op["value"] for op in appended)


def approval_graph(saver: QuicksaveSaver) -> Any:
    def book(state: ChatState) -> dict[str, Any]:
        decision = interrupt({"action": "book_flight", "args": {"to": "Lisbon"}})
        return {"messages": [{"role": "tool", "content": f"booking {decision}"}]}

    return one_node_graph(ChatState, book, saver)


def test_an_interrupt_is_kept_as_a_pending_write_and_resumes() -> None:
    graph = approval_graph(QuicksaveSaver())
    config: RunnableConfig = {"configurable": {"thread_id": "chat-interrupt"}}

    result = graph.invoke({"messages": [user("book me a flight")]}, config)

    assert [i.value for i in result["__interrupt__"]] == [{"action": "book_flight", "args": {"to": "Lisbon"}}]
    waiting = graph.get_state(config)
    assert waiting.next == ("book",)
    assert [i.value["action"] for task in waiting.tasks for i in task.interrupts] == ["book_flight"]
    thread = quicksave_thread("chat-interrupt")
    writes = ToolResult.objects.filter(thread=thread, tool__startswith=f"{WRITE_TOOL}:")
    channels = {write.result["channel"] for write in writes}
    assert INTERRUPT in channels

    # A fresh saver (another process, say) sees the same interrupt and resumes the graph.
    resumed = approval_graph(QuicksaveSaver()).invoke(Command(resume="approved"), config)

    assert resumed["messages"][-1] == {"role": "tool", "content": "booking approved"}
    assert graph.get_state(config).next == ()


def test_a_subgraph_checkpoints_into_its_own_namespace_thread() -> None:
    inner = approval_graph(QuicksaveSaver()).builder.compile()
    builder = StateGraph(ChatState)
    builder.add_node("inner", inner)
    builder.add_edge(START, "inner")
    builder.add_edge("inner", END)
    graph: Any = builder.compile(checkpointer=QuicksaveSaver())
    config: RunnableConfig = {"configurable": {"thread_id": "chat-subgraph"}}

    graph.invoke({"messages": [user("book me a flight")]}, config)

    namespaces = Thread.objects.filter(metadata__langgraph__thread_id="chat-subgraph").exclude(
        external_id="chat-subgraph"
    )
    assert [(t.external_id or "").startswith("chat-subgraph#inner:") for t in namespaces] == [True]
    state = graph.get_state(config, subgraphs=True)
    sub_state = state.tasks[0].state
    assert sub_state.config["configurable"]["checkpoint_ns"].startswith("inner:")
    assert sub_state.next == ("book",)

    resumed = graph.invoke(Command(resume="approved"), config)

    assert resumed["messages"][-1] == {"role": "tool", "content": "booking approved"}
    # Deleting the LangGraph thread removes every namespace of it.
    graph.checkpointer.delete_thread("chat-subgraph")
    assert not Thread.objects.filter(metadata__langgraph__thread_id="chat-subgraph").exists()


class EditableState(TypedDict):
    messages: Annotated[list[dict[str, Any]], add_messages]
    notes: list[str]


def edit_graph(saver: QuicksaveSaver) -> Any:
    """Each turn appends a message, rewrites the first one by id and edits `notes` in place."""

    def edit(state: EditableState) -> dict[str, Any]:
        turn = len(state["messages"])
        notes = state.get("notes") or []
        if notes:
            notes[0] = f"first note, seen at turn {turn}"  # the very list LangGraph holds, edited in place
        notes.append(f"note {turn}")
        return {
            "messages": [
                {"id": "m-first", "role": "assistant", "content": f"rewritten at turn {turn}"},
                {"id": f"m-{turn}", "role": "assistant", "content": f"turn {turn}"},
            ],
            "notes": notes,
        }

    return one_node_graph(EditableState, edit, saver)


def stored_values(thread_id: str) -> dict[str, Any]:
    """The latest state as a saver that has seen nothing reads it from the database."""
    config: RunnableConfig = {"configurable": {"thread_id": thread_id}}
    storage.clear_caches()
    found = QuicksaveSaver().get_tuple(config)
    assert found is not None
    return dict(found.checkpoint["channel_values"])


def test_replaced_messages_and_lists_edited_in_place_are_stored_as_the_graph_holds_them() -> None:
    graph = edit_graph(QuicksaveSaver())
    config: RunnableConfig = {"configurable": {"thread_id": "edits"}}
    for _ in range(4):
        graph.invoke({}, config)

    held = graph.get_state(config).values
    assert held["notes"][0].startswith("first note, seen at turn")
    assert len(held["notes"]) == 4
    values = stored_values("edits")
    assert [m.content for m in values["messages"]] == [m.content for m in held["messages"]]
    assert values["messages"][0].content == held["messages"][0].content == "rewritten at turn 4"
    assert values["notes"] == held["notes"]


def test_two_savers_taking_turns_on_one_thread_each_write_on_top_of_the_other() -> None:
    first, second = chat_graph(QuicksaveSaver()), chat_graph(QuicksaveSaver())
    config: RunnableConfig = {"configurable": {"thread_id": "turns"}}
    for turn in range(6):
        (first if turn % 2 == 0 else second).invoke({"messages": [user(f"turn {turn}")]}, config)

    values = stored_values("turns")
    assert [m["content"] for m in values["messages"] if m["role"] == "user"] == [f"turn {t}" for t in range(6)]
    assert len(values["messages"]) == 12
    thread = quicksave_thread("turns")
    assert Branch.objects.filter(thread=thread).count() == 1  # every put found its parent at the head


def test_a_read_after_a_put_gives_what_was_stored_even_if_the_list_was_changed_since() -> None:
    from langgraph.checkpoint.base import empty_checkpoint

    saver = QuicksaveSaver()
    messages = [user("one"), user("two")]

    def put(thread_id: str) -> RunnableConfig:
        config: RunnableConfig = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
        checkpoint = empty_checkpoint()
        checkpoint["channel_values"] = {"messages": messages}
        checkpoint["channel_versions"] = {"messages": 1}
        saver.put(config, checkpoint, {"source": "input", "step": -1}, {"messages": 1})
        return config

    unchanged = saver.get_tuple(put("reread"))
    assert unchanged is not None
    assert unchanged.checkpoint["channel_values"]["messages"] == [user("one"), user("two")]
    assert unchanged.checkpoint["channel_values"]["messages"] is not messages  # a list of its own

    config = put("reread-changed")
    messages.append(user("never saved"))  # the caller's list, changed after the put
    changed = saver.get_tuple(config)
    assert changed is not None
    assert changed.checkpoint["channel_values"]["messages"] == [user("one"), user("two")]


def test_each_read_of_the_checkpoint_just_written_hands_out_items_of_its_own() -> None:
    saver = QuicksaveSaver()
    config: RunnableConfig = {"configurable": {"thread_id": "own-items", "checkpoint_ns": ""}}
    checkpoint = empty_checkpoint()
    # Flat messages (copied a dict at a time) and a list mixing scalars and flat dicts.
    checkpoint["channel_values"] = {"messages": [user("one"), user("two")], "tags": ["a", {"k": "v"}, 3]}
    checkpoint["channel_versions"] = {"messages": 1, "tags": 1}
    config = saver.put(config, checkpoint, {"source": "input", "step": -1}, {"messages": 1, "tags": 1})

    first = saver.get_tuple(config)
    assert first is not None
    first.checkpoint["channel_values"]["messages"][0]["content"] = "changed"
    first.checkpoint["channel_values"]["tags"][1]["k"] = "changed"
    second = saver.get_tuple(config)
    assert second is not None
    assert second.checkpoint["channel_values"]["messages"] == [user("one"), user("two")]
    assert second.checkpoint["channel_values"]["tags"] == ["a", {"k": "v"}, 3]


def _rows_looked_at(cursor: Any, tables: list[str], read: Callable[[], T]) -> tuple[T, int]:
    """What `read` returns, and how many rows of `tables` it fetched or scanned (this transaction's
    statistics, so the cursor's connection must be the one `read` uses)."""
    counted = "SELECT " + " + ".join(
        f"pg_stat_get_xact_tuples_fetched('{table}'::regclass) + pg_stat_get_xact_tuples_returned('{table}'::regclass)"
        for table in tables
    )
    cursor.execute(counted)
    (before,) = cursor.fetchone()
    result = read()
    cursor.execute(counted)
    (after,) = cursor.fetchone()
    return result, after - before


def test_reading_the_newest_checkpoint_does_not_read_the_threads_older_writes() -> None:
    # The read joins a checkpoint's pending writes; a plan made while the thread was young
    # (PostgreSQL's cached generic plan) found them by thread alone, reading every write the
    # thread had made, so each read grew with the thread.
    with connection.cursor() as cursor:  # the statistics of a new installation: empty tables
        cursor.execute("ANALYZE checkpoints_thread, checkpoints_checkpoint, checkpoints_toolresult")
    saver = QuicksaveSaver(agent="reads")
    newest: RunnableConfig = {"configurable": {"thread_id": "long", "checkpoint_ns": ""}}
    config, checkpoint = newest, empty_checkpoint()
    for step in range(120):
        at = saver.put(config, checkpoint, {"source": "loop", "step": step, "parents": {}}, {})
        saver.put_writes(at, [("step", step), ("note", f"write {step}")], f"task-{step}")
        assert saver.get_tuple(newest) is not None  # the reads that made the plan, then reused it
        config, checkpoint = at, {**checkpoint, "id": str(uuid6(clock_seq=step + 1))}

    with transaction.atomic(), connection.cursor() as cursor:
        read, looked_at = _rows_looked_at(cursor, ["checkpoints_toolresult"], lambda: saver.get_tuple(newest))

    assert read is not None and read.pending_writes is not None
    assert [write[1:] for write in read.pending_writes] == [("step", 119), ("note", "write 119")]
    assert looked_at <= 4, f"the read looked at {looked_at} of the thread's 240 writes"


def test_writes_for_a_thread_deleted_behind_the_savers_back_go_to_the_thread_made_again() -> None:
    saver = QuicksaveSaver()
    graph = chat_graph(saver)
    config: RunnableConfig = {"configurable": {"thread_id": "deleted-meanwhile"}}
    graph.invoke({"messages": [user("hi")]}, config)
    latest = saver.get_tuple(config)
    assert latest is not None
    QuicksaveSaver().delete_thread("deleted-meanwhile")  # another saver, another process...

    saver.put_writes(latest.config, [("messages", [user("again")])], task_id="task-1")

    written = saver.get_tuple(latest.config)
    remade = quicksave_thread("deleted-meanwhile")
    assert ToolResult.objects.filter(thread=remade).count() == 1
    assert written is None  # its checkpoint went with the deleted thread


class ToolChatState(TypedDict):
    messages: Annotated[list[Any], add_messages]


def propose_a_tool_call(state: ToolChatState) -> dict[str, Any]:
    call = {"name": "book", "args": {"city": "Rome"}, "id": "call-1", "type": "tool_call"}
    return {"messages": [AIMessage(content="", tool_calls=[call], id="ai-1")]}


def read_in_a_fresh_process(thread_id: str) -> Any:
    """The graph's state as another process reads it, with its own saver and no caches."""
    script = (
        "import json, django; django.setup()\n"
        "from integrations.langgraph.saver import QuicksaveSaver\n"
        f"found = QuicksaveSaver().get_tuple({{'configurable': {{'thread_id': {thread_id!r}}}}})\n"
        "print(json.dumps([getattr(m, 'tool_calls', []) for m in found.checkpoint['channel_values']['messages']]))\n"
    )
    env = {**os.environ, "DATABASE_URL": database_url(), "DJANGO_SETTINGS_MODULE": "quicksave.settings"}
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_message_edited_in_place_and_sent_back_with_update_state_is_stored() -> None:
    graph = one_node_graph(ToolChatState, propose_a_tool_call, QuicksaveSaver())
    config: RunnableConfig = {"configurable": {"thread_id": "edit-in-place"}}
    graph.invoke({"messages": [HumanMessage(content="Book me a hotel", id="human-1")]}, config)

    # The usual human-in-the-loop edit: take the message, change it, send it back.
    proposed = graph.get_state(config).values["messages"][-1]
    proposed.tool_calls[0]["args"]["city"] = "Oslo"
    graph.update_state(config, {"messages": [proposed]})

    assert graph.get_state(config).values["messages"][-1].tool_calls[0]["args"] == {"city": "Oslo"}
    calls = read_in_a_fresh_process("edit-in-place")
    assert calls[-1][0]["args"] == {"city": "Oslo"}


SHARED_REPLY: dict[str, Any] = {}


def reply_with_the_shared_object(state: ChatState) -> dict[str, Any]:
    # A scripted model that hands every caller the very same object, as test doubles do.
    return {"messages": [SHARED_REPLY]}


def test_objects_given_to_or_handed_out_by_the_saver_are_shared_with_no_one() -> None:
    SHARED_REPLY.clear()
    SHARED_REPLY.update({"role": "assistant", "content": "first", "args": {"city": "Rome"}})
    graph = one_node_graph(ChatState, reply_with_the_shared_object, QuicksaveSaver())
    first: RunnableConfig = {"configurable": {"thread_id": "shared-1"}}
    second: RunnableConfig = {"configurable": {"thread_id": "shared-2"}}
    graph.invoke({"messages": [user("hi")]}, first)

    # The caller goes on changing the object it handed over: the first thread keeps what it stored.
    SHARED_REPLY["args"]["city"] = "Oslo"
    graph.invoke({"messages": [user("hi")]}, second)
    assert graph.get_state(first).values["messages"][-1]["args"] == {"city": "Rome"}
    assert graph.get_state(second).values["messages"][-1]["args"] == {"city": "Oslo"}

    # Two reads hand out two copies: changing one changes neither the other nor what is stored.
    read = graph.get_state(first).values["messages"]
    read[-1]["args"]["city"] = "Paris"
    read.append(user("sneaked in"))
    again = graph.get_state(first).values["messages"]
    assert again[-1]["args"] == {"city": "Rome"} and len(again) == 2
    graph.invoke({"messages": [user("more")]}, first)
    assert [m["content"] for m in graph.get_state(first).values["messages"]] == ["hi", "first", "more", "first"]
    assert graph.get_state(first).values["messages"][1]["args"] == {"city": "Rome"}


def test_a_graphs_steps_build_no_checkpoint_model_instances() -> None:
    # The saver keeps nothing of a written row but its id: building the model instance of its
    # 25 columns was a sixteenth of each put's instructions.
    graph = chat_graph(QuicksaveSaver())
    config: RunnableConfig = {"configurable": {"thread_id": "no-instances"}}
    graph.invoke({"messages": [user("hi")]}, config)
    built: list[Checkpoint] = []

    def count(sender: type[Checkpoint], instance: Checkpoint, **kwargs: Any) -> None:
        built.append(instance)

    signals.post_init.connect(count, sender=Checkpoint)
    try:
        for turn in range(3):
            graph.invoke({"messages": [user(f"turn {turn}")]}, config)
    finally:
        signals.post_init.disconnect(count, sender=Checkpoint)

    assert built == []
    assert Checkpoint.objects.filter(thread=quicksave_thread("no-instances")).count() == 12
    assert len(graph.get_state(config).values["messages"]) == 8


def test_channel_versions_and_versions_seen_are_diffed_as_make_patch_diffs_them() -> None:
    # The saver diffs these two members, which change on nearly every put, without encoding and
    # walking them; the ops must be those of the general path, op for op.
    rng = random.Random(23)
    keys = ["messages", "step", "a/b", "~x", "branch:to:node", "__start__"]
    scalars: list[Any] = [0, 1, 2, 300, True, False, None, "1", "00000000000000000000000000000002.0.5"]

    def flat(floats: bool = False) -> dict[str, Any]:
        pool = [*scalars, 1.0] if floats else scalars
        return {key: rng.choice(pool) for key in rng.sample(keys, rng.randint(0, len(keys)))}

    def nested() -> dict[str, Any]:
        return {key: flat() for key in rng.sample(keys, rng.randint(0, 4))}

    saver, taken = QuicksaveSaver(), 0
    for _ in range(3000):
        stored, value = rng.choice([(flat(rng.random() < 0.1), flat()), (nested(), nested())])
        if rng.random() < 0.5:  # most puts change a few members of the last checkpoint's
            value = {**stored, **{k: v for k, v in value.items() if rng.random() < 0.3}}
        fast = values.scalar_dicts_ops(stored, value, "/m")
        if fast is not None:
            taken += 1
            assert fast == values.member_ops(stored, saver._encode(value), "/m"), (stored, value)
    assert taken > 2000


def test_the_newest_checkpoint_read_keeps_no_plan_made_while_the_tables_were_young() -> None:
    # psycopg prepares a statement at its sixth run, and PostgreSQL then keeps a generic plan for
    # the connection's life: one made over near-empty tables sorted every checkpoint of the thread
    # and joined every pending write of it, on every read after (1.2 ms a read at 320 steps). The
    # tables are as the test database's flush leaves them: emptied, not analyzed since, as a
    # benchmark's TRUNCATE leaves them.
    saver = QuicksaveSaver(agent="young-tables")
    newest: RunnableConfig = {"configurable": {"thread_id": "young", "checkpoint_ns": ""}}
    config, checkpoint = newest, empty_checkpoint()
    with transaction.atomic(), connection.cursor() as cursor:  # every statement on this one connection
        for step in range(100):
            at = saver.put(config, checkpoint, {"source": "loop", "step": step, "parents": {}}, {})
            saver.put_writes(at, [("step", step)], f"task-{step}")
            assert saver.get_tuple(newest) is not None
            config, checkpoint = at, {**checkpoint, "id": str(uuid6(clock_seq=step + 1))}
        read, looked_at = _rows_looked_at(
            cursor, ["checkpoints_checkpoint", "checkpoints_toolresult"], lambda: saver.get_tuple(newest)
        )
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        prepared = [statement for (statement,) in cursor.fetchall()]

    assert read is not None and [write[1:] for write in read.pending_writes or []] == [("step", 99)]
    assert looked_at <= 8, f"the read looked at {looked_at} rows of 100 checkpoints and their writes"
    assert not [statement for statement in prepared if "cp.metadata, w.key" in statement]
