"""bench/langgraph_own_tests.py finds LangGraph's tests in a repository checkout or an unpacked sdist."""

from __future__ import annotations

from pathlib import Path

from bench import langgraph_own_tests as own


def _tests_at(path: Path) -> Path:
    path.mkdir(parents=True)
    for name in ("conftest.py", "conftest_checkpointer.py"):
        (path / name).write_text("")
    return path


def test_an_unpacked_sdist_is_read_from_its_top_level_tests(tmp_path: Path) -> None:
    tests = _tests_at(tmp_path / "tests")

    assert own.tests_of(tmp_path) == tests


def test_a_repository_checkout_is_read_from_libs_langgraph_tests(tmp_path: Path) -> None:
    tests = _tests_at(tmp_path / "libs" / "langgraph" / "tests")

    assert own.tests_of(tmp_path) == tests


def test_a_tests_folder_without_langgraphs_conftest_is_not_taken(tmp_path: Path) -> None:
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "conftest.py").write_text("")

    assert own.tests_of(tmp_path) is None


def test_a_test_is_counted_under_its_saver_not_under_langgraphs_memory_cache() -> None:
    # LangGraph's `cache` fixture is parametrized `sqlite` / `memory`, beside the saver.
    assert own.saver_of("test_multiple_interrupts_functional_cache[quicksave-memory]") == "quicksave"
    assert own.saver_of("test_multiple_interrupts_functional_cache[pgsaver-memory]") == "postgres"
    assert own.saver_of("test_multiple_interrupts_functional_cache[memsaver-memory]") == "memory"
    assert own.saver_of("test_in_one_fan_out_state_graph_waiting_edge_multiple[memory-True]") == "-"


def test_langgraphs_memory_snapshots_are_copied_to_every_savers_id() -> None:
    ambr = "# name: test_graph[memory]\n  'drawing'\n# ---\n"

    copied = own.with_saver_snapshots(ambr)

    for saver_id in ("memsaver", "pgsaver", "pgsaver_aio", "quicksave"):
        assert f"# name: test_graph[{saver_id}]\n  'drawing'\n# ---\n" in copied


def test_the_first_snapshot_of_a_file_is_copied_too() -> None:
    ambr = "# serializer version: 1\n# name: test_graph[memory]\n  'drawing'\n# ---\n"

    copied = own.with_saver_snapshots(ambr)

    assert copied.startswith(ambr)
    assert "# name: test_graph[memsaver]\n  'drawing'\n# ---\n" in copied
    assert copied.count("# serializer version") == 1
