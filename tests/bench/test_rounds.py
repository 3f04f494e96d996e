"""The store benchmark repeats its quick contenders in turns and reports each one's median round."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from bench import checkpoint_store
from bench.peers import Result


def _result(name: str, cps: float) -> Result:
    return Result(name=name, steps=10, cps=cps, bytes_per_cp=1.0, latest_read_ms=1.0, state_at_ms=1.0, history_ms=1.0)


def test_the_median_round_is_reported_with_every_rounds_rate() -> None:
    chosen = checkpoint_store.median_round([_result("floor", cps) for cps in (300.0, 100.0, 200.0)])

    assert chosen.cps == 200.0
    assert chosen.extra["cps_rounds"] == [300.0, 100.0, 200.0]  # in the order they ran


def test_of_an_even_number_of_rounds_the_slower_middle_one_is_reported() -> None:
    chosen = checkpoint_store.median_round([_result("floor", cps) for cps in (100.0, 400.0, 200.0, 300.0)])

    assert chosen.cps == 200.0


def test_a_single_round_is_reported_as_it_ran() -> None:
    chosen = checkpoint_store.median_round([_result("floor", 250.0)])

    assert chosen.cps == 250.0 and "cps_rounds" not in chosen.extra


def test_quick_contenders_take_turns_and_langgraph_runs_once_after_them(monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[str] = []
    rates = {"floor": iter([50.0, 70.0, 60.0]), "quicksave": iter([30.0, 10.0, 20.0]), "langgraph": iter([1.0])}

    def runner(name: str) -> Callable[[int], list[Result]]:
        def run(steps: int) -> list[Result]:
            ran.append(name)
            return [_result(name, next(rates[name]))]

        return run

    monkeypatch.setattr(checkpoint_store, "settle", lambda: None)
    monkeypatch.setattr(
        checkpoint_store, "CONTENDERS", tuple((name, runner(name)) for name in ("floor", "quicksave", "langgraph"))
    )

    results = checkpoint_store.run_size(10, rounds=3)

    assert ran == ["floor", "quicksave"] * 3 + ["langgraph"]
    assert [(result.name, result.cps) for result in results] == [
        ("floor", 60.0),
        ("quicksave", 20.0),
        ("langgraph", 1.0),
    ]
