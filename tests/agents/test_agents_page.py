"""The agents page: admins list agents and keys, issue a key shown once, and revoke one after confirming."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client

from audit.models import AuditEntry
from checkpoints import storage
from quicksave_agents.keys import create_agent_key, find_agent_key, issue_key
from quicksave_agents.models import Agent, AgentKey
from tests.conftest import person, signed_in

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin(db: Any) -> Client:
    return signed_in(person("ada", "admin"))


def test_admins_see_every_agent_with_its_keys_and_threads(admin: Client, agent: Agent) -> None:
    key, _ = create_agent_key(agent=agent, label="production worker")
    storage.create_thread(agent=agent, external_id="trip-1")
    issue_key(agent_name="code-review")

    page = admin.get("/agents/").content.decode()

    assert '<section class="card agent" id="agent-code-review"' in page
    assert f'<tr data-key="{key.prefix}">' in page and "production worker" in page
    assert "1 thread</a> · 1 active key" in page
    assert f'href="/agents/keys/{key.prefix}/revoke/"' in page


@pytest.mark.parametrize("role", ["viewer", "reviewer", None])
def test_only_admins_manage_keys(agent: Agent, role: str | None) -> None:
    client = signed_in(person("pat", role))
    key, _ = create_agent_key(agent=agent)

    assert client.get("/agents/").status_code == 403
    assert client.post("/agents/keys/", {"agent": "travel"}).status_code == 403
    assert client.post(f"/agents/keys/{key.prefix}/revoke/").status_code == 403
    assert AgentKey.objects.count() == 1 and AgentKey.objects.get().is_active
    assert "/login/" in Client().get("/agents/")["Location"]


def test_issuing_a_key_shows_it_once_uncached_and_it_works(admin: Client) -> None:
    response = admin.post("/agents/keys/", {"agent": "billing", "label": "nightly run"})

    assert response.status_code == 200
    assert "no-store" in response["Cache-Control"]
    plaintext = re.search(r'<pre class="raw" id="plaintext-key">(qs_[^<]+)</pre>', response.content.decode())
    assert plaintext is not None
    key = find_agent_key(plaintext.group(1))
    assert key is not None and key.agent.name == "billing" and key.label == "nightly run"
    assert plaintext.group(1) not in admin.get("/agents/").content.decode()  # listed by prefix only
    entry = AuditEntry.objects.get(action="agent_key.create")
    assert entry.actor_name == "ada" and entry.target_id == key.prefix


@pytest.mark.parametrize(
    ("form", "field", "message"),
    [
        ({"agent": "Billing Team"}, "agent", "Agent names are 1 to 64 lowercase letters"),
        ({"agent": "billing", "label": "a\x07b"}, "label", "character 2 is U+0007."),
        ({"agent": ""}, "agent", "This field is required."),
    ],
)
def test_a_bad_name_or_label_is_shown_by_its_field_and_creates_nothing(
    admin: Client, form: dict[str, str], field: str, message: str
) -> None:
    response = admin.post("/agents/keys/", form)

    assert response.status_code == 400
    errors = re.search(rf'<ul class="errorlist" id="{field}-errors" role="alert">(.*?)</ul>', response.content.decode())
    assert errors is not None and message in errors.group(1)
    assert not AgentKey.objects.exists() and not Agent.objects.filter(name="billing").exists()


def test_revoking_confirms_first_then_the_key_stops_working(admin: Client, agent: Agent) -> None:
    key, plaintext = create_agent_key(agent=agent, label="laptop")

    confirm = admin.get(f"/agents/keys/{key.prefix}/revoke/").content.decode()
    assert "travel has no other active key:" in confirm and 'id="confirm-revoke"' in confirm
    assert find_agent_key(plaintext) is not None  # looking is not revoking

    done = admin.post(f"/agents/keys/{key.prefix}/revoke/")
    assert done.status_code == 302 and done["Location"] == "/agents/"
    assert find_agent_key(plaintext) is None
    assert f"Key {key.prefix} of travel is revoked" in admin.get("/agents/").content.decode()
    assert AuditEntry.objects.filter(action="agent_key.revoke", target_id=key.prefix).count() == 1

    again = admin.post(f"/agents/keys/{key.prefix}/revoke/")
    assert again.status_code == 200 and "Already revoked" in again.content.decode()
    assert AuditEntry.objects.filter(action="agent_key.revoke").count() == 1
    for prefix in ("nope", "a%00b", "%00", "a" * 17):
        assert admin.get(f"/agents/keys/{prefix}/revoke/").status_code == 404


def test_the_page_reads_the_same_few_queries_however_many_agents_and_keys(
    admin: Client, django_assert_max_num_queries: Any
) -> None:
    for n in range(12):
        issue_key(agent_name=f"agent-{n}")
        issue_key(agent_name=f"agent-{n}", label="second")
    # Session, user, two permission reads, the nav's role and inbox count, agents, their keys, thread
    # counts, runs no worker claimed.
    with django_assert_max_num_queries(11):
        assert admin.get("/agents/").status_code == 200
