"""The Django admin shows audit entries read-only: even a superuser cannot add, change or delete one."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from audit import trail
from audit.models import AuditEntry

CHANGELIST = "/admin/audit/auditentry/"


@pytest.fixture
def entry(db: Any) -> AuditEntry:
    return trail.record(
        actor=None, actor_name="cli:ops", action="role.grant", target_type="user", target_id="rita",
        reason="on call this week", before={"roles": []}, after={"roles": ["reviewer"]}, address="10.0.0.7",
    )  # fmt: skip


@pytest.fixture
def superuser_client(db: Any) -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("root", password="root-password-1"))
    return client


def assert_unchanged(entry: AuditEntry) -> None:
    assert AuditEntry.objects.count() == 1
    stored = AuditEntry.objects.get(pk=entry.pk)
    assert (stored.reason, stored.actor_name, stored.after) == (entry.reason, entry.actor_name, entry.after)


def test_a_superuser_can_list_and_read_entries(superuser_client: Client, entry: AuditEntry) -> None:
    listing = superuser_client.get(CHANGELIST)
    assert listing.status_code == 200
    assert "cli:ops" in listing.content.decode()
    assert f"{CHANGELIST}add/" not in listing.content.decode()

    page = superuser_client.get(f"{CHANGELIST}{entry.pk}/change/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "on call this week" in html
    assert 'name="_save"' not in html and 'name="reason"' not in html  # shown, not editable
    assert f"{CHANGELIST}{entry.pk}/delete/" not in html


@pytest.mark.parametrize(
    ("method", "path", "data"),
    [
        ("post", "{pk}/change/", {"reason": "nothing happened", "actor_name": "someone", "_save": "Save"}),
        ("get", "{pk}/delete/", {}),
        ("post", "{pk}/delete/", {"post": "yes"}),
        ("get", "add/", {}),
        ("post", "add/", {"actor_name": "forger", "action": "role.grant", "target_type": "user", "target_id": "x"}),
    ],
)
def test_the_admin_refuses_to_change_delete_or_add(
    superuser_client: Client, entry: AuditEntry, method: str, path: str, data: dict[str, str]
) -> None:
    response = getattr(superuser_client, method)(CHANGELIST + path.format(pk=entry.pk), data)
    assert response.status_code == 403
    assert_unchanged(entry)


def test_the_bulk_delete_action_is_not_offered_and_does_nothing(superuser_client: Client, entry: AuditEntry) -> None:
    assert "delete_selected" not in superuser_client.get(CHANGELIST).content.decode()

    superuser_client.post(CHANGELIST, {"action": "delete_selected", "_selected_action": [entry.pk], "post": "yes"})

    assert_unchanged(entry)
