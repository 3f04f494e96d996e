"""Long-term memory (issue 29): QuicksaveStore against LangGraph's own PostgresStore.

Usage (from the repository root, with the project's venv)::

    .venv/bin/python bench/memory.py                         # 10,000 items in 100 namespaces
    .venv/bin/python bench/memory.py --items 2000 --namespaces 20 --reads 200

One run, one PostgreSQL server, one database (the bench database on DATABASE_URL's server, see
bench.quicksave_runs; the embedded server when DATABASE_URL is unset): the same workload goes
through `integrations.langgraph.store.QuicksaveStore` and through
`langgraph.store.postgres.PostgresStore` (langgraph-checkpoint-postgres), in that database,
each store's tables emptied first.

Workload (deterministic from --seed): `--items` items spread evenly over `--namespaces`
namespaces `("users", "u<n>")`, keys `k<n>`, each value `{"text": <200 characters of English>,
"kind": one of five, "n": <n>}`.

- puts: every item put once, one `put` call each (the load), then a fifth of them put again
  with a new value (updates: Quicksave keeps the old version, PostgresStore overwrites it);
  puts per second over all of them.
- gets: `--reads` `get` calls of random existing items; the median latency.
- searches: `--reads` `search(namespace, filter={"kind": ...}, limit=10)` of random namespaces
  (a filtered listing, no query); the median latency.
  The two stores' gets, and their searches, take turns call by call, so load from elsewhere on
  the machine falls on both alike.
- vector search: where the server has pgvector (the embedded PostgreSQL ships it; Debian's
  PostgreSQL 15 does not, and then this part runs again in a child process on the embedded
  server), --items items put through stores with an index (`dims` 64, a deterministic
  embedding: character trigram hashes, normalised), then `--reads` searches with a `query`, top
  10, taking turns between the two stores; the medians.

Targets: Quicksave's puts and gets at least PostgresStore's rate, its searches no slower, while
it also keeps every version. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# Run as a script, bench/ heads sys.path and bench/langgraph.py would shadow the real package.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.peers import english_text  # noqa: E402

KINDS = ("fact", "preference", "instruction", "note", "contact")
DIMS = 64
AGENT = "bench-memory"


def items(count: int, namespaces: int, seed: int) -> list[tuple[tuple[str, ...], str, dict[str, Any]]]:
    rng = random.Random(seed)
    return [
        (("users", f"u{n % namespaces}"), f"k{n}", {"text": english_text(rng, 200), "kind": KINDS[n % 5], "n": n})
        for n in range(count)
    ]


def embed(texts: Sequence[str]) -> list[list[float]]:
    """A deterministic embedding: each character trigram adds to one of DIMS buckets, normalised."""
    vectors = []
    for text in texts:
        vector = [0.0] * DIMS
        lowered = text.lower()
        for i in range(len(lowered) - 2):
            bucket = int.from_bytes(hashlib.blake2b(lowered[i : i + 3].encode(), digest_size=2).digest(), "big")
            vector[bucket % DIMS] += 1.0
        norm = math.sqrt(sum(v * v for v in vector)) or 1.0
        vectors.append([v / norm for v in vector])
    return vectors


def setup_django() -> None:
    if os.environ.get("DATABASE_URL"):
        from bench.quicksave_runs import setup_django as on_bench_database

        on_bench_database()
        return
    import django  # the embedded PostgreSQL (quicksave.embedded), as `dev.py run` uses it

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "quicksave.settings")
    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def database_url() -> str:
    """The database Django uses, for PostgresStore: the same server and database."""
    from django.conf import settings

    return str(settings.DATABASE_URL)


def empty_tables() -> None:
    from django.db import connection

    from memory.models import Namespace

    with connection.cursor() as cursor:
        for table in ("store_vectors", "store", "vector_migrations", "store_migrations"):
            cursor.execute(f"DROP TABLE IF EXISTS {table} CASCADE")
    Namespace.objects.all().delete()


@contextmanager
def postgres_store(index: dict[str, Any] | None = None) -> Iterator[Any]:
    from langgraph.store.postgres import PostgresStore

    with PostgresStore.from_conn_string(database_url(), index=index) as store:  # type: ignore[arg-type]
        store.setup()
        yield store


def quicksave_store(index: dict[str, Any] | None = None) -> Any:
    from integrations.langgraph.store import QuicksaveStore

    store = QuicksaveStore(agent=AGENT, index=index)  # type: ignore[arg-type]
    store.setup()
    return store


def timed_puts(store: Any, work: Sequence[tuple[tuple[str, ...], str, dict[str, Any]]]) -> float:
    """Puts per second over `work`, one call each."""
    started = time.perf_counter()
    for namespace, key, value in work:
        store.put(namespace, key, value)
    return len(work) / (time.perf_counter() - started)


def alternating_ms(calls: Sequence[tuple[Callable[[], Any], Callable[[], Any]]]) -> tuple[float, float]:
    """Median ms of each side's calls, the two sides taking turns (which goes first alternating)."""
    first: list[float] = []
    second: list[float] = []
    for index, (one, two) in enumerate(calls):
        order = [(one, first), (two, second)] if index % 2 == 0 else [(two, second), (one, first)]
        for call, samples in order:
            started = time.perf_counter()
            call()
            samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(first), statistics.median(second)


def run_plain(args: argparse.Namespace) -> dict[str, Any]:
    work = items(args.items, args.namespaces, args.seed)
    rng = random.Random(args.seed + 1)
    updates = [
        (ns, key, {**value, "text": english_text(rng, 200)}) for ns, key, value in rng.sample(work, len(work) // 5)
    ]
    empty_tables()
    quicksave = quicksave_store()
    figures: dict[str, Any] = {}
    with postgres_store() as peer:
        # Loads take turns in slices, so neither gets all the machine's quiet minutes.
        qs_rates, pg_rates = [], []
        puts = work + updates
        for start in range(0, len(puts), 1000):
            chunk = puts[start : start + 1000]
            qs_rates.append((len(chunk), timed_puts(quicksave, chunk)))
            pg_rates.append((len(chunk), timed_puts(peer, chunk)))
        figures["qs_put_per_s"] = round(sum(n for n, _ in qs_rates) / sum(n / r for n, r in qs_rates), 1)
        figures["pg_store_put_per_s"] = round(sum(n for n, _ in pg_rates) / sum(n / r for n, r in pg_rates), 1)

        picks = [rng.choice(work) for _ in range(args.reads)]
        for namespace, key, _ in picks[:20]:  # warm both
            quicksave.get(namespace, key)
            peer.get(namespace, key)
        qs_get, pg_get = alternating_ms([
            (partial(quicksave.get, ns, key), partial(peer.get, ns, key))
            for ns, key, _ in picks
        ])  # fmt: skip
        searches = [(("users", f"u{rng.randrange(args.namespaces)}"), rng.choice(KINDS)) for _ in range(args.reads)]
        qs_found = quicksave.search(searches[0][0], filter={"kind": searches[0][1]}, limit=10)
        pg_found = peer.search(searches[0][0], filter={"kind": searches[0][1]}, limit=10)
        assert {i.key for i in qs_found} == {i.key for i in pg_found}, "the two stores disagree on a search"
        qs_search, pg_search = alternating_ms([
            (partial(quicksave.search, ns, filter={"kind": kind}, limit=10),
             partial(peer.search, ns, filter={"kind": kind}, limit=10))
            for ns, kind in searches
        ])  # fmt: skip
    figures.update(
        qs_get_ms=round(qs_get, 3), pg_store_get_ms=round(pg_get, 3),
        qs_search_ms=round(qs_search, 3), pg_store_search_ms=round(pg_search, 3),
    )  # fmt: skip
    figures["qs_versions_kept"] = versions_kept()
    return figures


def versions_kept() -> int:
    from memory.models import ItemVersion

    return int(ItemVersion.objects.count())


def run_vector(args: argparse.Namespace) -> dict[str, Any]:
    from memory import vectors

    if not vectors.available():
        return {}
    work = items(args.items, args.namespaces, args.seed)
    rng = random.Random(args.seed + 2)
    empty_tables()
    index = {"dims": DIMS, "embed": embed, "fields": ["text"]}
    quicksave = quicksave_store(index)
    with postgres_store(index) as peer:
        for namespace, key, value in work:
            quicksave.put(namespace, key, value)
            peer.put(namespace, key, value)
        queries = [english_text(rng, 40) for _ in range(args.reads)]
        qs_ms, pg_ms = alternating_ms([
            (partial(quicksave.search, ("users",), query=q, limit=10),
             partial(peer.search, ("users",), query=q, limit=10))
            for q in queries
        ])  # fmt: skip
    return {"qs_vector_search_ms": round(qs_ms, 3), "pg_store_vector_search_ms": round(pg_ms, 3)}


def vector_elsewhere(args: argparse.Namespace) -> dict[str, Any]:
    """The vector part in a child process on the embedded PostgreSQL (DATABASE_URL unset)."""
    env = {key: value for key, value in os.environ.items() if key != "DATABASE_URL"}
    command = [sys.executable, __file__, "--vector-only", "--items", str(args.items),
               "--namespaces", str(args.namespaces), "--reads", str(args.reads), "--seed", str(args.seed)]  # fmt: skip
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        print(done.stdout[-2000:], done.stderr[-4000:], file=sys.stderr)
        raise SystemExit("bench/memory.py: the vector search on the embedded PostgreSQL failed")
    return dict(json.loads(lines[-1]))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=10_000)
    parser.add_argument("--namespaces", type=int, default=100)
    parser.add_argument("--reads", type=int, default=500, help="gets, searches and vector searches timed (each)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--vector-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.items < args.namespaces or args.namespaces < 1 or args.reads < 1:
        parser.error("--items must be at least --namespaces, which must be at least 1; --reads at least 1")
    os.environ.setdefault("QUICKSAVE_LOG_LEVEL", "WARNING")
    setup_django()
    if args.vector_only:
        print(json.dumps(run_vector(args)))
        return 0
    from memory import vectors

    print(f"[server] {database_url().split('@')[-1]}; {args.items:,} items in {args.namespaces} namespaces", flush=True)
    figures = run_plain(args)
    figures.update(run_vector(args) if vectors.available() else vector_elsewhere(args))
    print(f"{'':<24}{'QuicksaveStore':>16}{'PostgresStore':>16}")
    print(f"{'puts/s':<24}{figures['qs_put_per_s']:>16,.1f}{figures['pg_store_put_per_s']:>16,.1f}")
    for name, qs, pg in [("get ms (median)", "qs_get_ms", "pg_store_get_ms"),
                         ("search ms (median)", "qs_search_ms", "pg_store_search_ms"),
                         ("vector search ms", "qs_vector_search_ms", "pg_store_vector_search_ms")]:  # fmt: skip
        if qs in figures:
            print(f"{name:<24}{figures[qs]:>16.3f}{figures[pg]:>16.3f}")
    print(f"versions kept by Quicksave: {figures['qs_versions_kept']:,} (PostgresStore keeps the last value only)")
    targets = {
        "puts at least PostgresStore's rate": figures["qs_put_per_s"] >= figures["pg_store_put_per_s"],
        "gets at least PostgresStore's rate": figures["qs_get_ms"] <= figures["pg_store_get_ms"],
        "searches no slower": figures["qs_search_ms"] <= figures["pg_store_search_ms"],
    }
    for name, met in targets.items():
        print(f"[target] {name}: {'met' if met else 'MISSED'}")
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
