"""The audit trail: a decision leaves an entry, and the database refuses to change or delete one."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import DatabaseError, connection, transaction

from approvals.models import AuditEntry
from approvals.services import decide, request_approval
from checkpoints import store
from checkpoints.models import Thread
from quicksave.roles import grant_role


@pytest.fixture
def decided(thread: Thread) -> AuditEntry:
    checkpoint = store.append_checkpoint(thread=thread, parent=None, state={"a": 1})
    approval = request_approval(thread=thread, checkpoint=checkpoint, action="deploy", args={"env": "prod"})
    reviewer = User.objects.create_user("rita", password="pw-12345678")
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
