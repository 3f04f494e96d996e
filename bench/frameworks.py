"""Agent-framework sessions on Quicksave against each framework's own PostgreSQL storage.

Usage (from the repository root)::

    .venv/bin/python bench/frameworks.py                # 1,000 turns
    .venv/bin/python bench/frameworks.py --turns 300 --long-events 0

Two frameworks, one after the other; the OpenAI Agents SDK half (QuicksaveSession against the
SDK's SQLAlchemySession) is bench/frameworks_openai.py's `run_openai`, described there (its bytes
are those added after the first turn, on both sides; this half's are whole tables).

Google ADK: the same ADK `Runner` and
`LlmAgent` on a scripted model (integrations.adk.demo.ScriptedLlm, no network) play `--turns`
turns, each a short user message answered by one 1,000-character English message
(bench.peers.english_text), once on `QuicksaveSessionService` and once on ADK's
`DatabaseSessionService` (`postgresql+asyncpg`), both in one database of one PostgreSQL server
(see bench.peers.server_url). The runner reads the session with the 20 newest events
before each turn (`RunConfig.get_session_config`), the same for both.

Measures
--------
* turns per second: wall clock over all turns (two appended events each);
* bytes per turn: `pg_total_relation_size` (heap + TOAST + indexes) of the service's tables after
  the run over the turns, in a database of the benchmark's own, `quicksave_bench_frameworks`
  (Quicksave: bench.quicksave_runs.TABLES, truncated before; ADK: its
  sessions, events, app_states, user_states and adk_internal_metadata tables, dropped before);
* read: median `get_session(num_recent_events=10)` at the end (the latest-items read), beside a
  full `get_session` for reference, the two services' calls taking turns so that load from
  elsewhere on the machine falls on both alike;
* with `--long-events N` (default 10,000): the same latest-items read on a Quicksave session of
  N events appended through `append_event`.

Targets, against DatabaseSessionService in the same run: at least its turns per second, no more
than its bytes per turn, a latest-items read no slower. The very last line is one JSON object.
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
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from bench.peers import english_text, relation_bytes, server_url
from bench.quicksave_runs import TABLES

# A database of its own: the other benchmarks empty quicksave_bench's tables when they start
# (BENCH_FRAMEWORKS_DATABASE_NAME names another, so that two trees' runs do not share one).
DB_NAME = os.environ.get("BENCH_FRAMEWORKS_DATABASE_NAME") or "quicksave_bench_frameworks"
APP = "bench-adk"
USER = "bench-user"
WINDOW = 20
RECENT = 10
READ_REPEATS = 21
ADK_TABLES = ("events", "sessions", "app_states", "user_states", "adk_internal_metadata")


@dataclass
class ServiceRun:
    name: str
    turns: int
    seconds: float
    total_bytes: int
    read_ms: float = 0.0
    full_read_ms: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def tps(self) -> float:
        return self.turns / self.seconds

    @property
    def bytes_per_turn(self) -> float:
        return self.total_bytes / self.turns


def conninfo() -> str:
    return make_conninfo(server_url(), dbname=DB_NAME)


def setup_django() -> None:
    """Create the benchmark's database if needed, point Django at it and migrate Quicksave's schema."""
    import os

    import django
    from django.core.management import call_command

    maintenance = conninfo_to_dict(server_url()).get("dbname") or "postgres"
    with psycopg.connect(make_conninfo(server_url(), dbname=maintenance), autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DB_NAME,)).fetchone() is None:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DB_NAME)))
    parts = urlsplit(server_url())
    os.environ["DATABASE_URL"] = urlunsplit((parts.scheme, parts.netloc, f"/{DB_NAME}", parts.query, ""))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "quicksave.settings")
    django.setup()
    call_command("migrate", verbosity=0)


def settle() -> None:
    """Flush dirty pages before a run, so neither service pays for the other's writes."""
    with psycopg.connect(conninfo(), autocommit=True) as conn:
        conn.execute("CHECKPOINT")


def table_bytes(tables: Sequence[str]) -> int:
    with psycopg.connect(conninfo(), autocommit=True) as conn:
        return sum(relation_bytes(conn, tables).values())


def reset_quicksave() -> None:
    from checkpoints import storage

    storage.clear_caches()
    with psycopg.connect(conninfo(), autocommit=True) as conn:
        conn.execute(f"TRUNCATE {', '.join(TABLES)}, checkpoints_toolresult, approvals_approvalrequest CASCADE")


def replies(turns: int, seed: int = 7) -> list[str]:
    rng = random.Random(seed)
    return [english_text(rng) for _ in range(turns)]


def scripted_agent(texts: Sequence[str]) -> Any:
    """An LlmAgent whose model answers turn n with texts[n] (n counted from the user messages it sees)."""
    from google.adk.agents.llm_agent import LlmAgent
    from google.adk.models.llm_request import LlmRequest
    from google.adk.models.llm_response import LlmResponse

    from integrations.adk.demo import ScriptedLlm, text

    def script(request: LlmRequest) -> LlmResponse:
        last = request.contents[-1].parts[0].text if request.contents and request.contents[-1].parts else ""
        return text(texts[int((last or "turn 0").split()[-1])])

    return LlmAgent(name="bench", model=ScriptedLlm(script=script), instruction="Answer.")


async def play(service: Any, turns: int, texts: Sequence[str]) -> tuple[str, float]:
    """Create a session and play `turns` turns through ADK's Runner; (session id, seconds)."""
    from google.adk.agents.run_config import RunConfig
    from google.adk.runners import Runner
    from google.adk.sessions.base_session_service import GetSessionConfig
    from google.genai import types

    session = await service.create_session(app_name=APP, user_id=USER)
    runner = Runner(app_name=APP, agent=scripted_agent(texts), session_service=service)
    config = RunConfig(get_session_config=GetSessionConfig(num_recent_events=WINDOW))
    started = time.perf_counter()
    for turn in range(turns):
        message = types.Content(role="user", parts=[types.Part(text=f"turn {turn}")])
        async for _ in runner.run_async(user_id=USER, session_id=session.id, new_message=message, run_config=config):
            pass
    return session.id, time.perf_counter() - started


async def median_read_ms(read: Callable[[], Awaitable[Any]], repeats: int = READ_REPEATS) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        await read()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


async def check(service: Any, session_id: str, turns: int) -> None:
    """Both reads see the whole conversation's end."""
    from google.adk.sessions.base_session_service import GetSessionConfig

    recent = GetSessionConfig(num_recent_events=RECENT)
    got = await service.get_session(app_name=APP, user_id=USER, session_id=session_id, config=recent)
    full = await service.get_session(app_name=APP, user_id=USER, session_id=session_id)
    assert len(got.events) == RECENT and len(full.events) == 2 * turns, (len(got.events), len(full.events))
    assert got.events == full.events[-RECENT:]


async def interleaved_reads(sessions: Sequence[tuple[ServiceRun, Any, str]]) -> None:
    """Time each service's latest-items and full reads, taking turns call by call, so that load
    from elsewhere on the machine falls on both alike; sets their read_ms and full_read_ms."""
    from google.adk.sessions.base_session_service import GetSessionConfig

    recent = GetSessionConfig(num_recent_events=RECENT)
    for config, repeats, field_name in ((recent, READ_REPEATS, "read_ms"), (None, 5, "full_read_ms")):
        times: dict[str, list[float]] = {run.name: [] for run, _, _ in sessions}
        for _ in range(repeats):
            for run, service, session_id in sessions:
                t0 = time.perf_counter()
                await service.get_session(app_name=APP, user_id=USER, session_id=session_id, config=config)
                times[run.name].append((time.perf_counter() - t0) * 1000)
        for run, _, _ in sessions:
            setattr(run, field_name, statistics.median(times[run.name]))


def run_quicksave(turns: int, texts: Sequence[str]) -> tuple[ServiceRun, str]:
    from integrations.adk.sessions import QuicksaveSessionService

    reset_quicksave()
    settle()
    service = QuicksaveSessionService()

    async def go() -> tuple[str, float]:
        session_id, seconds = await play(service, turns, texts)
        await check(service, session_id, turns)
        return session_id, seconds

    session_id, seconds = asyncio.run(go())
    return ServiceRun("QuicksaveSessionService", turns, seconds, table_bytes(TABLES)), session_id


async def long_session_read(service: Any, events: int, texts: Sequence[str]) -> float:
    """The latest-items read on a session of `events` events (appended directly, not through a Runner)."""
    from google.adk.events.event import Event
    from google.adk.sessions.base_session_service import GetSessionConfig
    from google.genai import types

    session = await service.create_session(app_name=APP, user_id=USER)
    for n in range(events):
        content = types.Content(role="model", parts=[types.Part(text=texts[n % len(texts)])])
        await service.append_event(session, Event(invocation_id=f"inv-{n}", author="bench", content=content))
    recent = GetSessionConfig(num_recent_events=RECENT)
    got = await service.get_session(app_name=APP, user_id=USER, session_id=session.id, config=recent)
    assert got is not None and got.events == session.events[-RECENT:]
    return await median_read_ms(lambda: service.get_session(app_name=APP, user_id=USER, session_id=session.id,
                                                            config=recent))  # fmt: skip


def adk_database_url() -> str:
    parts = urlsplit(server_url())
    return urlunsplit(("postgresql+asyncpg", parts.netloc, f"/{DB_NAME}", "", ""))


def run_adk_database(turns: int, texts: Sequence[str]) -> tuple[ServiceRun, str]:
    from google.adk.sessions.database_session_service import DatabaseSessionService

    with psycopg.connect(conninfo(), autocommit=True) as conn:
        for table in ADK_TABLES:
            conn.execute(f"DROP TABLE IF EXISTS {table} CASCADE")
    settle()

    async def go() -> tuple[str, float]:
        async with DatabaseSessionService(adk_database_url()) as service:
            session_id, seconds = await play(service, turns, texts)
            await check(service, session_id, turns)
        return session_id, seconds

    session_id, seconds = asyncio.run(go())
    return ServiceRun("DatabaseSessionService", turns, seconds, table_bytes(ADK_TABLES)), session_id


def run_reads(quicksave: tuple[ServiceRun, str], peer: tuple[ServiceRun, str]) -> None:
    from google.adk.sessions.database_session_service import DatabaseSessionService

    from integrations.adk.sessions import QuicksaveSessionService

    async def go() -> None:
        async with DatabaseSessionService(adk_database_url()) as database:
            await interleaved_reads([(quicksave[0], QuicksaveSessionService(), quicksave[1]),
                                     (peer[0], database, peer[1])])  # fmt: skip

    asyncio.run(go())


def table(runs: Sequence[ServiceRun]) -> str:
    lines = [f"{'service':<26} {'turns/s':>9} {'bytes/turn':>11} {'recent read':>12} {'full read':>10}"]
    for run in runs:
        lines.append(f"{run.name:<26} {run.tps:>9.1f} {run.bytes_per_turn:>11.0f} {run.read_ms:>10.2f}ms "
                     f"{run.full_read_ms:>8.1f}ms")  # fmt: skip
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=1000)
    parser.add_argument(
        "--long-events", type=int, default=10_000,
        help="events of the long Quicksave session whose latest-items read is timed (0: none)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    setup_django()
    print(f"[server] {urlsplit(server_url()).netloc}; {args.turns} turns per service", flush=True)
    texts = replies(args.turns)
    peer, peer_session = run_adk_database(args.turns, texts)
    quicksave, quicksave_session = run_quicksave(args.turns, texts)
    run_reads((quicksave, quicksave_session), (peer, peer_session))
    if args.long_events:
        from integrations.adk.sessions import QuicksaveSessionService

        quicksave.extra["long_read_ms"] = asyncio.run(
            long_session_read(QuicksaveSessionService(), args.long_events, texts)
        )
    print(table([quicksave, peer]))
    targets = {
        "write rate >= DatabaseSessionService": quicksave.tps >= peer.tps,
        "bytes/turn <= DatabaseSessionService": quicksave.bytes_per_turn <= peer.bytes_per_turn,
        "latest-items read no slower": quicksave.read_ms <= peer.read_ms,
    }
    for name, met in targets.items():
        print(f"[target] {name}: {'met' if met else 'MISSED'}")
    summary = {
        "adk_quicksave_tps": round(quicksave.tps, 1), "adk_database_tps": round(peer.tps, 1),
        "adk_quicksave_bytes": round(quicksave.bytes_per_turn), "adk_database_bytes": round(peer.bytes_per_turn),
        "adk_read_ms": round(quicksave.read_ms, 3), "adk_peer_read_ms": round(peer.read_ms, 3),
        "adk_full_read_ms": round(quicksave.full_read_ms, 2), "adk_peer_full_read_ms": round(peer.full_read_ms, 2),
    }  # fmt: skip
    if "long_read_ms" in quicksave.extra:
        summary[f"adk_read_ms_at_{args.long_events}_events"] = round(quicksave.extra["long_read_ms"], 3)

    from bench.frameworks_openai import print_openai, run_openai

    os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")
    openai = run_openai(args.turns)
    print_openai(openai)
    print(json.dumps({**openai, **summary}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
