"""The worker's and the integrity check's command-line options: a value they cannot work with is a
one-line CommandError, not a hang or a traceback."""

from __future__ import annotations

from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from checkpoints import storage
from checkpoints.models import Thread


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [("--poll", "nan", "poll interval"), ("--poll", "inf", "poll interval"), ("--poll", "0", "poll interval"),
     ("--poll", "-1", "poll interval"), ("--lease", "-5", "lease")],
)  # fmt: skip
def test_run_agents_refuses_an_interval_it_would_hang_or_spin_on(
    db: Any, option: str, value: str, message: str
) -> None:
    """`--poll nan` used to block for ever in the notification wait, deaf to SIGTERM."""
    with pytest.raises(CommandError, match=message):
        call_command("run_agents", "--once", option, value, stderr=StringIO())


def test_verify_integrity_names_a_thread_id_that_is_no_uuid(db: Any) -> None:
    with pytest.raises(CommandError, match="takes a thread id"):
        call_command("verify_integrity", "--thread", "garbage", stdout=StringIO())


def test_verify_integrity_of_an_unknown_thread_is_an_error_not_an_ok(db: Any) -> None:
    with pytest.raises(CommandError, match="No thread has the id 00000000-0000-0000-0000-000000000000"):
        call_command("verify_integrity", "--thread", "00000000-0000-0000-0000-000000000000", stdout=StringIO())


def test_verify_integrity_of_one_thread_checks_it(thread: Thread) -> None:
    storage.append_checkpoint(thread=thread, parent=None, state={"a": 1})
    out = StringIO()

    call_command("verify_integrity", "--thread", str(thread.pk), stdout=out)

    assert out.getvalue().startswith("OK: every checkpoint in 1 thread(s)")
