"""Interrupts in a compiled LangGraph graph become approvals in the inbox; a decision resumes the
graph through the worker with `Command(resume=...)`, and its next checkpoints land on the thread."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any
from uuid import UUID, uuid4

import pytest
from django.contrib.auth.models import User
from django.utils import timezone
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.serde.types import INTERRUPT
from langgraph.types import Command, Interrupt

from approvals.models import ApprovalRequest, ApprovalStatus
from approvals.services import decide
from checkpoints import storage
from checkpoints.models import Checkpoint, Thread, ThreadStatus
from integrations.langgraph import tables
from integrations.langgraph.interrupts import resume_for
from integrations.langgraph.saver import QuicksaveSaver
from quicksave_agents.fencing import Fence, LeaseLost
from quicksave_agents.models import Run, RunReason, RunStatus
from quicksave_agents.runs import claim_run
from tests.conftest import person
from tests.integrations import graphs
from tests.integrations.conftest import WorkerThread

pytestmark = pytest.mark.django_db(transaction=True)

OFFER = {"flight": "TP1350", "to": "Lisbon", "price": 129}
EMAIL = {"to": "ana@example.com", "subject": "Welcome"}


@pytest.fixture
def rita(transactional_db: Any) -> User:
    return person("rita", "reviewer")


def config_for(thread_id: str) -> RunnableConfig:
    return {"configurable": {"thread_id": thread_id}}


def quicksave_thread(agent: str, thread_id: str) -> Thread:
    return Thread.objects.get(agent__name=agent, external_id=thread_id)


def pending(thread: Thread) -> ApprovalRequest:
    return ApprovalRequest.objects.get(thread=thread, status=ApprovalStatus.PENDING)


def start(agent: str, factory: Any, inputs: dict[str, Any]) -> tuple[Any, RunnableConfig, Thread]:
    """Run a graph until it interrupts; returns it, its config and its Quicksave thread."""
    thread_id = f"{agent}-{uuid4().hex[:8]}"
    graph = factory(QuicksaveSaver(agent=agent))
    graph.invoke(inputs, config_for(thread_id))
    return graph, config_for(thread_id), quicksave_thread(agent, thread_id)


def ask(question: Any) -> tuple[Any, RunnableConfig, Thread]:
    return start(graphs.ASK, graphs.ask_graph, {"question": question})


def test_an_interrupt_files_one_pending_approval_on_the_checkpoint_it_stopped_at() -> None:
    graph, config, thread = start(graphs.BOOKING, graphs.booking_graph, {"destination": "Lisbon"})

    approval = pending(thread)
    assert (approval.action, approval.args, approval.message) == ("book_flight", OFFER, "Book TP1350 to Lisbon?")
    waiting = graph.get_state(config)
    assert waiting.next == ("approve",)
    assert approval.checkpoint.metadata["lg_id"] == waiting.config["configurable"]["checkpoint_id"]
    thread.refresh_from_db()
    assert thread.status == ThreadStatus.WAITING_FOR_APPROVAL

    # Running the graph again without a decision raises the same interrupt: still one approval.
    graph.invoke(None, config)
    assert ApprovalRequest.objects.filter(thread=thread).count() == 1


@pytest.mark.parametrize("durability", ["sync", "async", "exit"])
def test_an_interrupt_is_filed_whenever_langgraph_saves_its_checkpoints(durability: str) -> None:
    # "async" saves a task's writes while the checkpoint's own put may still be running; "exit"
    # saves everything when the run stops.
    graph = graphs.booking_graph(QuicksaveSaver(agent=graphs.BOOKING))
    graph.invoke({"destination": "Lisbon"}, config_for(f"trip-{durability}"), durability=durability)

    approval = pending(quicksave_thread(graphs.BOOKING, f"trip-{durability}"))
    assert approval.action == "book_flight"
    assert (
        approval.checkpoint.metadata["lg_id"]
        == graph.get_state(config_for(f"trip-{durability}")).config["configurable"]["checkpoint_id"]
    )


def test_approving_resumes_the_graph_through_the_worker_and_its_checkpoints_follow(
    worker: WorkerThread, rita: User
) -> None:
    graph, config, thread = start(graphs.BOOKING, graphs.booking_graph, {"destination": "Lisbon"})
    approval = pending(thread)

    decide(approval=approval, user=rita, decision="approve")
    runs = worker.wait_for_runs(thread)

    assert [(run.reason, run.status) for run in runs] == [(RunReason.APPROVAL, RunStatus.COMPLETED)]
    state = graph.get_state(config)
    assert state.next == ()
    assert state.values["booked"] == "TP1350"
    assert state.values["decision"] == {"decision": "approve", "args": OFFER, "edited": False, "comment": "",
                                        "decided_by": "rita", "expired": False}  # fmt: skip
    after = Checkpoint.objects.filter(thread=thread, branch=approval.checkpoint.branch, seq__gt=approval.checkpoint.seq)
    # `approve` then `book` each end a superstep: two checkpoints on from the one that waited.
    assert [row.metadata["lg_metadata"]["source"] for row in after.order_by("seq")] == ["loop", "loop"]
    thread.refresh_from_db()
    assert thread.head is not None
    head = thread.head
    assert head == after.order_by("-seq").first()
    assert state.config["configurable"]["checkpoint_id"] == head.metadata["lg_id"]
    assert thread.status == ThreadStatus.COMPLETED  # the graph ran to its end


def test_edited_args_are_what_the_graph_resumes_with(worker: WorkerThread, rita: User) -> None:
    graph, config, thread = start(graphs.BOOKING, graphs.booking_graph, {"destination": "Lisbon"})

    decide(approval=pending(thread), user=rita, decision="approve", args={**OFFER, "flight": "TP1352"})
    worker.wait_for_runs(thread)

    values = graph.get_state(config).values
    assert values["booked"] == "TP1352"
    assert values["decision"]["edited"] is True
    assert values["decision"]["args"] == {**OFFER, "flight": "TP1352"}


def test_a_rejection_resumes_the_graph_with_the_reviewers_comment(worker: WorkerThread, rita: User) -> None:
    graph, config, thread = start(graphs.BOOKING, graphs.booking_graph, {"destination": "Lisbon"})

    decide(approval=pending(thread), user=rita, decision="reject", comment="Too expensive this week")
    worker.wait_for_runs(thread)

    values = graph.get_state(config).values
    assert values["booked"] is None
    assert values["decision"] == {
        "decision": "reject", "args": None, "edited": False, "comment": "Too expensive this week",
        "decided_by": "rita", "expired": False,
    }  # fmt: skip


def test_an_approval_that_expires_resumes_the_graph_with_the_configured_outcome(worker: WorkerThread) -> None:
    graph, config, thread = start(graphs.BOOKING, graphs.booking_graph, {"destination": "Lisbon"})
    # Nobody decides in time (the deadline is moved into the past rather than waited for).
    ApprovalRequest.objects.filter(pk=pending(thread).pk).update(expires_at=timezone.now() - timedelta(seconds=1))

    worker.wait_for_runs(thread)  # the worker expires overdue approvals as it polls

    decision = graph.get_state(config).values["decision"]
    assert (decision["decision"], decision["expired"], decision["decided_by"]) == ("reject", True, None)
    assert graph.get_state(config).values["booked"] is None


def hitl_request(*actions: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    """What LangChain's HumanInTheLoopMiddleware interrupts with for these tool calls."""
    return {
        "action_requests": [{"name": name, "args": args, "description": f"Tool: {name}"} for name, args in actions],
        "review_configs": [{"action_name": name, "allowed_decisions": ["approve", "edit", "reject"]}
                           for name, _ in actions],
    }  # fmt: skip


@pytest.mark.parametrize(
    ("decision", "edited", "expected"),
    [
        ("approve", None, {"type": "approve"}),
        ("approve", {**EMAIL, "to": "bo@example.com"},
         {"type": "edit", "edited_action": {"name": "send_email", "args": {**EMAIL, "to": "bo@example.com"}}}),
        ("reject", None, {"type": "reject", "message": "Not before the contract is signed"}),
    ],
)  # fmt: skip
def test_a_human_in_the_loop_middleware_request_resumes_with_langchain_decisions(
    worker: WorkerThread, rita: User, decision: str, edited: dict[str, Any] | None, expected: dict[str, Any]
) -> None:
    graph, config, thread = ask(hitl_request(("send_email", EMAIL)))
    approval = pending(thread)
    assert (approval.action, approval.args, approval.message) == ("send_email", EMAIL, "Tool: send_email")

    comment = "Not before the contract is signed" if decision == "reject" else ""
    decide(approval=approval, user=rita, decision=decision, args=edited, comment=comment)
    worker.wait_for_runs(thread)

    assert graph.get_state(config).values["answer"] == {"decisions": [expected]}


def test_several_tool_calls_in_one_request_are_one_approval_decided_together(worker: WorkerThread, rita: User) -> None:
    graph, config, thread = ask(hitl_request(("send_email", EMAIL), ("delete_draft", {"draft": 7})))
    approval = pending(thread)
    assert approval.action == "send_email, delete_draft"
    assert approval.args == {"actions": [{"name": "send_email", "args": EMAIL},
                                         {"name": "delete_draft", "args": {"draft": 7}}]}  # fmt: skip

    edited = {"actions": [{"name": "send_email", "args": EMAIL}, {"name": "delete_draft", "args": {"draft": 8}}]}
    decide(approval=approval, user=rita, decision="approve", args=edited)
    worker.wait_for_runs(thread)

    assert graph.get_state(config).values["answer"] == {"decisions": [
        {"type": "approve"}, {"type": "edit", "edited_action": {"name": "delete_draft", "args": {"draft": 8}}},
    ]}  # fmt: skip


def agent_inbox_request(*, allow_respond: bool) -> list[dict[str, Any]]:
    """The older HumanInterrupt list (langgraph.prebuilt.interrupt) that agent inboxes read."""
    config = {"allow_ignore": True, "allow_respond": allow_respond, "allow_edit": True, "allow_accept": True}
    return [{"action_request": {"action": "run_command", "args": {"command": "ls -l"}}, "config": config,
             "description": "Review the command before it runs"}]  # fmt: skip


@pytest.mark.parametrize(
    ("decision", "edited", "allow_respond", "expected"),
    [
        ("approve", None, True, {"type": "accept", "args": None}),
        ("approve", {"command": "ls"}, True,
         {"type": "edit", "args": {"action": "run_command", "args": {"command": "ls"}}}),
        ("reject", None, True, {"type": "response", "args": "Use the read-only shell"}),
        ("reject", None, False, {"type": "ignore", "args": None}),
    ],
)  # fmt: skip
def test_an_agent_inbox_interrupt_resumes_with_human_responses(
    worker: WorkerThread,
    rita: User,
    decision: str,
    edited: dict[str, Any] | None,
    allow_respond: bool,
    expected: dict[str, Any],
) -> None:
    graph, config, thread = ask(agent_inbox_request(allow_respond=allow_respond))
    approval = pending(thread)
    assert (approval.action, approval.args) == ("run_command", {"command": "ls -l"})
    assert approval.message == "Review the command before it runs"

    comment = "Use the read-only shell" if decision == "reject" else ""
    decide(approval=approval, user=rita, decision=decision, args=edited, comment=comment)
    worker.wait_for_runs(thread)

    assert graph.get_state(config).values["answer"] == [expected]


def test_any_other_value_is_asked_as_an_interrupt_and_edited_args_answer_it(worker: WorkerThread, rita: User) -> None:
    graph, config, thread = ask("What is the most we may spend?")
    approval = pending(thread)
    assert (approval.action, approval.args) == ("interrupt", {"value": "What is the most we may spend?"})
    assert approval.message == "What is the most we may spend?"

    decide(approval=approval, user=rita, decision="approve", args={"value": 500})
    worker.wait_for_runs(thread)

    answer = graph.get_state(config).values["answer"]
    assert (answer["decision"], answer["args"], answer["edited"]) == ("approve", {"value": 500}, True)


def test_a_second_interrupt_in_the_same_node_is_filed_once_the_first_is_decided(
    worker: WorkerThread, rita: User
) -> None:
    graph, config, thread = start(graphs.ASK_TWICE, graphs.ask_twice_graph, {"question": None})
    first = pending(thread)
    assert first.action == "charge_card"

    decide(approval=first, user=rita, decision="approve")
    worker.wait_for_runs(thread)
    second = pending(thread)
    assert (second.action, second.args) == ("send_receipt", {"to": "ana@example.com"})
    assert second.checkpoint_id == first.checkpoint_id  # the node has not finished: same superstep

    decide(approval=second, user=rita, decision="reject", comment="The customer opted out")
    worker.wait_for_runs(thread)

    assert graph.get_state(config).values["answer"] == ["approve", "reject"]
    assert ApprovalRequest.objects.filter(thread=thread).count() == 2


def test_two_questions_pending_at_once_are_asked_one_after_the_other(worker: WorkerThread, rita: User) -> None:
    graph, config, thread = start(graphs.ASK_BOTH, graphs.ask_both_graph, {"answers": []})
    assert len(graph.get_state(config).interrupts) == 2
    first = pending(thread)  # a thread waits on one decision at a time

    decide(approval=first, user=rita, decision="approve")
    worker.wait_for_runs(thread)
    second = pending(thread)
    assert {first.action, second.action} == {"approve_budget", "approve_contract"}

    decide(approval=second, user=rita, decision="reject", comment="Legal has not read it yet")
    worker.wait_for_runs(thread)

    answers = sorted(graph.get_state(config).values["answers"])
    by_action = {first.action: "approve", second.action: "reject"}
    assert answers == [["finance", by_action["approve_budget"]], ["legal", by_action["approve_contract"]]]
    assert graph.get_state(config).next == ()


def test_a_subgraphs_interrupt_is_filed_once_on_the_root_thread_and_resumes_it(
    worker: WorkerThread, rita: User
) -> None:
    graph, config, thread = start(graphs.NESTED, graphs.nested_graph, {"question": {"action": "wire_money",
                                                                                   "args": {"eur": 900}}})  # fmt: skip
    assert ApprovalRequest.objects.filter(thread__agent__name=graphs.NESTED).count() == 1
    approval = pending(thread)
    assert (approval.action, approval.args) == ("wire_money", {"eur": 900})

    decide(approval=approval, user=rita, decision="approve")
    worker.wait_for_runs(thread)

    assert graph.get_state(config).values["answer"]["decision"] == "approve"


def test_an_interrupt_saved_before_its_checkpoint_is_filed_when_the_checkpoint_lands() -> None:
    # Under async durability LangGraph saves a task's writes while the checkpoint's own put is in flight.
    saver = QuicksaveSaver(agent=graphs.ASK)
    config: RunnableConfig = {"configurable": {"thread_id": "early-writes", "checkpoint_ns": ""}}
    checkpoint = empty_checkpoint()
    at: RunnableConfig = {"configurable": {**config["configurable"], "checkpoint_id": checkpoint["id"]}}

    saver.put_writes(at, [(INTERRUPT, (Interrupt(value={"action": "deploy", "args": {"env": "prod"}}, id="0" * 32),))],
                     "task-1")  # fmt: skip
    assert not ApprovalRequest.objects.exists()
    saver.put(config, checkpoint, {"source": "loop", "step": 0, "parents": {}}, {})

    approval = pending(quicksave_thread(graphs.ASK, "early-writes"))
    assert (approval.action, approval.args) == ("deploy", {"env": "prod"})
    assert approval.checkpoint.metadata["lg_id"] == checkpoint["id"]


class WatchedLock:
    """A lock that tells when a thread had to wait for it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.contended = threading.Event()

    def __enter__(self) -> WatchedLock:
        if not self.lock.acquire(blocking=False):
            self.contended.set()
            self.lock.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.lock.release()


def test_an_interrupt_noted_while_its_checkpoint_commits_is_still_filed(monkeypatch: pytest.MonkeyPatch) -> None:
    # put_writes() looks for the checkpoint's row just before put() commits it, and notes the
    # interrupt for put() to file a moment after put() has looked for notes: it must not be lost.
    saver = QuicksaveSaver(agent=graphs.ASK)
    config: RunnableConfig = {"configurable": {"thread_id": "racing-writes", "checkpoint_ns": ""}}
    first = empty_checkpoint()
    saver.put(config, first, {"source": "input", "step": -1, "parents": {}}, {})
    after_first: RunnableConfig = {"configurable": {**config["configurable"], "checkpoint_id": first["id"]}}
    checkpoint = empty_checkpoint()
    at: RunnableConfig = {"configurable": {**config["configurable"], "checkpoint_id": checkpoint["id"]}}
    looked = threading.Event()
    notes = WatchedLock()
    real_row_of, real_append = tables.row_of, storage.append_checkpoint_id
    intercepted: list[bool] = []

    def row_of(thread: Thread, lg_id: str) -> Any:
        found = real_row_of(thread, lg_id)
        if lg_id == checkpoint["id"] and not intercepted:
            intercepted.append(found is None)
            looked.set()
            # put() has committed the row and waits to look for notes while this one is being taken.
            assert notes.contended.wait(10), "put() never came to look for notes"
        return found

    def append_checkpoint_id(**kwargs: Any) -> UUID:
        looked.wait(10)
        return real_append(**kwargs)

    monkeypatch.setattr(saver, "_unfiled_lock", notes)
    monkeypatch.setattr(tables, "row_of", row_of)
    monkeypatch.setattr(storage, "append_checkpoint_id", append_checkpoint_id)
    interrupt = (Interrupt(value={"action": "deploy", "args": {"env": "prod"}}, id="1" * 32),)
    writer = threading.Thread(target=saver.put_writes, args=(at, [(INTERRUPT, interrupt)], "task-1"))
    writer.start()
    saver.put(after_first, checkpoint, {"source": "loop", "step": 0, "parents": {}}, {})
    writer.join(20)

    assert intercepted == [True]  # put_writes() did look before the row was there
    approval = pending(quicksave_thread(graphs.ASK, "racing-writes"))
    assert (approval.action, approval.args) == ("deploy", {"env": "prod"})
    assert approval.checkpoint.metadata["lg_id"] == checkpoint["id"]


def test_a_graph_run_by_an_attempt_that_lost_its_run_writes_nothing(rita: User) -> None:
    _, config, thread = start(graphs.BOOKING, graphs.booking_graph, {"destination": "Lisbon"})
    approval = decide(approval=pending(thread), user=rita, decision="approve")
    resume: Command[Any] = Command(resume=resume_for(approval, decode=QuicksaveSaver().from_json))
    run = claim_run(agents=[thread.agent], worker="frozen")
    assert run is not None
    written = Checkpoint.objects.filter(thread=thread).count()
    Run.objects.filter(pk=run.pk).update(attempts=run.attempts + 1)  # another worker took the run over

    stale = graphs.booking_graph(QuicksaveSaver(agent=graphs.BOOKING, fence=Fence(run.pk, run.attempts)))
    with pytest.raises(LeaseLost):
        stale.invoke(resume, config)
    assert Checkpoint.objects.filter(thread=thread).count() == written

    expired = graphs.booking_graph(
        QuicksaveSaver(agent=graphs.BOOKING, fence=Fence(run.pk, run.attempts + 1), lease_held=lambda: False)
    )
    with pytest.raises(LeaseLost):
        expired.invoke(resume, config)
    assert Checkpoint.objects.filter(thread=thread).count() == written


def test_a_graphs_thread_records_its_framework_for_the_badge() -> None:
    _, _, thread = ask("Which fare?")

    assert thread.metadata["framework"] == "langgraph"
