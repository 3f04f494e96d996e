"""Run ADK's session tests (tests/unittests/sessions/) with QuicksaveSessionService registered
beside ADK's own backends, and count passes and failures per backend.

    .venv/bin/python bench/adk_own_tests.py ADK_CHECKOUT [--workdir DIR] [-- PYTEST_ARGS...]

ADK_CHECKOUT is a tree of github.com/google/adk-python, best at the tag of the installed
`google-adk` (`pip show google-adk`; the script says when the tree's src/google/adk/version.py
names another). Only tests/ is read: tests/unittests/sessions/, tests/unittests/conftest.py (ADK's
test environment) and, when present, tests/unittests/integrations/redis/_fake_redis.py (which
ADK's Redis backend entry needs). This script fetches nothing; make the tree with e.g.
`git --git-dir=<adk-python git dir> archive <tag> tests src/google/adk/version.py | tar -x -C DIR`.

Every ADK test taking the `session_service` fixture runs once per backend. The script copies the
tests to a work directory outside this repository (--workdir, default a new temporary one) and
registers a `quicksave` backend, `QuicksaveSessionService()`, in whichever registry the tree has:

- `tests/unittests/sessions/_conformance.py` (ADK's shared contract, newer trees): one more
  `_Backend('quicksave', ...)` in its `BACKENDS` list, with no divergences (a backend that fails
  a contract test must record it there, and the test is then a strict xfail);
- the `session_service` fixture's `params=[...]` in test_session_service.py (older trees,
  before the registry): one more param, `'quicksave'`.

The quicksave backend runs on a database of its own made on DATABASE_URL's server
(--test-database, migrated once, dropped at the end), its tables emptied before each test. When
the Redis fake is missing from the tree, the Redis entry is left out (said in the output). By
default the whole sessions directory runs (--files to narrow it), collection errors of other
files not stopping it (a module whose optional dependency is not installed, e.g. the Vertex AI
tests' google-api-core). It prints passed / failed / xfailed / skipped per backend (tests not
parametrized by backend count under `-`), the modules that could not be collected, and the tests
that failed for quicksave alone; the last line is the same as one JSON object.

Example (the run in README, Google ADK section):

    git --git-dir=/path/to/adk-python.git archive <commit> tests src/google/adk/version.py | tar -x -C /tmp/adk
    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/quicksave \\
        .venv/bin/python bench/adk_own_tests.py /tmp/adk --workdir /tmp/adk-run
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from importlib import metadata
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

REPO = Path(__file__).resolve().parent.parent
MARKER = "@pytest.fixture(params=BACKENDS"

# The newer registry: one more entry in _conformance.BACKENDS (the module imports what this uses).
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

# The older registry: the fixture's own params list in test_session_service.py.
FIXTURE = re.compile(
    r"(?P<head>@pytest\.fixture\(\s*params=\[)(?P<params>[^\]]*?)(?P<close>,?\s*\]\s*\)\s*\n"
    r"async def session_service\(request, tmp_path\):\n(?:  \"\"\"[^\n]*\"\"\"\n)?)"
)
FIXTURE_BRANCH = """  # --- Added by Quicksave's bench/adk_own_tests.py: QuicksaveSessionService.
  if request.param == 'quicksave':
    from quicksave_backend import empty_quicksave
    from integrations.adk.sessions import QuicksaveSessionService

    await empty_quicksave()
    yield QuicksaveSessionService()
    return
"""

HARNESS = """
\"\"\"Written by Quicksave's bench/adk_own_tests.py: Django on a database of the run's own.\"\"\"

import os

import django
from channels.db import database_sync_to_async

TABLES = (
    "checkpoints_checkpoint", "checkpoints_event", "checkpoints_thread", "checkpoints_branch",
    "checkpoints_threadkey", "checkpoints_materialisedhead", "checkpoints_toolresult", "checkpoints_blob",
    "checkpoints_deletedthread", "approvals_approvalrequest", "agents_toolcall", "agents_run", "agents_agent",
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
"""

CONFTEST = """
# --- Added by Quicksave's bench/adk_own_tests.py.
import quicksave_backend

quicksave_backend.setup()


def pytest_collection_modifyitems(items):
    # Name each test's backend in the report: the registry entry's name, or the older fixture's
    # param (a string or enum member). A test that parametrizes `session_service` itself with a
    # service object (ADK's in-memory-only tests) is not a registry backend: it counts under `-`.
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is not None and "session_service" in callspec.params:
            backend = callspec.params["session_service"]
            name = getattr(backend, "name", backend)
            if isinstance(name, str):
                item.user_properties.append(("backend", name))
"""

# The older fixture's enum members, as the registry names the same backends.
ENUM_NAMES = {"IN_MEMORY": "in_memory", "IN_MEMORY_WITH_LIGHT_COPY_ENABLED": "in_memory_light_copy",
              "DATABASE": "database", "SQLITE": "sqlite"}  # fmt: skip


def prepare(checkout: Path, workdir: Path) -> tuple[Path, str]:
    """Copy ADK's session tests into `workdir` as the package tests.unittests.sessions and register
    the quicksave backend; returns the sessions directory and which registry it was registered in."""
    source = checkout / "tests" / "unittests"
    sessions = workdir / "tests" / "unittests" / "sessions"
    shutil.copytree(source / "sessions", sessions)
    for package in (workdir / "tests", workdir / "tests" / "unittests"):
        (package / "__init__.py").touch()
    if (source / "conftest.py").exists():
        shutil.copy(source / "conftest.py", workdir / "tests" / "unittests" / "conftest.py")
    (workdir / "quicksave_backend.py").write_text(HARNESS.lstrip())
    conftest = sessions / "conftest.py"
    conftest.write_text((conftest.read_text() if conftest.exists() else "") + CONFTEST)
    if (sessions / "_conformance.py").exists():
        register_in_conformance(source, workdir, sessions)
        return sessions, "_conformance.BACKENDS"
    tests = sessions / "test_session_service.py"
    text = tests.read_text()
    found = FIXTURE.search(text)
    if found is None:
        raise SystemExit(f"{sessions} has neither _conformance.py nor a `session_service` fixture with params: "
                         "not a registry this script knows.")  # fmt: skip
    text = (text[: found.start()] + found["head"] + found["params"].rstrip().rstrip(",") + ",\n        'quicksave',"
            + found["close"].lstrip(",") + FIXTURE_BRANCH + text[found.end():])  # fmt: skip
    tests.write_text(text)
    return sessions, "test_session_service.session_service params"


def register_in_conformance(source: Path, workdir: Path, sessions: Path) -> None:
    conformance = (sessions / "_conformance.py").read_text()
    fake = source / "integrations" / "redis" / "_fake_redis.py"
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


def backend_of(case: ET.Element) -> str:
    """The backend a test ran on (the property the conftest records), `-` for a test without one."""
    for prop in case.iter("property"):
        if prop.get("name") == "backend":
            name = prop.get("value", "-")
            return ENUM_NAMES.get(name, name)
    return "-"


def count(report: Path) -> tuple[dict[str, Counter[str]], dict[str, set[str]], list[str]]:
    """Outcomes per backend, the tests (without their backend id) that failed per backend, and the
    modules that could not be collected."""
    outcomes: dict[str, Counter[str]] = defaultdict(Counter)
    failed: dict[str, set[str]] = defaultdict(set)
    uncollected = []
    for case in ET.parse(report).getroot().iter("testcase"):  # noqa: S314 - pytest's own file
        name = case.get("name", "")
        error = case.find("error")
        if error is not None and error.get("message", "").startswith("collection failure"):
            uncollected.append(f"{case.get('classname')}.{name}".strip("."))
            continue
        backend = backend_of(case)
        test = case.get("classname", "") + "::" + re.sub(r"\[.*\]$", "", name)
        if case.find("failure") is not None or error is not None:
            outcomes[backend]["failed"] += 1
            failed[backend].add(test)
        elif (skipped := case.find("skipped")) is not None:
            outcomes[backend]["xfailed" if skipped.get("type") == "pytest.xfail" else "skipped"] += 1
        else:
            outcomes[backend]["passed"] += 1
    return outcomes, failed, uncollected


def checkout_version(checkout: Path) -> str | None:
    version = checkout / "src" / "google" / "adk" / "version.py"
    found = re.search(r'__version__ = "([^"]+)"', version.read_text()) if version.exists() else None
    return found.group(1) if found else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkout", type=Path)
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--files", nargs="+", default=["."])
    parser.add_argument("--test-database", default="quicksave_adk_contract")
    parser.add_argument("pytest_args", nargs="*")
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="adk-contract-"))
    if workdir.exists() and any(workdir.iterdir()):
        raise SystemExit(f"{workdir} is not empty.")
    installed = metadata.version("google-adk")
    tree = checkout_version(args.checkout)
    if tree != installed:
        print(f"[note] the tree is ADK {tree or '(no src/google/adk/version.py)'}, the installed google-adk "
              f"{installed}: its tests run against the installed one", flush=True)  # fmt: skip
    sessions, registry = prepare(args.checkout, workdir)
    print(f"[note] quicksave registered in {registry}", flush=True)
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
             "-o", "asyncio_default_fixture_loop_scope=function", "--continue-on-collection-errors",
             f"--junitxml={report}", "--rootdir", str(workdir), "-o", "django_find_project=false",
             "-p", "no:django", *args.pytest_args],
            cwd=sessions, env=env, check=False,
        )  # fmt: skip
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{args.test_database}" WITH (FORCE)')
    outcomes, failed, uncollected = count(report)
    print(f"\n{'backend':<22} {'passed':>7} {'failed':>7} {'xfailed':>8} {'skipped':>8}")
    for backend in sorted(outcomes):
        row = outcomes[backend]
        print(f"{backend:<22} {row['passed']:>7} {row['failed']:>7} {row['xfailed']:>8} {row['skipped']:>8}")
    print("not collected:", uncollected or "none")
    others = set().union(*(tests for backend, tests in failed.items() if backend not in ("quicksave", "-")))
    alone = sorted(failed["quicksave"] - others)
    print("failed for quicksave alone:", alone or "none")
    print(json.dumps({"adk_tree": tree, "google_adk": installed, "registry": registry, "not_collected": uncollected,
                      "quicksave_only_failed": alone,
                      "backends": {name: dict(row) for name, row in sorted(outcomes.items())}}))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
