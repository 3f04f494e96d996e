"""manage.py import_langgraph: threads a graph ran on LangGraph's PostgresSaver, copied into Quicksave
and carried on there with QuicksaveSaver."""

from __future__ import annotations

import io
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, TypedDict
from urllib.parse import quote

import psycopg
import pytest
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver, CheckpointTuple
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import Command, interrupt

from approvals.models import ApprovalRequest
from checkpoints import storage
from checkpoints.models import Branch, Checkpoint, Thread, ToolResult
from integrations.langgraph import importer
from integrations.langgraph.importer import import_threads
from integrations.langgraph.saver import QuicksaveSaver
from tests.conftest import person, signed_in

pytestmark = pytest.mark.django_db(transaction=True)

# Per process: another test run on the same server must not drop them under this one.
SOURCE_DB = f"lg_import_source_{os.getpid()}"
EMPTY_DB = f"lg_import_empty_{os.getpid()}"


class Chat(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


def chat_graph(checkpointer: BaseCheckpointSaver[Any]) -> Any:
    """research (a subgraph) -> respond -> approve, which asks a person before a message that says "send"."""

    def look_up(state: Chat) -> Chat:
        return {"messages": [AIMessage(f"found {len(state['messages'])} messages")]}

    research = StateGraph(Chat)
    research.add_node("look_up", look_up)
    research.add_edge(START, "look_up")
    research.add_edge("look_up", END)

    def respond(state: Chat) -> Chat:
        return {"messages": [AIMessage(f"answer {len(state['messages'])}")]}

    def approve(state: Chat) -> Chat:
        asked = [m for m in state["messages"] if isinstance(m, HumanMessage)][-1]
        if "send" not in str(asked.content):
            return {"messages": []}
        decision = interrupt({"action": "send_email", "args": {"to": "ana@example.com"}, "message": "Send it?"})
        return {"messages": [AIMessage(f"sent: {decision}")]}

    builder = StateGraph(Chat)
    builder.add_node("research", research.compile())
    builder.add_node("respond", respond)
    builder.add_node("approve", approve)
    builder.add_edge(START, "research")
    builder.add_edge("research", "respond")
    builder.add_edge("respond", "approve")
    builder.add_edge("approve", END)
    return builder.compile(checkpointer=checkpointer)


def thread(thread_id: str) -> RunnableConfig:
    return {"configurable": {"thread_id": thread_id}}


def url(dbname: str) -> str:
    db = settings.DATABASES["default"]
    password = f":{quote(db['PASSWORD'], safe='')}" if db.get("PASSWORD") else ""
    return (
        f"postgresql://{quote(db['USER'], safe='')}{password}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{dbname}"
    )


def recreate(dbname: str, *, drop_only: bool = False) -> None:
    with psycopg.connect(url("postgres"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
        if not drop_only:
            conn.execute(f'CREATE DATABASE "{dbname}"')


@dataclass(frozen=True)
class Source:
    url: str
    cut: datetime  # chat-a and chat-b were written before it, chat-c after
    fork_point: str  # the chat-a checkpoint update_state forked at


@pytest.fixture(scope="session")
def source(django_db_setup: Any) -> Iterator[Source]:
    """A PostgresSaver database in which the chat graph ran three threads: chat-a answered two
    questions (the second after a person said yes to sending), then was forked with
    update_state at its first question and ran on; chat-b waits at an interrupt; chat-c, written
    after `cut`, answered one question."""
    recreate(SOURCE_DB)
    recreate(EMPTY_DB)
    with PostgresSaver.from_conn_string(url(SOURCE_DB)) as saver:
        saver.setup()
        graph = chat_graph(saver)
        graph.invoke({"messages": [HumanMessage("hello")]}, thread("chat-a"))
        graph.invoke({"messages": [HumanMessage("please send it")]}, thread("chat-a"))
        graph.invoke(Command(resume="yes"), thread("chat-a"))
        # Back to just before `respond` answered "hello", with a different question.
        old = next(
            h
            for h in graph.get_state_history(thread("chat-a"))
            if h.next == ("respond",) and len(h.values["messages"]) == 2
        )
        forked = graph.update_state(old.config, {"messages": [HumanMessage("tell me more")]})
        graph.invoke(None, forked)
        graph.invoke({"messages": [HumanMessage("send the report")]}, thread("chat-b"))
        cut = datetime.now(UTC)
        graph.invoke({"messages": [HumanMessage("hi")]}, thread("chat-c"))
    yield Source(url=url(SOURCE_DB), cut=cut, fork_point=old.config["configurable"]["checkpoint_id"])
    recreate(SOURCE_DB, drop_only=True)
    recreate(EMPTY_DB, drop_only=True)


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("import_langgraph", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def reported(out: str, label: str) -> str:
    """The figure the command printed after `label:`."""
    found = re.search(rf"^  {re.escape(label)}: +(.+)$", out, re.MULTILINE)
    assert found is not None, out
    return found.group(1)


def listed(saver: BaseCheckpointSaver[Any], thread_id: str) -> dict[tuple[str, str], CheckpointTuple]:
    """Every checkpoint of a thread, all namespaces, by (namespace, checkpoint id)."""
    return {
        (t.config["configurable"]["checkpoint_ns"], t.config["configurable"]["checkpoint_id"]): t
        for t in saver.list(thread(thread_id))
    }


def from_source(source: Source, thread_id: str) -> dict[tuple[str, str], CheckpointTuple]:
    with PostgresSaver.from_conn_string(source.url) as saver:
        return listed(saver, thread_id)


def counts(source: Source, *thread_ids: str) -> tuple[int, int]:
    """(checkpoints, pending writes) the source holds for these threads."""
    found = [t for thread_id in thread_ids for t in from_source(source, thread_id).values()]
    return len(found), sum(len(t.pending_writes or []) for t in found)


def stored() -> tuple[int, int, int, int]:
    return Thread.objects.count(), Checkpoint.objects.count(), ToolResult.objects.count(), Branch.objects.count()


def test_every_namespace_checkpoint_and_write_is_copied_as_it_was(source: Source) -> None:
    out = run("--from", source.url)

    checkpoints, writes = counts(source, "chat-a", "chat-b", "chat-c")
    assert reported(out, "threads") == "3 (7 namespaces)"  # chat-a's research ran three times, b's and c's once
    assert reported(out, "checkpoints copied") == f"{checkpoints} (0 already in Quicksave)"
    assert reported(out, "pending writes copied") == f"{writes} (0 already in Quicksave)"
    saver = QuicksaveSaver()
    for thread_id in ("chat-a", "chat-b", "chat-c"):
        original, copied = from_source(source, thread_id), listed(saver, thread_id)
        assert copied.keys() == original.keys()
        assert len({ns for ns, _ in copied}) > 1  # the research subgraph's namespaces came too
        for key, want in original.items():
            got = copied[key]
            assert got.checkpoint["channel_values"] == want.checkpoint["channel_values"], key
            assert got.checkpoint["channel_versions"] == want.checkpoint["channel_versions"], key
            assert got.checkpoint["versions_seen"] == want.checkpoint["versions_seen"], key
            assert got.metadata == want.metadata, key
            assert got.parent_config == want.parent_config, key
            assert sorted(map(repr, got.pending_writes or [])) == sorted(map(repr, want.pending_writes or [])), key
    # One Quicksave thread per (thread, namespace), under the default agent.
    assert {t.external_id for t in Thread.objects.filter(agent__name="langgraph")} == {
        f"{thread_id}#{ns}" if ns else thread_id
        for thread_id in ("chat-a", "chat-b", "chat-c")
        for ns, _ in from_source(source, thread_id)
    }


def test_the_tree_keeps_its_parents_and_the_fork_opens_a_branch(source: Source) -> None:
    run("--from", source.url, "--thread", "chat-a")

    root = Thread.objects.get(agent__name="langgraph", external_id="chat-a")
    rows = list(Checkpoint.objects.filter(thread=root).select_related("parent"))
    for row in rows:
        lg_parent = row.metadata["lg_parent"]
        assert (row.parent.metadata["lg_id"] if row.parent else None) == lg_parent
    fork = Branch.objects.get(thread=root, fork_point__isnull=False)
    assert fork.fork_point is not None and fork.fork_point.metadata["lg_id"] == source.fork_point
    first = Checkpoint.objects.filter(branch=fork).order_by("seq").first()
    assert first is not None and first.metadata["lg_metadata"]["source"] == "update"
    # The main branch is the line LangGraph wrote first: both questions, the fork after it.
    main = [row for row in rows if row.branch_id != fork.pk]
    assert len(main) + Checkpoint.objects.filter(branch=fork).count() == len(rows)
    assert max(r.metadata["lg_id"] for r in main) < first.metadata["lg_id"]


def test_a_second_run_copies_nothing(source: Source) -> None:
    run("--from", source.url)
    before = stored()

    out = run("--from", source.url)

    assert stored() == before
    checkpoints, writes = counts(source, "chat-a", "chat-b", "chat-c")
    assert reported(out, "checkpoints copied") == f"0 ({checkpoints} already in Quicksave)"
    assert reported(out, "pending writes copied") == f"0 ({writes} already in Quicksave)"


def test_a_run_cut_short_is_finished_by_the_next(source: Source) -> None:
    class Crash(Exception):
        pass

    def crash_halfway(done: int, total: int) -> None:
        if done == total // 2:
            raise Crash

    with PostgresSaver.from_conn_string(source.url) as saver, pytest.raises(Crash):
        import_threads(source=saver, thread_ids=["chat-a"], progress=crash_halfway)
    checkpoints, writes = counts(source, "chat-a")
    partial = Checkpoint.objects.count()
    assert 0 < partial < checkpoints

    out = run("--from", source.url, "--thread", "chat-a")

    assert reported(out, "checkpoints copied") == f"{checkpoints - partial} ({partial} already in Quicksave)"
    assert Checkpoint.objects.count() == checkpoints
    assert ToolResult.objects.count() == writes
    # A checkpoint whose writes were not all saved gets the missing ones, and nothing else.
    ToolResult.objects.filter(pk=ToolResult.objects.order_by("id").values("id")[:1]).delete()
    out = run("--from", source.url, "--thread", "chat-a")
    assert reported(out, "checkpoints copied").startswith("0 (")
    assert reported(out, "pending writes copied") == f"1 ({writes - 1} already in Quicksave)"
    assert ToolResult.objects.count() == writes


def test_a_dry_run_reports_what_would_be_copied_and_writes_nothing(source: Source) -> None:
    out = run("--from", source.url, "--dry-run")

    checkpoints, writes = counts(source, "chat-a", "chat-b", "chat-c")
    assert out.startswith("Dry run of an import from ") and ": nothing was written." in out
    assert reported(out, "threads") == "3 (7 namespaces)"
    assert reported(out, "checkpoints to copy") == f"{checkpoints} (0 already in Quicksave)"
    assert reported(out, "pending writes to copy") == f"{writes} (0 already in Quicksave)"
    assert reported(out, "waiting at an interrupt") == "1 thread(s), to be filed as approvals"
    assert stored() == (0, 0, 0, 0)
    assert not ApprovalRequest.objects.exists()

    run("--from", source.url, "--thread", "chat-b")
    out = run("--from", source.url, "--dry-run")
    b_checkpoints, b_writes = counts(source, "chat-b")
    assert (
        reported(out, "checkpoints to copy") == f"{checkpoints - b_checkpoints} ({b_checkpoints} already in Quicksave)"
    )
    assert reported(out, "pending writes to copy") == f"{writes - b_writes} ({b_writes} already in Quicksave)"
    assert stored()[1] == b_checkpoints


def test_threads_are_picked_by_id_and_by_time(source: Source) -> None:
    cut = source.cut.isoformat()

    def copied() -> set[str]:
        names = Thread.objects.values_list("external_id", flat=True)
        return {name for name in names if name and "#" not in name}

    with pytest.raises(CommandError, match="has no thread 'no-such-thread': nothing was copied"):
        run("--from", source.url, "--thread", "chat-a", "--thread", "no-such-thread")
    with pytest.raises(CommandError, match=r"has no thread 'no-such-thread'\.$"):
        run("--from", source.url, "--thread", "no-such-thread", "--dry-run")
    assert stored() == (0, 0, 0, 0)
    run("--from", source.url, "--since", cut, "--dry-run")
    assert copied() == set()
    run("--from", source.url, "--since", cut)
    assert copied() == {"chat-c"}
    run("--from", source.url, "--until", cut, "--thread", "chat-a", "chat-c")
    assert copied() == {"chat-a", "chat-c"}
    run("--from", source.url, "--until", cut)
    assert copied() == {"chat-a", "chat-b", "chat-c"}

    with pytest.raises(CommandError, match="ISO 8601"):
        run("--from", source.url, "--since", "yesterday")


def test_the_interrupt_a_thread_waits_at_becomes_an_approval(source: Source) -> None:
    run("--from", source.url, "--no-approvals", "--thread", "chat-b")
    assert not ApprovalRequest.objects.exists()
    QuicksaveSaver().delete_thread("chat-b")
    assert not Thread.objects.exists()

    out = run("--from", source.url)

    # chat-a's interrupt was answered before the move: history, not a question.
    approval = ApprovalRequest.objects.get()
    assert approval.thread.external_id == "chat-b"
    assert (approval.action, approval.args, approval.status) == ("send_email", {"to": "ana@example.com"}, "pending")
    assert reported(out, "waiting at an interrupt") == "1 thread(s), filed as approvals"
    run("--from", source.url)
    assert ApprovalRequest.objects.count() == 1


def test_the_graph_goes_on_with_quicksave_from_where_postgres_left_off(source: Source) -> None:
    run("--from", source.url)
    graph = chat_graph(QuicksaveSaver())
    before = graph.get_state(thread("chat-c"))
    last_id = before.config["configurable"]["checkpoint_id"]
    with PostgresSaver.from_conn_string(source.url) as saver:
        assert last_id == saver.get_tuple(thread("chat-c")).config["configurable"]["checkpoint_id"]  # type: ignore[union-attr]

    result = graph.invoke({"messages": [HumanMessage("and again")]}, thread("chat-c"))

    assert [m.content for m in result["messages"]] == [
        *[m.content for m in before.values["messages"]], "and again", "found 4 messages", "answer 5",
    ]  # fmt: skip
    history = list(graph.get_state_history(thread("chat-c")))
    ids = [h.config["configurable"]["checkpoint_id"] for h in history]
    assert last_id in ids and ids.index(last_id) > 0
    assert history[-1].parent_config is None

    # The thread that waited at an interrupt is resumed from Quicksave.
    waiting = graph.invoke(Command(resume="approved"), thread("chat-b"))
    assert waiting["messages"][-1].content == "sent: approved"


def test_imported_history_is_browsable_and_diffable(source: Source) -> None:
    run("--from", source.url, "--thread", "chat-c")

    history = list(chat_graph(QuicksaveSaver()).get_state_history(thread("chat-c")))
    # hi, found 1 messages, answer 2: after approve, after respond, after research, ...
    assert [len(h.values.get("messages", [])) for h in history][:3] == [3, 3, 2]
    answered = Checkpoint.objects.get(metadata__lg_id=history[1].config["configurable"]["checkpoint_id"])
    assert answered.parent is not None
    ops = storage.diff(base=answered.parent, target=answered)
    assert [op["path"] for op in ops if op["path"].startswith("/channel_values/messages")] == [
        "/channel_values/messages/-"
    ]
    page = signed_in(person("vera", "viewer")).get(f"/checkpoints/{answered.pk}/diff/")
    assert page.status_code == 200
    assert "messages" in page.content.decode()


def test_an_unreadable_source_is_a_clear_error(source: Source) -> None:
    with pytest.raises(
        CommandError, match=re.escape("Cannot connect to the PostgresSaver database 127.0.0.1:1/nowhere: ")
    ) as refused:
        run("--from", "postgresql://ana:s3cret@127.0.0.1:1/nowhere")
    assert "s3cret" not in str(refused.value)
    with pytest.raises(CommandError, match="--from takes a PostgreSQL URL"):
        run("--from", "not a url")
    with pytest.raises(CommandError, match=f"/{EMPTY_DB} has no PostgresSaver tables"):
        run("--from", url(EMPTY_DB))
    assert stored() == (0, 0, 0, 0)


def test_the_source_is_read_a_page_at_a_time_and_never_written(source: Source, monkeypatch: Any) -> None:
    monkeypatch.setattr(importer, "PAGE", 4)
    with PostgresSaver.from_conn_string(source.url) as saver:
        before = [t.config for t in saver.list(None)]
    progress = io.StringIO()

    call_command("import_langgraph", "--from", source.url, "--agent", "moved", stdout=io.StringIO(), stderr=progress)

    with PostgresSaver.from_conn_string(source.url) as saver:
        assert [t.config for t in saver.list(None)] == before
    assert Checkpoint.objects.count() == len(before)
    assert {t.agent.name for t in Thread.objects.select_related("agent")} == {"moved"}
    lines = progress.getvalue().splitlines()
    assert lines[0] == f"import [{'-' * 30}]   0% 0/{len(before)} checkpoints"
    assert lines[-1] == f"import [{'#' * 30}] 100% {len(before)}/{len(before)} checkpoints"
