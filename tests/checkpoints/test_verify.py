"""manage.py verify_integrity: every thread is checked, and every failure is reported, not only the first."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.urls import reverse
from rest_framework.test import APIClient

from checkpoints import storage
from checkpoints.models import Checkpoint, Thread, ThreadKey
from checkpoints.storage import codec, crypto
from checkpoints.storage.errors import IntegrityFailure
from quicksave_agents.models import Agent
from tests.conftest import person, signed_in


def _written(agent: Agent, steps: int = 3) -> tuple[Thread, list[Checkpoint]]:
    thread = storage.create_thread(agent=agent)[0]
    written = [storage.append_checkpoint(thread=thread, parent=None, state={"n": 0, "card": "4111-1111"})]
    for n in range(1, steps):
        written.append(storage.append_checkpoint(thread=thread, parent=written[-1], patch=[
            {"op": "replace", "path": "/n", "value": n}
        ]))  # fmt: skip
    return thread, written


def _raw(sql: str, params: list[Any]) -> None:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


def _forget_everything() -> None:
    storage.clear_caches()
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


def test_a_back_dated_checkpoint_fails_verify_integrity_and_its_replay(agent: Agent, capsys: Any) -> None:
    _, written = _written(agent)
    _raw(
        "UPDATE checkpoints_checkpoint SET created_at = created_at - interval '3 days' WHERE id = %s",
        [written[1].pk],
    )
    _forget_everything()

    with pytest.raises(CommandError, match="1 checkpoint"):
        call_command("verify_integrity")
    assert f"checkpoint {written[1].pk}: row does not match its integrity MAC" in capsys.readouterr().out
    with pytest.raises(IntegrityFailure):
        storage.state_at(written[1])


def test_a_rolled_back_head_pointer_is_reported_and_the_api_serves_the_true_head(
    agent: Agent, owner_client: APIClient, capsys: Any
) -> None:
    thread, written = _written(agent)
    _raw("UPDATE checkpoints_thread SET head_id = %s WHERE id = %s", [written[0].pk, thread.pk])
    _forget_everything()

    with pytest.raises(CommandError, match="1 of 1 thread"):
        call_command("verify_integrity")
    out = capsys.readouterr().out
    assert f"FAILED thread {thread.pk}: its head points to checkpoint {written[0].pk}" in out
    assert str(written[-1].pk) in out

    detail = owner_client.get(f"/api/v1/threads/{thread.pk}/").json()
    assert (detail["head"]["id"], detail["head"]["seq"]) == (str(written[-1].pk), 3)
    page = signed_in(person("vera", "viewer")).get(reverse("dashboard:thread", kwargs={"thread_id": thread.pk}))
    head_link = reverse("dashboard:checkpoint", kwargs={"checkpoint_id": written[-1].pk})
    assert f'<a class="button primary" href="{head_link}">Open head #3</a>' in page.content.decode()


def test_rows_whose_mac_predates_created_at_coverage_still_verify(agent: Agent, capsys: Any) -> None:
    thread, written = _written(agent, steps=4)
    # Re-MAC the thread as Quicksave did before created_at was covered (version 1).
    parent_mac: bytes | None = None
    for checkpoint in Checkpoint.objects.filter(thread=thread).order_by("seq"):
        parent_mac = codec.legacy_integrity_mac(
            parent_integrity=parent_mac, checkpoint_id=checkpoint.id, thread_id=checkpoint.thread_id,
            branch_id=checkpoint.branch_id, parent_id=checkpoint.parent_id, seq=checkpoint.seq, kind=checkpoint.kind,
            payload=bytes(checkpoint.payload), fields=storage.mac_fields(checkpoint),
        )  # fmt: skip
        _raw("UPDATE checkpoints_checkpoint SET integrity = %s WHERE id = %s", [parent_mac, checkpoint.id])
    _forget_everything()

    call_command("verify_integrity")
    assert "OK" in capsys.readouterr().out
    assert storage.state_at(written[-1])["n"] == 3
    # A new checkpoint chained from a version-1 parent is written (and checked) as version 2.
    newer = storage.append_checkpoint(thread=thread, parent=written[-1], patch=[{"op": "remove", "path": "/card"}])
    _raw("UPDATE checkpoints_checkpoint SET created_at = created_at - interval '3 days' WHERE id = %s", [newer.pk])
    _forget_everything()
    with pytest.raises(CommandError, match="1 checkpoint"):
        call_command("verify_integrity")
