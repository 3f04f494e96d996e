"""Time travel on a LangGraph thread: a fork made in the dashboard (checkpoints.forks.fork) is a
LangGraph checkpoint that `get_state_history` lists, and the graph runs on from it the way it
does after LangGraph's own `update_state` on its own saver."""

from __future__ import annotations

from typing import Any
from uuid import uuid4

import pytest
from django.contrib.auth.models import User
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.memory import InMemorySaver

from checkpoints.forks import fork
from checkpoints.models import Checkpoint, CheckpointSource, Thread
from integrations.langgraph.saver import QuicksaveSaver
from quicksave_agents.models import RunReason, RunStatus
from tests.conftest import person
from tests.integrations import graphs
from tests.integrations.conftest import WorkerThread

pytestmark = pytest.mark.django_db(transaction=True)

SEVEN = [{"op": "replace", "path": "/channel_values/count", "value": 7}]


@pytest.fixture
def ada(transactional_db: Any) -> User:
    return person("ada", "admin")


def run_counter(saver: Any) -> tuple[Any, RunnableConfig]:
    graph = graphs.counter_graph(saver)
    config: RunnableConfig = {"configurable": {"thread_id": f"count-{uuid4().hex[:8]}"}}
    assert graph.invoke({"count": 1, "trail": ""}, config) == {"count": 25, "trail": "abc"}
    return graph, config


def after_add_one(graph: Any, config: RunnableConfig) -> Any:
    """The snapshot `add_one` left, with `times_ten` due next."""
    return next(snapshot for snapshot in graph.get_state_history(config) if snapshot.next == ("times_ten",))


def row_of(snapshot: Any) -> Checkpoint:
    return Checkpoint.objects.get(metadata__lg_id=snapshot.config["configurable"]["checkpoint_id"])


def lineage(graph: Any, config: RunnableConfig, *, down_to: str) -> list[tuple[Any, ...]]:
    """(values, next, source, step) from the newest snapshot back to the one with id `down_to`."""
    found = []
    snapshot = graph.get_state(config)
    while snapshot.config["configurable"]["checkpoint_id"] != down_to:
        found.append((snapshot.values, snapshot.next, snapshot.metadata["source"], snapshot.metadata["step"]))
        snapshot = graph.get_state(snapshot.parent_config)
    return found


def test_a_dashboard_fork_is_listed_by_get_state_history_as_a_langgraph_update(ada: User) -> None:
    graph, config = run_counter(QuicksaveSaver(agent=graphs.COUNTER))
    fork_point = after_add_one(graph, config)
    before = list(graph.get_state_history(config))

    forked = fork(checkpoint=row_of(fork_point), user=ada, reason="Start the multiplication from seven", patch=SEVEN)

    history = list(graph.get_state_history(config))
    assert len(history) == len(before) + 1
    newest = history[0]
    assert newest.config["configurable"]["checkpoint_id"] == forked.metadata["lg_id"]
    assert newest.parent_config["configurable"]["checkpoint_id"] == fork_point.config["configurable"]["checkpoint_id"]
    assert (newest.metadata["source"], newest.metadata["step"]) == ("update", fork_point.metadata["step"] + 1)
    assert newest.values == {"count": 7, "trail": "a"}
    assert newest.next == ("times_ten",)
    assert graph.get_state(config).config == newest.config  # the thread's latest checkpoint is the fork
    assert (forked.source, forked.branch.name) == (CheckpointSource.HUMAN, "fork-1")
    versions = (newest.config, fork_point.config)
    count_versions = [graph.checkpointer.get_tuple(c).checkpoint["channel_versions"]["count"] for c in versions]
    assert count_versions[0] > count_versions[1]  # the edited channel has a new version, as update_state gives it


def test_running_on_from_a_fork_matches_update_state_and_invoke_on_langgraphs_own_saver(ada: User) -> None:
    graph, config = run_counter(QuicksaveSaver(agent=graphs.COUNTER))
    fork_point = after_add_one(graph, config)
    forked = fork(checkpoint=row_of(fork_point), user=ada, reason="Start the multiplication from seven", patch=SEVEN)
    at_fork: RunnableConfig = {"configurable": {**config["configurable"], "checkpoint_id": forked.metadata["lg_id"]}}

    quicksave_result = graph.invoke(None, at_fork)

    peer, peer_config = run_counter(InMemorySaver())
    peer_fork_point = after_add_one(peer, peer_config)
    peer_result = peer.invoke(None, peer.update_state(peer_fork_point.config, {"count": 7}))

    assert quicksave_result == peer_result == {"count": 75, "trail": "abc"}
    ours = lineage(graph, config, down_to=fork_point.config["configurable"]["checkpoint_id"])
    theirs = lineage(peer, peer_config, down_to=peer_fork_point.config["configurable"]["checkpoint_id"])
    assert ours == theirs
    assert [source for _, _, source, _ in ours] == ["loop", "loop", "update"]
    # The branch the fork left keeps its own ending.
    old_end = {"configurable": {**config["configurable"], "checkpoint_id": before_fork_end(graph, config, forked)}}
    assert graph.get_state(old_end).values == {"count": 25, "trail": "abc"}


def before_fork_end(graph: Any, config: RunnableConfig, forked: Checkpoint) -> str:
    """The LangGraph id of the newest checkpoint on the main branch."""
    head = Checkpoint.objects.filter(thread_id=forked.thread_id, branch__name="main").order_by("-seq").first()
    assert head is not None
    return str(head.metadata["lg_id"])


def test_a_fork_that_resumes_runs_the_graph_on_through_the_worker(worker: WorkerThread, ada: User) -> None:
    graph, config = run_counter(QuicksaveSaver(agent=graphs.COUNTER))
    fork_point = after_add_one(graph, config)

    forked = fork(checkpoint=row_of(fork_point), user=ada, reason="Start from seven", patch=SEVEN, resume=True)
    thread = Thread.objects.get(pk=forked.thread_id)
    runs = worker.wait_for_runs(thread)

    assert [(run.reason, run.status) for run in runs] == [(RunReason.FORK, RunStatus.COMPLETED)]
    assert graph.get_state(config).values == {"count": 75, "trail": "abc"}
    on_fork = Checkpoint.objects.filter(branch=forked.branch).order_by("seq")
    assert [row.metadata["lg_metadata"]["source"] for row in on_fork] == ["update", "loop", "loop"]
