"""LangGraph graphs as in-process agents: the worker resumes a graph when a person decides on
one of its interrupts, and runs it on from a checkpoint when an admin forks or resumes its thread.

Register a factory that compiles the graph with the checkpointer it is given, in a module
listed in QUICKSAVE_AGENT_MODULES, and run the graph with `QuicksaveSaver(agent=<same name>)`:

    @register_graph("booking")
    def booking(checkpointer: QuicksaveSaver) -> CompiledStateGraph:
        return builder.compile(checkpointer=checkpointer)

    booking(QuicksaveSaver(agent="booking")).invoke(inputs, {"configurable": {"thread_id": "trip-7"}})

The worker rebuilds the graph in its own process for every run it claims. A run queued by a
decision resumes the thread's latest checkpoint with `Command(resume=...)` (see
integrations.langgraph.interrupts for the values); any other run (a fork, a manual resume)
invokes the graph with no input from the run's checkpoint. A retried run goes on from the
latest checkpoint, so the work a dead worker finished is not done again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.types import Command

from approvals.models import ApprovalRequest
from checkpoints import storage
from checkpoints.models import Checkpoint, Thread, ThreadStatus
from integrations.langgraph.interrupts import resume_for
from integrations.langgraph.saver import QuicksaveSaver
from quicksave_agents import runtime
from quicksave_agents.fencing import Fence
from quicksave_agents.models import Run, RunReason

GraphFactory = Callable[[QuicksaveSaver], Any]


class LangGraphAgent(runtime.LoopAgent):
    """A compiled LangGraph graph driven by the worker; made by `register_graph`."""

    def build(self, checkpointer: QuicksaveSaver) -> Any:
        """The compiled graph, checkpointing with `checkpointer` (register_graph sets the factory)."""
        raise NotImplementedError

    def drive(self, run: Run, thread: Thread, *, lease_held: Callable[[], bool]) -> str:
        info = thread.metadata.get("langgraph", {})
        if info.get("checkpoint_ns"):
            raise RuntimeError(f"Thread {thread.pk} is a subgraph's namespace; runs resume the root graph's thread.")
        saver = QuicksaveSaver(agent=self.name, fence=Fence(run.pk, run.attempts), lease_held=lease_held)
        graph = self.build(saver)
        latest: RunnableConfig = {"configurable": {"thread_id": info.get("thread_id", thread.external_id)}}
        if run.reason == RunReason.APPROVAL and run.approval_id is not None:
            approval = ApprovalRequest.objects.select_related("decided_by").get(pk=run.approval_id)
            head = Thread.objects.values_list("head_id", flat=True).get(pk=thread.pk)
            if head != approval.checkpoint_id:
                # The graph resumes its latest checkpoint: the decision is for that one only.
                raise runtime.ApprovalMismatch(
                    f"Run {run.pk} would resume the graph at checkpoint {head}, but its decision was made at "
                    f"checkpoint {approval.checkpoint_id}; not acting on it."
                )
            graph.invoke(Command(resume=resume_for(approval, decode=saver.from_json)), latest)
        else:
            graph.invoke(None, latest if run.attempts > 1 else self._at(run, latest))
        if graph.get_state(latest).next:
            return "suspended"
        storage.set_thread_status(thread=thread, status=ThreadStatus.COMPLETED)
        return "done"

    @staticmethod
    def _at(run: Run, latest: RunnableConfig) -> RunnableConfig:
        """The config that points the graph at the run's checkpoint."""
        lg_id = Checkpoint.objects.filter(pk=run.checkpoint_id).values_list("metadata__lg_id", flat=True).get()
        if not lg_id:
            raise RuntimeError(f"Checkpoint {run.checkpoint_id} was not written by LangGraph; nothing to run from.")
        return {"configurable": {**latest["configurable"], "checkpoint_id": lg_id}}


def register_graph(name: str, *, version: str = "1") -> Callable[[GraphFactory], GraphFactory]:
    """Decorator: make the worker run the graph this factory compiles for agent `name`."""

    def register(factory: GraphFactory) -> GraphFactory:
        agent_class = type(
            f"LangGraphAgent[{name}]",
            (LangGraphAgent,),
            {"name": name, "version": version, "build": staticmethod(factory), "__module__": factory.__module__},
        )
        runtime.register(agent_class)
        return factory

    return register
