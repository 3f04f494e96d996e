"""The OpenAI Agents SDK on Quicksave: QuicksaveSession keeps a conversation as checkpoints stored
as deltas and branches it from any turn; a run that stops on a tool approval waits in the inbox,
and a decision resumes it through the worker with the SDK's RunState, bound to the call."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest
from agents import Runner
from agents.memory import SessionSettings
from asgiref.sync import async_to_sync
from django.contrib.auth.models import User
from django.db import connection

from approvals.models import ApprovalRequest, ApprovalStatus
from approvals.services import decide, resolve_in_doubt
from bench.peers import english_text
from bench.quicksave_runs import TABLES
from checkpoints import forks, storage
from checkpoints.models import Checkpoint, CheckpointStatus, PayloadKind, Thread, ThreadStatus
from integrations.openai_agents.runner import run_agent
from integrations.openai_agents.session import QuicksaveSession
from integrations.openai_agents.tools import call_key
from quicksave_agents import tool_calls
from quicksave_agents.models import RunStatus
from tests.conftest import person
from tests.integrations import openai_agents_agents as demo
from tests.integrations.conftest import WorkerThread

pytestmark = pytest.mark.django_db(transaction=True)


def user(text: str) -> Any:
    return {"role": "user", "content": text}


def reply(text: str) -> Any:
    return {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}


def items_of(session: QuicksaveSession, limit: int | None = None) -> list[Any]:
    return list(async_to_sync(session.get_items)(limit))


def last_text(session: QuicksaveSession) -> str:
    """The text of the conversation's latest item (the agent's last message)."""
    last: Any = session.read_items()[-1]
    return str(last["content"][0]["text"])


@pytest.fixture
def rita(transactional_db: Any) -> User:
    return person("rita", "reviewer")


@pytest.fixture
def worker(transactional_db: Any) -> Iterator[WorkerThread]:
    running = WorkerThread([demo.TRANSFER, demo.TWO_CALLS, demo.CHAT])
    running.thread.start()
    demo.calls.clear()
    yield running
    running.worker.stopping.set()
    running.thread.join(timeout=10)


def paused(agent: Any, session_id: str, text: str = "Pay ACME") -> tuple[QuicksaveSession, ApprovalRequest]:
    session = QuicksaveSession(session_id, agent=agent.name)
    async_to_sync(run_agent)(agent, text, session=session, run_config=demo.RUN_CONFIG)
    return session, ApprovalRequest.objects.get(thread=session.thread, status=ApprovalStatus.PENDING)


# --- the session ---------------------------------------------------------------------------------


def test_each_add_items_is_one_checkpoint_stored_as_a_delta_of_the_new_items(transactional_db: Any) -> None:
    session = QuicksaveSession("chat-1")
    history = [user("x" * 2000), reply("y" * 2000)]
    async_to_sync(session.add_items)(history)
    async_to_sync(session.add_items)([user("short")])

    checkpoints = list(Checkpoint.objects.filter(thread=session.thread).order_by("seq"))
    assert [c.label for c in checkpoints] == ["session", "user, message", "user"]
    last = checkpoints[-1]
    assert last.kind == PayloadKind.DELTA
    assert len(bytes(last.payload)) < 200 < last.state_bytes
    assert storage.load_node(last.pk).state == {"items": [*history, user("short")]}
    assert items_of(session) == [*history, user("short")]


def test_a_thread_records_its_framework_and_session_id(transactional_db: Any) -> None:
    thread = QuicksaveSession("chat-meta", agent="support").thread
    assert thread.metadata == {"framework": "openai-agents", "openai_agents": {"session_id": "chat-meta"}}
    assert (thread.agent.name, thread.external_id) == ("support", "chat-meta")


def test_get_items_returns_the_latest_items_up_to_the_limit_of_the_call_or_the_settings(transactional_db: Any) -> None:
    conversation = [user(f"q{n}") if n % 2 == 0 else reply(f"a{n}") for n in range(6)]
    session = QuicksaveSession("chat-limit", session_settings=SessionSettings(limit=2))
    async_to_sync(session.add_items)(conversation)

    assert items_of(session) == conversation[-2:]
    assert items_of(session, 3) == conversation[-3:]
    assert QuicksaveSession("chat-limit").read_items() == conversation


def test_pop_item_removes_the_latest_item_and_clear_session_empties_it_as_checkpoints(transactional_db: Any) -> None:
    session = QuicksaveSession("chat-pop")
    async_to_sync(session.add_items)([user("hi"), reply("hello")])

    assert async_to_sync(session.pop_item)() == reply("hello")
    assert items_of(session) == [user("hi")]
    async_to_sync(session.clear_session)()
    assert items_of(session) == []
    assert async_to_sync(session.pop_item)() is None
    labels = list(Checkpoint.objects.filter(thread=session.thread).order_by("seq").values_list("label", flat=True))
    assert labels == ["session", "user, message", "pop item", "clear"]


def test_a_second_session_object_appends_after_the_first_ones_writes(transactional_db: Any) -> None:
    first, second = QuicksaveSession("chat-two"), QuicksaveSession("chat-two")
    async_to_sync(first.add_items)([user("one")])
    assert items_of(second) == [user("one")]
    async_to_sync(first.add_items)([user("two")])
    async_to_sync(second.add_items)([user("three")])  # its head is stale: it appends after "two"
    assert items_of(first) == [user("one"), user("two"), user("three")]


# Every table of Quicksave's that bench/frameworks_openai.py counts, but the thread's: every write
# rewrites its row (the event counter), and when the dead versions are pruned depends on other
# sessions of the server, not on what a turn stores.
STORED_TABLES = [table for table in TABLES if table != "checkpoints_thread"]


def stored_bytes() -> int:
    """What those tables take on disk: heap, TOAST and indexes, as the benchmark counts them."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT sum(pg_total_relation_size(name::regclass)) FROM unnest(%s::text[]) AS name",
                       [STORED_TABLES])  # fmt: skip
        return int(cursor.fetchone()[0])


# What a turn of the benchmark's shape stores (its two checkpoints, their index entries and
# events, its share of the snapshots that bound a read), in bytes: 3,092 over these 400 turns
# (3,400 while each checkpoint's event repeated the checkpoint's fields, 3,482 while its metadata
# also counted its items and turns). Bytes on disk do not depend on timing, so more than this is
# a turn storing more.
TURN_BYTES_BUDGET = 3_150


def test_a_turn_of_a_kilobyte_answer_stays_within_its_byte_budget(transactional_db: Any) -> None:
    with connection.cursor() as cursor:  # fresh files: no pages left by earlier tests' rows
        cursor.execute(f"TRUNCATE {', '.join(TABLES)} CASCADE")
    storage.clear_caches()
    session = QuicksaveSession("chat-bytes")
    before = stored_bytes()  # with the thread's branch, key and empty first checkpoint
    rng, turns = random.Random(7), 400
    for turn in range(turns):  # what Runner.run adds per turn: the input, then the model's message
        session.append_items([{"content": f"turn {turn}", "role": "user"}])
        answer: Any = {"type": "output_text", "text": english_text(rng), "annotations": [], "logprobs": []}
        session.append_items([{"id": f"msg-{turn}", "type": "message", "role": "assistant", "status": "completed",
                               "content": [answer]}])  # fmt: skip

    assert len(session.read_items()) == 2 * turns
    assert (stored_bytes() - before) / turns <= TURN_BYTES_BUDGET


def test_a_branch_from_a_turn_holds_the_conversation_before_it_and_leaves_the_original_alone(
    transactional_db: Any,
) -> None:
    session = QuicksaveSession("chat-branch")
    for n in (1, 2, 3):
        async_to_sync(session.add_items)([user(f"q{n}")])
        async_to_sync(session.add_items)([reply(f"a{n}")])

    branch = async_to_sync(session.create_branch_from_turn)(2, "try-again")
    assert items_of(branch) == [user("q1"), reply("a1")]
    async_to_sync(branch.add_items)([user("q2, differently")])

    assert items_of(branch) == [user("q1"), reply("a1"), user("q2, differently")]
    assert len(items_of(session)) == 6
    assert QuicksaveSession("chat-branch", branch="try-again").read_items() == items_of(branch)
    with pytest.raises(ValueError, match="no turn 4"):
        session.branch_from_turn(4)


def test_each_checkpoint_counts_the_user_turns_in_its_step_without_metadata(transactional_db: Any) -> None:
    session = QuicksaveSession("chat-steps")
    async_to_sync(session.add_items)([user("q1")])
    async_to_sync(session.add_items)([reply("a1")])
    async_to_sync(session.add_items)([user("q2"), reply("a2")])
    async_to_sync(session.pop_item)()
    async_to_sync(session.pop_item)()

    rows = Checkpoint.objects.filter(thread=session.thread).order_by("seq").values_list("step", "metadata")
    assert list(rows) == [(0, {}), (1, {}), (1, {}), (2, {}), (2, {}), (1, {})]
    assert Thread.objects.get(pk=session.thread.pk).step == 1


def test_a_conversation_written_with_counts_in_metadata_reads_and_branches_as_before(transactional_db: Any) -> None:
    # Checkpoints written before the turn count moved to `step` counted items and turns in metadata.
    thread = QuicksaveSession("chat-old").thread
    head = Checkpoint.objects.get(thread=thread)
    for n, items in enumerate(([user("q1")], [reply("a1")], [user("q2")], [reply("a2")]), start=1):
        head = storage.append_checkpoint(
            thread=thread, parent=head, patch=[{"op": "add", "path": "/items/-", "value": items[0]}],
            metadata={"openai_agents": {"items": n, "turns": (n + 1) // 2}},
        )  # fmt: skip

    session = QuicksaveSession("chat-old")
    async_to_sync(session.add_items)([user("q3")])
    assert Checkpoint.objects.filter(thread=thread).order_by("-seq").first().step == 3  # type: ignore[union-attr]
    branch = session.branch_from_turn(2)
    assert items_of(branch) == [user("q1"), reply("a1")]


def test_a_run_reads_its_history_from_the_session_and_stores_the_turn(transactional_db: Any) -> None:
    session = QuicksaveSession("chat-run", agent=demo.CHAT)
    async_to_sync(session.add_items)([user("earlier"), reply("before")])
    result = async_to_sync(Runner.run)(demo.chat(), "now", session=session, run_config=demo.RUN_CONFIG)

    assert result.final_output == "seen 3"
    assert [item.get("role") for item in items_of(session)] == ["user", "assistant", "user", "assistant"]


# --- approvals -------------------------------------------------------------------------------------


def test_a_run_that_stops_for_approval_files_the_call_and_keeps_its_run_state(transactional_db: Any) -> None:
    session, approval = paused(demo.transfer(), "pay-1")

    assert (approval.action, approval.args) == ("pay", demo.PAYMENT)
    waiting = approval.checkpoint
    assert waiting.status == CheckpointStatus.WAITING_FOR_APPROVAL
    assert waiting.metadata["openai_agents"]["call_id"] == "call-pay-1"
    state = storage.load_node(waiting.pk).state
    assert state["run_state"]["state"]["$schemaVersion"]
    assert Thread.objects.get(pk=session.thread.pk).status == ThreadStatus.WAITING_FOR_APPROVAL
    assert demo.calls == []


def test_approving_resumes_the_run_in_the_worker_and_the_agent_finishes(worker: WorkerThread, rita: User) -> None:
    session, approval = paused(demo.transfer(), "pay-approve")
    decide(approval=approval, user=rita, decision="approve")
    worker.wait_for_runs(session.thread)

    assert demo.calls == [("pay", demo.PAYMENT)]
    thread = Thread.objects.get(pk=session.thread.pk)
    assert thread.status == ThreadStatus.COMPLETED
    assert last_text(session) == "Result: paid 120 to ACME Ltd"
    assert thread.head_id is not None and "run_state" not in storage.load_node(thread.head_id).state


def test_edited_arguments_are_what_the_tool_runs_with(worker: WorkerThread, rita: User) -> None:
    session, approval = paused(demo.transfer(), "pay-edit")
    decide(approval=approval, user=rita, decision="approve", args={"to": "ACME Ltd", "amount": 100})
    worker.wait_for_runs(session.thread)

    assert demo.calls == [("pay", {"to": "ACME Ltd", "amount": 100})]
    assert last_text(session) == "Result: paid 100 to ACME Ltd"


def test_a_rejection_reaches_the_model_with_the_reviewers_comment(worker: WorkerThread, rita: User) -> None:
    session, approval = paused(demo.transfer(), "pay-reject")
    decide(approval=approval, user=rita, decision="reject", comment="Not this supplier")
    worker.wait_for_runs(session.thread)

    assert demo.calls == []
    assert last_text(session) == "Result: Not this supplier"


def test_two_calls_in_one_response_are_asked_one_after_the_other(worker: WorkerThread, rita: User) -> None:
    session, first = paused(demo.two_calls(), "pay-two")
    assert first.args == demo.PAYMENT
    decide(approval=first, user=rita, decision="approve")
    worker.wait_for_runs(session.thread)
    second = ApprovalRequest.objects.get(thread=session.thread, status=ApprovalStatus.PENDING)
    assert second.args == {"to": "Globex", "amount": 75}
    assert demo.calls == []  # nothing runs until every call of the pause is decided

    decide(approval=second, user=rita, decision="reject", comment="Globex is paid already")
    worker.wait_for_runs(session.thread)
    assert demo.calls == [("pay", demo.PAYMENT)]
    assert last_text(session) == "paid 120 to ACME Ltd | Globex is paid already"


def test_a_decision_on_a_checkpoint_that_is_no_longer_the_head_fails_closed(worker: WorkerThread, rita: User) -> None:
    session, approval = paused(demo.transfer(), "pay-moved")
    # Someone wrote to the conversation after it paused: the decision was made on what it was then.
    QuicksaveSession("pay-moved", agent=demo.TRANSFER).append_items([user("and one more thing")])
    decide(approval=approval, user=rita, decision="approve")
    runs = worker.wait_for_runs(session.thread)

    assert demo.calls == []
    assert runs[-1].status == RunStatus.FAILED
    assert Thread.objects.get(pk=session.thread.pk).status == ThreadStatus.FAILED


def test_a_decision_whose_arguments_are_not_the_paused_calls_fails_closed(worker: WorkerThread, rita: User) -> None:
    session, approval = paused(demo.transfer(), "pay-tampered")
    # The approval's recorded arguments no longer hash to the call's (a tampered row).
    approval.args = {"to": "Mallory", "amount": 120}
    approval.save(update_fields=["args"])
    decide(approval=approval, user=rita, decision="approve")
    worker.wait_for_runs(session.thread)

    assert demo.calls == []
    thread = Thread.objects.get(pk=session.thread.pk)
    assert thread.status == ThreadStatus.FAILED
    head = Checkpoint.objects.get(pk=thread.head_id) if thread.head_id else None
    assert head is not None
    assert "not acting on it" in head.metadata["openai_agents"]["error"]


def test_a_call_a_dead_attempt_started_goes_to_a_person_and_their_answer_is_what_the_agent_gets(
    worker: WorkerThread, rita: User
) -> None:
    session, approval = paused(demo.transfer(), "pay-doubt")
    # An earlier attempt logged its intent to pay and died before recording whether it did.
    key = call_key(thread_id=session.thread.pk, start=approval.checkpoint_id, call_id="call-pay-1")
    tool_calls.begin(thread_id=session.thread.pk, key=key, tool="pay", args=demo.PAYMENT)
    decide(approval=approval, user=rita, decision="approve")
    worker.wait_for_runs(session.thread)

    doubt = ApprovalRequest.objects.get(thread=session.thread, status=ApprovalStatus.PENDING)
    assert (doubt.kind, doubt.action, doubt.args) == ("in_doubt", "pay", demo.PAYMENT)
    assert demo.calls == []
    resolve_in_doubt(approval=doubt, user=rita, resolution="happened", result="paid 120 to ACME Ltd (bank statement)")
    worker.wait_for_runs(session.thread)

    assert demo.calls == []  # it had happened: the agent goes on with the recorded result, not a second payment
    assert last_text(session) == "Result: paid 120 to ACME Ltd (bank statement)"
    assert Thread.objects.get(pk=session.thread.pk).status == ThreadStatus.COMPLETED


def test_a_dashboard_fork_of_a_turn_resumes_the_agent_on_the_edited_conversation(
    worker: WorkerThread, rita: User
) -> None:
    session = QuicksaveSession("chat-fork", agent=demo.CHAT)
    async_to_sync(run_agent)(demo.chat(), "first", session=session, run_config=demo.RUN_CONFIG)
    async_to_sync(run_agent)(demo.chat(), "second", session=session, run_config=demo.RUN_CONFIG)
    after_first = Checkpoint.objects.filter(thread=session.thread, label="message").order_by("seq").first()
    assert after_first is not None
    admin = person("ada", "admin")

    fork = forks.fork(checkpoint=after_first, user=admin, reason="ask again", resume=True,
                      patch=[{"op": "add", "path": "/items/-", "value": user("again")}])  # fmt: skip
    worker.wait_for_runs(session.thread)

    assert fork.step == 2  # the user turns of the edited conversation
    on_fork = QuicksaveSession("chat-fork", agent=demo.CHAT)  # the thread's active branch: the fork's
    assert items_of(on_fork)[-2]["content"] == "again"
    assert last_text(on_fork) == "seen 3"
    assert len(QuicksaveSession("chat-fork", agent=demo.CHAT, branch="main").read_items()) == 4


def test_a_dashboard_fork_of_a_paused_run_asks_for_the_same_call_again_on_the_fork(
    worker: WorkerThread, rita: User
) -> None:
    session, approval = paused(demo.transfer(), "pay-fork")
    fork = forks.fork(checkpoint=approval.checkpoint, user=person("ada", "admin"), reason="retry", resume=True)
    worker.wait_for_runs(session.thread)

    assert ApprovalRequest.objects.get(pk=approval.pk).status == ApprovalStatus.CANCELLED  # it was the old branch's
    again = ApprovalRequest.objects.get(thread=session.thread, status=ApprovalStatus.PENDING)
    assert (again.action, again.args, again.checkpoint.branch_id) == ("pay", demo.PAYMENT, fork.branch_id)
    decide(approval=again, user=rita, decision="approve")
    worker.wait_for_runs(session.thread)
    assert demo.calls == [("pay", demo.PAYMENT)]
    assert last_text(QuicksaveSession("pay-fork", agent=demo.TRANSFER)) == "Result: paid 120 to ACME Ltd"
