"""Checkpoint-store benchmark: Quicksave vs LangGraph's PostgresSaver vs a raw-psycopg floor.

Usage (from /work/main)::

    .venv/bin/python bench/checkpoint_store.py                # sizes 100 and 1000
    .venv/bin/python bench/checkpoint_store.py --steps 1000
    .venv/bin/python bench/checkpoint_store.py --steps 100,1000 --steps 5000
    .venv/bin/python bench/checkpoint_store.py --steps 1000 --rounds 9

Every contender runs in this one process against one PostgreSQL server, inside
the dedicated database ``quicksave_bench`` (see :mod:`bench.peers` for the
workload, the measures and how the server is chosen).  For each size a table
is printed, followed by ratio lines; the very last line printed is one JSON
object with the figures for the largest size, for CI and the README.

The floor and Quicksave's runs take a second or two each, and this machine's speed swings
by a fifth from one minute to the next, so a single run of each can land in a fast minute
for one and a slow one for the other. They run ``--rounds`` times (5 by default), taking
turns, and each reports its median round, with every round's rate printed beside it.
LangGraph's run takes minutes and leaves hundreds of MiB of WAL behind: it runs once, last.

Quicksave's contenders (store by patch, store by full state, HTTP) live in
:mod:`bench.quicksave_runs`.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

# Run as a script, bench/ heads sys.path and bench/langgraph.py would shadow the real
# `langgraph` package: drop that folder and put the project root there instead.
_HERE = Path(__file__).resolve().parent
_ROOT = _HERE.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

from bench.peers import (  # noqa: E402
    Result,
    bench_conninfo,
    ensure_bench_database,
    print_table,
    run_floor,
    run_langgraph,
    server_settings,
    settle,
)
from bench.quicksave_runs import run_quicksave  # noqa: E402

DEFAULT_SIZES: tuple[int, ...] = (100, 1000)
DEFAULT_ROUNDS = 5


Runner = Callable[[int], list[Result]]

# LangGraph last: its run leaves hundreds of MiB of dirty pages and WAL behind,
# which would slow whoever ran next.
CONTENDERS: tuple[tuple[str, Runner], ...] = (
    ("floor", lambda steps: [run_floor(steps)]),
    ("quicksave", run_quicksave),
    ("langgraph", lambda steps: [run_langgraph(steps)]),
)
# The contenders that run once, after every round of the others.
RUN_ONCE = frozenset({"langgraph"})


def parse_sizes(values: Sequence[str] | None) -> list[int]:
    """Parse repeated and/or comma-separated ``--steps`` values into sorted unique sizes."""
    if not values:
        return list(DEFAULT_SIZES)
    sizes: set[int] = set()
    for value in values:
        for part in value.split(","):
            part = part.strip().replace("_", "")
            if not part:
                continue
            n = int(part)
            if n < 2:
                raise argparse.ArgumentTypeError(f"--steps must be >= 2, got {n}")
            sizes.add(n)
    return sorted(sizes)


def run_size(steps: int, only: set[str] | None = None, rounds: int = 1) -> list[Result]:
    """Run every contender (or those in `only`) at one size: those not in RUN_ONCE `rounds`
    times, taking turns, each giving its median round; then those in RUN_ONCE."""
    chosen = [(label, runner) for label, runner in CONTENDERS if not only or label in only]
    repeated = [(label, runner) for label, runner in chosen if label not in RUN_ONCE]
    runs: dict[str, list[Result]] = {}
    for _ in range(rounds):
        for _, runner in repeated:
            settle()
            for result in runner(steps):
                runs.setdefault(result.name, []).append(result)
    results = [median_round(rounds_run) for rounds_run in runs.values()]
    for label, runner in chosen:
        if label in RUN_ONCE:
            settle()
            results.extend(runner(steps))
    return results


def median_round(rounds: Sequence[Result]) -> Result:
    """The round with the median rate (the slower of the middle two for an even count), noting
    every round's rate in its extra figures as `cps_rounds`."""
    ranked = sorted(rounds, key=lambda result: result.cps)
    median = ranked[(len(ranked) - 1) // 2]
    if len(rounds) > 1:
        median.extra["cps_rounds"] = [round(result.cps, 1) for result in rounds]
    return median


def _compare(value: float, base: float, *, higher_is_better: bool, good: str, bad: str) -> str:
    """``"3.10x faster"`` / ``"2.00x slower"`` style comparison of ``value`` against ``base``."""
    if value <= 0 or base <= 0:
        return "n/a"
    factor = value / base if higher_is_better else base / value
    return f"{factor:.2f}x {good}" if factor >= 1 else f"{1 / factor:.2f}x {bad}"


def ratio_lines(results: Sequence[Result]) -> list[str]:
    """Human-readable comparisons of every contender against the floor and LangGraph."""
    by_name = {r.name: r for r in results}
    lines: list[str] = []
    for base_name in ("floor", "langgraph"):
        base = by_name.get(base_name)
        if base is None:
            continue
        for r in results:
            if r.name == base_name or (base_name == "langgraph" and r.name == "floor"):
                continue
            parts = [
                "writes " + _compare(r.cps, base.cps, higher_is_better=True, good="faster", bad="slower"),
                "storage "
                + _compare(
                    r.bytes_per_cp,
                    base.bytes_per_cp,
                    higher_is_better=False,
                    good="smaller",
                    bad="larger",
                ),
                "latest read "
                + _compare(
                    r.latest_read_ms,
                    base.latest_read_ms,
                    higher_is_better=False,
                    good="faster",
                    bad="slower",
                ),
                "state-at read "
                + _compare(
                    r.state_at_ms,
                    base.state_at_ms,
                    higher_is_better=False,
                    good="faster",
                    bad="slower",
                ),
                "history "
                + _compare(
                    r.history_ms,
                    base.history_ms,
                    higher_is_better=False,
                    good="faster",
                    bad="slower",
                ),
            ]
            lines.append(f"  {r.name} vs {base_name}: " + ", ".join(parts))
    plain, sealed = by_name.get("quicksave"), by_name.get("quicksave_encrypted")
    if plain and sealed:
        lines.append(
            f"  encryption at rest: {sealed.cps:.0f} vs {plain.cps:.0f} checkpoints/s "
            f"({sealed.cps / plain.cps:.0%} of the unencrypted rate; target >= 70%), "
            f"{sealed.bytes_per_cp:.0f} vs {plain.bytes_per_cp:.0f} bytes per checkpoint"
        )
    return lines


def _key(name: str) -> str:
    return re.sub(r"[^0-9a-zA-Z]+", "_", name).strip("_").lower()


def summary(
    steps: int, results: Sequence[Result], smallest: Sequence[Result] = (), *, rounds: int = 1
) -> dict[str, Any]:
    """The final JSON object: figures of every contender at the largest size (the median round
    of each repeated one)."""
    out: dict[str, Any] = {"steps": steps, "rounds": rounds}
    by_name = {r.name: r for r in results}
    qs = by_name.get("quicksave")
    http = by_name.get("quicksave_http")
    out["latest_read_ms"] = round(qs.latest_read_ms, 3) if qs else None
    # The first, truly cold read (it replays, then saves the materialised head the median reads).
    out["latest_read_first_ms"] = qs.extra.get("latest_read_first_ms") if qs else None
    out["state_at_ms"] = round(qs.state_at_ms, 3) if qs else None
    out["http_cps"] = round(http.cps, 1) if http else None
    out["http_p99_ms"] = http.extra.get("p99_ms") if http else None
    sealed = by_name.get("quicksave_encrypted")
    out["encrypted_over_plain_cps"] = round(sealed.cps / qs.cps, 3) if qs and sealed else None
    small = {r.name: r for r in smallest}.get("quicksave")
    key = f"rate_{steps}_over_{small.steps}" if small else "rate_1000_over_100"
    out[key] = round(qs.cps / small.cps, 3) if qs and small and small.steps != steps else None
    # Room for the Quicksave keys: present (null) even when the hook is not wired.
    for name in ("langgraph", "floor", "quicksave"):
        out[f"{name}_cps"] = None
        out[f"{name}_bytes_per_cp"] = None
    for r in results:
        k = _key(r.name)
        out[f"{k}_cps"] = _figure(r.cps, 1)
        out[f"{k}_bytes_per_cp"] = _figure(r.bytes_per_cp, 1)
        out[f"{k}_latest_read_ms"] = _figure(r.latest_read_ms, 3)
        out[f"{k}_state_at_ms"] = _figure(r.state_at_ms, 3)
        out[f"{k}_history_ms"] = _figure(r.history_ms, 3)
        if "cps_rounds" in r.extra:
            out[f"{k}_cps_rounds"] = r.extra["cps_rounds"]
    return out


def _figure(value: float, digits: int) -> float | None:
    """A rounded figure, or None (JSON null) for one not measured (NaN is not JSON)."""
    return round(value, digits) if math.isfinite(value) else None


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--steps",
        action="append",
        metavar="N[,N...]",
        help="workload size(s); repeatable or comma-separated (default: 100 and 1000)",
    )
    parser.add_argument(
        "--only",
        action="append",
        choices=[label for label, _ in CONTENDERS],
        help="run only these contenders (repeatable); default: all",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=DEFAULT_ROUNDS,
        metavar="N",
        help=f"runs of the floor and of Quicksave's contenders, taking turns; each reports its median "
        f"round (default: {DEFAULT_ROUNDS}; LangGraph runs once)",
    )
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    try:
        sizes = parse_sizes(args.steps)
    except (ValueError, argparse.ArgumentTypeError) as exc:
        parser.error(str(exc))

    ensure_bench_database()
    shown = re.sub(r"password=\S+", "password=***", bench_conninfo())
    print(f"database: {shown}", flush=True)
    settings = server_settings(bench_conninfo())
    print("server: " + ", ".join(f"{k}={v}" for k, v in settings.items()), flush=True)

    all_results: dict[int, list[Result]] = {}
    for steps in sizes:
        print(f"\n== {steps} steps ==", flush=True)
        results = run_size(steps, set(args.only or []), args.rounds)
        all_results[steps] = results
        print_table(results)
        for line in ratio_lines(results):
            print(line)

    largest = max(sizes)
    figures = summary(largest, all_results[largest], all_results[min(sizes)], rounds=args.rounds)
    print(json.dumps(figures, allow_nan=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
