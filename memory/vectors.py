"""Semantic search with pgvector, where the server has it.

Embeddings are stored as `real[]` on every server (so the schema is one), and cast to pgvector's
`vector(dims)` when searched: the cast is immutable, so an HNSW index on that expression
(`ensure_index`, made by QuicksaveStore.setup for its dimensions and distance) serves searches
over many items. Without the extension (Debian's PostgreSQL 15, say) a search with a query falls
back to full-text search over the same fields (memory.selectors).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from django.db import connection

Distance = Literal["cosine", "inner_product", "l2"]
# pgvector's operator, and the score that grows with similarity (PostgresStore's scores).
_OPERATORS: dict[str, tuple[str, str]] = {
    "cosine": ("<=>", "1 - {d}"),
    "inner_product": ("<#>", "-({d})"),
    "l2": ("<->", "-({d})"),
}
_OPCLASSES = {"cosine": "vector_cosine_ops", "inner_product": "vector_ip_ops", "l2": "vector_l2_ops"}
MAX_DIMS = 2000  # pgvector's limit for an indexed vector


@dataclass(frozen=True, slots=True)
class VectorSearch:
    """A semantic search: the query's embedding and how distance is measured."""

    embedding: list[float]
    distance: Distance = "cosine"

    @property
    def dims(self) -> int:
        return len(self.embedding)


def available() -> bool:
    """Whether this database has the pgvector extension (the embedded server does; the migration
    creates it where the server offers it)."""
    settings_dict = connection.settings_dict
    key = (settings_dict["HOST"], settings_dict["PORT"], settings_dict["NAME"])
    if key not in _available:
        with connection.cursor() as cursor:
            cursor.execute("SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'vector')")
            _available[key] = bool(cursor.fetchone()[0])
    return _available[key]


_available: dict[tuple[str, str, str], bool] = {}


def check(distance: str, dims: int) -> None:
    if distance not in _OPERATORS:
        raise ValueError(f"distance_type must be one of {', '.join(_OPERATORS)}, not {distance!r}.")
    if not 0 < dims <= MAX_DIMS:
        raise ValueError(f"dims must be from 1 to {MAX_DIMS}, not {dims}.")


def distance_sql(search: VectorSearch, column: str = "x.embedding") -> str:
    """`column <op> query` with the query as parameter `%(query_vector)s`, as the HNSW index has it."""
    operator = _OPERATORS[search.distance][0]
    dims = int(search.dims)
    return f"({column}::vector({dims})) {operator} %(query_vector)s::vector({dims})"


def score_sql(search: VectorSearch, distance: str) -> str:
    return _OPERATORS[search.distance][1].format(d=distance)


def array_literal(embedding: list[float]) -> str:
    """An embedding as a PostgreSQL `real[]` literal."""
    return "{" + ",".join(repr(float(component)) for component in embedding) + "}"


def vector_literal(embedding: list[float]) -> str:
    """An embedding as a pgvector literal."""
    return "[" + ",".join(repr(float(component)) for component in embedding) + "]"


def ensure_index(*, dims: int, distance: Distance) -> bool:
    """An HNSW index for searches of `dims`-dimensional embeddings by `distance`, made unless it
    exists; False where the server has no pgvector."""
    check(distance, dims)
    if not available():
        return False
    name = f"memory_index_hnsw_{int(dims)}_{distance}"
    with connection.cursor() as cursor:
        cursor.execute(
            f"CREATE INDEX IF NOT EXISTS {name} ON memory_indexentry USING hnsw "
            f"((embedding::vector({int(dims)})) {_OPCLASSES[distance]}) WHERE dims = {int(dims)}"
        )
    return True
