"""What QuicksaveSaver's features cost in bench/langgraph.py's write rate, switched off one by one.

Usage (from /work/main)::

    .venv/bin/python bench/langgraph_ablation.py               # 1,000 steps, two rounds
    .venv/bin/python bench/langgraph_ablation.py --steps 300 --rounds 1

Issue 9 asks QuicksaveSaver for five times PostgresSaver's write rate on the graph of
``bench/langgraph.py``. This answers how far from that target the saver's features put it:
it runs the same workload with ``PostgresSaver`` and then with ``QuicksaveSaver``, first as
shipped and then with one more of these switched off at each stage (so the last stage has
them all off):

1. ``no encryption``: ``QUICKSAVE_ENCRYPT`` off, so no thread gets a data key and payloads
   and pending writes are stored without AES-GCM;
2. ``no compression``: no zstd on payloads (``codec.COMPRESS_FROM`` out of reach);
3. ``no live events``: no ``checkpoint.created`` event handed to the websocket publisher
   (still written to the Event table, in the same statement as the checkpoint);
4. ``no pending writes``: ``put_writes`` stores nothing (LangGraph's conformance suite fails);
5. ``no read``: ``get_tuple`` for the newest checkpoint answers from the checkpoint this
   saver just wrote, without asking the database (wrong as soon as anyone else writes the thread).

The stages are not options: each gives up something the product or LangGraph's contract
needs. Rounds take turns (PostgresSaver, then each stage) and each figure is the median
of its rounds; each line gives the stage's rate and its ratio to PostgresSaver's median.
The last line is a JSON object with every stage's median and ratio.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any
from unittest import mock

_HERE = Path(__file__).resolve().parent
_ROOT = _HERE.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

from bench.langgraph import CPS_TARGET, run_postgres_saver, run_quicksave_saver  # noqa: E402
from bench.peers import ensure_bench_database, quiet_langchain_warnings, settle  # noqa: E402
from bench.quicksave_runs import setup_django  # noqa: E402

DEFAULT_STEPS = 1_000
DEFAULT_ROUNDS = 2
Switch = Callable[[contextlib.ExitStack[Any]], None]


def _no_encryption(stack: contextlib.ExitStack[Any]) -> None:
    from django.test import override_settings

    stack.enter_context(override_settings(QUICKSAVE_ENCRYPT=False))


def _no_compression(stack: contextlib.ExitStack[Any]) -> None:
    from checkpoints.storage import codec

    stack.enter_context(mock.patch.object(codec, "COMPRESS_FROM", sys.maxsize))


def _no_live_events(stack: contextlib.ExitStack[Any]) -> None:
    from checkpoints import live

    stack.enter_context(mock.patch.object(live, "publish", lambda **_: None))


def _no_pending_writes(stack: contextlib.ExitStack[Any]) -> None:
    from integrations.langgraph.saver import QuicksaveSaver

    stack.enter_context(mock.patch.object(QuicksaveSaver, "put_writes", lambda *_, **__: None))


def _no_read(stack: contextlib.ExitStack[Any]) -> None:
    from integrations.langgraph import saver as langgraph_saver

    stack.enter_context(mock.patch.object(langgraph_saver, "QuicksaveSaver", _unread_saver()))


def _unread_saver() -> type[Any]:
    """QuicksaveSaver whose read of a thread's newest checkpoint is the one it last wrote there."""
    from langgraph.checkpoint.base import get_checkpoint_id

    from integrations.langgraph.saver import QuicksaveSaver

    class UnreadSaver(QuicksaveSaver):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self._written: dict[tuple[str, str], dict[str, Any]] = {}

        def put(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
            stored = super().put(config, checkpoint, metadata, new_versions)
            key = (str(config["configurable"]["thread_id"]), config["configurable"].get("checkpoint_ns", ""))
            self._written[key] = {
                "lg_id": checkpoint["id"], "lg_parent": config["configurable"].get("checkpoint_id"),
                "lg_metadata": self._encode(dict(metadata)),
            }  # fmt: skip
            return stored

        def get_tuple(self, config: Any) -> Any:
            key = (str(config["configurable"]["thread_id"]), config["configurable"].get("checkpoint_ns", ""))
            known, written = self._known.get(*key), self._written.get(key)
            if get_checkpoint_id(config) or known is None or written is None or written["lg_id"] != known.lg_id:
                return super().get_tuple(config)
            return self._tuple(*key, known.row, written, {}, reuse=known.lists())

    return UnreadSaver


STAGES: tuple[tuple[str, Switch | None], ...] = (
    ("as shipped", None),
    ("no encryption", _no_encryption),
    ("no compression", _no_compression),
    ("no live events", _no_live_events),
    ("no pending writes", _no_pending_writes),
    ("no read", _no_read),
)


@contextlib.contextmanager
def _switched_off(upto: int) -> Iterator[None]:
    """Every stage's switch up to and including stage `upto`."""
    with contextlib.ExitStack() as stack:
        for _, switch in STAGES[: upto + 1]:
            if switch is not None:
                switch(stack)
        yield


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS, help="workload steps (default: 1000)")
    parser.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS, help="rounds of every run (default: 2)")
    args = parser.parse_args(argv)
    if args.steps < 2 or args.rounds < 1:
        parser.error("--steps must be >= 2 and --rounds >= 1")
    ensure_bench_database()
    setup_django()
    with quiet_langchain_warnings():
        import integrations.langgraph.saver  # noqa: F401 (imported once, before any stage patches it)

    postgres: list[float] = []
    stages: list[list[float]] = [[] for _ in STAGES]
    for round_ in range(1, args.rounds + 1):
        settle()
        postgres.append(run_postgres_saver(args.steps).cps)
        print(f"round {round_}: PostgresSaver {postgres[-1]:,.1f} steps/s", flush=True)
        for index, (name, _) in enumerate(STAGES):
            settle()
            with _switched_off(index):
                stages[index].append(run_quicksave_saver(args.steps).cps)
            print(f"round {round_}: QuicksaveSaver, {name}: {stages[index][-1]:,.1f} steps/s", flush=True)

    base = statistics.median(postgres)
    print(f"\n== {args.steps} steps, median of {args.rounds} round(s); each stage also has the ones above it off ==")
    print(f"PostgresSaver: {base:,.1f} steps/s")
    figures: dict[str, dict[str, float]] = {}
    for (name, _), rates in zip(STAGES, stages, strict=True):
        rate = statistics.median(rates)
        figures[name] = {"cps": round(rate, 1), "ratio": round(rate / base, 3)}
        print(f"QuicksaveSaver, {name:<18} {rate:8,.1f} steps/s  {rate / base:5.2f}x PostgresSaver")
    last = figures[STAGES[-1][0]]["ratio"]
    verdict = "reaches" if last >= CPS_TARGET else "misses"
    print(f"with all of them off QuicksaveSaver {verdict} the {CPS_TARGET:g}x target ({last:.2f}x)")
    print(json.dumps({"steps": args.steps, "rounds": args.rounds, "postgres_saver_cps": round(base, 1), **figures}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
