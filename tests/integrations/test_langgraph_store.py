"""QuicksaveStore as LangGraph's BaseStore: a compiled graph's `store`, sync and async batches,
filters, namespaces, TTL, agent scoping, and search by meaning (pgvector) or by words (fallback)."""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any, TypedDict

import pytest
from django.db import connection, transaction
from django.utils import timezone
from langgraph.graph import START, StateGraph
from langgraph.store.base import BaseStore, GetOp, Item, ListNamespacesOp, MatchCondition, PutOp, SearchOp

from checkpoints.models import Thread
from integrations.langgraph.saver import QuicksaveSaver
from integrations.langgraph.store import QuicksaveStore
from memory import reads, selectors, vectors
from memory.access import EVERYTHING
from memory.models import IndexEntry, Writer
from memory.models import Item as ItemRow
from tests.waiting import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


class Letters:
    """A deterministic embedding: letter frequencies, normalised (texts with the same letters are
    near), counting the texts it embedded."""

    dims = 26

    def __init__(self) -> None:
        self.embedded: list[str] = []

    def __call__(self, texts: list[str]) -> list[list[float]]:
        self.embedded.extend(texts)
        return [self.one(text) for text in texts]

    @staticmethod
    def one(text: str) -> list[float]:
        counts = [float(text.lower().count(chr(ord("a") + i))) for i in range(26)]
        norm = math.sqrt(sum(c * c for c in counts)) or 1.0
        return [c / norm for c in counts]


def by_letters(letters: Letters, **extra: Any) -> Any:
    """An IndexConfig embedding the `text` field with `letters`."""
    return {"dims": Letters.dims, "embed": letters, "fields": ["text"], **extra}


class Counter(TypedDict):
    n: int


def remember(state: Counter, store: BaseStore) -> dict[str, int]:
    seen = store.get(("counters",), "last")
    store.put(("counters",), "last", {"n": state["n"], "previous": seen.value["n"] if seen else None})
    return {"n": state["n"] + 1}


def test_a_node_store_argument_is_quicksave_memory_and_each_write_names_its_thread() -> None:
    builder: Any = StateGraph(Counter)
    builder.add_node("first", remember)
    builder.add_node("second", remember)
    builder.add_edge(START, "first")
    builder.add_edge("first", "second")
    store = QuicksaveStore()
    graph = builder.compile(checkpointer=QuicksaveSaver(), store=store)

    graph.invoke({"n": 0}, {"configurable": {"thread_id": "counting"}}, durability="sync")

    item = store.get(("counters",), "last")
    assert item is not None and item.value == {"n": 1, "previous": 0}
    versions = selectors.item_history(namespace=("counters",), key="last", scope=EVERYTHING)
    assert versions is not None and [v.value["n"] for v in versions] == [1, 0]
    thread = Thread.objects.get(agent__name="langgraph", external_id="counting")
    # Each step's write names the thread and the checkpoint the step started from.
    assert {v.thread_id for v in versions} == {thread.pk}
    assert all(v.checkpoint_id is not None for v in versions) and versions[0].checkpoint_id != versions[1].checkpoint_id
    assert {v.writer for v in versions} == {Writer.AGENT}


def test_a_nodes_read_is_recorded_with_the_thread_and_the_checkpoint_its_step_started_from() -> None:
    builder: Any = StateGraph(Counter)
    builder.add_node("first", remember)
    builder.add_node("second", remember)
    builder.add_edge(START, "first")
    builder.add_edge("first", "second")
    store = QuicksaveStore()
    graph = builder.compile(checkpointer=QuicksaveSaver(), store=store)

    graph.invoke({"n": 0}, {"configurable": {"thread_id": "counting"}}, durability="sync")
    store.get(("counters",), "last")  # outside a run: no thread, nothing recorded

    assert reads.flush()
    versions = selectors.item_history(namespace=("counters",), key="last", scope=EVERYTHING)
    assert versions is not None
    thread = Thread.objects.get(agent__name="langgraph", external_id="counting")
    # The first step found nothing; the second read version 1 from the checkpoint it wrote version 2 from.
    [read] = selectors.item_reads(namespace=("counters",), key="last", scope=EVERYTHING)
    assert (read.version, read.thread_id, read.checkpoint_id) == (1, thread.pk, versions[0].checkpoint_id)


def test_a_batch_answers_each_operation_in_order() -> None:
    store = QuicksaveStore()
    store.put(("test", "foo"), "key1", {"data": "value1"})

    results = store.batch([
        GetOp(namespace=("test", "foo"), key="key1"),
        PutOp(namespace=("test", "bar"), key="key2", value={"data": "value2"}),
        SearchOp(namespace_prefix=("test",), filter={"data": "value2"}),
        ListNamespacesOp(match_conditions=(MatchCondition("prefix", ("test",)),)),
        GetOp(namespace=("test",), key="missing"),
        PutOp(namespace=("test", "foo"), key="key1", value=None),
        GetOp(namespace=("test", "foo"), key="key1"),
    ])  # fmt: skip

    assert isinstance(results[0], Item) and results[0].value == {"data": "value1"}
    assert results[1] is None
    assert [item.key for item in results[2]] == ["key2"]  # type: ignore[union-attr]
    assert results[3] == [("test", "bar"), ("test", "foo")]
    assert results[4] is None and results[5] is None and results[6] is None


def test_the_async_api_reads_and_writes_the_same_items() -> None:
    store = QuicksaveStore()

    async def scenario() -> tuple[Any, ...]:
        await store.aput(("users", "u1"), "prefs", {"theme": "dark", "size": 12})
        await store.aput(("users", "u2"), "prefs", {"theme": "light", "size": 14})
        found = await store.asearch(("users",), filter={"size": {"$gt": 12}})
        got = await store.aget(("users", "u1"), "prefs")
        await store.adelete(("users", "u1"), "prefs")
        return found, got, await store.aget(("users", "u1"), "prefs"), await store.alist_namespaces(suffix=("u2",))

    found, got, deleted, namespaces = asyncio.run(scenario())

    assert [item.namespace for item in found] == [("users", "u2")]
    assert got.value == {"theme": "dark", "size": 12}
    assert deleted is None
    assert namespaces == [("users", "u2")]


def test_items_with_a_ttl_are_omitted_once_expired_and_swept_as_versions() -> None:
    store = QuicksaveStore(ttl={"default_ttl": 60, "omit_expired": True})
    store.put(("sessions",), "s1", {"user": "al"})
    store.put(("sessions",), "keep", {"user": "bo"}, ttl=None)
    ItemRow.objects.filter(key="s1").update(expires_at=timezone.now())

    assert store.get(("sessions",), "s1") is None
    assert [item.key for item in store.search(("sessions",))] == ["keep"]
    assert store.sweep_ttl() == 1
    versions = selectors.item_history(namespace=("sessions",), key="s1", scope=EVERYTHING)
    assert versions is not None and versions[0].deleted and versions[0].rule == "ttl"


def test_the_ttl_sweeper_runs_in_its_thread_until_stopped() -> None:
    store = QuicksaveStore(ttl={"default_ttl": 1})
    store.put(("sessions",), "s1", {"user": "al"})
    ItemRow.objects.filter(key="s1").update(expires_at=timezone.now())

    stopped = store.start_ttl_sweeper(sweep_interval_minutes=0.001)  # type: ignore[arg-type]
    try:
        wait_until(
            lambda: store.get(("sessions",), "s1", refresh_ttl=False) is None,
            what="the sweeper to delete the expired item",
        )
    finally:
        assert store.stop_ttl_sweeper(timeout=10)
    assert stopped.done()


def test_another_agents_store_does_not_see_these_namespaces() -> None:
    mine, theirs = QuicksaveStore(agent="planner"), QuicksaveStore(agent="executor")
    mine.put(("plans",), "p1", {"step": 1})

    assert theirs.get(("plans",), "p1") is None
    assert theirs.search(()) == []
    assert theirs.list_namespaces() == []
    assert mine.list_namespaces() == [("plans",)]


def test_without_pgvector_a_query_searches_the_indexed_words_and_nothing_is_embedded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Runs on every server: where pgvector exists, the store is told it does not.
    monkeypatch.setattr(vectors, "available", lambda: False)
    letters = Letters()
    store = QuicksaveStore(index=by_letters(letters))
    store.setup()
    store.put(("docs",), "a", {"text": "zany zebra"})
    store.put(("docs",), "b", {"text": "dull dog"})
    store.put(("docs",), "c", {"text": "zebra crossing", "hidden": "dog"}, index=False)

    found = store.search(("docs",), query="zebra")

    assert found[0].key == "a"
    assert found[0].score is not None and found[0].score > 0
    assert {item.key: item.score for item in found}["c"] == 0
    assert letters.embedded == []
    assert IndexEntry.objects.filter(embedding__isnull=False).count() == 0


@pytest.mark.pgvector
@pytest.mark.parametrize("distance", ["cosine", "inner_product", "l2"])
def test_with_pgvector_a_query_finds_the_nearest_items_with_their_similarity(distance: str) -> None:
    letters = Letters()
    store = QuicksaveStore(index=by_letters(letters, distance_type=distance))
    store.setup()
    texts = {"a": "zany zebra", "b": "dull dog", "c": "cats and catnip", "d": "zebras graze"}
    for key, text in texts.items():
        store.put(("docs",), key, {"text": text})
    store.put(("docs",), "e", {"text": "zebra zebra"}, index=False)

    found = store.search(("docs",), query="zebra", limit=3)

    query = Letters.one("zebra")

    def similarity(text: str) -> float:
        vector = Letters.one(text)
        dot = sum(a * b for a, b in zip(query, vector, strict=True))
        if distance == "l2":
            return -math.sqrt(sum((a - b) ** 2 for a, b in zip(query, vector, strict=True)))
        return dot  # unit vectors: cosine and inner product agree

    expected = sorted(texts, key=lambda key: similarity(texts[key]), reverse=True)[:3]
    assert [item.key for item in found] == expected
    for item in found:
        assert item.score == pytest.approx(similarity(texts[item.key]), abs=1e-5)
    assert "zebra" in letters.embedded
    assert IndexEntry.objects.filter(embedding__isnull=False).count() == 4


@pytest.mark.pgvector
def test_with_pgvector_a_search_under_one_namespace_finds_its_items_when_the_nearest_are_elsewhere() -> None:
    store = QuicksaveStore(index=by_letters(Letters()))
    store.setup()
    for n in range(60):
        store.put(("zoo",), f"z{n}", {"text": "zebra " + "z" * n})
    texts = {"a": "zany cat", "b": "dull dog", "c": "big bear"}
    for key, text in texts.items():
        store.put(("docs",), key, {"text": text})

    # As on a large table, where the planner takes the HNSW index over reading every entry: its
    # scan stops at the 40 entries nearest the query (hnsw.ef_search), here all of ("zoo",).
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        found = store.search(("docs",), query="zebra", limit=3)

    assert sorted(item.key for item in found) == ["a", "b", "c"]
    scores = [item.score for item in found]
    assert scores == sorted(scores, reverse=True)  # type: ignore[type-var]


@pytest.mark.pgvector
def test_with_pgvector_a_search_under_one_namespace_reads_only_its_entries_by_index() -> None:
    store = QuicksaveStore(index=by_letters(Letters()))
    store.setup()
    for n in range(60):
        store.put(("zoo",), f"z{n}", {"text": "zebra " + "z" * n})
    store.put(("docs",), "a", {"text": "zany cat"})
    plans: list[str] = []

    def explain(execute: Any, sql: str, params: Any, many: bool, context: dict[str, Any]) -> Any:
        if "candidates AS MATERIALIZED" in sql:
            context["cursor"].cursor.execute("EXPLAIN (FORMAT JSON) " + sql, params)
            plans.append(json.dumps(context["cursor"].cursor.fetchone()[0]))
        return execute(sql, params, many, context)

    # As on a large table, where reading every entry costs more than an index's few.
    with transaction.atomic(), connection.cursor() as cursor, connection.execute_wrapper(explain):
        cursor.execute("SET LOCAL enable_seqscan = off")
        assert [item.key for item in store.search(("docs",), query="zebra", limit=3)] == ["a"]

    # The exact branch (a narrow prefix: the index's nearest entries are all elsewhere) finds the
    # namespace's entries by its index, not by reading the table's.
    assert len(plans) == 1 and '"Index Name": "memory_index_namespace"' in plans[0]


@pytest.mark.pgvector
def test_with_pgvector_a_search_filters_and_pages_the_nearest_items() -> None:
    store = QuicksaveStore(index=by_letters(Letters()))
    store.setup()
    for key, text, color in [("a", "red apple", "red"), ("b", "red car", "red"), ("c", "green apple", "green")]:
        store.put(("shop",), key, {"text": text, "color": color})

    assert [item.key for item in store.search(("shop",), query="apple", filter={"color": "red"})] == ["a", "b"]
    first = store.search(("shop",), query="apple", limit=1)
    second = store.search(("shop",), query="apple", limit=1, offset=1)
    assert first[0].key != second[0].key

    async def asearch() -> list[Any]:
        return await store.asearch(("shop",), query="green apple", limit=1)

    assert [item.key for item in asyncio.run(asearch())] == ["c"]
