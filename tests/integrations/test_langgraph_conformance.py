"""LangGraph's own checkpointer conformance suite, run against QuicksaveSaver."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import langgraph.checkpoint.conformance as conformance
import pytest

from integrations.langgraph.saver import QuicksaveSaver

pytestmark = pytest.mark.django_db(transaction=True)


@conformance.checkpointer_test(name="QuicksaveSaver")
async def quicksave_saver() -> AsyncGenerator[QuicksaveSaver, None]:
    yield QuicksaveSaver(agent="langgraph-conformance")


def test_quicksave_saver_passes_langgraph_conformance(capsys: Any) -> None:
    # The suite is async. Run it on a loop of its own in a worker thread: Playwright's sync
    # API keeps an event loop running on the main thread once the browser tests have started.
    with ThreadPoolExecutor(max_workers=1) as pool:
        report = pool.submit(asyncio.run, conformance.validate(quicksave_saver)).result()
    report.print_report()
    results = report.to_dict()["results"]
    with capsys.disabled():
        print(
            json.dumps(
                {name: {k: r[k] for k in ("passed", "tests_passed", "tests_failed")} for name, r in results.items()}
            )
        )
    failures = {name: r["failures"] for name, r in results.items() if r["failures"]}
    assert report.passed_all_base(), failures
    # The extended capabilities are implemented too, so every one is detected and passes.
    assert report.passed_all(), failures
    assert all(r["detected"] for r in results.values()), results
