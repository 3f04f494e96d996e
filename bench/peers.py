"""Shared harness, workload and peer contenders for the checkpoint-store benchmark.

The benchmark (``bench/checkpoint_store.py``) compares, in one process against
one PostgreSQL server, several ways of persisting an AI agent's state after every
step of the same workload.  This module holds everything except Quicksave's own
store, which plugs in through ``run_quicksave`` in the CLI.

Workload
--------
``workload(steps, seed)`` yields ``steps`` :class:`Step` objects, numbered from 1.
Each step models one turn of a travel-planning agent:

* ``message`` -- ``{"role": "assistant", "content": <text>}`` where ``text`` is
  exactly 1,000 characters of English-like prose: words drawn at random from a
  fixed vocabulary of about 360 common English words, grouped into sentences of
  6-16 words, sentence-cased and ending in periods.  Every step's text differs.
* ``step`` -- the 1-based step number.
* ``facts`` -- a small dict *replaced* (not merged) every step:
  ``{"city": str, "budget": int, "nights": int, "updated_at_step": step}``.

The state after step *n* is therefore: the list of the first *n* messages
(append-only), ``step = n`` and the facts of step *n* (last value wins).
Everything is deterministic from ``seed``, so every contender stores
byte-for-byte the same content.

Contenders defined here
-----------------------
``floor``
    Raw psycopg: one table ``bench_floor``; each step is ONE committed
    ``INSERT`` of the step's change (autocommit connection, so one round trip
    per checkpoint).  Reads fold the rows back into the state.  This is the
    floor any append-only checkpoint store has to pay.
``langgraph``
    A compiled LangGraph ``StateGraph`` checkpointed by
    ``langgraph.checkpoint.postgres.PostgresSaver``; one ``graph.invoke`` per
    workload step.

Measures (see :class:`Result`)
------------------------------
* ``cps`` -- workload steps persisted per second (wall clock over all steps).
* ``bytes_per_cp`` -- on-disk size of the contender's tables (heap + TOAST +
  indexes, ``pg_total_relation_size``) after the run, divided by the steps.
  Tables are dropped and recreated before each run.
* ``latest_read_ms`` -- median time to materialise the full latest state.
* ``state_at_ms`` -- median time to materialise the full state at a random
  earlier checkpoint.
* ``history_ms`` -- time to list the thread's whole checkpoint history.

Database
--------
The server comes from ``BENCH_DATABASE_URL``, else ``DATABASE_URL``, else
``postgresql://postgres@127.0.0.1:5432/postgres``.  The benchmark always works
inside a dedicated database, ``quicksave_bench`` unless ``BENCH_DATABASE_NAME``
names another (``bench/compare.py`` gives each tree its own), creating it
through an autocommit connection to the maintenance database if needed, so
nothing else is touched.
"""

from __future__ import annotations

import gc
import operator
import os
import random
import statistics
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any, TypedDict

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

if TYPE_CHECKING:
    from langchain_core.runnables import RunnableConfig

BENCH_DB_NAME = os.environ.get("BENCH_DATABASE_NAME") or "quicksave_bench"
DEFAULT_SERVER_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
MESSAGE_CHARS = 1_000
READ_REPEATS = 20
HISTORY_MAX_REPEATS = 5
HISTORY_TIME_BUDGET_S = 10.0
THREAD_ID = "bench-thread"

# --------------------------------------------------------------------------
# Workload
# --------------------------------------------------------------------------

# ~360 common English words.  Every length from 1 to the longest word occurs,
# which lets the generator hit exactly MESSAGE_CHARS characters.
_VOCABULARY_TEXT = """
    a I an at by to of in on it we is as or be do go if me my no so up us
    the and for you are was can but not all any had her his one our out day
    get has him how man new now old see two way who boy did its let put say
    she too use sea car bus map fly eat sun hot bed air set end few far
    time that with this from they have will your what when make like into
    just over also back only more most very well even good much some then
    than them here city park room food road view trip tour walk rain wind
    hill lake boat ship town port cafe menu wine fish rice tree bird long
    night train hotel place plane beach river coast north south early later
    never often small large quiet busy green water light sleep dream guide
    local price money cheap ticket market street bridge church garden museum
    palace island valley forest desert winter summer spring autumn morning
    evening dinner lunch coffee bakery border travel friend family people
    answer before should around little through between another because
    nothing suggest arrive depart return booking journey weather station
    airport minutes evening history culture ancient village mountain harbour
    festival cathedral breakfast afternoon itinerary luggage passport
    currency exchange schedule comfortable available restaurant reservation
    recommend excellent beautiful wonderful important interesting delicious
    expensive convenient neighborhood architecture relationship construction
    conversation accommodate information experience
    particular especially afterwards everything somewhere sometimes together
    tomorrow yesterday weekend holiday vacation adventure explore discover
    visit stay leave book pack plan check taxi ferry metro tram hike swim
    climb relax enjoy taste share drive ride pay tip rent hire cross follow
    arrange compare prefer decide budget nights rooms window balcony terrace
    sunset sunrise ocean island bay cliff cave tower castle square fountain
    gallery theatre concert ticketed queue crowd season rainy sunny cloudy
    windy warm cold mild fresh spicy sweet salty bitter sour local regional
    national famous popular hidden quiet lively narrow wide steep flat
    ask tell show find keep give take come look want need know think feel
    try seem turn start begin open close move live stand hear run bring
"""
VOCABULARY: tuple[str, ...] = tuple(_VOCABULARY_TEXT.split())

CITIES: tuple[str, ...] = (
    "Lisbon", "Porto", "Seville", "Kyoto", "Osaka", "Hanoi", "Oaxaca",
    "Tbilisi", "Krakow", "Ljubljana", "Valparaiso", "Marrakesh", "Bergen",
    "Naples", "Istanbul", "Montreal",
)  # fmt: skip

_WORDS_BY_LEN: dict[int, tuple[str, ...]] = {}
for _w in sorted(set(VOCABULARY)):
    _WORDS_BY_LEN[len(_w)] = (*_WORDS_BY_LEN.get(len(_w), ()), _w)
_MAX_WORD = max(_WORDS_BY_LEN)
assert all(n in _WORDS_BY_LEN for n in range(1, _MAX_WORD + 1)), "vocabulary has a length gap"
_ALL_WORDS: tuple[str, ...] = tuple(sorted(set(VOCABULARY)))


@dataclass(frozen=True, slots=True)
class Step:
    """One workload step: the message appended and the facts replaced."""

    step: int
    message: dict[str, str]
    facts: dict[str, Any]

    @property
    def change(self) -> dict[str, Any]:
        """The step's delta as one JSON-able document."""
        return {"message": self.message, "step": self.step, "facts": self.facts}


def _cased(word: str, sentence_start: bool) -> str:
    return word[:1].upper() + word[1:] if sentence_start else word


def english_text(rng: random.Random, length: int = MESSAGE_CHARS) -> str:
    """Return exactly ``length`` characters of sentence-cased random English words.

    Sentences have 6-16 words and end with a period; the text ends with a
    complete sentence.  Near the end, word lengths are chosen so the final
    sentence lands exactly on ``length``.
    """
    out: list[str] = []
    used = 0
    sentence_start = True
    words_left = rng.randint(6, 16)
    # Below this many remaining characters we steer word lengths to finish exactly.
    finish_zone = 2 * _MAX_WORD + 3
    while True:
        remaining = length - used
        sep = "" if used == 0 else " "
        if remaining > finish_zone:
            word = _cased(rng.choice(_ALL_WORDS), sentence_start)
            words_left -= 1
            end = words_left <= 0
            piece = sep + word + ("." if end else "")
            sentence_start = end
            if end:
                words_left = rng.randint(6, 16)
        else:
            need = remaining - len(sep) - 1  # final word + "."
            if 1 <= need <= _MAX_WORD:
                piece = sep + _cased(rng.choice(_WORDS_BY_LEN[need]), sentence_start) + "."
                out.append(piece)
                break
            # Pick a word that leaves room for exactly one more word + ".".
            lo = max(1, remaining - len(sep) - 3 - _MAX_WORD)
            hi = min(_MAX_WORD, remaining - len(sep) - 4)
            n = rng.randint(lo, hi)
            piece = sep + _cased(rng.choice(_WORDS_BY_LEN[n]), sentence_start)
            sentence_start = False
        out.append(piece)
        used += len(piece)
    text = "".join(out)
    assert len(text) == length, (len(text), length)
    return text


def workload(steps: int, seed: int = 7) -> Iterator[Step]:
    """Yield ``steps`` deterministic workload steps numbered from 1 (see module doc)."""
    rng = random.Random(seed)
    for n in range(1, steps + 1):
        content = english_text(rng)
        facts = {
            "city": rng.choice(CITIES),
            "budget": rng.randrange(500, 5_000, 50),
            "nights": rng.randint(1, 14),
            "updated_at_step": n,
        }
        yield Step(step=n, message={"role": "assistant", "content": content}, facts=facts)


def empty_state() -> dict[str, Any]:
    """The agent state before step 1."""
    return {"messages": [], "step": 0, "facts": {}}


def fold(changes: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Rebuild the full state from step changes in order (append messages, replace the rest)."""
    state = empty_state()
    messages: list[dict[str, Any]] = state["messages"]
    for change in changes:
        messages.append(change["message"])
        state["step"] = change["step"]
        state["facts"] = change["facts"]
    return state


# --------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------


@dataclass
class Result:
    """One contender's figures at one workload size."""

    name: str
    steps: int
    cps: float
    bytes_per_cp: float
    latest_read_ms: float
    state_at_ms: float
    history_ms: float
    extra: dict[str, Any] = field(default_factory=dict)


def _fmt_bytes(n: float) -> str:
    if n >= 1024 * 1024:
        return f"{n / (1024 * 1024):.2f} MiB"
    if n >= 1024:
        return f"{n / 1024:.1f} KiB"
    return f"{n:.0f} B"


def format_table(results: Sequence[Result]) -> str:
    """Render results as a fixed-width table followed by each contender's extras."""
    headers = (
        "contender",
        "steps",
        "cp/s",
        "bytes/cp",
        "latest ms",
        "state-at ms",
        "history ms",
    )
    rows = [
        (
            r.name,
            str(r.steps),
            f"{r.cps:,.1f}",
            _fmt_bytes(r.bytes_per_cp),
            f"{r.latest_read_ms:,.2f}",
            f"{r.state_at_ms:,.2f}",
            f"{r.history_ms:,.2f}",
        )
        for r in results
    ]
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(headers)]
    lines = [
        "  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(headers, widths, strict=True))),
        "  ".join("-" * w for w in widths),
    ]
    for row in rows:
        lines.append(
            "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
        )
    for r in results:
        if r.extra:
            lines.append(f"  {r.name}: " + ", ".join(f"{k}={v}" for k, v in r.extra.items()))
    return "\n".join(lines)


def print_table(results: Sequence[Result], title: str | None = None) -> None:
    """Print :func:`format_table` with an optional title line."""
    if title:
        print(title)
    print(format_table(results))


# --------------------------------------------------------------------------
# Database plumbing
# --------------------------------------------------------------------------


def server_url() -> str:
    """The configured PostgreSQL server URL (any database on it)."""
    return os.environ.get("BENCH_DATABASE_URL") or os.environ.get("DATABASE_URL") or DEFAULT_SERVER_URL


def bench_conninfo(dbname: str = BENCH_DB_NAME) -> str:
    """Connection string for ``dbname`` on the configured server."""
    return make_conninfo(server_url(), dbname=dbname)


def bench_conninfo_dict() -> dict[str, Any]:
    """Connection parameters for the bench database (host, port, user, dbname, ...)."""
    return conninfo_to_dict(bench_conninfo())


def ensure_bench_database() -> str:
    """Create the bench database (``BENCH_DB_NAME``) if missing and return its connection string."""
    params = conninfo_to_dict(server_url())
    maintenance = params.get("dbname") or "postgres"
    if maintenance == BENCH_DB_NAME:
        maintenance = "postgres"
    with psycopg.connect(make_conninfo(server_url(), dbname=maintenance), autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (BENCH_DB_NAME,)).fetchone()
        if exists is None:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(BENCH_DB_NAME)))
    return bench_conninfo()


def settle() -> None:
    """Flush dirty pages before a run, so no contender pays for the writes of the one before
    (a 1,000-step LangGraph or full-state run leaves hundreds of MiB of WAL and dirty pages)."""
    try:
        with psycopg.connect(bench_conninfo(), autocommit=True) as conn:
            conn.execute("CHECKPOINT")
    except psycopg.Error as exc:  # CHECKPOINT needs a superuser or pg_checkpoint
        print(f"[note] could not CHECKPOINT before a run: {exc}", flush=True)


def relation_bytes(conn: psycopg.Connection[Any], tables: Sequence[str]) -> dict[str, int]:
    """``pg_total_relation_size`` (heap + TOAST + indexes) of each table."""
    sizes: dict[str, int] = {}
    for table in tables:
        row = conn.execute("SELECT pg_total_relation_size(%s::regclass)", (table,)).fetchone()
        assert row is not None
        value = row["pg_total_relation_size"] if isinstance(row, dict) else row[0]
        sizes[table] = int(value)
    return sizes


# --------------------------------------------------------------------------
# Timing helpers
# --------------------------------------------------------------------------


def time_ms(fn: Callable[[], object]) -> float:
    """Wall-clock milliseconds of one call."""
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1000


def median_ms(fn: Callable[[], object], repeats: int = READ_REPEATS) -> float:
    """Median wall-clock milliseconds over ``repeats`` calls."""
    return statistics.median(time_ms(fn) for _ in range(repeats))


def window_cps(t0: float, stamps: Sequence[float]) -> dict[str, float]:
    """Steps/s over the first and the last 10% of the steps (``stamps`` = end time of each step)."""
    n = max(1, len(stamps) // 10)
    first = n / (stamps[n - 1] - t0)
    before_last = stamps[-n - 1] if len(stamps) > n else t0
    last = n / (stamps[-1] - before_last)
    return {"cps_first_10pct": round(first, 1), "cps_last_10pct": round(last, 1)}


def server_settings(conninfo: str) -> dict[str, str]:
    """Durability/size-relevant server settings, printed with the results."""
    names = ["server_version", "fsync", "synchronous_commit", "shared_buffers", "default_toast_compression"]
    with psycopg.connect(conninfo) as conn:
        rows = conn.execute(
            "SELECT name, current_setting(name) FROM pg_settings WHERE name = ANY(%s) ORDER BY name", (names,)
        ).fetchall()
    return {name: value for name, value in rows}


def budgeted_median_ms(
    fn: Callable[[], object],
    max_repeats: int = HISTORY_MAX_REPEATS,
    budget_s: float = HISTORY_TIME_BUDGET_S,
) -> tuple[float, int]:
    """Median over up to ``max_repeats`` calls, stopping early once ``budget_s`` is spent (>= 1 call)."""
    samples: list[float] = []
    start = time.perf_counter()
    while len(samples) < max_repeats:
        samples.append(time_ms(fn))
        if time.perf_counter() - start > budget_s:
            break
    return statistics.median(samples), len(samples)


# --------------------------------------------------------------------------
# Contender: floor (raw psycopg, one committed INSERT per step)
# --------------------------------------------------------------------------

FLOOR_DDL = """
CREATE TABLE bench_floor (
    id bigserial PRIMARY KEY,
    thread_id text,
    step int,
    change jsonb,
    created_at timestamptz DEFAULT now()
)
"""


def run_floor(steps: int, seed: int = 7) -> Result:
    """Run the raw-psycopg floor contender over ``steps`` workload steps."""
    conninfo = ensure_bench_database()
    work = list(workload(steps, seed))
    rng = random.Random(seed * 1_000 + steps)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS bench_floor")
        conn.execute(FLOOR_DDL)

        insert = "INSERT INTO bench_floor (thread_id, step, change) VALUES (%s, %s, %s)"
        gc.collect()
        stamps: list[float] = []
        t0 = time.perf_counter()
        for s in work:
            # autocommit: each execute is its own committed transaction, one round trip.
            conn.execute(insert, (THREAD_ID, s.step, Jsonb(s.change)))
            stamps.append(time.perf_counter())
        elapsed = stamps[-1] - t0

        sizes = relation_bytes(conn, ["bench_floor"])

        def read_state(upto: int | None = None) -> dict[str, Any]:
            if upto is None:
                rows = conn.execute(
                    "SELECT change FROM bench_floor WHERE thread_id = %s ORDER BY id",
                    (THREAD_ID,),
                ).fetchall()
            else:
                rows = conn.execute(
                    "SELECT change FROM bench_floor WHERE thread_id = %s AND step <= %s ORDER BY id",
                    (THREAD_ID, upto),
                ).fetchall()
            return fold([r[0] for r in rows])

        latest = read_state()
        assert latest["step"] == steps and len(latest["messages"]) == steps
        assert latest["messages"][-1] == work[-1].message and latest["facts"] == work[-1].facts
        latest_ms = median_ms(read_state)

        targets = [rng.randint(1, max(1, steps - 1)) for _ in range(READ_REPEATS)]
        samples = []
        for k in targets:
            t = time.perf_counter()
            st = read_state(k)
            samples.append((time.perf_counter() - t) * 1000)
            assert st["step"] == k and len(st["messages"]) == k and st["facts"] == work[k - 1].facts
        state_at_ms = statistics.median(samples)

        def history() -> list[tuple[Any, ...]]:
            return conn.execute(
                "SELECT id, step, created_at FROM bench_floor WHERE thread_id = %s ORDER BY id",
                (THREAD_ID,),
            ).fetchall()

        assert len(history()) == steps
        history_ms, history_n = budgeted_median_ms(history)

    return Result(
        name="floor",
        steps=steps,
        cps=steps / elapsed,
        bytes_per_cp=sum(sizes.values()) / steps,
        latest_read_ms=latest_ms,
        state_at_ms=state_at_ms,
        history_ms=history_ms,
        extra={"rows": steps, **window_cps(t0, stamps), "history_repeats": history_n},
    )


# --------------------------------------------------------------------------
# Contender: LangGraph + PostgresSaver
# --------------------------------------------------------------------------

LANGGRAPH_TABLES: tuple[str, ...] = (
    "checkpoints",
    "checkpoint_blobs",
    "checkpoint_writes",
    "checkpoint_migrations",
)


@contextmanager
def quiet_langchain_warnings() -> Iterator[None]:
    """Silence LangChain's import-time deprecation chatter (not part of the measurement).

    ``import langchain_core`` installs its own "default" filter for its pending
    deprecation warnings, which would override an outer "ignore"; so import it
    first, then ignore.  The previous filters are restored on exit.
    """
    with warnings.catch_warnings():
        import langchain_core  # noqa: F401

        warnings.simplefilter("ignore")
        yield


class AgentState(TypedDict):
    """LangGraph state: append-only messages, last-value step and facts."""

    messages: Annotated[list[dict[str, Any]], operator.add]
    step: int
    facts: dict[str, Any]


def build_graph(work: Sequence[Step], checkpointer: Any) -> Any:
    """Compile a one-node graph; each invoke advances exactly one workload step.

    The node reads the current ``step`` from the checkpointed state (0 on a new
    thread) and returns the *next* workload step's update, so the graph is a
    pure function of its state and ``graph.invoke({}, config)`` performs one
    step.  The empty input adds nothing to the state.
    """
    with quiet_langchain_warnings():
        from langgraph.graph import END, START, StateGraph

    def advance(state: AgentState) -> dict[str, Any]:
        nxt = work[state.get("step", 0)]
        return {"messages": [nxt.message], "step": nxt.step, "facts": nxt.facts}

    builder = StateGraph(AgentState)
    builder.add_node("advance", advance)
    builder.add_edge(START, "advance")
    builder.add_edge("advance", END)
    return builder.compile(checkpointer=checkpointer)


@contextmanager
def fresh_postgres_saver() -> Iterator[tuple[psycopg.Connection[Any], Any]]:
    """A PostgresSaver on freshly created tables, on a connection set up as its documentation requires."""
    with quiet_langchain_warnings():
        from langgraph.checkpoint.postgres import PostgresSaver

    conninfo = ensure_bench_database()
    with psycopg.connect(conninfo, autocommit=True) as admin:
        for table in LANGGRAPH_TABLES:
            admin.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(table)))
    with psycopg.connect(conninfo, autocommit=True, prepare_threshold=0, row_factory=dict_row) as conn:
        saver = PostgresSaver(conn)
        saver.setup()
        yield conn, saver


def run_langgraph(steps: int, seed: int = 7) -> Result:
    """Run the LangGraph ``PostgresSaver`` contender over ``steps`` workload steps.

    The saver gets a psycopg ``Connection`` opened with ``autocommit=True,
    prepare_threshold=0, row_factory=dict_row`` as its documentation requires,
    and LangGraph's default durability (``"async"``: checkpoints are written by
    a background thread, but ``invoke`` returns only after they are committed).
    """
    work = list(workload(steps, seed))
    rng = random.Random(seed * 1_000 + steps)
    config: RunnableConfig = {"configurable": {"thread_id": THREAD_ID}}

    with fresh_postgres_saver() as (conn, saver):
        graph = build_graph(work, saver)

        gc.collect()
        stamps: list[float] = []
        t0 = time.perf_counter()
        for _ in work:
            graph.invoke({}, config=config)
            stamps.append(time.perf_counter())
        elapsed = stamps[-1] - t0

        sizes = relation_bytes(conn, LANGGRAPH_TABLES)
        # Raw vs stored (TOAST-compressed) size of the channel blobs, per channel.
        blob_rows = conn.execute(
            "SELECT channel, sum(octet_length(blob)) AS raw, sum(pg_column_size(blob)) AS stored"
            " FROM checkpoint_blobs GROUP BY channel ORDER BY channel"
        ).fetchall()
        blob_mib = {r["channel"]: f"{int(r['raw']) / 2**20:.1f}->{int(r['stored']) / 2**20:.1f} MiB" for r in blob_rows}
        counts: dict[str, int] = {}
        for table in ("checkpoints", "checkpoint_blobs", "checkpoint_writes"):
            row = conn.execute(sql.SQL("SELECT count(*) AS n FROM {}").format(sql.Identifier(table))).fetchone()
            assert row is not None
            counts[table] = int(row["n"])

        latest = graph.get_state(config)
        assert latest.values["step"] == steps and len(latest.values["messages"]) == steps
        assert latest.values["messages"][-1] == work[-1].message and latest.values["facts"] == work[-1].facts
        latest_ms = median_ms(lambda: graph.get_state(config))

        # Full history through LangGraph's public API.  The first (timed) listing
        # also supplies the checkpoint configs for the state-at reads.
        t = time.perf_counter()
        snapshots = list(graph.get_state_history(config))
        history_samples = [(time.perf_counter() - t) * 1000]
        snapshot_configs = [snap.config for snap in snapshots]
        assert len(snapshot_configs) == counts["checkpoints"]
        del snapshots
        gc.collect()
        while len(history_samples) < HISTORY_MAX_REPEATS and sum(history_samples) < HISTORY_TIME_BUDGET_S * 1000:
            history_samples.append(time_ms(lambda: list(graph.get_state_history(config))))
            gc.collect()
        history_ms = statistics.median(history_samples)

        # State at a random earlier checkpoint (any of LangGraph's checkpoint rows
        # except the newest), through graph.get_state(<that checkpoint's config>).
        earlier = snapshot_configs[1:]  # newest first
        picks = [rng.choice(earlier) for _ in range(READ_REPEATS)]
        samples = []
        for cfg in picks:
            t = time.perf_counter()
            snap = graph.get_state(cfg)
            samples.append((time.perf_counter() - t) * 1000)
            values = snap.values
            assert len(values.get("messages", [])) == values.get("step", 0)
            if values.get("step"):
                assert values["facts"] == work[values["step"] - 1].facts
        state_at_ms = statistics.median(samples)

        # The same history straight from the saver (no StateSnapshot building),
        # to show where the time goes.
        saver_list_ms = time_ms(lambda: list(saver.list(config)))

    total_bytes = sum(sizes.values())
    return Result(
        name="langgraph",
        steps=steps,
        cps=steps / elapsed,
        bytes_per_cp=total_bytes / steps,
        latest_read_ms=latest_ms,
        state_at_ms=state_at_ms,
        history_ms=history_ms,
        extra={
            "history_via": "list(graph.get_state_history(config))",
            "history_repeats": len(history_samples),
            "saver_list_ms": round(saver_list_ms, 2),
            **window_cps(t0, stamps),
            "checkpoint_rows": counts["checkpoints"],
            "checkpoint_rows_per_step": round(counts["checkpoints"] / steps, 2),
            "bytes_per_checkpoint_row": round(total_bytes / counts["checkpoints"]),
            "blob_rows": counts["checkpoint_blobs"],
            "write_rows": counts["checkpoint_writes"],
            "table_bytes": sizes,
            "blob_raw->stored": blob_mib,
        },
    )
