"""Nothing a process keeps after a graph run holds on to that run (its graph, loop or frames),
even when the saver met an exception inside a transaction during it.

The saver's lent connections (checkpoints.storage.lent_connection) stay open for the process. Django's
connection object remembers the last exception that went through one of its atomic blocks, and
that exception's traceback holds every frame of the call up to the graph loop: were the object
kept, the last such run would stay in memory for good (LangGraph's own loop-refcount test,
`test_pregel_loop_refcount`, then fails after these tests). Mirrors that test: drop the graph,
collect, and look for loops still alive.
"""

from __future__ import annotations

import asyncio
import gc
import operator
import weakref
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph
from langgraph.pregel._loop import AsyncPregelLoop, SyncPregelLoop
from langgraph.pregel._runner import PregelRunner
from langgraph.types import interrupt

from approvals.models import ApprovalRequest
from integrations.langgraph.saver import QuicksaveSaver

pytestmark = pytest.mark.django_db(transaction=True)


class State(TypedDict):
    messages: Annotated[list[str], operator.add]


def ask(action: str) -> Any:
    def node(state: State) -> dict[str, Any]:
        interrupt({"action": action, "args": {}, "message": f"may I {action}?"})
        return {"messages": [action]}

    node.__name__ = action
    return node


def two_interrupting_nodes() -> Any:
    """START -> (book, pay) -> END: both interrupt in one step. The thread waits on one decision
    at a time, so filing the second approval fails on its unique constraint inside the saver's
    transaction (and is filed when the first is decided)."""
    builder: Any = StateGraph(State)
    builder.add_node("book", ask("book"))
    builder.add_node("pay", ask("pay"))
    builder.add_edge(START, "book")
    builder.add_edge(START, "pay")
    builder.add_edge("book", END)
    builder.add_edge("pay", END)
    return builder.compile(checkpointer=QuicksaveSaver())


def live(*kinds: type) -> list[Any]:
    gc.collect()
    # type(), not isinstance(): isinstance asks __class__, which evaluates a lazy object left by an
    # earlier test (django-csp's nonce) and raises.
    return [obj for obj in gc.get_objects() if issubclass(type(obj), kinds)]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_run_whose_saver_failed_in_a_transaction_is_freed(mode: str) -> None:
    kinds = (SyncPregelLoop, AsyncPregelLoop, PregelRunner)
    before = len(live(*kinds))
    config: Any = {"configurable": {"thread_id": f"refcount-{mode}"}}
    graph = two_interrupting_nodes()
    if mode == "sync":
        result = graph.invoke({"messages": []}, config)
    else:
        result = asyncio.run(graph.ainvoke({"messages": []}, config))
    assert len(result["__interrupt__"]) == 2
    assert ApprovalRequest.objects.filter(status="pending").count() == 1  # the second waits its turn
    graph_ref = weakref.ref(graph)
    del graph, result

    assert len(live(*kinds)) <= before  # this run's loop and runner are gone
    assert graph_ref() is None
