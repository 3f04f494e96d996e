"""Encryption at rest: sealed payloads, tool results and approval args, bound to their row and
field; per-thread data keys wrapped by a rotatable keyring; deleting a thread shreds its key."""

from __future__ import annotations

import io
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test import override_settings

from approvals import services as approvals
from approvals.models import ApprovalRequest
from checkpoints import storage
from checkpoints.models import Checkpoint, Thread, ThreadKey, ToolResult
from checkpoints.storage import codec, crypto
from checkpoints.storage.crypto import DecryptionFailure
from checkpoints.storage.tool_results import get_tool_result, put_tool_result
from quicksave.env import ConfigError, envsecret
from quicksave.keyring import new_master_key_entry, parse_keyring
from quicksave_agents.models import Agent

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "sk-live-4f9a0c1e7b2d4e6f8a9b0c1d2e3f4a5b"


@pytest.fixture(autouse=True)
def fresh_caches() -> Iterator[None]:
    storage.clear_caches()
    crypto.forget_keys()
    yield
    storage.clear_caches()
    crypto.forget_keys()


def raw(sql: str, params: list[Any]) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def payload_of(checkpoint_id: Any) -> bytes:
    return bytes(raw("SELECT payload FROM checkpoints_checkpoint WHERE id = %s", [checkpoint_id])[0][0])


def readable(blob: bytes) -> bytes:
    """Everything a thief could read from a stored value without keys: its bytes, and what they
    unpack to if they are a plain frame (zlib or zstd)."""
    try:
        return blob + codec.unframe(blob)
    except (ValueError, zlib.error):
        return blob


def long_secret_state(step: int) -> dict[str, Any]:
    return {"api_key": SECRET, "notes": [f"step {i} {SECRET}" for i in range(step + 20)]}


def test_checkpoint_payloads_are_sealed_and_read_back(agent: Agent) -> None:
    thread, _ = storage.create_thread(agent=agent)
    first = storage.append_checkpoint(thread=thread, parent=None, state=long_secret_state(0))
    card = [{"op": "add", "path": "/card", "value": SECRET}]
    second = storage.append_checkpoint(thread=thread, parent=first, patch=card)

    for checkpoint in (first, second):
        stored = payload_of(checkpoint.pk)
        assert stored[0] == crypto.SEALED
        assert SECRET.encode() not in readable(stored)
    crypto.forget_keys()
    storage.clear_caches()
    assert storage.state_at(second.pk)["card"] == SECRET


def test_a_payload_copied_into_another_row_does_not_decrypt(agent: Agent) -> None:
    thread, _ = storage.create_thread(agent=agent)
    first = storage.append_checkpoint(thread=thread, parent=None, state={"a": SECRET})
    second = storage.append_checkpoint(thread=thread, parent=first, state={"a": SECRET, "b": 2})
    raw("UPDATE checkpoints_checkpoint SET payload = (SELECT payload FROM checkpoints_checkpoint WHERE id = %s) "
        "WHERE id = %s RETURNING id", [first.pk, second.pk])  # fmt: skip

    moved = Checkpoint.objects.get(pk=second.pk)
    with pytest.raises(DecryptionFailure, match="altered or moved"):
        storage.decode_payload(moved)
    assert storage.decode_payload(Checkpoint.objects.get(pk=first.pk)) == {"a": SECRET}


def test_a_payload_copied_into_another_threads_row_does_not_decrypt(agent: Agent) -> None:
    mine, _ = storage.create_thread(agent=agent)
    theirs, _ = storage.create_thread(agent=agent)
    source = storage.append_checkpoint(thread=mine, parent=None, state={"a": SECRET})
    target = storage.append_checkpoint(thread=theirs, parent=None, state={"a": "x"})
    # Same checkpoint id bound, different thread key: copy the payload *and* pretend the id matches.
    sealed = payload_of(source.pk)
    with pytest.raises(DecryptionFailure):
        crypto.unseal(theirs.pk, storage.payload_ad(source.pk), sealed)
    with pytest.raises(DecryptionFailure):
        crypto.unseal(theirs.pk, storage.payload_ad(target.pk), sealed)


def test_tool_results_are_sealed_and_bound_to_their_key(agent: Agent) -> None:
    thread, _ = storage.create_thread(agent=agent)
    put_tool_result(thread=thread, key="charge-1", tool="stripe", result={"token": SECRET})
    put_tool_result(thread=thread, key="charge-2", tool="stripe", result={"token": "other"})
    stored = bytes(raw("SELECT result FROM checkpoints_toolresult WHERE key = 'charge-1'", [])[0][0])
    assert stored[0] == crypto.SEALED and SECRET.encode() not in readable(stored)
    crypto.forget_keys()
    found = get_tool_result(thread=thread, key="charge-1")
    assert found is not None and found.result == {"token": SECRET}

    raw("UPDATE checkpoints_toolresult SET result = (SELECT result FROM checkpoints_toolresult WHERE key = 'charge-1') "
        "WHERE key = 'charge-2' RETURNING id", [])  # fmt: skip
    moved = ToolResult.objects.get(thread=thread, key="charge-2")
    with pytest.raises(DecryptionFailure):
        _ = moved.result


def test_approval_args_are_sealed_and_bound_to_their_field(agent: Agent, django_user_model: Any) -> None:
    thread, _ = storage.create_thread(agent=agent)
    checkpoint = storage.append_checkpoint(thread=thread, parent=None, state={})
    approval = approvals.request_approval(thread=thread, checkpoint=checkpoint, action="pay", args={"card": SECRET})
    reviewer = django_user_model.objects.create_user("rita", is_superuser=True)
    approvals.decide(approval=approval, user=reviewer, decision="approve", args={"card": SECRET, "amount": 5})

    args, decided = raw("SELECT args, decided_args FROM approvals_approvalrequest WHERE id = %s", [approval.pk])[0]
    for stored in (bytes(args), bytes(decided)):
        assert stored[0] == crypto.SEALED and SECRET.encode() not in readable(stored)
    crypto.forget_keys()
    fresh = ApprovalRequest.objects.get(pk=approval.pk)
    assert (fresh.args, fresh.decided_args) == ({"card": SECRET}, {"card": SECRET, "amount": 5})

    raw("UPDATE approvals_approvalrequest SET decided_args = args WHERE id = %s RETURNING id", [approval.pk])
    with pytest.raises(DecryptionFailure):
        _ = ApprovalRequest.objects.get(pk=approval.pk).decided_args


def test_deleting_a_thread_shreds_its_key_so_a_backup_of_its_rows_is_unreadable(agent: Agent) -> None:
    thread, _ = storage.create_thread(agent=agent)
    head = storage.append_checkpoint(thread=thread, parent=None, state=long_secret_state(3))
    put_tool_result(thread=thread, key="k", result={"token": SECRET})
    backup = {
        "checkpoints": raw("SELECT id, payload FROM checkpoints_checkpoint WHERE thread_id = %s", [thread.pk]),
        "tool_results": raw("SELECT key, result FROM checkpoints_toolresult WHERE thread_id = %s", [thread.pk]),
        "key": raw("SELECT master_key_id, wrapped FROM checkpoints_threadkey WHERE thread_id = %s", [thread.pk]),
    }
    assert backup["key"] and storage.state_at(head.pk)["api_key"] == SECRET

    storage.delete_thread(thread)

    assert not Thread.objects.filter(pk=thread.pk).exists()
    assert not ThreadKey.objects.filter(thread_id=thread.pk).exists()
    assert raw("SELECT count(*) FROM checkpoints_threadkey WHERE thread_id = %s", [thread.pk]) == [(0,)]
    crypto.forget_keys()  # what a restarted process, or one restoring the backup, knows
    for checkpoint_id, payload in backup["checkpoints"]:
        assert SECRET.encode() not in readable(bytes(payload))
        with pytest.raises(DecryptionFailure, match="crypto-shredded"):
            crypto.unseal(thread.pk, storage.payload_ad(checkpoint_id), bytes(payload))
    for _key, result in backup["tool_results"]:
        assert SECRET.encode() not in readable(bytes(result))


@pytest.fixture
def two_master_keys() -> tuple[str, str]:
    return new_master_key_entry("old"), new_master_key_entry("new")


def test_rotate_keys_rewraps_every_data_key_under_the_new_master_key(
    agent: Agent, two_master_keys: tuple[str, str]
) -> None:
    old, new = two_master_keys
    heads = []
    with override_settings(QUICKSAVE_ENCRYPTION_KEYS=old):
        for index in range(3):
            thread, _ = storage.create_thread(agent=agent)
            heads.append(storage.append_checkpoint(thread=thread, parent=None, state={"n": index, "s": SECRET}))
    crypto.forget_keys()
    storage.clear_caches()
    with override_settings(QUICKSAVE_ENCRYPTION_KEYS=new), pytest.raises(DecryptionFailure, match="'old'"):
        storage.state_at(heads[0].pk)

    out = io.StringIO()
    with override_settings(QUICKSAVE_ENCRYPTION_KEYS=f"{new},{old}"):
        call_command("rotate_keys", "--batch", "2", stdout=out)
    text = out.getvalue()
    assert "3 data key(s) to re-wrap under master key 'new'" in text
    assert "2/" in text and "Re-wrapped 3 data key(s); 0 left" in text
    assert set(ThreadKey.objects.values_list("master_key_id", flat=True)) == {"new"}

    crypto.forget_keys()
    storage.clear_caches()
    with override_settings(QUICKSAVE_ENCRYPTION_KEYS=new):
        assert [storage.state_at(head.pk)["n"] for head in heads] == [0, 1, 2]


def test_rotate_keys_fails_clearly_when_a_wrapping_key_left_the_keyring(
    agent: Agent, two_master_keys: tuple[str, str]
) -> None:
    old, new = two_master_keys
    with override_settings(QUICKSAVE_ENCRYPTION_KEYS=old):
        storage.create_thread(agent=agent)
    with override_settings(QUICKSAVE_ENCRYPTION_KEYS=new), pytest.raises(CommandError, match=r"'old'.*not in"):
        call_command("rotate_keys", stdout=io.StringIO())


@override_settings(QUICKSAVE_ENCRYPT=False)
def test_a_thread_made_with_encryption_off_stores_plain_rows(agent: Agent) -> None:
    thread, _ = storage.create_thread(agent=agent)
    head = storage.append_checkpoint(thread=thread, parent=None, state={"a": "visible"})
    assert not ThreadKey.objects.filter(thread_id=thread.pk).exists()
    assert payload_of(head.pk)[0] != crypto.SEALED
    crypto.forget_keys()
    storage.clear_caches()
    assert storage.state_at(head.pk) == {"a": "visible"}


@pytest.mark.parametrize(
    ("keyring", "message"),
    [
        ("", "holds no key"),
        ("nokey", "entry 1 must look like id:base64key"),
        ("a:not base64!", r"entry 1 \(a\) is not valid base64"),
        ("a:c2hvcnQ=", r"entry 1 \(a\) must decode to 32 bytes, got 5"),
        (f"{new_master_key_entry('a')},{new_master_key_entry('a')}", "entry 2 repeats the key id 'a'"),
    ],
)
def test_a_bad_keyring_is_refused_naming_the_entry(keyring: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_keyring(keyring)


def test_secrets_are_generated_once_for_the_embedded_default_and_required_in_production(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("QUICKSAVE_ENCRYPTION_KEYS", raising=False)
    file = tmp_path / "var" / "encryption_keys"
    first = envsecret("QUICKSAVE_ENCRYPTION_KEYS", file, generate=lambda: new_master_key_entry("local-1"),
                      required=False)  # fmt: skip
    again = envsecret("QUICKSAVE_ENCRYPTION_KEYS", file, generate=lambda: "never used", required=False)
    assert first == again and parse_keyring(first)[0].id == "local-1"
    assert file.stat().st_mode & 0o077 == 0  # readable by its owner only
    with pytest.raises(ConfigError, match="QUICKSAVE_ENCRYPTION_KEYS must be set in production"):
        envsecret("QUICKSAVE_ENCRYPTION_KEYS", tmp_path / "other", generate=lambda: "x", required=True)
    monkeypatch.setenv("QUICKSAVE_ENCRYPTION_KEYS", "from-env")
    assert envsecret("QUICKSAVE_ENCRYPTION_KEYS", file, generate=lambda: "x", required=True) == "from-env"
