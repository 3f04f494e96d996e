"""Run ADK's shared session-service contract tests with QuicksaveSessionService registered beside
ADK's own backends, and count passes and failures per backend.

    .venv/bin/python bench/adk_own_tests.py ADK_CHECKOUT [--workdir DIR] [-- PYTEST_ARGS...]

ADK_CHECKOUT is a checkout of github.com/google/adk-python, best at the tag of the installed
`google-adk` (`pip show google-adk`); only tests/unittests/sessions/ (and, when present,
tests/unittests/integrations/redis/_fake_redis.py, which ADK's Redis backend entry needs) is
read. This script fetches nothing.

ADK keeps the contract in `tests/unittests/sessions/_conformance.py`: every test taking the
`session_service` fixture runs once per backend in its `BACKENDS` list, and a backend that fails
one must record it in `divergences` (the test is then a strict xfail). This script copies those
tests to a work directory outside this repository (--workdir, default a new temporary one),
adds one entry to that list, `_Backend('quicksave', ...)` with no divergences, and runs pytest on
test_session_service.py (--files). The quicksave backend is `QuicksaveSessionService()` on a
database of its own made on DATABASE_URL's server (--test-database, migrated once, dropped at the
end), its tables emptied before each test. When the Redis fake is missing from the checkout, the
Redis entry is left out (said in the output). It prints passed / failed / xfailed / skipped per
backend (tests not parametrized by backend count under `-`), and the tests that failed for
quicksave alone.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

REPO = Path(__file__).resolve().parent.parent
MARKER = "@pytest.fixture(params=BACKENDS"

BACKEND = """

# --- Added by Quicksave's bench/adk_own_tests.py: QuicksaveSessionService, held to the contract.
@contextlib.asynccontextmanager
async def _make_quicksave(
    tmp_path: pathlib.Path,
) -> AsyncIterator[BaseSessionService]:
  del tmp_path
  from quicksave_backend import empty_quicksave
  from integrations.adk.sessions import QuicksaveSessionService

  await empty_quicksave()
  yield QuicksaveSessionService()


BACKENDS.append(_Backend('quicksave', _make_quicksave))


"""

HARNESS = '''
"""Written by Quicksave's bench/adk_own_tests.py: Django on a database of the run's own."""

import os

import django
from channels.db import database_sync_to_async

TABLES = (
    "checkpoints_checkpoint", "checkpoints_event", "checkpoints_thread", "checkpoints_branch",
    "checkpoints_threadkey", "checkpoints_materialisedhead", "checkpoints_toolresult",
    "approvals_approvalrequest", "agents_agent",
)


def setup() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "quicksave.settings")
    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def _empty() -> None:
    from django.db import connection

    from checkpoints import storage

    storage.clear_caches()
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {', '.join(TABLES)} CASCADE")


async def empty_quicksave() -> None:
    await database_sync_to_async(_empty)()
'''

CONFTEST = """
# --- Added by Quicksave's bench/adk_own_tests.py.
import quicksave_backend

quicksave_backend.setup()
"""


def prepare(checkout: Path, workdir: Path) -> Path:
    """Copy ADK's session tests into `workdir` as the package tests.unittests.sessions, register
    the quicksave backend; returns the sessions directory."""
    source = checkout / "tests" / "unittests"
    sessions = workdir / "tests" / "unittests" / "sessions"
    shutil.copytree(source / "sessions", sessions)
    for package in (workdir / "tests", workdir / "tests" / "unittests"):
        (package / "__init__.py").touch()
    fake = source / "integrations" / "redis" / "_fake_redis.py"
    conformance = (sessions / "_conformance.py").read_text()
    if fake.exists():
        redis = workdir / "tests" / "unittests" / "integrations" / "redis"
        redis.mkdir(parents=True)
        for package in (redis.parent, redis):
            (package / "__init__.py").touch()
        shutil.copy(fake, redis / "_fake_redis.py")
    else:
        print("[note] tests/unittests/integrations/redis/_fake_redis.py is not in the checkout: the redis "
              "backend is left out of this run", flush=True)  # fmt: skip
        conformance = conformance.replace("from ..integrations.redis._fake_redis import FakeRedisAsync\n", "")
        conformance = re.sub(r"\n    # Two more Redis divergences.*?\n    _Backend\(\n        'redis',.*?\n    \),",
                             "", conformance, flags=re.S)  # fmt: skip
    if MARKER not in conformance:
        raise SystemExit(f"{sessions / '_conformance.py'} has no `{MARKER}`: not the registry this script knows.")
    (sessions / "_conformance.py").write_text(conformance.replace(MARKER, BACKEND.lstrip("\n") + MARKER, 1))
    (workdir / "quicksave_backend.py").write_text(textwrap.dedent(HARNESS).lstrip())
    conftest = sessions / "conftest.py"
    conftest.write_text((conftest.read_text() if conftest.exists() else "") + CONFTEST)
    return sessions


def count(report: Path) -> tuple[dict[str, Counter[str]], dict[str, set[str]]]:
    """Outcomes per backend, and the tests (without their backend id) that failed per backend."""
    outcomes: dict[str, Counter[str]] = defaultdict(Counter)
    failed: dict[str, set[str]] = defaultdict(set)
    for case in ET.parse(report).getroot().iter("testcase"):  # noqa: S314 - pytest's own file
        name = case.get("name", "")
        match = re.search(r"\[(?:.*-)?(in_memory|in_memory_light_copy|database|sqlite|redis|per_agent_database|"
                          r"quicksave)(?:-.*)?\]$", name)  # fmt: skip
        backend = match.group(1) if match else "-"
        test = re.sub(r"\[.*\]$", "", name)
        if case.find("failure") is not None or case.find("error") is not None:
            outcomes[backend]["failed"] += 1
            failed[backend].add(test)
        elif (skipped := case.find("skipped")) is not None:
            outcomes[backend]["xfailed" if skipped.get("type") == "pytest.xfail" else "skipped"] += 1
        else:
            outcomes[backend]["passed"] += 1
    return outcomes, failed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkout", type=Path)
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--files", nargs="+", default=["test_session_service.py"])
    parser.add_argument("--test-database", default="quicksave_adk_contract")
    parser.add_argument("pytest_args", nargs="*")
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="adk-contract-"))
    if workdir.exists() and any(workdir.iterdir()):
        raise SystemExit(f"{workdir} is not empty.")
    sessions = prepare(args.checkout, workdir)
    server = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
    parts = urlsplit(server)
    database = urlunsplit((parts.scheme, parts.netloc, f"/{args.test_database}", parts.query, ""))
    admin = urlunsplit((parts.scheme, parts.netloc, "/postgres", parts.query, ""))
    import psycopg

    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{args.test_database}"')
        conn.execute(f'CREATE DATABASE "{args.test_database}"')
    report = workdir / "report.xml"
    env = {**os.environ, "DATABASE_URL": database, "QUICKSAVE_EMBEDDED_WORKER": "false",
           "PYTHONPATH": os.pathsep.join([str(workdir), str(REPO)])}  # fmt: skip
    try:
        subprocess.run(
            [sys.executable, "-m", "pytest", *args.files, "-p", "no:cacheprovider", "-q", "--asyncio-mode=auto",
             f"--junitxml={report}", "--rootdir", str(workdir), "-o", "django_find_project=false",
             "-p", "no:django", *args.pytest_args],
            cwd=sessions, env=env, check=False,
        )  # fmt: skip
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{args.test_database}" WITH (FORCE)')
    outcomes, failed = count(report)
    print(f"\n{'backend':<22} {'passed':>7} {'failed':>7} {'xfailed':>8} {'skipped':>8}")
    for backend in sorted(outcomes):
        row = outcomes[backend]
        print(f"{backend:<22} {row['passed']:>7} {row['failed']:>7} {row['xfailed']:>8} {row['skipped']:>8}")
    others = set().union(*(tests for backend, tests in failed.items() if backend not in ("quicksave", "-")))
    print("failed for quicksave alone:", sorted(failed["quicksave"] - others) or "none")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
