"""Copy LangGraph threads from a PostgresSaver database into Quicksave (integrations.langgraph.importer)."""

from __future__ import annotations

from contextlib import ExitStack
from datetime import datetime
from typing import Any

import psycopg
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from checkpoints.management.commands.prune import ProgressBar

READ_ONLY = "-c default_transaction_read_only=on"


class Command(BaseCommand):
    help = (
        "Copy LangGraph threads from the database of a LangGraph PostgresSaver "
        "(langgraph-checkpoint-postgres) into Quicksave, as QuicksaveSaver stores them: every namespace "
        "(subgraphs), every checkpoint parents first (forks become branches), metadata and pending "
        "writes. Checkpoints already copied are skipped, so it is safe to run again. The source is "
        "only read, through PostgresSaver's own API."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--from", dest="source", required=True, metavar="URL",
            help="PostgreSQL URL of the PostgresSaver database, e.g. postgresql://user@host:5432/app",
        )  # fmt: skip
        parser.add_argument(
            "--thread", dest="threads", action="extend", nargs="+", metavar="ID",
            help="Copy only these LangGraph thread ids (repeatable)",
        )  # fmt: skip
        parser.add_argument(
            "--since", metavar="ISO", help="Only threads with a checkpoint written at or after this time"
        )
        parser.add_argument("--until", metavar="ISO", help="Only threads with a checkpoint written before this time")
        parser.add_argument(
            "--agent", default="langgraph",
            help="The Quicksave agent to file the threads under, as QuicksaveSaver(agent=...) (default: langgraph)",
        )  # fmt: skip
        parser.add_argument(
            "--no-approvals", action="store_true",
            help="Do not file the interrupt a thread is waiting at as a pending approval",
        )  # fmt: skip
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help="Report what would be copied (threads, checkpoints, writes); write nothing",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        # Imported here, so that `manage.py help` works without the optional LangGraph packages.
        try:
            from langgraph.checkpoint.postgres import PostgresSaver

            from integrations.langgraph.importer import MissingThreads, SourceUnreadable, import_threads
        except ImportError as exc:
            raise CommandError(
                f"import_langgraph needs LangGraph and langgraph-checkpoint-postgres ({exc.msg}); "
                "pip install -r requirements-langgraph.txt"
            ) from None
        agent: str = options["agent"]
        if not 0 < len(agent) <= 64 or not agent.isprintable():
            raise CommandError("--agent takes 1 to 64 printable characters.")
        since, until = _moment(options["since"], "--since"), _moment(options["until"], "--until")
        if since is not None and until is not None and since >= until:
            raise CommandError("--since must be earlier than --until.")
        url: str = options["source"]
        where = _where(url)
        dry_run: bool = options["dry_run"]
        progress = ProgressBar(self.stderr, label="import", unit="checkpoints") if options["verbosity"] > 0 else None
        with ExitStack() as opened:
            try:
                source = opened.enter_context(PostgresSaver.from_conn_string(_read_only(url)))
            except psycopg.Error as exc:
                raise CommandError(
                    f"Cannot connect to the PostgresSaver database {where}: {_first_line(exc)}"
                ) from None
            try:
                report = import_threads(
                    source=source, agent=agent, thread_ids=options["threads"], since=since, until=until,
                    approvals=not options["no_approvals"], dry_run=dry_run, progress=progress,
                )  # fmt: skip
            except MissingThreads as exc:
                listed = ", ".join(repr(thread_id) for thread_id in exc.thread_ids)
                raise CommandError(f"{where} has no thread {listed}: nothing was copied.") from None
            except SourceUnreadable as exc:
                if isinstance(exc.__cause__, psycopg.errors.UndefinedTable):
                    raise CommandError(
                        f"{where} has no PostgresSaver tables: is it the database your PostgresSaver.setup() ran on?"
                    ) from None
                raise CommandError(f"Cannot read the PostgresSaver database {where}: {_first_line(exc)}") from None

        if dry_run:
            self.stdout.write(f"Dry run of an import from {where}: nothing was written.")
        else:
            self.stdout.write(f"Imported from {where}.")
        copied = "to copy" if dry_run else "copied"
        lines = [
            ("threads", f"{report.threads:,} ({report.namespaces:,} namespaces)"),
            (f"checkpoints {copied}", f"{report.checkpoints:,} ({report.checkpoints_present:,} already in Quicksave)"),
            (f"pending writes {copied}", f"{report.writes:,} ({report.writes_present:,} already in Quicksave)"),
        ]
        if report.waiting:
            filed = (
                "not filed (--no-approvals)" if options["no_approvals"] else f"{'to be ' * dry_run}filed as approvals"
            )
            lines.append(("waiting at an interrupt", f"{report.waiting:,} thread(s), {filed}"))
        for label, value in lines:
            self.stdout.write(f"  {label + ':':<26}{value}")
        if report.missing:  # a dry run's; a real run stopped before writing
            listed = ", ".join(repr(thread_id) for thread_id in report.missing)
            raise CommandError(f"{where} has no thread {listed}.")


def _moment(value: str | None, option: str) -> datetime | None:
    """An ISO 8601 date or time; without a zone, in the server's TIME_ZONE."""
    if value is None:
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise CommandError(f"{option} takes an ISO 8601 date or time, e.g. 2026-11-24T18:00:00Z.") from None
    return timezone.make_aware(moment) if timezone.is_naive(moment) else moment


def _where(url: str) -> str:
    """The source database as host:port/name, for messages: never its password."""
    try:
        parts = conninfo_to_dict(url)
    except psycopg.Error:
        raise CommandError(
            "--from takes a PostgreSQL URL (postgresql://user@host:5432/database) or a libpq connection string."
        ) from None
    host = parts.get("host") or "localhost"
    port = f":{parts['port']}" if parts.get("port") else ""
    return f"{host}{port}/{parts.get('dbname') or parts.get('user') or ''}"


def _read_only(url: str) -> str:
    """The URL with every transaction read-only: the import never writes to its source."""
    options = conninfo_to_dict(url).get("options")
    return make_conninfo(url, options=f"{options} {READ_ONLY}" if options else READ_ONLY)


def _first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
