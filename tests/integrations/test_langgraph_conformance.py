"""LangGraph's own checkpointer conformance suite, run against QuicksaveSaver."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from typing import Any

import pytest

pytest.importorskip("langgraph")
conformance = pytest.importorskip("langgraph.checkpoint.conformance")

from checkpoints.langgraph_saver import QuicksaveSaver  # noqa: E402

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


@conformance.checkpointer_test(name="QuicksaveSaver")
async def quicksave_saver() -> AsyncGenerator[QuicksaveSaver, None]:
    yield QuicksaveSaver(agent="langgraph-conformance")


async def test_quicksave_saver_passes_langgraph_conformance(capsys: Any) -> None:
    report = await conformance.validate(quicksave_saver)
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
