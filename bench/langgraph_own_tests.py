"""Run LangGraph's own graph tests with QuicksaveSaver as the checkpointer, beside LangGraph's
PostgresSaver and InMemorySaver in the same run, and count passes and failures per saver.

    .venv/bin/python bench/langgraph_own_tests.py LANGGRAPH_CHECKOUT [options] [-- PYTEST_ARGS...]

LANGGRAPH_CHECKOUT is a checkout of the langgraph repository (github.com/langchain-ai/langgraph),
best at the tag of the installed `langgraph` (`pip show langgraph`), of which only
libs/langgraph/tests is read; or an unpacked sdist of langgraph, which holds the same tests at
its top (tests/). This script fetches nothing: get the tests yourself, e.g.
`pip download --no-deps --no-binary :all: langgraph==<version>` and unpack it, or
`git archive <tag> libs/langgraph/tests | tar -x`.

What it does, all in a work directory outside this repository (--workdir, default a new
temporary one): copies those tests there; points LangGraph's Postgres fixtures at
--postgres-url; replaces its `sync_checkpointer` / `async_checkpointer` fixtures by ones whose
params are the savers asked for (--savers):

- `memory`: LangGraph's own test saver, `MemorySaverAssertImmutable` (an InMemorySaver that
  also checks that saved checkpoints are not mutated afterwards), param id `memsaver` (LangGraph's
  own id, `memory`, is also its cache fixture's);
- `postgres`: PostgresSaver (sync tests, param id `pgsaver`) / AsyncPostgresSaver (async
  tests, `pgsaver_aio`) on a new database per test, as LangGraph's own conftest makes them;
- `quicksave`: `QuicksaveSaver(agent=<new name per test>)` on a Django test database (made once
  per run on DATABASE_URL's server, named by --test-database, dropped at the end). Async tests
  get the same saver: its async methods run the sync ones through `database_sync_to_async`;

copies each `[memory]` snapshot of LangGraph's syrupy files to the savers' test ids (the
snapshots are of graphs and streams, the same whatever the saver); then runs pytest on --files
(by default LangGraph's graph tests: test_pregel.py, test_pregel_async.py, test_interruption.py,
test_large_cases.py, test_large_cases_async.py, test_checkpoint_migration.py), with NO_DOCKER
set (LangGraph's stores and caches in memory), and prints the
passed / failed / skipped counts per saver, with the tests that failed for QuicksaveSaver only
(those whose `memory` and `postgres` runs passed). Tests not parametrized by saver are counted
under `-`. PYTEST_ARGS go to pytest as they are (`-k`, `-x`, `--lf` is not kept: no cache).

Needs, beside requirements-dev.txt: syrupy, pytest-mock, pytest-repeat,
langgraph-checkpoint-sqlite and pycryptodome (LangGraph's conftest imports them), and a
PostgreSQL server whose user may create databases (DATABASE_URL, or --database-url).

Those may go in a directory of their own, so the project's environment stays as it is:
`pip install --no-deps --target /tmp/lgdeps syrupy pytest-mock pytest-repeat
langgraph-checkpoint-sqlite pycryptodome`, then run with PYTHONPATH=/tmp/lgdeps.

Example (the run reported in docs/langgraph-own-tests.md):

    pip download --no-deps --no-binary :all: langgraph==1.2.24 -d /tmp/sd
    tar -xzf /tmp/sd/langgraph-1.2.24.tar.gz -C /tmp
    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/quicksave PYTHONPATH=/tmp/lgdeps \\
        .venv/bin/python bench/langgraph_own_tests.py /tmp/langgraph-1.2.24 --workdir /tmp/lgtests
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
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
GRAPH_TESTS = (
    "test_pregel.py",
    "test_pregel_async.py",
    "test_interruption.py",
    "test_large_cases.py",
    "test_large_cases_async.py",
    "test_checkpoint_migration.py",
)
SAVERS = ("memory", "postgres", "quicksave")
# The fixture param id each saver runs under, in sync and async tests. None of LangGraph's own ids:
# its store fixtures take `postgres`, its cache fixture `memory` (and a test may take both a cache
# and a saver), so a count by id would put a test under the wrong saver.
IDS = {"memory": ("memsaver",), "postgres": ("pgsaver", "pgsaver_aio"), "quicksave": ("quicksave",)}

# A pytest plugin module, imported at the end of LangGraph's conftest so that its fixtures
# replace LangGraph's of the same names.
HARNESS = '''
"""Written by bench/langgraph_own_tests.py: the savers LangGraph's graph tests run with."""

import os
import secrets
import sys

import pytest

from tests.conftest_checkpointer import (
    _checkpointer_memory,
    _checkpointer_postgres,
    _checkpointer_postgres_aio,
)

SAVERS = os.environ["QS_SAVERS"].split(",")
# Appended, not prepended: LangGraph's `tests` package must win over Quicksave's.
sys.path.append(os.environ["QS_REPO"])
os.environ["DJANGO_SETTINGS_MODULE"] = "quicksave.settings"


# Set up before any saver fixture (sync, outside the event loop an async test's fixtures run in,
# where Django refuses to make a database), whichever test comes first; nothing without quicksave.
@pytest.fixture(scope="session")
def quicksave_db():
    if "quicksave" not in SAVERS:
        yield
        return
    import django

    django.setup()
    from django.db import connection, connections

    from checkpoints.storage import lent_connection

    old_name = connection.creation.create_test_db(verbosity=0, autoclobber=True, keepdb=False)
    yield
    lent_connection.close()
    connections.close_all()
    for db in connections.all():
        if hasattr(db, "close_pool"):
            db.close_pool()
    connection.creation.destroy_test_db(old_name, verbosity=0)


def _quicksave():
    from checkpoints import storage
    from integrations.langgraph.saver import QuicksaveSaver

    storage.clear_caches()
    # A new Quicksave agent per test: LangGraph's tests reuse thread ids from test to test. Not
    # named by uuid.uuid4(), which tests with `deterministic_uuids` count the calls of.
    return QuicksaveSaver(agent=f"lg-{secrets.token_hex(8)}")


SAVER_OF_ID = {"memsaver": "memory", "pgsaver": "postgres", "pgsaver_aio": "postgres", "quicksave": "quicksave"}


def _ids(*names):
    return [name for name in names if SAVER_OF_ID[name] in SAVERS]


@pytest.fixture(params=_ids("memsaver", "pgsaver", "quicksave"))
def sync_checkpointer(request, quicksave_db):
    if request.param == "memsaver":
        with _checkpointer_memory() as saver:
            yield saver
    elif request.param == "pgsaver":
        with _checkpointer_postgres() as saver:
            yield saver
    else:
        yield _quicksave()


@pytest.fixture(params=_ids("memsaver", "pgsaver_aio", "quicksave"))
async def async_checkpointer(request, quicksave_db):
    if request.param == "memsaver":
        with _checkpointer_memory() as saver:
            yield saver
    elif request.param == "pgsaver_aio":
        async with _checkpointer_postgres_aio() as saver:
            yield saver
    else:
        yield _quicksave()
'''

PYTEST_INI = """\
[pytest]
addopts = --strict-markers --snapshot-warn-unused -p no:cacheprovider -p no:django
asyncio_default_fixture_loop_scope = function
"""


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog="Arguments after -- go to pytest (-k, -x...)."
    )
    parser.add_argument(
        "checkout", type=Path, help="a langgraph checkout (holds libs/langgraph/tests) or unpacked sdist (tests/)"
    )
    parser.add_argument("--workdir", type=Path, help="where to build and run (default: a new temporary directory)")
    parser.add_argument("--files", nargs="+", default=list(GRAPH_TESTS), help="test files of libs/langgraph/tests")
    parser.add_argument("--savers", default=",".join(SAVERS), help="comma-separated, of: " + ", ".join(SAVERS))
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL"), help="default: DATABASE_URL")
    parser.add_argument("--test-database", default="test_quicksave_lg_own", help="the Django test database's name")
    parser.add_argument(
        "--postgres-url", help="server URL for PostgresSaver's per-test databases (default: DATABASE_URL's server)"
    )
    parser.add_argument(
        "--json", action="store_true", help="end with one JSON line of the counts (for bench/compare.py)"
    )
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    pytest_args = argv[split + 1 :]

    tests = tests_of(args.checkout)
    if tests is None:
        parser.error(f"{args.checkout} holds neither libs/langgraph/tests nor tests/ with a conftest.py")
    if not args.database_url:
        parser.error("set DATABASE_URL or --database-url (a PostgreSQL database Quicksave may use)")
    savers = [name for name in args.savers.split(",") if name]
    if unknown := set(savers) - set(SAVERS):
        parser.error(f"unknown savers: {', '.join(sorted(unknown))}")
    postgres_url = args.postgres_url or server_url(args.database_url)
    if not postgres_url.endswith("/"):
        postgres_url += "/"

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="lgtests-"))
    build(tests, workdir, postgres_url)
    junit = workdir / "junit.xml"
    command = [
        sys.executable, "-m", "pytest", "-c", str(workdir / "pytest.ini"), "--rootdir", str(workdir),
        f"--junitxml={junit}", "-q", *[f"tests/{name}" for name in args.files], *pytest_args,
    ]  # fmt: skip
    env = {
        **os.environ,
        "QS_REPO": str(REPO),
        "QS_SAVERS": ",".join(savers),
        "DATABASE_URL": args.database_url,
        "DATABASE_TEST_NAME": args.test_database,
        "QUICKSAVE_TESTING": "1",
        # LangGraph's stores and caches in memory only (its Postgres and Redis ones are not
        # what is tested here); the savers are the ones asked for.
        "NO_DOCKER": "true",
    }
    print("workdir:", workdir, flush=True)
    print("running:", shlex.join(command), flush=True)
    returncode = subprocess.call(command, cwd=workdir, env=env)
    if junit.is_file():
        counts = report(junit, savers)
        if args.json:
            print(json.dumps(counts))
    return returncode


def tests_of(checkout: Path) -> Path | None:
    """LangGraph's tests in `checkout`: a repository checkout's libs/langgraph/tests, or the
    tests/ at the top of an unpacked langgraph sdist; None when it holds neither."""
    for tests in (checkout / "libs" / "langgraph" / "tests", checkout / "tests"):
        if (tests / "conftest.py").is_file() and (tests / "conftest_checkpointer.py").is_file():
            return tests
    return None


def server_url(database_url: str) -> str:
    """The URL of `database_url`'s server, without the database."""
    parts = urlsplit(database_url)
    return urlunsplit((parts.scheme, parts.netloc, "/", "", ""))


def build(tests: Path, workdir: Path, postgres_url: str) -> None:
    """LangGraph's tests in workdir/tests, set up for the savers (see the module docstring)."""
    target = workdir / "tests"
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(tests, target, ignore=shutil.ignore_patterns("__pycache__"))
    for module in ("conftest_checkpointer.py", "conftest_store.py"):
        path = target / module
        text, found = re.subn(
            r"^DEFAULT_POSTGRES_URI = .*$", f"DEFAULT_POSTGRES_URI = {postgres_url!r}", path.read_text(), flags=re.M
        )
        if not found:
            raise SystemExit(f"{path}: no DEFAULT_POSTGRES_URI to point at {postgres_url}")
        path.write_text(text)
    (target / "quicksave_harness.py").write_text(HARNESS)
    conftest = target / "conftest.py"
    conftest.write_text(
        conftest.read_text()
        + "\n\n# Added by Quicksave's bench/langgraph_own_tests.py: these replace the fixtures above.\n"
        + "from tests.quicksave_harness import async_checkpointer, quicksave_db, sync_checkpointer  # noqa\n"
    )
    for snapshots in (target / "__snapshots__").glob("*.ambr"):
        snapshots.write_text(with_saver_snapshots(snapshots.read_text()))
    (workdir / "pytest.ini").write_text(PYTEST_INI)


def with_saver_snapshots(ambr: str) -> str:
    """The syrupy file with each `[memory...]` entry also under every saver's test id."""
    # The file's first entry follows its `# serializer version: ...` line: an entry starts at its name.
    blocks = [block[block.find("# name: ") :] if "# name: " in block else block for block in ambr.split("# ---\n")]
    names = {block.split("\n", 1)[0] for block in blocks}
    extra = []
    for block in blocks:
        head = block.split("\n", 1)[0]
        if not head.startswith("# name: ") or not re.search(r"[\[-]memory[\]-]", head):
            continue
        for saver_id in ("memsaver", "pgsaver", "pgsaver_aio", "quicksave"):
            copy = re.sub(r"([\[-])memory([\]-])", rf"\g<1>{saver_id}\g<2>", block, count=1)
            if copy.split("\n", 1)[0] not in names:
                extra.append(copy)
    if not extra:
        return ambr
    return ambr + "".join(block + "# ---\n" for block in extra)


def saver_of(name: str) -> str:
    """The saver a test id ran with (`-` when it is not parametrized by saver)."""
    params = re.search(r"\[(.*)\]$", name)
    if params:
        tokens = set(params.group(1).split("-"))
        for saver, ids in IDS.items():
            if tokens & set(ids):
                return saver
    return "-"


def without_saver(name: str) -> str:
    """The test id with its saver's param left out: the same test under every saver."""
    test, _, params = name.partition("[")
    ids = {saver_id for saver_ids in IDS.values() for saver_id in saver_ids}
    rest = [token for token in params.rstrip("]").split("-") if token not in ids]
    return f"{test}[{'-'.join(rest)}]" if rest else test


def report(junit: Path, savers: list[str]) -> dict[str, int]:
    """Print the counts per saver and the tests failed by QuicksaveSaver alone; return them flat
    (`<saver>_passed`, ..., `quicksave_only_failed`)."""
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    outcome: dict[tuple[str, str], dict[str, tuple[str, str]]] = defaultdict(dict)
    for case in ET.parse(junit).getroot().iter("testcase"):  # noqa: S314 - pytest's own file
        name, module = case.get("name", ""), case.get("classname", "")
        failed = case.find("failure") if case.find("failure") is not None else case.find("error")
        state = "failed" if failed is not None else "skipped" if case.find("skipped") is not None else "passed"
        saver = saver_of(name)
        counts[saver][state] += 1
        message = (failed.get("message") or "").strip().splitlines()[0][:160] if failed is not None else ""
        outcome[(module, without_saver(name))][saver] = (state, message)
    print("\nper saver (passed / failed / skipped):")
    for saver in [*savers, "-"]:
        found = counts.get(saver, Counter())
        print(f"  {saver:10} {found['passed']:5} / {found['failed']:4} / {found['skipped']:4}")
    only = [
        (key, runs["quicksave"][1])
        for key, runs in sorted(outcome.items())
        if runs.get("quicksave", ("",))[0] == "failed"
        and all(runs.get(other, ("passed",))[0] != "failed" for other in ("memory", "postgres"))
    ]
    print(f"\nfailed with QuicksaveSaver only ({len(only)}):")
    for (module, name), message in only:
        print(textwrap.shorten(f"  {module}::{name}  {message}", 220))
    flat = {f"{saver}_{state}": counts[saver][state] for saver in savers for state in ("passed", "failed", "skipped")}
    return {**flat, "quicksave_only_failed": len(only)}


if __name__ == "__main__":
    sys.exit(main())
