"""LangGraph's `BaseStore` on Quicksave's long-term memory: `graph.compile(checkpointer=QuicksaveSaver(),
store=QuicksaveStore())`, and a node's `store` argument writes versioned, sealed, integrity-chained
items that people can inspect, search and share (memory/).

Mapping:

- A LangGraph namespace is a memory namespace path, an item its item; `PutOp(value=None)` is a
  delete. Every put and delete is a new version written by the store's Quicksave agent
  (`langgraph` by default, the saver's default too), which owns the namespaces it makes: another
  agent sees them only once a person shares them.
- Inside a graph run, a write names the Quicksave thread of the run's `thread_id` (the saver's
  thread, found under the store's agent) and that thread's head checkpoint at the time: the
  checkpoint the step writing it started from. A get or search there is recorded as a read by
  the same thread and checkpoint (memory.reads), found by the read's own statement.
- `index` (an IndexConfig: `dims`, `embed`, `fields`, and PostgresStore's `distance_type`): each put
  indexes the texts at its fields (`put(..., index=[...])` or the config's; `index=False` none) for
  full-text search always, and, where the database has pgvector, with the embeddings `embed`
  makes; a search with a `query` is then a nearest-neighbour search. Without pgvector (Debian's
  PostgreSQL 15) the query is a full-text search of the same texts, and nothing is embedded.
- `ttl` (a TTLConfig) as PostgresStore: a TTL in minutes per item, refreshed by reads unless
  told not to, expired items omitted when `omit_expired`, and a sweeper thread
  (`start_ttl_sweeper`) that deletes them (as versions written by Quicksave, rule "ttl").

`abatch` embeds with the embedding function's async form, then runs the operations in a worker
thread (`database_sync_to_async`) as every async method of the saver does.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from collections.abc import Iterable, Sequence
from typing import Any, cast

from channels.db import database_sync_to_async
from django.db import connection, connections
from langchain_core.embeddings import Embeddings
from langgraph.config import get_config
from langgraph.store.base import (
    BaseStore,
    GetOp,
    IndexConfig,
    Item,
    ListNamespacesOp,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
    TTLConfig,
    ensure_embeddings,
    get_text_at_path,
    tokenize_path,
)

from memory import reads, selectors, store, vectors
from memory.access import Scope
from memory.selectors import Found
from memory.texts import IndexText
from quicksave_agents.keys import get_or_create_agent
from quicksave_agents.models import Agent

log = logging.getLogger(__name__)

_DISTANCES = ("cosine", "inner_product", "l2")


class QuicksaveStore(BaseStore):
    """A LangGraph store that keeps every version of every item in Quicksave's memory."""

    supports_ttl = True

    def __init__(self, *, agent: str = "langgraph", index: IndexConfig | None = None, ttl: TTLConfig | None = None):
        """`agent` names the Quicksave agent the store reads and writes as; `index` turns on search
        by meaning (see the module docstring); `ttl` sets expiry as PostgresStore's does."""
        self.agent_name = agent
        self.ttl_config = ttl
        self.index_config: dict[str, Any] | None = None
        self.embeddings: Embeddings | None = None
        self._fields: list[tuple[str, str | list[str]]] = []
        self._distance = "cosine"
        if index is not None:
            self.index_config = dict(index)
            vector_type = self.index_config.get("ann_index_config", {}).get("vector_type", "vector")
            if vector_type != "vector":
                raise ValueError(f"QuicksaveStore stores embeddings as pgvector `vector`, not {vector_type!r}.")
            self._distance = self.index_config.get("distance_type", "cosine")
            if self._distance not in _DISTANCES:
                raise ValueError(f"distance_type must be one of {', '.join(_DISTANCES)}, not {self._distance!r}.")
            vectors.check(self._distance, int(self.index_config["dims"]))
            fields = self.index_config.get("fields") or ["$"]
            self._fields = [(field, "$" if field == "$" else tokenize_path(field)) for field in fields]
            self.embeddings = ensure_embeddings(self.index_config.get("embed"))
        self._agent: Agent | None = None
        self._sweeper: threading.Thread | None = None
        self._sweeper_stop = threading.Event()

    # ------------------------------------------------------------------ set-up

    def _get_agent(self) -> Agent:
        if self._agent is None:
            self._agent = get_or_create_agent(name=self.agent_name, description="LangGraph graphs")
        return self._agent

    @property
    def _scope(self) -> Scope:
        return Scope(self._get_agent().pk)

    def setup(self) -> None:
        """Make the store's agent and, where the database has pgvector, the HNSW index its searches
        use (for the IndexConfig's dimensions and distance). The tables are Quicksave's migrations'."""
        self._get_agent()
        if self.index_config is not None:
            vectors.ensure_index(dims=int(self.index_config["dims"]), distance=self._distance)  # type: ignore[arg-type]

    # ------------------------------------------------------------------ operations

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        ops = list(ops)
        put_vectors = self._embed_puts(ops, self._texts_to_embed(ops))
        query_vectors = self._embed_queries(ops)
        return self._run(ops, put_vectors, query_vectors)

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        ops = list(ops)
        wanted = self._texts_to_embed(ops)
        put_vectors: list[list[float]] = []
        query_vectors: dict[int, list[float]] = {}
        if self.embeddings is not None and await database_sync_to_async(vectors.available)():
            if wanted:
                put_vectors = await self.embeddings.aembed_documents(wanted)
            for position, op in enumerate(ops):
                if isinstance(op, SearchOp) and op.query:
                    query_vectors[position] = await self.embeddings.aembed_query(op.query)
        return cast(list[Result], await database_sync_to_async(self._run)(ops, put_vectors, query_vectors))

    def _run(
        self, ops: list[Op], put_vectors: list[list[float]], query_vectors: dict[int, list[float]]
    ) -> list[Result]:
        results: list[Result] = []
        embedded = iter(put_vectors)
        for position, op in enumerate(ops):
            if isinstance(op, GetOp):
                results.append(self._get(op))
            elif isinstance(op, SearchOp):
                results.append(self._search(op, query_vectors.get(position)))
            elif isinstance(op, ListNamespacesOp):
                results.append(self._list_namespaces(op))
            elif isinstance(op, PutOp):
                self._put(op, embedded)
                results.append(None)
            else:
                raise ValueError(f"Unknown operation {type(op).__name__}.")
        return results

    def _omit_expired(self) -> bool:
        return bool(self.ttl_config and self.ttl_config.get("omit_expired"))

    def _get(self, op: GetOp) -> Item | None:
        found = selectors.get_item(
            namespace=op.namespace, key=op.key, scope=self._scope, refresh_ttl=op.refresh_ttl,
            omit_expired=self._omit_expired(), reader=self._reader(),
        )  # fmt: skip
        return None if found is None else _item(found)

    def _search(self, op: SearchOp, query_vector: list[float] | None) -> list[SearchItem]:
        vector = None
        query = None
        if op.query and self.index_config is not None:
            if query_vector is not None:
                vector = vectors.VectorSearch(embedding=query_vector, distance=self._distance)  # type: ignore[arg-type]
            else:
                query = op.query  # no pgvector here: full-text search over the same fields
        found = selectors.search_items(
            scope=self._scope, prefix=op.namespace_prefix, filter=op.filter, query=query, vector=vector,
            vectors_per_item=max(len(self._fields), 1), limit=op.limit, offset=op.offset,
            refresh_ttl=op.refresh_ttl, omit_expired=self._omit_expired(), reader=self._reader(),
        )  # fmt: skip
        return [_search_item(item) for item in found]

    def _list_namespaces(self, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        prefix: tuple[str, ...] = ()
        suffix: tuple[str, ...] = ()
        for condition in op.match_conditions or ():
            if condition.match_type == "prefix" and not prefix:
                prefix = tuple(condition.path)
            elif condition.match_type == "suffix" and not suffix:
                suffix = tuple(condition.path)
            else:
                raise ValueError(f"QuicksaveStore lists by one prefix and one suffix, not {condition!r}.")
        return selectors.list_namespaces(
            scope=self._scope, prefix=prefix, suffix=suffix, max_depth=op.max_depth, limit=op.limit,
            offset=op.offset, omit_expired=self._omit_expired(),
        )  # fmt: skip

    def _put(self, op: PutOp, embedded: Any) -> None:
        agent = self._get_agent()
        author = store.Author.agent(agent.pk)
        origin = self._origin()
        if op.value is None:
            store.delete_item(namespace=op.namespace, key=op.key, author=author, scope=self._scope, origin=origin)
            return
        texts = self._index_texts(op)
        entries = None
        if texts:
            entries = [
                IndexText(field=field, text=text, embedding=next(embedded, None) if self._embedding_now() else None)
                for field, text in texts
            ]
        store.put_item(
            namespace=op.namespace, key=op.key, value=dict(op.value), author=author, scope=self._scope,
            origin=origin, ttl_minutes=op.ttl, index=entries,
        )  # fmt: skip

    # ------------------------------------------------------------------ indexing

    def _index_texts(self, op: PutOp) -> list[tuple[str, str]] | None:
        """(field name, text) to index for a put, named as PostgresStore names them."""
        if self.index_config is None or op.index is False or op.value is None:
            return None
        paths = self._fields if op.index is None else [(field, tokenize_path(field)) for field in op.index]
        found: list[tuple[str, str]] = []
        for field, tokens in paths:
            texts = get_text_at_path(op.value, tokens)
            found.extend((f"{field}.{i}" if len(texts) > 1 else field, text) for i, text in enumerate(texts))
        return found

    def _embedding_now(self) -> bool:
        return self.embeddings is not None and vectors.available()

    def _texts_to_embed(self, ops: Sequence[Op]) -> list[str]:
        return [
            text
            for op in ops
            if isinstance(op, PutOp)
            for _, text in (self._index_texts(op) or [])
        ]  # fmt: skip

    def _embed_puts(self, ops: Sequence[Op], texts: list[str]) -> list[list[float]]:
        if not texts or not self._embedding_now():
            return []
        assert self.embeddings is not None
        return self.embeddings.embed_documents(texts)

    def _embed_queries(self, ops: Sequence[Op]) -> dict[int, list[float]]:
        if not self._embedding_now():
            return {}
        assert self.embeddings is not None
        return {
            position: self.embeddings.embed_query(op.query)
            for position, op in enumerate(ops)
            if isinstance(op, SearchOp) and op.query
        }

    # ------------------------------------------------------------------ provenance

    @staticmethod
    def _run_thread() -> str | None:
        """The `thread_id` of the graph run calling the store (None outside a run)."""
        try:
            configurable = get_config().get("configurable", {})
        except RuntimeError:  # not inside a graph run
            return None
        thread_id = configurable.get("thread_id")
        return None if thread_id is None else str(thread_id)

    def _reader(self) -> reads.Reader | None:
        """Who reads, inside a graph run: its thread, which the read resolves (memory.reads)."""
        thread_id = self._run_thread()
        if thread_id is None:
            return None
        return reads.Reader(agent_id=self._get_agent().pk, external_id=thread_id)

    def _origin(self) -> store.Origin:
        """The Quicksave thread of the graph run making this write, and its head then."""
        thread_id = self._run_thread()
        if thread_id is None:
            return store.NOWHERE
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT id, head_id FROM checkpoints_thread WHERE agent_id = %s AND external_id = %s",
                [self._get_agent().pk, thread_id],
            )
            row = cursor.fetchone()
        if row is None:
            return store.NOWHERE
        return store.Origin(thread_id=row[0], checkpoint_id=row[1])

    # ------------------------------------------------------------------ expiry

    def sweep_ttl(self) -> int:
        """Delete every expired item now; returns how many."""
        return store.sweep_expired()

    def start_ttl_sweeper(self, sweep_interval_minutes: int | None = None) -> concurrent.futures.Future[None]:
        """Sweep expired items every `sweep_interval_minutes` (default: the TTLConfig's, else 5) in a
        daemon thread until `stop_ttl_sweeper`."""
        done: concurrent.futures.Future[None] = concurrent.futures.Future()
        if self._sweeper is not None and self._sweeper.is_alive():
            done.set_result(None)
            return done
        minutes = sweep_interval_minutes or (self.ttl_config or {}).get("sweep_interval_minutes") or 5
        self._sweeper_stop.clear()

        def sweep() -> None:
            try:
                while not self._sweeper_stop.wait(float(minutes) * 60):
                    try:
                        swept = self.sweep_ttl()
                    except Exception:
                        log.exception("memory TTL sweep failed; trying again in %s minutes", minutes)
                    else:
                        if swept:
                            log.info("memory TTL sweep deleted %d expired items", swept)
            finally:
                connections.close_all()
                done.set_result(None)

        self._sweeper = threading.Thread(target=sweep, name="quicksave-memory-ttl", daemon=True)
        self._sweeper.start()
        return done

    def stop_ttl_sweeper(self, timeout: float | None = None) -> bool:
        """Stop the sweeper; whether it stopped within `timeout` seconds."""
        if self._sweeper is None:
            return True
        self._sweeper_stop.set()
        self._sweeper.join(timeout)
        stopped = not self._sweeper.is_alive()
        if stopped:
            self._sweeper = None
        return stopped


def _item(found: Found) -> Item:
    return Item(
        value=found.value, key=found.key, namespace=found.namespace, created_at=found.created_at,
        updated_at=found.updated_at,
    )  # fmt: skip


def _search_item(found: Found) -> SearchItem:
    return SearchItem(
        namespace=found.namespace, key=found.key, value=found.value, created_at=found.created_at,
        updated_at=found.updated_at, score=found.score,
    )  # fmt: skip
