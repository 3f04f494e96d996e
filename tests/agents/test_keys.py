"""Agent API keys: `createagentkey` issues one, only its SHA-256 is stored, revoked or altered keys fail,
and creating or revoking one is audited."""

from __future__ import annotations

import getpass
import hashlib
from io import StringIO
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.db import connection
from rest_framework.test import APIClient

from audit.models import AuditEntry
from quicksave_agents.keys import revoke_agent_key
from quicksave_agents.models import Agent, AgentKey
from tests.conftest import password_hash


def create_key(*args: str) -> tuple[str, str, str]:
    """Run `createagentkey` and return (key, stdout, stderr)."""
    stdout, stderr = StringIO(), StringIO()
    call_command("createagentkey", *args, stdout=stdout, stderr=stderr)
    return stdout.getvalue().strip(), stdout.getvalue(), stderr.getvalue()


def split_key(key: str) -> tuple[str, str]:
    """(prefix, secret) of a `qs_<prefix>_<secret>` key."""
    assert key.startswith("qs_"), key
    prefix, _, secret = key[len("qs_") :].partition("_")
    assert prefix and secret, key
    return prefix, secret


def list_threads(key: str) -> Any:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    return client.get("/api/v1/threads/")


def assert_authentication_failed(response: Any) -> None:
    assert response.status_code == 401, response.content
    assert response.json()["error"]["code"] == "authentication_failed"
    assert response["WWW-Authenticate"] == "Bearer"


def test_createagentkey_prints_the_key_once_and_creates_the_agent(db: Any) -> None:
    assert not Agent.objects.filter(name="travel").exists()

    key, stdout, stderr = create_key("travel")

    assert stdout == f"{key}\n"  # the key and nothing else, so `$(manage.py createagentkey x)` captures it
    prefix, secret = split_key(key)
    assert secret not in stderr
    assert prefix in stderr and "shown once" in stderr
    agent = Agent.objects.get(name="travel")
    assert list(agent.keys.values_list("prefix", flat=True)) == [prefix]

    response = list_threads(key)
    assert response.status_code == 200, response.content
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    created = client.post("/api/v1/threads/", data="{}", content_type="application/json")
    assert created.status_code == 201, created.content
    assert created.json()["agent"] == "travel"


def test_createagentkey_adds_a_key_to_an_existing_agent(agent: Agent, agent_key: str) -> None:
    key, _, _ = create_key("travel", "--label", "laptop")

    assert Agent.objects.filter(name="travel").count() == 1
    assert agent.keys.count() == 2
    assert AgentKey.objects.get(prefix=split_key(key)[0]).label == "laptop"
    assert key != agent_key
    assert list_threads(key).status_code == 200
    assert list_threads(agent_key).status_code == 200


def test_only_a_sha256_of_the_secret_is_stored(db: Any) -> None:
    key, _, _ = create_key("travel")
    prefix, secret = split_key(key)

    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM agents_agentkey WHERE prefix = %s", [prefix])
        columns = [column.name for column in cursor.description]
        rows = cursor.fetchall()

    assert len(rows) == 1
    row = dict(zip(columns, rows[0], strict=True))
    assert row["secret_hash"] == hashlib.sha256(secret.encode()).hexdigest()
    for column, value in row.items():
        text = bytes(value).decode("latin-1") if isinstance(value, (bytes, memoryview)) else str(value)
        assert secret not in text, column
        assert key not in text, column


def test_revoked_key_gets_401(db: Any) -> None:
    key, _, _ = create_key("travel")
    assert list_threads(key).status_code == 200

    revoke_agent_key(key=AgentKey.objects.get(prefix=split_key(key)[0]))

    assert_authentication_failed(list_threads(key))


def _tampered(key: str, other_key: str) -> dict[str, str]:
    prefix, secret = split_key(key)
    other_prefix, _ = split_key(other_key)
    flipped = secret[:-1] + ("A" if secret[-1] != "A" else "B")
    return {
        "last character changed": f"qs_{prefix}_{flipped}",
        "secret truncated": f"qs_{prefix}_{secret[:-1]}",
        "secret extended": f"qs_{prefix}_{secret}x",
        "secret under another key's prefix": f"qs_{other_prefix}_{secret}",
        "secret only": f"qs_{secret}",
    }


@pytest.mark.parametrize(
    "tampering",
    [
        "last character changed",
        "secret truncated",
        "secret extended",
        "secret under another key's prefix",
        "secret only",
    ],
)
def test_key_with_a_tampered_secret_gets_401(db: Any, tampering: str) -> None:
    key, _, _ = create_key("travel")
    other_key, _, _ = create_key("travel")
    assert list_threads(key).status_code == 200

    assert_authentication_failed(list_threads(_tampered(key, other_key)[tampering]))


@pytest.mark.parametrize("name", ["Not A Slug", "Travel", "trip/42", "café", "", "_travel", "a" * 65])
def test_createagentkey_refuses_a_name_that_is_not_a_lowercase_slug(db: Any, name: str) -> None:
    stdout = StringIO()

    with pytest.raises(CommandError, match="1 to 64 lowercase letters") as raised:
        call_command("createagentkey", name, stdout=stdout, stderr=StringIO())

    assert repr(name) in str(raised.value)
    assert stdout.getvalue() == ""
    assert not Agent.objects.exists()
    assert not AgentKey.objects.exists()


def test_createagentkey_records_the_new_key_in_the_audit_trail_without_its_secret(db: Any) -> None:
    key, _, _ = create_key("travel", "--label", "laptop")
    prefix, secret = split_key(key)

    entry = AuditEntry.objects.get(action="agent_key.create")
    assert (entry.target_type, entry.target_id) == ("agent_key", prefix)
    assert entry.after == {"agent": "travel", "prefix": prefix, "label": "laptop"}
    assert entry.actor is None
    assert entry.actor_name == f"cli:{getpass.getuser()}"
    assert secret not in str(entry.after)


def test_revoking_a_key_is_audited_once_with_who_and_from_where(db: Any) -> None:
    key, _, _ = create_key("travel")
    row = AgentKey.objects.get(prefix=split_key(key)[0])
    admin = User.objects.create(username="ada", password=password_hash("pw-12345678"))

    revoke_agent_key(key=row, actor=admin, address="10.0.0.9")
    revoke_agent_key(key=row, actor=admin, address="10.0.0.9")  # already revoked: nothing changes

    entry = AuditEntry.objects.get(action="agent_key.revoke")
    assert (entry.actor, entry.actor_name, entry.address, entry.target_id) == (admin, "ada", "10.0.0.9", row.prefix)
    assert entry.before == {"agent": "travel", "revoked_at": None}
    row.refresh_from_db()
    assert row.revoked_at is not None
    assert entry.after == {"agent": "travel", "revoked_at": row.revoked_at.isoformat()}


@pytest.mark.parametrize(
    ("label", "message"),
    [
        ("x" * 101, "A label is at most 100 characters; got 101."),
        ("tab\there", "A label holds printable characters only; character 4 is U+0009."),
        ("nul\x00", "A label holds printable characters only; character 4 is U+0000."),
        ("rtl\u202eoverride", "character 4 is U+202E."),
    ],
)
def test_a_label_the_key_cannot_hold_is_refused_and_no_agent_is_left_behind(db: Any, label: str, message: str) -> None:
    with pytest.raises(CommandError) as refused:
        create_key("fresh", "--label", label)

    assert message in str(refused.value)

    assert not Agent.objects.filter(name="fresh").exists()
    assert not AgentKey.objects.exists()


def test_a_key_in_use_shows_when_it_was_last_used_to_the_minute(db: Any, settings: Any) -> None:
    from datetime import timedelta

    from django.test.utils import CaptureQueriesContext

    from quicksave_agents.keys import find_agent_key, issue_key

    settings.QUICKSAVE_KEY_CACHE_SECONDS = 0  # every call looks the key up
    key, raw = issue_key(agent_name="travel")
    assert key.last_used_at is None

    assert find_agent_key(raw) is not None
    key.refresh_from_db()
    first = key.last_used_at
    assert first is not None

    with CaptureQueriesContext(connection) as queries:
        find_agent_key(raw)  # within the minute: read, nothing written
    assert [q["sql"] for q in queries if q["sql"].startswith("UPDATE")] == []

    AgentKey.objects.filter(pk=key.pk).update(last_used_at=first - timedelta(minutes=2))
    find_agent_key(raw)
    key.refresh_from_db()
    assert key.last_used_at is not None and key.last_used_at > first - timedelta(seconds=1)
