"""QUICKSAVE_LOG_FILE (which `dev.py run` sets): every line goes to the file; the console keeps
Quicksave's own lines, one short line each, and the server's own errors."""

from __future__ import annotations

import logging
import logging.config
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.conf import settings

from quicksave.logs import logging_config


@pytest.fixture
def log_file(tmp_path: Path) -> Iterator[Callable[[], Path]]:
    """Configures the log with a file when called: from the test itself, so the console handler
    writes to the standard error capsys reads in the test (pytest swaps it between phases)."""
    path = tmp_path / "quicksave.log"

    def configure() -> Path:
        logging.config.dictConfig(logging_config(json_lines=False, level="INFO", log_file=str(path)))
        return path

    try:
        yield configure
    finally:
        logging.config.dictConfig(settings.LOGGING)  # closes the file's handler too


def test_third_party_lines_go_to_the_file_only(
    log_file: Callable[[], Path], capsys: pytest.CaptureFixture[str]
) -> None:
    path = log_file()
    logging.getLogger("uvicorn.access").info('127.0.0.1:5000 - "GET /healthz HTTP/1.1" 200')
    logging.getLogger("django.request").warning("Not Found: /favicon.png")
    logging.getLogger("py.warnings").warning("DeprecationWarning: pkg_resources is deprecated")

    console = capsys.readouterr().err

    assert console == ""
    written = path.read_text()
    assert "GET /healthz" in written and "Not Found: /favicon.png" in written and "pkg_resources" in written


def test_quicksaves_lines_reach_the_console_briefly_and_the_file_in_full(
    log_file: Callable[[], Path], capsys: pytest.CaptureFixture[str]
) -> None:
    path = log_file()
    logging.getLogger("quicksave_agents.worker").info("run 7 (approval) of thread 9: done")
    try:
        raise KeyError("phase")
    except KeyError:
        logging.getLogger("quicksave_agents.runtime").exception("agent demo-migration failed in thread 9")

    console = capsys.readouterr().err.splitlines()

    assert [line[9:] for line in console] == [
        "run 7 (approval) of thread 9: done",
        f"error: agent demo-migration failed in thread 9 (KeyError; the traceback is in {path})",
    ]
    written = path.read_text()
    assert "Traceback (most recent call last)" in written and "KeyError: 'phase'" in written


def test_the_servers_own_errors_reach_the_console(
    log_file: Callable[[], Path], capsys: pytest.CaptureFixture[str]
) -> None:
    log_file()
    logging.getLogger("uvicorn.error").info("Started server process [42]")
    logging.getLogger("uvicorn.error").error("[Errno 98] error while attempting to bind on address: in use")

    console = capsys.readouterr().err.splitlines()

    assert [line[9:] for line in console] == ["error: [Errno 98] error while attempting to bind on address: in use"]


def test_without_a_log_file_every_line_goes_to_the_console() -> None:
    config = logging_config(json_lines=False, level="INFO")

    assert set(config["handlers"]) == {"console"}
    assert "filters" not in config["handlers"]["console"] or config["handlers"]["console"]["filters"] == ["context"]
