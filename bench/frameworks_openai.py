"""The OpenAI Agents SDK half of bench/frameworks.py: QuicksaveSession against the SDK's own
SQLAlchemySession on the same PostgreSQL.

Usage (from the repository root)::

    .venv/bin/python bench/frameworks_openai.py            # 1,000 turns
    .venv/bin/python bench/frameworks_openai.py --turns 300

The same `Runner.run` and `Agent`, on the SDK's scripted model (`agents.testing.ScriptedModel`,
no network, tracing off), play `--turns` turns on each session: a short user message answered by
one 1,000-character English message (bench.peers.english_text). Each turn the SDK reads the 20
latest items (`SessionSettings(limit=20)`, the same for both) and adds the user message and the
answer (two `add_items`). Both sessions live in one database of one PostgreSQL server,
`quicksave_bench_frameworks` (the one bench/frameworks.py's other half uses), with the peer on
`postgresql+asyncpg` as the SDK documents.

Measures: turns per second (wall clock over all turns); bytes per turn, the bytes each side's
tables grew by from the end of the first turn to the end of the run, over the turns after the
first (`pg_total_relation_size`, heap + TOAST + indexes: Quicksave's bench.quicksave_runs.TABLES,
truncated before; the SDK's agent_sessions and agent_messages, dropped before), read the same way
for both outside the clock. The first turn is where each side makes its conversation (the SDK's
session row, Quicksave's thread, branch, key and first checkpoint) and each table's first pages
(a heap page, an index's metapage and root: 8 to 16 KiB a table whatever it holds), fixed costs
that a deployment pays once per table or per conversation and that would otherwise be counted as
if every turn paid a share of them: Quicksave's seven tables against the SDK's two. Pages a table
adds later (free-space and visibility maps, TOAST and its index, the thread row's dead versions,
which depend on the run's length and the server's other sessions: some 0 to 250 bytes a turn
here) count for both. A `[bytes]` line per table gives its heap, TOAST and indexes per turn so
counted, and its whole size per turn (first turn included) beside it, and a last `[bytes] whole`
line both sides' whole sizes per turn, what this bench reported before 2026-11-26 (evening).
And the median latest-items read, `get_items(limit=10)` at the end, the two sessions' calls
taking turns so that load from elsewhere on the machine falls on both alike. `run_openai(turns)`
returns the `openai_*` keys of the issue; the very last line printed here is that JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg

from bench.frameworks import DB_NAME, conninfo, settle, setup_django, table_bytes
from bench.peers import english_text, server_url
from bench.quicksave_runs import TABLES

WINDOW = 20
RECENT = 10
READ_REPEATS = 41
PEER_TABLES = ("agent_messages", "agent_sessions")
# Per table: heap (with its free-space and visibility maps), TOAST (with its index), indexes.
Parts = dict[str, tuple[int, int, int]]


def scripted_agent(texts: Sequence[str]) -> Any:
    """An Agent whose model answers "turn n" with texts[n]."""
    from agents import Agent
    from agents.testing import ModelCall, ModelStep, ScriptedModel, assistant_message

    def respond(call: ModelCall) -> Any:
        last = call.input[-1] if isinstance(call.input, list) and call.input else {}
        turn = int(str(last.get("content", "turn 0")).split()[-1])
        return [assistant_message(texts[turn], item_id=f"msg-{turn}")]

    model = ScriptedModel([ModelStep.respond(respond) for _ in texts])
    return Agent(name="bench", instructions="Answer.", model=model)


async def play(session: Any, texts: Sequence[str], tables: Sequence[str]) -> tuple[float, Parts]:
    """Play one turn per text through `Runner.run` on `session`; returns the seconds taken and the
    parts of `tables` after the first turn (read outside the clock)."""
    from agents import RunConfig, Runner

    agent, config = scripted_agent(texts), RunConfig(tracing_disabled=True)
    seconds = 0.0
    first: Parts = {}
    for turns in (range(1), range(1, len(texts))):
        started = time.perf_counter()
        for turn in turns:
            await Runner.run(agent, f"turn {turn}", session=session, run_config=config)
        seconds += time.perf_counter() - started
        first = first or table_parts(tables)
    return seconds, first


async def check(session: Any, turns: int) -> None:
    """Both sessions hold the whole conversation, and the latest-items read is its end."""
    everything = await session.get_items(limit=4 * turns)  # past the settings window of 20
    assert len(everything) == 2 * turns, len(everything)
    assert await session.get_items(limit=RECENT) == everything[-RECENT:]


def table_parts(tables: Sequence[str]) -> Parts:
    """Each table's heap (with its free-space and visibility maps), TOAST (with its index) and
    indexes, in bytes, which pg_total_relation_size adds up."""
    parts = {}
    with psycopg.connect(conninfo(), autocommit=True) as conn:
        for table in tables:
            row = conn.execute(
                "SELECT pg_total_relation_size(c.oid), coalesce(pg_total_relation_size(nullif(c.reltoastrelid, 0)), 0),"
                " pg_indexes_size(c.oid) FROM pg_class c WHERE c.oid = %s::regclass",
                (table,),
            ).fetchone()
            assert row is not None
            total, toast, indexes = row
            parts[table] = (total - toast - indexes, toast, indexes)
    return parts


def breakdown(name: str, first: Parts, turns: int) -> float:
    """Print each table's bytes per turn after the first turn (its heap, TOAST and indexes), and in
    brackets its whole size per turn (the first turn's bytes included); returns their sum."""
    total = 0.0
    for table, (heap, toast, indexes) in table_parts(list(first)).items():
        added = [(now - then) / (turns - 1) for now, then in zip((heap, toast, indexes), first[table], strict=True)]
        print(f"[bytes] {name} {table}: {sum(added):.0f}/turn (heap {added[0]:.0f}, TOAST {added[1]:.0f}, "
              f"indexes {added[2]:.0f}) [whole {(heap + toast + indexes) / turns:.0f}/turn]")  # fmt: skip
        total += sum(added)
    return total


def peer_url() -> str:
    parts = urlsplit(server_url())
    return urlunsplit(("postgresql+asyncpg", parts.netloc, f"/{DB_NAME}", "", ""))


def run_openai(turns: int, *, seed: int = 7) -> dict[str, float]:
    """Play `turns` turns on each session and read their ends; the `openai_*` figures (Django set up)."""
    from agents.extensions.memory.sqlalchemy_session import SQLAlchemySession
    from agents.memory import SessionSettings

    from checkpoints import storage
    from integrations.openai_agents.session import QuicksaveSession

    if turns < 2:
        raise ValueError("bytes are counted after the first turn: play at least two")
    rng = random.Random(seed)
    texts = [english_text(rng) for _ in range(turns)]
    settings = SessionSettings(limit=WINDOW)

    with psycopg.connect(conninfo(), autocommit=True) as conn:
        for table in PEER_TABLES:
            conn.execute(f"DROP TABLE IF EXISTS {table} CASCADE")
        conn.execute(f"TRUNCATE {', '.join(TABLES)}, checkpoints_toolresult, approvals_approvalrequest CASCADE")
    storage.clear_caches()

    async def go() -> dict[str, float]:
        peer = SQLAlchemySession.from_url("bench-peer", url=peer_url(), create_tables=True, session_settings=settings)
        await peer.get_items()  # creates its tables before the clock starts
        settle()
        peer_seconds, peer_first = await play(peer, texts, PEER_TABLES)
        await check(peer, turns)
        peer_whole = table_bytes(PEER_TABLES)
        peer_bytes = breakdown("SQLAlchemySession", peer_first, turns)

        settle()
        quicksave = QuicksaveSession("bench-quicksave", agent="bench-openai", session_settings=settings)
        seconds, first = await play(quicksave, texts, TABLES)
        await check(quicksave, turns)
        whole = table_bytes(TABLES)
        quicksave_bytes = breakdown("QuicksaveSession", first, turns)
        print(
            f"[bytes] whole: QuicksaveSession {whole / turns:.0f}/turn, SQLAlchemySession {peer_whole / turns:.0f}/turn"
        )

        # A reader that did not write (a dashboard, another worker): a new session object each.
        reader = QuicksaveSession("bench-quicksave", agent="bench-openai")
        times: dict[str, list[float]] = {"quicksave": [], "peer": []}
        for _ in range(READ_REPEATS):
            for name, session in (("quicksave", reader), ("peer", peer)):
                t0 = time.perf_counter()
                await session.get_items(limit=RECENT)
                times[name].append((time.perf_counter() - t0) * 1000)
        await peer.engine.dispose()
        return {
            "openai_quicksave_tps": round(turns / seconds, 1),
            "openai_sqlalchemy_tps": round(turns / peer_seconds, 1),
            "openai_quicksave_bytes": round(quicksave_bytes),
            "openai_sqlalchemy_bytes": round(peer_bytes),
            "openai_read_ms": round(statistics.median(times["quicksave"]), 3),
            "openai_peer_read_ms": round(statistics.median(times["peer"]), 3),
        }

    return asyncio.run(go())


def print_openai(result: dict[str, float]) -> None:
    """The table and the target lines of one `run_openai` result."""
    print(f"{'session':<20} {'turns/s':>9} {'bytes/turn':>11} {'latest-items read':>18}")
    print(f"{'QuicksaveSession':<20} {result['openai_quicksave_tps']:>9.1f} {result['openai_quicksave_bytes']:>11} "
          f"{result['openai_read_ms']:>16.2f}ms")  # fmt: skip
    print(f"{'SQLAlchemySession':<20} {result['openai_sqlalchemy_tps']:>9.1f} {result['openai_sqlalchemy_bytes']:>11} "
          f"{result['openai_peer_read_ms']:>16.2f}ms")  # fmt: skip
    targets = {
        "write rate >= SQLAlchemySession": result["openai_quicksave_tps"] >= result["openai_sqlalchemy_tps"],
        "bytes/turn <= SQLAlchemySession": result["openai_quicksave_bytes"] <= result["openai_sqlalchemy_bytes"],
        "latest-items read no slower": result["openai_read_ms"] <= result["openai_peer_read_ms"],
    }
    for name, met in targets.items():
        print(f"[target] {name}: {'met' if met else 'MISSED'}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=1000)
    args = parser.parse_args(argv)
    os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")
    setup_django()
    print(f"[server] {urlsplit(server_url()).netloc}; {args.turns} turns per session", flush=True)
    result = run_openai(args.turns)
    print_openai(result)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
