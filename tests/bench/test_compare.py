"""bench/compare.py reads each bench's figures, flags what got worse, and keeps the two trees' databases apart."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import compare
from bench.compare import Figure, Row, Run


def test_a_ratio_more_than_the_tolerance_worse_is_flagged_either_way_round() -> None:
    assert Row("b", "writes", "ratio", "higher", old=2.0, new=1.7).flag(0.10) == "WORSE"
    assert Row("b", "writes", "ratio", "higher", old=2.0, new=1.9).flag(0.10) == ""
    assert Row("b", "bytes", "ratio", "lower", old=0.2, new=0.23).flag(0.10) == "WORSE"
    assert Row("b", "bytes", "ratio", "lower", old=0.2, new=0.1).flag(0.10) == ""


def test_an_absolute_figure_worse_is_noted_but_not_flagged() -> None:
    assert Row("b", "p95 ms", "absolute", "lower", old=10.0, new=20.0).flag(0.10) == "(worse)"


def test_a_test_count_is_flagged_when_it_moves_the_wrong_way_at_all() -> None:
    assert Row("b", "quicksave_passed", "count", "higher", old=284, new=283).flag(0.10) == "WORSE"
    assert Row("b", "quicksave_only_failed", "count", "lower", old=0, new=1).flag(0.10) == "WORSE"
    assert Row("b", "quicksave_only_failed", "count", "lower", old=0, new=0).flag(0.10) == ""


def test_a_figure_one_side_did_not_report_is_marked_missing() -> None:
    assert Row("b", "writes", "ratio", "higher", old=2.0, new=None).flag(0.10) == "missing"


def test_each_side_reports_the_median_of_its_runs() -> None:
    def run(side: str, value: float) -> Run:
        return Run("tool_calls", side, 1.0, Path("log"), [Figure("ratio", value, "higher", "ratio")])

    (row,) = compare.rows([run("old", 1.0), run("new", 5.0), run("new", 3.0), run("old", 2.0), run("old", 9.0)])

    assert (row.old, row.new) == (2.0, 4.0)
    assert row.spread == (9.0 - 1.0) / 2.0  # old's runs moved more than new's


def test_old_and_new_take_turns_at_going_first() -> None:
    assert list(compare.turns(range(1, 4))) == [(1, ("old", "new")), (2, ("new", "old")), (3, ("old", "new"))]


def test_the_figures_are_the_last_json_line_printed() -> None:
    stdout = 'database: x\n{"steps": 1}\nround 1: 3.0 steps/s\n{"tool_call_over_no_tool": 0.5}\n'

    assert compare.last_json(stdout) == {"tool_call_over_no_tool": 0.5}
    assert compare.last_json("no json here\n") is None


def test_langgraph_test_counts_are_read_from_text_when_the_script_has_no_json() -> None:
    stdout = (
        "per saver (passed / failed / skipped):\n"
        "  memory        16 /    0 /    0\n  quicksave     15 /    1 /    2\n  -              1 /    0 /    0\n"
        "\nfailed with QuicksaveSaver only (1):\n  tests/x.py::test_y  boom\n"
    )

    assert compare.own_tests_counts(stdout) == {
        "memory_passed": 16, "memory_failed": 0, "memory_skipped": 0,
        "quicksave_passed": 15, "quicksave_failed": 1, "quicksave_skipped": 2, "quicksave_only_failed": 1,
    }  # fmt: skip


def test_checkpoint_store_ratios_are_each_contender_against_the_floor_and_langgraph() -> None:
    data = {
        "floor_cps": 200.0, "floor_bytes_per_cp": 1000.0, "langgraph_cps": 20.0, "langgraph_bytes_per_cp": 50000.0,
        "quicksave_cps": 100.0, "quicksave_bytes_per_cp": 4000.0, "quicksave_http_cps": 50.0,
        "quicksave_http_bytes_per_cp": 4000.0, "quicksave_http_latest_read_ms": None, "rate_300_over_100": 1.2,
    }  # fmt: skip

    figures = {f.name: f for f in compare.checkpoint_store_figures(data)}

    assert figures["quicksave / floor: writes"].value == 0.5
    assert figures["quicksave / langgraph: bytes/cp"].value == 0.08
    assert figures["quicksave / langgraph: bytes/cp"].better == "lower"
    assert figures["quicksave_http / floor: writes"].value == 0.25
    assert "quicksave_http / floor: latest read ms" not in figures  # not measured: null in the JSON
    assert figures["rate_300_over_100"].kind == "ratio"


def test_an_old_checkout_is_told_its_database_by_writing_the_name_over_the_literal(tmp_path: Path) -> None:
    bench = tmp_path / "bench"
    bench.mkdir()
    (bench / "peers.py").write_text('BENCH_DB_NAME = "quicksave_bench"\n')
    (bench / "quicksave_runs.py").write_text('URL = "/quicksave_bench"\nOTHER = "quicksave_benchmark"\n')

    compare.name_database(compare.Tree("old", tmp_path, "8787e875", "h_bench_8787e875"), editable=True)

    assert (bench / "peers.py").read_text() == 'BENCH_DB_NAME = "h_bench_8787e875"\n'
    assert (bench / "quicksave_runs.py").read_text() == 'URL = "/h_bench_8787e875"\nOTHER = "quicksave_benchmark"\n'


def test_a_working_tree_whose_benches_cannot_be_told_their_database_is_refused(tmp_path: Path) -> None:
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "peers.py").write_text('BENCH_DB_NAME = "quicksave_bench"\n')

    with pytest.raises(SystemExit, match="BENCH_DATABASE_NAME"):
        compare.name_database(compare.Tree("new", tmp_path, "worktree", "h_bench_worktree"), editable=False)

    assert (tmp_path / "bench" / "peers.py").read_text() == 'BENCH_DB_NAME = "quicksave_bench"\n'


def test_this_trees_benches_read_their_database_name_from_the_environment() -> None:
    peers = Path(compare.__file__).with_name("peers.py").read_text()

    assert compare.DB_NAME_ENV in peers
