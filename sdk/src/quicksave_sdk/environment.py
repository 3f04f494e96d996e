"""Environment references: record what the world looked like at a checkpoint, and check it still
does before a fork resumes from there.

A reference is ``{"kind", "locator", "digest"}`` (kinds: git, image, object, file, snapshot), kept
in the checkpoint's ``metadata["environment"]``; the server refuses any other shape, naming the
field and the limit. ``Client.serve(handle, verify_environment=check_local)`` checks a fork's
references before ``handle`` sees the run: a mismatch fails the thread at that checkpoint with a
message saying what changed, and the run is not handed to ``handle``.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from collections.abc import Callable, Iterable
from pathlib import Path

Reference = dict[str, str]
Verifier = Callable[[list[Reference]], list[str]]


def git(path: str | Path) -> Reference:
    """The commit a git checkout at `path` is on."""
    return {"kind": "git", "locator": str(path), "digest": _git_head(Path(path))}


def file(path: str | Path) -> Reference:
    """A file's SHA-256."""
    return {"kind": "file", "locator": str(path), "digest": "sha256:" + _sha256(Path(path))}


def check_local(references: Iterable[Reference]) -> list[str]:
    """What no longer matches, one sentence each, for the references this machine can check (git
    checkouts and files); other kinds are left to the caller's own verifier."""
    changed = []
    for reference in references:
        kind, locator, digest = reference["kind"], reference["locator"], reference["digest"]
        try:
            if kind == "git":
                now = _git_head(Path(locator))
                if not (len(digest) >= 7 and now.startswith(digest)):
                    changed.append(f"git {locator} is at {now[:12]}, not {digest[:12]}")
            elif kind == "file":
                now = "sha256:" + _sha256(Path(locator))
                if now != digest:
                    changed.append(f"file {locator} has {now[:19]}…, not {digest[:19]}…")
        except (OSError, subprocess.CalledProcessError) as exc:
            changed.append(f"{kind} {locator} cannot be read here ({type(exc).__name__})")
    return changed


def _git_head(path: Path) -> str:
    program = shutil.which("git")
    if program is None:
        raise FileNotFoundError("git is not installed here")
    # A fixed argv, no shell: the path is one argument whatever it holds.
    done = subprocess.run(  # noqa: S603
        [program, "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True, check=True, timeout=30
    )  # fmt: skip
    return done.stdout.strip()


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
