#!/usr/bin/env python3
"""Quicksave's developer entry point: one command to run the app, one to test it.

    python3 dev.py run [--host HOST] [--port PORT]   venv, migrate, admin user, demo data, serve
    python3 dev.py stop                              stop the server and the embedded PostgreSQL
    python3 dev.py reset-demo [--yes]                delete the demo threads and seed them again
    python3 dev.py reset-password                    a new admin password, kept in var/admin-password
    python3 dev.py test [-- PYTEST ARGS]             venv, ruff, ruff format --check, mypy, pytest + coverage
                                                     (and the pgvector tests on the embedded PostgreSQL)
    python3 dev.py lint                              ruff, ruff format --check, mypy
    python3 dev.py fmt                               ruff format, ruff check --fix
    python3 dev.py lock                              re-make the lock files after a requirements*.txt change

Both install from lock files (every package pinned with its hashes, made by uv from the
requirements*.txt next to them), then the local SDK on its own (it has no hash).

Standard library only: it runs before .venv exists. With DATABASE_URL unset,
settings.py starts an embedded PostgreSQL under var/ on first use.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn
from urllib.parse import parse_qs, urlparse

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
VENV_BIN = VENV / "bin"
PYTHON = VENV_BIN / "python"
RUFF = VENV_BIN / "ruff"
REQUIREMENTS = ROOT / "requirements.txt"
REQUIREMENTS_DEV = ROOT / "requirements-dev.txt"
FRAMEWORK_REQUIREMENTS = tuple(
    ROOT / f"requirements-{name}.txt" for name in ("langgraph", "pydantic-ai", "adk", "openai-agents")
)
SDK = ROOT / "sdk"
# Each lock file and what it is made from (the SDK's own dependencies go in the test set's).
LOCKS: dict[Path, tuple[Path, ...]] = {
    # `run` serves the demo agents of every framework, so it installs each integration's
    # optional requirements too; the core itself needs only requirements.txt.
    ROOT / "requirements.lock": (REQUIREMENTS, *FRAMEWORK_REQUIREMENTS),
    ROOT / "requirements-dev.lock": (REQUIREMENTS_DEV, SDK / "pyproject.toml"),
}
RUNTIME_LOCK, DEV_LOCK = LOCKS
PIN = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==(\S+)")
DEFAULT_CHROMIUM = "/usr/bin/chromium"


def step(title: str) -> None:
    print(f"==> {title}", flush=True)


def run(*args: str | Path) -> None:
    subprocess.run([str(arg) for arg in args], cwd=ROOT, check=True)


def manage(*args: str) -> None:
    run(PYTHON, "manage.py", *args)


def exec_python(*args: str) -> NoReturn:
    """Replace this process, so Ctrl-C and SIGTERM reach the server or pytest directly."""
    sys.stdout.flush()
    os.execv(PYTHON, [str(PYTHON), *args])  # noqa: S606  (fixed argv, no shell)


# --- virtualenv ----------------------------------------------------------------------------------


def requirement_files(path: Path) -> list[Path]:
    """`path` and every file it pulls in with `-r`, recursively."""
    files = [path]
    for line in path.read_text().splitlines():
        match = re.match(r"\s*(?:-r|--requirement)[\s=]+(\S+)", line)
        if match:
            files += requirement_files(path.parent / match.group(1))
    return files


def fingerprint(paths: Sequence[Path]) -> str:
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def stamp_path(source: Path) -> Path:
    return VENV / f".quicksave-{source.relative_to(ROOT).as_posix().replace('/', '-')}.sha256"


def is_current(source: Path, files: Sequence[Path]) -> bool:
    stamp = stamp_path(source)
    return stamp.exists() and stamp.read_text().strip() == fingerprint(files)


def mark_current(source: Path, files: Sequence[Path]) -> None:
    stamp_path(source).write_text(fingerprint(files) + "\n")


def pins(path: Path) -> dict[str, str]:
    """`name==version` pins of a requirements or lock file, names normalised (PEP 503)."""
    found = {}
    for line in path.read_text().splitlines():
        match = PIN.match(line.strip())
        if match:
            found[re.sub(r"[-_.]+", "-", match.group(1)).lower()] = match.group(2)
    return found


def check_lock(lock: Path) -> None:
    """Fail when a requirements file pins what its lock file does not: someone forgot `dev.py lock`."""
    locked = pins(lock)
    sources = [path for source in LOCKS[lock] if source.suffix == ".txt" for path in requirement_files(source)]
    for requirements in sources:
        stale = [f"{name}=={version}" for name, version in pins(requirements).items() if locked.get(name) != version]
        if stale:
            sys.exit(
                f"dev.py: {requirements.name} pins {', '.join(stale)}, which {lock.name} does not: "
                "run `python3 dev.py lock` and commit the lock files"
            )


def create_venv() -> None:
    if not PYTHON.exists():
        step(f"create virtualenv {VENV.relative_to(ROOT)}/")
        run(sys.executable, "-m", "venv", VENV)


def ensure_venv(lock: Path) -> None:
    """Create .venv if missing and install `lock`, hashes checked, unless unchanged since the last install."""
    check_lock(lock)
    create_venv()
    if is_current(lock, [lock]):
        print(f"    {lock.name} unchanged since the last install")
        return
    # --no-deps: the lock already is the whole closure. Without it pip resolves each package's own
    # requirements again, and pip 23.2 takes an extra (pytest-cov's `coverage[toml]>=…`) as a new,
    # unpinned requirement, failing hash-checking as soon as PyPI has a newer release than the pin.
    step(f"pip install --no-deps --require-hashes -r {lock.name}")
    quiet = ("--quiet", "--disable-pip-version-check")
    run(PYTHON, "-m", "pip", "install", *quiet, "--no-deps", "--require-hashes", "-r", lock)
    mark_current(lock, [lock])


def ensure_sdk() -> None:
    """The local SDK, editable; its dependencies are in the test set's lock, so none are fetched here."""
    pyproject = SDK / "pyproject.toml"
    if not pyproject.exists() or is_current(pyproject, [pyproject]):
        return
    step("pip install --no-deps -e sdk")
    run(PYTHON, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps", "-e", SDK)
    mark_current(pyproject, [pyproject])


def use_venv_environment() -> None:
    """Children (manage.py, tests that spawn processes) see the venv first on PATH."""
    os.environ["PYTHONUNBUFFERED"] = "1"
    os.environ["VIRTUAL_ENV"] = str(VENV)
    os.environ["PATH"] = f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"
    os.environ.pop("PYTHONHOME", None)


# --- database, static files, browser ---------------------------------------------------------------


def var_dir() -> Path:
    return ROOT / os.environ.get("QUICKSAVE_VAR_DIR", "var")  # an absolute value replaces ROOT


def log_file() -> Path:
    """Every log line of `run` (the server's, uvicorn's, libraries' warnings); the console keeps Quicksave's own."""
    return var_dir() / "log" / "quicksave.log"


def server_pid_file() -> Path:
    return var_dir() / "run" / "server.pid"


def shown(path: Path) -> str:
    """`path` as a person types it from the checkout (var/log/quicksave.log), or absolute when outside it."""
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def describe_database() -> str:
    """Where the data goes, without the password."""
    url = os.environ.get("DATABASE_URL", "")
    if not url:
        return f"embedded PostgreSQL under {var_dir() / 'pgdata'} (DATABASE_URL is unset)"
    parsed = urlparse(url)
    host = parsed.hostname or parse_qs(parsed.query).get("host", ["local socket"])[-1]
    try:
        port = f":{parsed.port}" if parsed.port else ""
    except ValueError:
        port = ":?"
    user = f"{parsed.username}@" if parsed.username else ""
    return f"PostgreSQL at {user}{host}{port}{parsed.path} (DATABASE_URL)"


def static_sources() -> list[Path]:
    """static/ and every app's <app>/static/ — not var/ (where they are collected) nor dot folders."""
    skip = {var_dir().resolve(), VENV.resolve()}
    found = [ROOT / "static", *ROOT.glob("*/static")]
    return sorted(
        p for p in found if p.is_dir() and p.parent.resolve() not in skip and not p.parent.name.startswith(".")
    )


def static_fingerprint() -> str:
    # Installed apps (admin, API docs) ship static files too: a requirements change re-collects.
    digest = hashlib.sha256(fingerprint([RUNTIME_LOCK]).encode())
    for source in static_sources():
        for path in sorted(source.rglob("*")):
            if path.is_file():
                info = path.stat()
                digest.update(f"{path.relative_to(ROOT)}:{info.st_size}:{info.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def collectstatic_if_needed() -> None:
    stamp = var_dir() / "static" / ".quicksave-collected"
    current = static_fingerprint()
    if stamp.exists() and stamp.read_text().strip() == current:
        print("    static files up to date")
        return
    step("collectstatic")
    manage("collectstatic", "--noinput", "--verbosity", "0")
    stamp.parent.mkdir(parents=True, exist_ok=True)
    stamp.write_text(current + "\n")


def has_management_command(name: str) -> bool:
    listing = subprocess.run(
        [str(PYTHON), "manage.py", "help", "--commands"], cwd=ROOT, check=True, capture_output=True, text=True
    )
    return name in listing.stdout.split()


def require_test_tools() -> None:
    """Stop before a long run whose browser, Redis or PgBouncer tests could only fail: they never skip."""
    chromium = os.environ.get("QUICKSAVE_CHROMIUM") or DEFAULT_CHROMIUM
    missing = []
    if not os.access(chromium, os.X_OK):
        missing.append(f"Chromium at {chromium}: apt-get install chromium, or set QUICKSAVE_CHROMIUM to a Chromium")
    if shutil.which("redis-server") is None:
        missing.append("redis-server on PATH: apt-get install redis-server")
    if shutil.which("pgbouncer") is None:
        missing.append("pgbouncer on PATH (the deployment test runs Quicksave through it): apt-get install pgbouncer")
    if missing:
        sys.exit("dev.py test needs " + "; and ".join(missing))
    os.environ["QUICKSAVE_CHROMIUM"] = chromium


# --- commands --------------------------------------------------------------------------------------


def lint() -> None:
    step("ruff check")
    run(RUFF, "check", ".")
    step("ruff format --check")
    run(RUFF, "format", "--check", ".")
    step("mypy")
    run(PYTHON, "-m", "mypy", ".")
    step("lint-imports")
    # The package map of ARCHITECTURE.md: no import cycles, the core never imports an integration.
    run(VENV_BIN / "lint-imports")


def manage_logged(*args: str, log: Path) -> None:
    """manage.py with its output on the console and its standard error (log lines: the demo's
    deliberate failures, libraries' warnings) appended to `log`; shown here only when it fails."""
    result = subprocess.run([str(PYTHON), "manage.py", *args], cwd=ROOT, stderr=subprocess.PIPE, check=False)
    with open(log, "ab") as handle:
        handle.write(result.stderr)
    if result.returncode:
        tail = result.stderr.decode(errors="replace").strip().splitlines()[-15:]
        print("\n".join(tail), file=sys.stderr)
        raise subprocess.CalledProcessError(result.returncode, ["manage.py", *args])


def running_pid(pid_file: Path, *names: str, forget_stale: bool = True) -> int | None:
    """The pid in `pid_file` when that process is alive and its command line names each of `names`
    (a pid the system gave to another program since is not ours); a stale file of ours is removed."""
    try:
        pid = int(pid_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        if forget_stale:
            pid_file.unlink(missing_ok=True)
        return None
    except PermissionError:
        pass  # alive, another user's: the embedded PostgreSQL runs as `pgserver` under root
    cmdline = Path(f"/proc/{pid}/cmdline")
    if cmdline.exists() and not all(name.encode() in cmdline.read_bytes() for name in names):
        if forget_stale:
            pid_file.unlink(missing_ok=True)
        return None
    return pid


def server_pid() -> int | None:
    return running_pid(server_pid_file(), "uvicorn", "quicksave.asgi")


def box(lines: list[str]) -> str:
    width = max(len(line) for line in lines)
    rule = "+" + "-" * (width + 2) + "+"
    return "\n".join([rule, *(f"| {line.ljust(width)} |" for line in lines), rule])


def wait_until_serving(process: subprocess.Popen[bytes], url: str, timeout: float = 180) -> bool:
    """Whether the server answers /healthz (any status: it is serving) before it exits or `timeout` passes."""
    deadline = time.monotonic() + timeout
    while process.poll() is None and time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "healthz", timeout=2):  # noqa: S310  (our own http:// URL)
                return True
        except urllib.error.HTTPError:
            return True  # 503 while a dependency is down: serving all the same
        except OSError:
            time.sleep(0.25)
    return False


def command_run(host: str, port: int) -> int:
    ensure_venv(RUNTIME_LOCK)
    if pid := server_pid():
        sys.exit(f"dev.py: Quicksave is already running (pid {pid}); stop it with `python3 dev.py stop` first")
    log = log_file()
    log.parent.mkdir(parents=True, exist_ok=True)
    print(f"    database: {describe_database()}", flush=True)
    print(f"    log: {shown(log)} has every line; this console keeps Quicksave's own", flush=True)
    step("migrate")
    with open(log, "ab") as handle:
        result = subprocess.run([str(PYTHON), "manage.py", "migrate", "--noinput"], cwd=ROOT, stdout=handle,
                                stderr=subprocess.STDOUT, check=False)  # fmt: skip
    if result.returncode:
        print("\n".join(log.read_text(errors="replace").splitlines()[-15:]), file=sys.stderr)
        raise subprocess.CalledProcessError(result.returncode, ["manage.py", "migrate"])
    step("ensureadmin")
    manage_logged("ensureadmin", log=log)
    collectstatic_if_needed()
    if has_management_command("seed_demo"):
        step("seed_demo")
        manage_logged("seed_demo", log=log)
    sign_in = subprocess.run([str(PYTHON), "manage.py", "ensureadmin", "--describe"], cwd=ROOT, check=True,
                             capture_output=True, text=True).stdout.splitlines()  # fmt: skip
    shown_host = "127.0.0.1" if host in ("0.0.0.0", "::") else (f"[{host}]" if ":" in host else host)  # noqa: S104
    url = f"http://{shown_host}:{port}/"
    step(f"serve {url}")
    return serve(host, port, url, [
        f"Quicksave is running at {url}", *sign_in,
        f"Log          {shown(log)}",
        "Stop         Ctrl-C, or python3 dev.py stop (stops PostgreSQL too)",
        "Demo again   python3 dev.py reset-demo",
    ])  # fmt: skip


def serve(host: str, port: int, url: str, ready_lines: list[str]) -> int:
    """Run uvicorn as a child (its pid in var/run/server.pid for `dev.py stop`), print the closing box once
    it answers, and pass it the signals this process gets; its exit status is ours."""
    # Two malloc arenas, as the production image has them (deploy/Dockerfile).
    env = {"MALLOC_ARENA_MAX": "2", **os.environ, "QUICKSAVE_LOG_FILE": str(log_file())}
    # A process group of its own: Ctrl-C reaches it once, from here (twice, uvicorn would not shut down cleanly).
    process = subprocess.Popen(
        # The options of quicksave/serving.py (this script runs before the venv exists, so it cannot import it).
        [str(PYTHON), "-m", "uvicorn", "quicksave.asgi:application", "--host", host, "--port", str(port),
         "--ws-per-message-deflate", "false"],
        cwd=ROOT, env=env, process_group=0,
    )  # fmt: skip
    pid_file = server_pid_file()
    pid_file.parent.mkdir(parents=True, exist_ok=True)
    pid_file.write_text(f"{process.pid}\n")

    def forward(signum: int, frame: object) -> None:
        if process.poll() is None:
            process.send_signal(signum)

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, forward)
    try:
        if wait_until_serving(process, url):
            print(box(ready_lines), flush=True)
        elif process.poll() is None:
            print(f"dev.py: the server has not answered yet; see {shown(log_file())}", file=sys.stderr, flush=True)
        code = process.wait()
    finally:
        if pid_file.exists() and pid_file.read_text().strip() == str(process.pid):
            pid_file.unlink()
    if code not in (0, -signal.SIGINT, -signal.SIGTERM):
        print(f"dev.py: the server stopped (exit {code}); the end of {shown(log_file())}:", file=sys.stderr)
        print("\n".join(log_file().read_text(errors="replace").splitlines()[-15:]), file=sys.stderr)
        return code if code > 0 else 1
    return 0


def command_stop() -> None:
    """Stop the server `run` started, then the embedded PostgreSQL (never a server DATABASE_URL names)."""
    if pid := server_pid():
        os.kill(pid, signal.SIGTERM)
        print(f"stopping the server (pid {pid})…", flush=True)
        if not wait_for_exit(pid, 30):
            sys.exit(f"dev.py: the server (pid {pid}) is still running after 30 s; kill it with `kill -9 {pid}`")
        server_pid_file().unlink(missing_ok=True)
        print("    the server stopped")
    else:
        print("    the server is not running")
    if os.environ.get("DATABASE_URL"):
        print(f"    database: {describe_database()}: not ours to stop")
        return
    postmaster = var_dir() / "pgdata" / "postmaster.pid"
    if pid := running_pid(postmaster, "postgres", forget_stale=False):  # PostgreSQL minds its own file
        try:
            os.kill(pid, signal.SIGINT)  # PostgreSQL's fast shutdown: sessions end, the data is kept
        except PermissionError:
            sys.exit(f"dev.py: PostgreSQL (pid {pid}) runs as another user; stop it as that user or as root")
        print(f"stopping the embedded PostgreSQL (pid {pid})…", flush=True)
        if not wait_for_exit(pid, 60):
            sys.exit(f"dev.py: PostgreSQL (pid {pid}) is still running after 60 s")
        print("    the embedded PostgreSQL stopped")
    else:
        print("    the embedded PostgreSQL is not running")


def wait_for_exit(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            pass
        time.sleep(0.1)
    return False


def command_reset_demo(yes: bool) -> None:
    ensure_venv(RUNTIME_LOCK)
    log_file().parent.mkdir(parents=True, exist_ok=True)
    manage_logged("reset_demo", *(["--yes"] if yes else []), log=log_file())


def command_reset_password() -> None:
    ensure_venv(RUNTIME_LOCK)
    manage("ensureadmin", "--reset-password")


def pgvector_pass(pytest_args: Sequence[str]) -> None:
    """The tests marked `pgvector` on the embedded PostgreSQL, which has the extension, when
    DATABASE_URL names a server that may not; the main pass then deselects them (on a server
    without the extension they would fail, never skip)."""
    if not os.environ.get("DATABASE_URL"):
        return  # the main run is on the embedded server: they run there
    step("pytest -m pgvector on the embedded PostgreSQL (DATABASE_URL unset for this pass)")
    env = {key: value for key, value in os.environ.items() if key != "DATABASE_URL"}
    args = [str(PYTHON), "-m", "pytest", "-m", "pgvector", "--no-cov", "-q", *pytest_args]
    # 5: none of the selected tests needs pgvector.
    if subprocess.run(args, cwd=ROOT, env=env, check=False).returncode not in (0, 5):
        sys.exit("dev.py: the pgvector tests failed on the embedded PostgreSQL")
    # They passed there: the main pass leaves them out instead of failing on a server without it.
    os.environ["QUICKSAVE_PGVECTOR_TESTS_RAN"] = "1"


def command_test(pytest_args: Sequence[str]) -> NoReturn:
    ensure_venv(DEV_LOCK)
    ensure_sdk()
    print(f"    database: {describe_database()}", flush=True)
    require_test_tools()
    lint()
    pgvector_pass(pytest_args)
    step("pytest " + " ".join(pytest_args))
    # pytest's own exit status goes straight to the caller; 5 ("no tests collected") is non-zero, so a failure.
    exec_python("-m", "pytest", *pytest_args)


def command_lint() -> None:
    ensure_venv(DEV_LOCK)
    lint()


def command_fmt() -> None:
    ensure_venv(DEV_LOCK)
    step("ruff format")
    run(RUFF, "format", ".")
    step("ruff check --fix")
    run(RUFF, "check", "--fix", ".")


def command_lock() -> None:
    """Resolve each lock file again from its requirements, keeping every pin they do not change."""
    create_venv()
    uv = VENV_BIN / "uv"
    if not uv.exists():  # uv is in the test set; the lock being re-made may not be installable yet
        version = pins(REQUIREMENTS_DEV)["uv"]
        run(PYTHON, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", f"uv=={version}")
    for lock, sources in LOCKS.items():
        step(f"uv pip compile {' '.join(source.relative_to(ROOT).as_posix() for source in sources)} -> {lock.name}")
        inputs = [source.relative_to(ROOT).as_posix() for source in sources]
        # --universal: one lock for every platform and Python >= 3.11, not just this machine's.
        run(uv, "pip", "compile", "--quiet", "--generate-hashes", "--universal", "--python-version", "3.11",
            *inputs, "--output-file", lock.name)  # fmt: skip


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """Split off everything after `--` (passed to pytest) and parse the rest."""
    extra: list[str] = []
    if "--" in argv:
        extra = argv[argv.index("--") + 1 :]
        argv = argv[: argv.index("--")]
    parser = argparse.ArgumentParser(prog="dev.py", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("run", help="set everything up and serve the dashboard")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    commands.add_parser("stop", help="stop the server `run` started and the embedded PostgreSQL")
    reset = commands.add_parser("reset-demo", help="delete the demo threads and seed them again (asks first)")
    reset.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    commands.add_parser("reset-password", help="give the admin a new password, kept in var/admin-password")
    commands.add_parser("test", help="lint, type-check and run the whole test suite (pytest args after --)")
    commands.add_parser("lint", help="ruff, ruff format --check, mypy, lint-imports")
    commands.add_parser("fmt", help="ruff format, ruff check --fix")
    commands.add_parser("lock", help="re-make requirements*.lock from requirements*.txt (uv, with hashes)")
    args = parser.parse_args(argv)
    if extra and args.command != "test":
        parser.error("only `test` takes arguments after --")
    return args, extra


def main(argv: list[str]) -> int:
    if sys.version_info < (3, 11):  # noqa: UP036  (a newcomer may run it with an older system python)
        print(f"dev.py needs Python 3.11+, this is {sys.version.split()[0]}", file=sys.stderr)
        return 2
    args, pytest_args = parse(argv)
    os.chdir(ROOT)
    use_venv_environment()
    try:
        if args.command == "run":
            return command_run(args.host, args.port)
        elif args.command == "stop":
            command_stop()
        elif args.command == "reset-demo":
            command_reset_demo(args.yes)
        elif args.command == "reset-password":
            command_reset_password()
        elif args.command == "test":
            command_test(pytest_args)
        elif args.command == "lint":
            command_lint()
        elif args.command == "lock":
            command_lock()
        else:
            command_fmt()
    except subprocess.CalledProcessError as failed:
        print(f"dev.py: failed (exit {failed.returncode}): {' '.join(map(str, failed.cmd))}", file=sys.stderr)
        return failed.returncode or 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
