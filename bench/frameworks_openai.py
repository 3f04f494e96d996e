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

Measures: turns per second (wall clock over all turns); bytes per turn (`pg_total_relation_size`,
heap + TOAST + indexes, of each side's tables after the run: Quicksave's bench.quicksave_runs.TABLES,
truncated before; the SDK's agent_sessions and agent_messages, dropped before; Quicksave's thread
row, rewritten by every write, leaves dead versions whose pages depend on the run's length and
the server's other sessions, some 0 to 130 bytes a turn here); and the median
latest-items read, `get_items(limit=10)` at the end, the two sessions' calls taking turns so that
load from elsewhere on the machine falls on both alike. `run_openai(turns)` returns the
`openai_*` keys of the issue (after a `[bytes]` line per table: its heap, TOAST and indexes per
turn); the very last line printed here is that JSON object.
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


async def play(session: Any, texts: Sequence[str]) -> float:
    """Play one turn per text through `Runner.run` on `session`; returns the seconds taken."""
    from agents import RunConfig, Runner

    agent, config = scripted_agent(texts), RunConfig(tracing_disabled=True)
    started = time.perf_counter()
    for turn in range(len(texts)):
        await Runner.run(agent, f"turn {turn}", session=session, run_config=config)
    return time.perf_counter() - started


async def check(session: Any, turns: int) -> None:
    """Both sessions hold the whole conversation, and the latest-items read is its end."""
    everything = await session.get_items(limit=4 * turns)  # past the settings window of 20
    assert len(everything) == 2 * turns, len(everything)
    assert await session.get_items(limit=RECENT) == everything[-RECENT:]


def breakdown(name: str, tables: Sequence[str], turns: int) -> None:
    """Print each table's share of a side's bytes per turn: heap (with its free-space and visibility
    maps), TOAST (with its index) and indexes, which pg_total_relation_size adds up."""
    with psycopg.connect(conninfo(), autocommit=True) as conn:
        for table in tables:
            row = conn.execute(
                "SELECT pg_total_relation_size(c.oid), coalesce(pg_total_relation_size(nullif(c.reltoastrelid, 0)), 0),"
                " pg_indexes_size(c.oid) FROM pg_class c WHERE c.oid = %s::regclass",
                (table,),
            ).fetchone()
            assert row is not None
            total, toast, indexes = (value / turns for value in row)
            print(f"[bytes] {name} {table}: {total:.0f}/turn (heap {total - toast - indexes:.0f}, "
                  f"TOAST {toast:.0f}, indexes {indexes:.0f})")  # fmt: skip


def peer_url() -> str:
    parts = urlsplit(server_url())
    return urlunsplit(("postgresql+asyncpg", parts.netloc, f"/{DB_NAME}", "", ""))


def run_openai(turns: int, *, seed: int = 7) -> dict[str, float]:
    """Play `turns` turns on each session and read their ends; the `openai_*` figures (Django set up)."""
    from agents.extensions.memory.sqlalchemy_session import SQLAlchemySession
    from agents.memory import SessionSettings

    from checkpoints import storage
    from integrations.openai_agents.session import QuicksaveSession

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
        peer_seconds = await play(peer, texts)
        await check(peer, turns)
        peer_bytes = table_bytes(PEER_TABLES)
        breakdown("SQLAlchemySession", PEER_TABLES, turns)

        settle()
        quicksave = QuicksaveSession("bench-quicksave", agent="bench-openai", session_settings=settings)
        seconds = await play(quicksave, texts)
        await check(quicksave, turns)
        quicksave_bytes = table_bytes(TABLES)
        breakdown("QuicksaveSession", TABLES, turns)

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
            "openai_quicksave_bytes": round(quicksave_bytes / turns),
            "openai_sqlalchemy_bytes": round(peer_bytes / turns),
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
