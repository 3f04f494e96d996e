"""bench/callgrind_append.py reads callgrind's dumps: the writer's windows, the publisher's rounds."""

from __future__ import annotations

from pathlib import Path

from bench import callgrind_append


def _dump(path: Path, total: int, sleeps: int = 0) -> None:
    calls = f"cfn=(1) time_sleep\ncalls={sleeps} 0\n0 10\n" if sleeps else ""
    path.write_text(f"# callgrind format\nevents: Ir\nsummary: {total}\n\nfn=(2) run\n{calls}")


def test_the_writer_counts_its_windows_after_the_setup_and_the_publisher_its_whole_life(tmp_path: Path) -> None:
    _dump(tmp_path / "callgrind.out.7.1-01", 9_000_000)  # the setup: not counted
    _dump(tmp_path / "callgrind.out.7.2-01", 300_000)
    _dump(tmp_path / "callgrind.out.7.3-01", 500_000)
    _dump(tmp_path / "callgrind.out.7-01", 0)  # the exit
    _dump(tmp_path / "callgrind.out.7-02", 1_000)
    _dump(tmp_path / "callgrind.out.7-03", 60_000, sleeps=3)

    lines = callgrind_append.report(tmp_path, 4)

    assert lines[0] == "writer thread: 200,000 per append (windows of 2: 0.150 M, 0.250 M)"
    assert lines[1:] == [
        "thread 2: 250 per append",
        "live publisher (thread 3): 15,000 per append, 3 rounds, 20,000 a round",
        "whole process: 215,250 per append",
    ]
