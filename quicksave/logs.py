"""Log lines: one JSON object a line in production, plain text in development, and on every line
the request and the thread it was written for.

`RequestContextMiddleware` (quicksave.middleware) binds the request id for the request's thread
and the thread id its URL names; the worker binds the thread of the run it drives, a thread
socket the thread it follows. `ContextFilter` copies them, and the trace and span ids when
tracing is on, onto every record; `JsonFormatter` writes them out. QUICKSAVE_LOG_FORMAT picks
`json` or `text` (json by default in production, text otherwise).
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

from quicksave import telemetry

request_id: ContextVar[str | None] = ContextVar("quicksave_request_id", default=None)
thread_id: ContextVar[str | None] = ContextVar("quicksave_thread_id", default=None)

# Attributes every LogRecord has; whatever else a call passes in `extra` is written out too.
_RECORD_FIELDS = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "request_id", "thread_id",
                                                                   "trace_id", "span_id"}  # fmt: skip


@contextlib.contextmanager
def bound(*, request: str | None = None, thread: object | None = None) -> Iterator[None]:
    """Name the request and/or thread on every line logged inside the block (in this thread or task)."""
    tokens = []
    if request is not None:
        tokens.append((request_id, request_id.set(request)))
    if thread is not None:
        tokens.append((thread_id, thread_id.set(str(thread))))
    try:
        yield
    finally:
        for var, token in reversed(tokens):
            var.reset(token)


def forget_request(sender: object = None, **kwargs: object) -> None:
    """On `request_finished`: the request thread's next lines belong to no request."""
    request_id.set(None)
    thread_id.set(None)


def bind_thread(thread: object) -> None:
    """Name `thread` on every later line of the current task (a websocket's, say) or request."""
    thread_id.set(str(thread))


class ContextFilter(logging.Filter):
    """Adds request_id, thread_id, trace_id and span_id (None when there is none) to every record."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id.get()
        record.thread_id = thread_id.get()
        ids = telemetry.ids()
        record.trace_id, record.span_id = ids if ids else (None, None)
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time (UTC, ISO 8601), level, logger, message, request_id,
    thread_id, trace_id, span_id, the `extra` fields, and the traceback when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": getattr(record, "request_id", None),
            "thread_id": getattr(record, "thread_id", None),
            "trace_id": getattr(record, "trace_id", None),
            "span_id": getattr(record, "span_id", None),
            "process": record.process,
        }
        for key, value in record.__dict__.items():
            if key not in _RECORD_FIELDS and not key.startswith("_"):
                line[key] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, default=str, ensure_ascii=False)


TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s [request=%(request_id)s thread=%(thread_id)s] %(message)s"


# The packages whose lines are Quicksave's own (the console keeps these when a log file takes the rest).
OWN_PACKAGES = frozenset({"quicksave", "checkpoints", "approvals", "quicksave_agents", "audit", "notifications",
                          "memory", "integrations", "django.server"})  # fmt: skip


class OwnLinesFilter(logging.Filter):
    """Passes Quicksave's own lines, and errors of the server itself (a port already in use)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name.partition(".")[0] in OWN_PACKAGES:
            return True
        return record.name == "uvicorn.error" and record.levelno >= logging.ERROR


class BriefFormatter(logging.Formatter):
    """One short line a record for a person watching the console: the time, the level when it is
    not INFO, the message; a traceback is left to the log file, which the line names."""

    def __init__(self, log_file: str = "") -> None:
        super().__init__("%(asctime)s %(message)s", datefmt="%H:%M:%S")
        self.log_file = log_file

    def format(self, record: logging.LogRecord) -> str:
        line = f"{self.formatTime(record, self.datefmt)} "
        if record.levelno != logging.INFO:
            line += f"{record.levelname.lower()}: "
        line += record.getMessage()
        if record.exc_info and record.exc_info[0] is not None:
            line += f" ({record.exc_info[0].__name__}; the traceback is in {self.log_file})"
        return line


def logging_config(*, json_lines: bool, level: str, log_file: str = "") -> dict[str, Any]:
    """settings.LOGGING: every line, uvicorn's included, through one handler on standard error.

    With `log_file` (QUICKSAVE_LOG_FILE, which `dev.py run` sets) every line goes to that file
    instead, and the console keeps Quicksave's own lines, one short line each: the access log,
    libraries' warnings and tracebacks stay out of a person's way, and in the file."""
    handler = {
        "class": "logging.StreamHandler",
        "filters": ["context"],
        "formatter": "json" if json_lines else "text",
    }
    handlers: dict[str, Any] = {"console": handler}
    everywhere = ["console"]
    if log_file:
        handlers["file"] = {**handler, "class": "logging.FileHandler", "filename": log_file, "encoding": "utf-8"}
        handlers["console"] = {"class": "logging.StreamHandler", "filters": ["own"], "formatter": "brief"}
        everywhere = ["console", "file"]
    # uvicorn configures its loggers before it loads the app; these replace its handlers so its
    # lines (the access log, start-up and shutdown) have the same shape as everyone else's.
    uvicorn = {"handlers": everywhere, "level": level, "propagate": False}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"context": {"()": "quicksave.logs.ContextFilter"}, "own": {"()": "quicksave.logs.OwnLinesFilter"}},
        "formatters": {
            "json": {"()": "quicksave.logs.JsonFormatter"},
            "text": {"format": TEXT_FORMAT},
            "brief": {"()": "quicksave.logs.BriefFormatter", "log_file": log_file},
        },
        "handlers": handlers,
        "root": {"handlers": everywhere, "level": level},
        "loggers": {
            "uvicorn": uvicorn,
            "uvicorn.error": {"handlers": [], "level": level, "propagate": True},  # through "uvicorn"
            "uvicorn.access": uvicorn,
            # httpx logs every request it makes at INFO; the notifications dispatcher logs each outcome itself.
            "httpx": {"level": "WARNING"},
        },
    }
