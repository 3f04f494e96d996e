"""Small compiled LangGraph graphs for the approval and time-travel tests, registered for the
worker (the browser tests' server loads this module through QUICKSAVE_AGENT_MODULES)."""

from __future__ import annotations

import operator
from typing import Annotated, Any, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt

from integrations.langgraph.runner import register_graph
from integrations.langgraph.saver import QuicksaveSaver

BOOKING = "lg-booking"
ASK = "lg-ask"
ASK_TWICE = "lg-ask-twice"
NESTED = "lg-nested"
ASK_BOTH = "lg-ask-both"
COUNTER = "lg-counter"


class Booking(TypedDict, total=False):
    destination: str
    offer: dict[str, Any]
    decision: Any
    booked: str | None


@register_graph(BOOKING)
def booking_graph(checkpointer: QuicksaveSaver) -> Any:
    """Find a flight, ask a person to approve booking it, book what they approved."""

    def find_flight(state: Booking) -> Booking:
        return {"offer": {"flight": "TP1350", "to": state["destination"], "price": 129}}

    def approve(state: Booking) -> Booking:
        offer = state["offer"]
        decision = interrupt(
            {"action": "book_flight", "args": offer, "message": f"Book {offer['flight']} to {offer['to']}?"}
        )
        return {"decision": decision}

    def book(state: Booking) -> Booking:
        decision = state["decision"]
        return {"booked": decision["args"]["flight"] if decision["decision"] == "approve" else None}

    builder = StateGraph(Booking)
    builder.add_node("find_flight", find_flight)
    builder.add_node("approve", approve)
    builder.add_node("book", book)
    builder.add_edge(START, "find_flight")
    builder.add_edge("find_flight", "approve")
    builder.add_edge("approve", "book")
    builder.add_edge("book", END)
    return builder.compile(checkpointer=checkpointer)


class Question(TypedDict, total=False):
    question: Any
    answer: Any


@register_graph(ASK)
def ask_graph(checkpointer: QuicksaveSaver) -> Any:
    """Interrupt with whatever value the input's `question` holds; keep what it resumes with."""

    def ask(state: Question) -> Question:
        return {"answer": interrupt(state["question"])}

    builder = StateGraph(Question)
    builder.add_node("ask", ask)
    builder.add_edge(START, "ask")
    builder.add_edge("ask", END)
    return builder.compile(checkpointer=checkpointer)


@register_graph(ASK_TWICE)
def ask_twice_graph(checkpointer: QuicksaveSaver) -> Any:
    """One node that interrupts twice: the second question is asked once the first is decided."""

    def ask(state: Question) -> Question:
        first = interrupt({"action": "charge_card", "args": {"amount": 129}})
        second = interrupt({"action": "send_receipt", "args": {"to": "ana@example.com"}})
        return {"answer": [first["decision"], second["decision"]]}

    builder = StateGraph(Question)
    builder.add_node("ask", ask)
    builder.add_edge(START, "ask")
    builder.add_edge("ask", END)
    return builder.compile(checkpointer=checkpointer)


class Answers(TypedDict, total=False):
    answers: Annotated[list[Any], operator.add]


@register_graph(ASK_BOTH)
def ask_both_graph(checkpointer: QuicksaveSaver) -> Any:
    """Two nodes in one superstep, each interrupting: two questions pending at once."""

    def ask_finance(state: Answers) -> Answers:
        return {"answers": [["finance", interrupt({"action": "approve_budget", "args": {"eur": 900}})["decision"]]]}

    def ask_legal(state: Answers) -> Answers:
        return {"answers": [["legal", interrupt({"action": "approve_contract", "args": {"pages": 4}})["decision"]]]}

    builder = StateGraph(Answers)
    builder.add_node("ask_finance", ask_finance)
    builder.add_node("ask_legal", ask_legal)
    builder.add_edge(START, "ask_finance")
    builder.add_edge(START, "ask_legal")
    builder.add_edge("ask_finance", END)
    builder.add_edge("ask_legal", END)
    return builder.compile(checkpointer=checkpointer)


@register_graph(NESTED)
def nested_graph(checkpointer: QuicksaveSaver) -> Any:
    """The `ask` graph as a subgraph: its interrupt reaches the root graph's thread."""
    builder = StateGraph(Question)
    builder.add_node("inner", ask_graph(checkpointer).builder.compile())
    builder.add_edge(START, "inner")
    builder.add_edge("inner", END)
    return builder.compile(checkpointer=checkpointer)


class Count(TypedDict):
    count: int
    trail: str


@register_graph(COUNTER)
def counter_graph(checkpointer: Any) -> Any:
    """Three steps, each changing both channels: a fork between them shows where a run went on from."""

    def add_one(state: Count) -> Count:
        return {"count": state["count"] + 1, "trail": state["trail"] + "a"}

    def times_ten(state: Count) -> Count:
        return {"count": state["count"] * 10, "trail": state["trail"] + "b"}

    def add_five(state: Count) -> Count:
        return {"count": state["count"] + 5, "trail": state["trail"] + "c"}

    builder = StateGraph(Count)
    builder.add_node("add_one", add_one)
    builder.add_node("times_ten", times_ten)
    builder.add_node("add_five", add_five)
    builder.add_edge(START, "add_one")
    builder.add_edge("add_one", "times_ten")
    builder.add_edge("times_ten", "add_five")
    builder.add_edge("add_five", END)
    return builder.compile(checkpointer=checkpointer)
