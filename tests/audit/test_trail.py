"""The audit trail: a decision leaves an entry, and the database refuses to change or delete one."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import DatabaseError, connection, transaction
from django.test import Client, override_settings

from approvals.services import decide, request_approval
from audit import trail
from audit.models import AuditEntry
from checkpoints import forks, storage
from checkpoints.models import Thread
from quicksave.roles import grant_role
from quicksave_agents.models import Agent
from tests.conftest import password_hash, person, signed_in


@pytest.fixture
def decided(thread: Thread) -> AuditEntry:
    checkpoint = storage.append_checkpoint(thread=thread, parent=None, state={"a": 1})
    approval = request_approval(thread=thread, checkpoint=checkpoint, action="deploy", args={"env": "prod"})
    reviewer = User.objects.create(username="rita", password=password_hash("pw-12345678"))
    grant_role(user=reviewer, role="reviewer")
    decide(approval=approval, user=reviewer, decision="reject", comment="not on a Friday", address="10.0.0.7")
    return AuditEntry.objects.get(action="approval.reject")


def test_a_decision_records_who_what_why_and_from_where(decided: AuditEntry) -> None:
    assert (decided.actor_name, decided.action, decided.target_type) == ("rita", "approval.reject", "approval")
    assert decided.reason == "not on a Friday"
    assert decided.address == "10.0.0.7"
    assert decided.before["status"] == "pending"
    assert decided.after["status"] == "rejected"


@pytest.mark.parametrize(
    "sql",
    ["UPDATE approvals_auditentry SET reason = 'nothing happened'", "DELETE FROM approvals_auditentry"],
)
def test_the_database_refuses_to_change_or_delete_an_entry(decided: AuditEntry, sql: str) -> None:
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(sql)
    decided.refresh_from_db()
    assert decided.reason == "not on a Friday"


def test_deleting_the_thread_keeps_its_audit_entries(decided: AuditEntry, thread: Thread, db: Any) -> None:
    with connection.cursor() as cursor:
        cursor.execute("UPDATE approvals_auditentry SET thread_id = NULL WHERE id = %s", [decided.pk])
    decided.refresh_from_db()
    assert decided.thread_id is None
    assert decided.reason == "not on a Friday"


SECRETS = ("DE-SECRET-IBAN-1", "DE-EDITED-IBAN-2", "FORK-SECRET-CARD-3")


def _raw_audit_rows() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT coalesce(string_agg(row_to_json(a)::text, '\n'), '') FROM approvals_auditentry a")
        return str(cursor.fetchone()[0])


def test_deleting_the_thread_shreds_the_secrets_its_audit_entries_hold(thread: Thread) -> None:
    ada = person("ada", "admin")
    first = storage.append_checkpoint(thread=thread, parent=None, state={"card": "4111", "amount": 90})
    approval = request_approval(thread=thread, checkpoint=first, action="pay", args={"iban": SECRETS[0]})
    decide(approval=approval, user=ada, decision="approve", args={"iban": SECRETS[1]})
    forks.fork(checkpoint=first, user=ada, reason="wrong card",
               patch=[{"op": "replace", "path": "/card", "value": SECRETS[2]}])  # fmt: skip
    decision = AuditEntry.objects.get(action="approval.approve")
    fork = AuditEntry.objects.get(action="thread.fork")
    root = Client()
    root.force_login(
        User.objects.create(
            username="root", password=password_hash("root-password-1"), is_staff=True, is_superuser=True
        )
    )

    # While the thread lives, the page and the admin show the values; the rows hold none of them.
    assert SECRETS[0] in signed_in(ada).get("/audit/").content.decode()
    assert SECRETS[1] in signed_in(ada).get("/audit/").content.decode()
    assert SECRETS[2] in root.get(f"/admin/audit/auditentry/{fork.pk}/change/").content.decode()
    assert not [secret for secret in SECRETS if secret in _raw_audit_rows()]

    forks.delete(thread=thread, user=ada, reason="the customer asked")

    raw = _raw_audit_rows()
    assert AuditEntry.objects.filter(pk__in=[decision.pk, fork.pk]).count() == 2
    assert not [secret for secret in SECRETS if secret in raw]
    page = signed_in(ada).get("/audit/").content.decode()
    assert not [secret for secret in SECRETS if secret in page]
    assert "[sealed; thread deleted]" in page
    for entry in (decision, fork):
        admin_page = root.get(f"/admin/audit/auditentry/{entry.pk}/change/").content.decode()
        assert "[sealed; thread deleted]" in admin_page
        assert not [secret for secret in SECRETS if secret in admin_page]


def test_a_thread_stored_without_a_data_key_keeps_only_a_digest_of_its_secrets(agent: Agent) -> None:
    with override_settings(QUICKSAVE_ENCRYPT=False):
        plain = storage.create_thread(agent=agent)[0]
    entry = trail.record(
        actor=None, action="approval.approve", target_type="approval", target_id="a-1", thread=plain,
        before={"status": "pending", "args": {"iban": SECRETS[0]}}, sealed=("args",),
    )  # fmt: skip

    assert SECRETS[0] not in _raw_audit_rows()
    assert trail.opened(entry).before == {"status": "pending", "args": trail.DIGEST_ONLY}
