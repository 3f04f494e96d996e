"""LangGraph's DeltaChannel on QuicksaveSaver: a channel stored as the writes that built it,
rebuilt through get_delta_channel_history, kept whole by prune and copy_thread."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.channels.delta import DeltaChannel
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Send

from checkpoints.models import Checkpoint, Thread
from integrations.langgraph.saver import QuicksaveSaver

pytestmark = pytest.mark.django_db(transaction=True)


def extend(state: list[str], writes: Sequence[list[str]]) -> list[str]:
    return [*state, *(item for write in writes for item in write)]


class Diary(TypedDict, total=False):
    # A snapshot every third update: most checkpoints store no value for `entries`.
    entries: Annotated[list[str], DeltaChannel(extend, snapshot_frequency=3)]
    turns: int


def diary_graph(saver: BaseCheckpointSaver[Any]) -> Any:
    """START -> write -> END; `write` adds one entry a turn."""

    def write(state: Diary) -> Diary:
        turn = state.get("turns", 0) + 1
        return {"entries": [f"turn {turn}"], "turns": turn}

    builder: Any = StateGraph(Diary)
    builder.add_node("write", write)
    builder.add_edge(START, "write")
    builder.add_edge("write", END)
    return builder.compile(checkpointer=saver)


def fan_out_graph(saver: BaseCheckpointSaver[Any]) -> Any:
    """Three parallel tasks write `entries` in one superstep: an order-sensitive replay."""

    def split(state: Diary) -> Diary:
        return {"turns": state.get("turns", 0) + 1}

    def fan_out(state: Diary) -> list[Send]:
        return [Send("worker", {"entries": [], "turns": n}) for n in (3, 1, 2)]

    def worker(state: Diary) -> Diary:
        return {"entries": [f"worker {state['turns']}"]}

    builder: Any = StateGraph(Diary)
    builder.add_node("split", split)
    builder.add_node("worker", worker)
    builder.add_edge(START, "split")
    builder.add_conditional_edges("split", fan_out, ["worker"])
    builder.add_edge("worker", END)
    return builder.compile(checkpointer=saver)


def run_turns(graph: Any, thread_id: str, turns: int) -> RunnableConfig:
    config: RunnableConfig = {"configurable": {"thread_id": thread_id}}
    for turn in range(turns):
        graph.invoke({"entries": [f"user {turn}"]}, config)
    return config


def every_checkpoint(saver: BaseCheckpointSaver[Any], thread_id: str) -> list[RunnableConfig]:
    return [found.config for found in saver.list({"configurable": {"thread_id": thread_id}})]


def test_a_delta_channel_reads_back_as_on_langgraphs_own_saver() -> None:
    saver, peer = QuicksaveSaver(), InMemorySaver()
    config = run_turns(diary_graph(saver), "diary", 5)
    run_turns(diary_graph(peer), "diary", 5)
    graph = diary_graph(saver)

    values = graph.get_state(config).values
    assert values == diary_graph(peer).get_state(config).values
    assert values["entries"] == [entry for turn in range(5) for entry in (f"user {turn}", f"turn {turn + 1}")]
    # Most checkpoints hold no value for the channel: it is rebuilt from the writes before them.
    stored = [found.checkpoint["channel_values"] for found in saver.list(config)]
    assert 0 < sum("entries" in values for values in stored) < len(stored) / 2

    def lengths(graph: Any) -> list[int]:
        return [len(snapshot.values.get("entries", [])) for snapshot in graph.get_state_history(config)]

    assert lengths(graph) == lengths(diary_graph(peer))


@pytest.mark.parametrize("durability", ["async", "exit"])
def test_a_delta_channel_reads_back_under_each_durability(durability: str) -> None:
    # Under "exit" LangGraph saves every superstep's writes under the checkpoint the run began at.
    saver, peer = QuicksaveSaver(), InMemorySaver()
    config: RunnableConfig = {"configurable": {"thread_id": f"diary-{durability}"}}
    for graph in (diary_graph(saver), diary_graph(peer)):
        for turn in range(5):
            graph.invoke({"entries": [f"user {turn}"]}, config, durability=durability)

    values = diary_graph(saver).get_state(config).values
    assert values == diary_graph(peer).get_state(config).values and len(values["entries"]) == 10


def test_get_delta_channel_history_matches_the_walk_langgraph_defines() -> None:
    saver = QuicksaveSaver()
    config = run_turns(diary_graph(saver), "diary-walk", 4)
    # A fork: update_state on an older checkpoint, then the graph runs on from it.
    graph = diary_graph(saver)
    older = list(graph.get_state_history(config))[5].config
    forked = graph.update_state(older, {"entries": ["forked"]})
    graph.invoke(None, forked)

    for at in every_checkpoint(saver, "diary-walk"):
        # The base class's walk follows get_tuple and parent_config: the contract, slowly.
        expected = BaseCheckpointSaver.get_delta_channel_history(saver, config=at, channels=["entries", "turns"])
        assert saver.get_delta_channel_history(config=at, channels=["entries", "turns"]) == expected
    assert saver.get_delta_channel_history(config=config, channels=[]) == {}
    unknown: RunnableConfig = {"configurable": {"thread_id": "no-such-thread"}}
    assert saver.get_delta_channel_history(config=unknown, channels=["entries"]) == {"entries": {"writes": []}}


def test_parallel_writes_replay_in_the_order_the_run_applied_them() -> None:
    saver, peer = QuicksaveSaver(), InMemorySaver()
    config = run_turns(fan_out_graph(saver), "fan-out", 2)
    run_turns(fan_out_graph(peer), "fan-out", 2)

    assert fan_out_graph(saver).get_state(config).values == fan_out_graph(peer).get_state(config).values
    head = saver.get_tuple(config)
    assert head is not None
    ours = saver.get_delta_channel_history(config=head.config, channels=["entries"])["entries"]
    theirs = peer.get_delta_channel_history(config=config, channels=["entries"])["entries"]
    assert [value for _, _, value in ours["writes"]] == [value for _, _, value in theirs["writes"]]


def test_prune_keeps_the_checkpoints_a_delta_channel_is_rebuilt_from() -> None:
    saver = QuicksaveSaver()
    config = run_turns(diary_graph(saver), "diary-prune", 5)
    before = diary_graph(saver).get_state(config).values
    count = Checkpoint.objects.filter(thread__external_id="diary-prune").count()

    saver.prune(["diary-prune"])

    assert diary_graph(saver).get_state(config).values == before
    kept = Checkpoint.objects.filter(thread__external_id="diary-prune").count()
    assert 1 < kept < count  # the latest, and the ancestors back to the channel's last snapshot
    diary_graph(saver).invoke({"entries": ["after prune"]}, config)
    assert diary_graph(saver).get_state(config).values["entries"][-2:] == ["after prune", "turn 6"]


def test_copy_thread_copies_the_history_a_delta_channel_is_rebuilt_from() -> None:
    saver = QuicksaveSaver()
    config = run_turns(diary_graph(saver), "diary-source", 4)

    saver.copy_thread("diary-source", "diary-copy")

    copy: RunnableConfig = {"configurable": {"thread_id": "diary-copy"}}
    assert diary_graph(saver).get_state(copy).values == diary_graph(saver).get_state(config).values
    assert Thread.objects.filter(external_id="diary-copy").exists()


def test_an_async_graph_rebuilds_a_delta_channel() -> None:
    saver = QuicksaveSaver()
    config: RunnableConfig = {"configurable": {"thread_id": "diary-async"}}

    async def run() -> dict[str, Any]:
        graph = diary_graph(saver)
        for turn in range(4):
            await graph.ainvoke({"entries": [f"user {turn}"]}, config)
        return (await graph.aget_state(config)).values

    values = asyncio.run(run())

    assert values["entries"][-2:] == ["user 3", "turn 4"] and len(values["entries"]) == 8
