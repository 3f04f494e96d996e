"""manage.py verify_integrity: every thread is checked, and every failure is reported, not only the first."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from agents.models import Agent
from checkpoints import crypto, store
from checkpoints.models import Checkpoint, Thread, ThreadKey


def _written(agent: Agent, steps: int = 3) -> tuple[Thread, list[Checkpoint]]:
    thread = store.create_thread(agent=agent)[0]
    written = [store.append_checkpoint(thread=thread, parent=None, state={"n": 0, "card": "4111-1111"})]
    for n in range(1, steps):
        written.append(store.append_checkpoint(thread=thread, parent=written[-1], patch=[
            {"op": "replace", "path": "/n", "value": n}
        ]))  # fmt: skip
    return thread, written


def _raw(sql: str, params: list[Any]) -> None:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


def _forget_everything() -> None:
    store.clear_caches()
    crypto.forget_keys()


def test_verify_integrity_reports_an_unreadable_thread_and_checks_the_rest(agent: Agent, capsys: Any) -> None:
    tampered, _ = _written(agent)
    unknown_master, _ = _written(agent)
    _, altered_rows = _written(agent)
    healthy, _ = _written(agent)
    wrapped = bytearray(ThreadKey.objects.get(thread=tampered).wrapped)
    wrapped[-1] ^= 0xFF
    _raw("UPDATE checkpoints_threadkey SET wrapped = %s WHERE thread_id = %s", [bytes(wrapped), tampered.pk])
    _raw("UPDATE checkpoints_threadkey SET master_key_id = 'gone' WHERE thread_id = %s", [unknown_master.pk])
    _raw("UPDATE checkpoints_checkpoint SET step = 42 WHERE id = %s", [altered_rows[1].pk])
    _forget_everything()

    with pytest.raises(CommandError, match="3 of 4 thread"):
        call_command("verify_integrity")

    out = capsys.readouterr().out
    assert f"thread {tampered.pk}" in out and "does not unwrap" in out
    assert f"thread {unknown_master.pk}" in out and "'gone'" in out
    # The threads after the unreadable ones were still checked.
    assert f"checkpoint {altered_rows[1].pk}" in out
    assert str(healthy.pk) not in out
