"""The memory API: put, get, search, delete, namespaces and history with agent scoping; blackboards
with compare-and-set, leases and their events; grants; precise 400s naming the field and limit."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from audit.models import AuditEntry
from checkpoints import storage
from checkpoints.models import Thread
from memory.models import BoardEvent, ItemVersion, NamespaceGrant
from quicksave_agents.models import Agent, AgentKey
from tests.conftest import person

pytestmark = pytest.mark.django_db

ITEM = "/api/v1/memory/namespaces/users.alice/items/prefs/"


def put(client: APIClient, url: str, body: dict[str, Any]) -> Any:
    return client.put(url, body, format="json")


def error(response: Any) -> dict[str, Any]:
    body: dict[str, Any] = response.json()["error"]
    return body


@pytest.fixture
def admin_client(db: Any) -> APIClient:
    client = APIClient()
    client.force_authenticate(person("ada", "admin"))
    return client


@pytest.fixture
def memory_viewer_client(db: Any) -> APIClient:
    client = APIClient()
    client.force_authenticate(person("vic", "viewer"))
    return client


def test_an_agent_puts_gets_and_deletes_an_item_and_its_history_names_who_and_where(
    owner_client: APIClient, thread: Thread, agent: Agent
) -> None:
    checkpoint = storage.append_checkpoint(thread=thread, parent=None, state={"step": 1})
    first = put(owner_client, ITEM, {"value": {"color": "red"}})
    second = put(owner_client, ITEM, {"value": {"color": "blue"}, "thread": str(thread.pk),
                                      "checkpoint": str(checkpoint.pk)})  # fmt: skip
    got = owner_client.get(ITEM)
    deleted = owner_client.delete(ITEM)
    history = owner_client.get(ITEM + "history/")

    assert (first.status_code, second.status_code) == (201, 200)
    assert first.json()["version"] == 1 and first.json()["created"] is True
    assert got.status_code == 200
    assert got.json()["value"] == {"color": "blue"} and got.json()["version"] == 2
    assert deleted.status_code == 200 and deleted.json()["deleted"] is True and deleted.json()["version"] == 3
    assert owner_client.get(ITEM).status_code == 404
    versions = history.json()["results"]
    assert [(v["version"], v["deleted"], v["value"]) for v in versions] == [
        (3, True, None), (2, False, {"color": "blue"}), (1, False, {"color": "red"}),
    ]  # fmt: skip
    assert versions[1]["writer"] == "agent" and versions[1]["agent"] == "travel"
    assert versions[1]["agent_key"] == AgentKey.objects.get(agent=agent).prefix
    assert (versions[1]["thread"], versions[1]["checkpoint"]) == (str(thread.pk), str(checkpoint.pk))
    assert versions[2]["thread"] is None


def test_an_item_reads_as_it_was_at_a_time(owner_client: APIClient) -> None:
    put(owner_client, ITEM, {"value": {"v": 1}})
    at = put(owner_client, ITEM, {"value": {"v": 2}}).json()["updated_at"]
    put(owner_client, ITEM, {"value": {"v": 3}})

    then = owner_client.get(ITEM, {"as_of": at})

    assert then.json()["value"] == {"v": 2} and then.json()["version"] == 2
    bad = owner_client.get(ITEM, {"as_of": "yesterday"})
    assert bad.status_code == 400 and bad.json()["error"]["message"].startswith("as_of:")


def test_keys_may_hold_slashes_and_other_characters(owner_client: APIClient) -> None:
    url = "/api/v1/memory/namespaces/users.alice/items/notes/2026%3F%20a%25b/"
    assert put(owner_client, url, {"value": 1}).status_code == 201
    found = owner_client.get("/api/v1/memory/items/").json()["results"]
    assert [item["key"] for item in found] == ["notes/2026? a%b"]
    assert owner_client.get(url + "history/").json()["results"][0]["value"] == 1


def test_an_agent_sees_only_its_namespaces_until_a_person_grants_it_one(
    owner_client: APIClient, foreign_client: APIClient, admin_client: APIClient, other_agent: Agent
) -> None:
    put(owner_client, ITEM, {"value": {"color": "red"}})

    assert foreign_client.get(ITEM).status_code == 404
    assert foreign_client.get(ITEM + "history/").status_code == 404
    assert foreign_client.get("/api/v1/memory/namespaces/").json()["results"] == []
    assert foreign_client.get("/api/v1/memory/items/").json()["results"] == []
    refused = put(foreign_client, ITEM, {"value": {"color": "black"}})
    assert refused.status_code == 404 and "belongs to another agent" in error(refused)["message"]
    assert foreign_client.delete(ITEM).status_code == 404

    granted = admin_client.post("/api/v1/memory/grants/", {"prefix": ["users"], "agent": "code-review",
                                                           "reason": "pair on alice"}, format="json")  # fmt: skip
    assert granted.status_code == 201
    assert foreign_client.get(ITEM).json()["value"] == {"color": "red"}
    assert foreign_client.get("/api/v1/memory/namespaces/").json()["results"] == [{"namespace": ["users", "alice"]}]
    assert foreign_client.get("/api/v1/memory/grants/").json()["results"][0]["agent"] == "code-review"

    revoked = admin_client.post(f"/api/v1/memory/grants/{granted.json()['id']}/revoke/", {"reason": "done"},
                                format="json")  # fmt: skip
    assert revoked.status_code == 200 and revoked.json()["revoked_by"] == "ada"
    assert foreign_client.get(ITEM).status_code == 404
    audited = AuditEntry.objects.filter(action__startswith="memory.").order_by("created_at")
    assert list(audited.values_list("action", "reason")) == [
        ("memory.grant", "pair on alice"), ("memory.revoke", "done"),
    ]  # fmt: skip


def test_only_admins_grant_and_only_readers_read(
    owner_client: APIClient, memory_viewer_client: APIClient, stranger_client: APIClient, other_agent: Agent
) -> None:
    put(owner_client, ITEM, {"value": 1})
    body = {"prefix": ["users"], "agent": "code-review", "reason": "r"}
    assert owner_client.post("/api/v1/memory/grants/", body, format="json").status_code == 403
    assert memory_viewer_client.post("/api/v1/memory/grants/", body, format="json").status_code == 403
    assert memory_viewer_client.get(ITEM).status_code == 200
    assert put(memory_viewer_client, ITEM, {"value": 2}).status_code == 403
    assert stranger_client.get(ITEM).status_code == 403
    assert not NamespaceGrant.objects.exists()


def test_a_person_with_the_admin_role_writes_as_themselves(admin_client: APIClient) -> None:
    assert put(admin_client, ITEM, {"value": {"by": "ada"}}).status_code == 201
    version = admin_client.get(ITEM + "history/").json()["results"][0]
    assert (version["writer"], version["user"], version["agent"]) == ("person", "ada", None)


def test_search_filters_and_finds_words_and_pages_with_a_cursor(owner_client: APIClient) -> None:
    for n in range(5):
        value = {"status": "open" if n % 2 == 0 else "done", "text": f"task number {n}"}
        put(owner_client, f"/api/v1/memory/namespaces/tasks.open/items/t{n}/", {"value": value, "index": ["text"]})
    put(
        owner_client, "/api/v1/memory/namespaces/notes/items/n1/", {"value": {"text": "lisbon trip"}, "index": ["text"]}
    )

    first = owner_client.get("/api/v1/memory/namespaces/tasks/items/", {"filter": '{"status": "open"}', "limit": "2"})
    rest = owner_client.get(first.json()["next"])
    words = owner_client.get("/api/v1/memory/items/", {"query": "lisbon"})

    assert [i["key"] for i in first.json()["results"]] == ["t4", "t2"]
    assert [i["key"] for i in rest.json()["results"]] == ["t0"] and rest.json()["next"] is None
    assert words.json()["results"][0]["key"] == "n1" and words.json()["results"][0]["score"] > 0
    scoped = owner_client.get("/api/v1/memory/items/", {"prefix": "notes"}).json()["results"]
    assert [i["key"] for i in scoped] == ["n1"]


def test_namespaces_are_listed_in_order_a_page_at_a_time(owner_client: APIClient) -> None:
    for name in ("c", "a", "b.x", "b.y"):
        put(owner_client, f"/api/v1/memory/namespaces/{name}/items/k/", {"value": 1})

    first = owner_client.get("/api/v1/memory/namespaces/", {"limit": 2})
    second = owner_client.get(first.json()["next"])
    depth = owner_client.get("/api/v1/memory/namespaces/", {"prefix": "b", "max_depth": "1"})

    assert [r["namespace"] for r in first.json()["results"]] == [["a"], ["b", "x"]]
    assert [r["namespace"] for r in second.json()["results"]] == [["b", "y"], ["c"]]
    assert second.json()["next"] is None
    assert depth.json()["results"] == [{"namespace": ["b"]}]


def test_history_pages_from_newest_to_oldest(owner_client: APIClient) -> None:
    for n in range(5):
        put(owner_client, ITEM, {"value": {"n": n}})
    first = owner_client.get(ITEM + "history/", {"limit": 2})
    second = owner_client.get(first.json()["next"])
    third = owner_client.get(second.json()["next"])
    pages = [first, second, third]
    assert [[v["version"] for v in page.json()["results"]] for page in pages] == [[5, 4], [3, 2], [1]]
    assert third.json()["next"] is None


@pytest.mark.parametrize(
    ("method", "url", "body", "field"),
    [
        ("put", ITEM, {}, "value"),
        ("put", ITEM, {"value": 1, "colour": "red"}, "colour"),
        ("put", ITEM, {"value": 1, "expected_version": -1}, "expected_version"),
        ("put", ITEM, {"value": 1, "ttl_minutes": "NaN"}, "ttl_minutes"),
        ("put", ITEM, {"value": 1, "thread": "00000000-0000-0000-0000-000000000000"}, "thread"),
        ("put", ITEM, {"value": 1, "checkpoint": "00000000-0000-0000-0000-000000000000"}, "checkpoint"),
        ("put", ITEM, {"value": 1, "index": "text"}, "index"),
        ("put", "/api/v1/memory/namespaces/users..alice/items/k/", {"value": 1}, "namespace"),
        ("put", "/api/v1/memory/namespaces/users/items/k/history/", {"value": 1}, "method"),
        ("get", "/api/v1/memory/items/?limit=0", None, "limit"),
        ("get", "/api/v1/memory/items/?limit=201", None, "limit"),
        ("get", "/api/v1/memory/items/?filter=%7Bnope", None, "filter"),
        ("get", "/api/v1/memory/items/?filter=%5B1%5D", None, "filter"),
        ("get", '/api/v1/memory/items/?filter={"a":{"$regex":"x"}}', None, "filter"),
        ("get", "/api/v1/memory/items/?cursor=abc", None, "cursor"),
        ("get", "/api/v1/memory/items/?sort=key", None, "sort"),
        ("get", "/api/v1/memory/namespaces/?cursor=eyJhZnRlciI6W119", None, "cursor"),
        ("get", "/api/v1/memory/namespaces/?max_depth=0", None, "max_depth"),
        ("get", ITEM + "history/?cursor=eyJiZWZvcmUiOiJ4In0", None, "cursor"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(
    owner_client: APIClient, method: str, url: str, body: dict[str, Any] | None, field: str
) -> None:
    response = getattr(owner_client, method)(url, body, format="json") if body is not None else owner_client.get(url)
    if field == "method":
        assert response.status_code == 405
        return
    assert response.status_code in (400, 422), response.content
    found = error(response)
    named = found["message"].split(":")[0] if found["code"] == "invalid" else found["detail"].get("field")
    assert named == field, found
    assert not ItemVersion.objects.exists()


def test_a_limit_names_its_bounds(owner_client: APIClient) -> None:
    response = owner_client.get("/api/v1/memory/items/", {"limit": 500})
    assert error(response)["message"] == "limit: Ensure this value is less than or equal to 200."


def test_a_value_past_the_limit_is_a_413_naming_it(owner_client: APIClient, settings: Any) -> None:
    settings.QUICKSAVE_MEMORY_MAX_VALUE_BYTES = 1024
    response = put(owner_client, ITEM, {"value": {"text": "x" * 2000}})
    assert response.status_code == 413
    assert error(response)["detail"] == {"field": "value", "limit": 1024}


def test_compare_and_set_answers_409_with_the_current_version(owner_client: APIClient) -> None:
    assert put(owner_client, ITEM, {"value": 1, "expected_version": 0}).status_code == 201
    assert put(owner_client, ITEM, {"value": 2, "expected_version": 1}).status_code == 200
    stale = put(owner_client, ITEM, {"value": 3, "expected_version": 1})
    assert stale.status_code == 409
    assert error(stale)["code"] == "version_conflict" and error(stale)["detail"]["current_version"] == 2
    gone = owner_client.delete(ITEM + "?expected_version=1")
    assert gone.status_code == 409 and owner_client.get(ITEM).json()["value"] == 2


BOARD = "/api/v1/memory/boards/team.tasks/"
TASK = "/api/v1/memory/namespaces/team.tasks/items/t1/"


def test_a_board_with_leases_fencing_and_its_events(owner_client: APIClient, foreign_client: APIClient) -> None:
    made = owner_client.post("/api/v1/memory/boards/", {"namespace": ["team", "tasks"]}, format="json")
    again = owner_client.post("/api/v1/memory/boards/", {"namespace": ["team", "tasks"]}, format="json")
    assert (made.status_code, again.status_code, made.json()["created"]) == (201, 200, True)
    put(owner_client, TASK, {"value": {"status": "open"}})

    lease = owner_client.post(BOARD + "leases/", {"key": "t1", "holder": "w1", "ttl_seconds": 30}, format="json")
    held = owner_client.post(BOARD + "leases/", {"key": "t1", "holder": "w2", "ttl_seconds": 30}, format="json")
    unfenced = put(owner_client, TASK, {"value": {"status": "stolen"}})
    token = lease.json()["fencing_token"]
    fenced = put(owner_client, TASK, {"value": {"status": "done"}, "fencing_token": token, "expected_version": 1})
    listed = owner_client.get(BOARD + "leases/").json()["results"]
    renewed = owner_client.post(BOARD + "leases/renew/", {"key": "t1", "fencing_token": token, "ttl_seconds": 60},
                                format="json")  # fmt: skip
    released = owner_client.post(BOARD + "leases/release/", {"key": "t1", "fencing_token": token}, format="json")
    late = put(owner_client, TASK, {"value": {"status": "late"}, "fencing_token": token})

    assert lease.status_code == 201 and held.status_code == 409 and error(held)["code"] == "lease_held"
    assert error(held)["detail"]["holder"] == "w1"
    assert unfenced.status_code == 409 and error(unfenced)["code"] == "lease_held"
    assert fenced.status_code == 200 and fenced.json()["version"] == 2
    assert [(h["key"], h["holder"], h["agent"]) for h in listed] == [("t1", "w1", "travel")]
    assert "fencing_token" not in listed[0]
    assert renewed.status_code == 200 and released.status_code == 204
    assert late.status_code == 409 and error(late)["code"] == "lease_lost"
    events = owner_client.get(BOARD + "events/", {"after_seq": 1}).json()
    assert [(e["seq"], e["type"]) for e in events["results"]] == [
        (2, "lease.acquired"), (3, "item.written"), (4, "lease.released"),
    ]  # fmt: skip
    assert owner_client.get(BOARD).json()["seq"] == 4
    assert foreign_client.get(BOARD + "events/").status_code == 404
    assert foreign_client.post(BOARD + "leases/", {"key": "t1", "holder": "x", "ttl_seconds": 5},
                               format="json").status_code == 404  # fmt: skip


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("leases/", {"key": "t1", "holder": "w", "ttl_seconds": 0}, "ttl_seconds"),
        ("leases/", {"key": "t1", "holder": "w", "ttl_seconds": 86401}, "ttl_seconds"),
        ("leases/", {"key": "t1", "ttl_seconds": 5}, "holder"),
        ("leases/", {"key": "t1", "holder": "w" * 201, "ttl_seconds": 5}, "holder"),
        ("leases/", {"holder": "w", "ttl_seconds": 5}, "key"),
        ("leases/renew/", {"key": "t1", "fencing_token": 0, "ttl_seconds": 5}, "fencing_token"),
        ("leases/release/", {"key": "t1", "fencing_token": "one"}, "fencing_token"),
    ],
)
def test_bad_lease_requests_name_the_field(
    owner_client: APIClient, path: str, body: dict[str, Any], field: str
) -> None:
    owner_client.post("/api/v1/memory/boards/", {"namespace": ["team", "tasks"]}, format="json")
    response = owner_client.post(BOARD + path, body, format="json")
    assert response.status_code == 400
    assert error(response)["message"].split(":")[0] == field
    assert BoardEvent.objects.count() == 0


def test_a_plain_namespace_is_not_made_a_board_and_has_no_leases(owner_client: APIClient) -> None:
    put(owner_client, "/api/v1/memory/namespaces/team.tasks/items/t1/", {"value": 1})
    made = owner_client.post("/api/v1/memory/boards/", {"namespace": ["team", "tasks"]}, format="json")
    lease = owner_client.post(BOARD + "leases/", {"key": "t1", "holder": "w", "ttl_seconds": 5}, format="json")
    token = put(owner_client, "/api/v1/memory/namespaces/team.tasks/items/t1/", {"value": 2, "fencing_token": 1})
    assert made.status_code == 409 and error(made)["code"] == "not_a_board"
    assert lease.status_code == 409 and error(lease)["code"] == "not_a_board"
    assert token.status_code == 409 and error(token)["detail"] == {"field": "fencing_token"}
    bad = owner_client.post("/api/v1/memory/boards/", {"namespace": "team.tasks"}, format="json")
    assert bad.status_code == 400 and error(bad)["detail"] == {"field": "namespace"}


def test_the_schema_documents_the_memory_api(admin_client: APIClient) -> None:
    schema = admin_client.get("/api/schema/", HTTP_ACCEPT="application/json").json()
    paths = schema["paths"]
    assert "/api/v1/memory/namespaces/{namespace}/items/{key}/" in paths
    assert {"get", "put", "delete"} <= set(paths["/api/v1/memory/namespaces/{namespace}/items/{key}/"])
    assert "/api/v1/memory/namespaces/{namespace}/items/{key}/history/" in paths
    assert "/api/v1/memory/boards/{namespace}/leases/" in paths
    assert "/api/v1/memory/grants/{grant_id}/revoke/" in paths


def test_a_memory_grant_to_an_unknown_agent_names_the_agent(admin_client: APIClient) -> None:
    response = admin_client.post("/api/v1/memory/grants/", {"prefix": ["u"], "agent": "nobody", "reason": "r"},
                                 format="json")  # fmt: skip
    assert response.status_code == 400 and error(response)["message"] == "agent: No agent is named 'nobody'."
    assert User.objects.filter(username="ada").exists() and not NamespaceGrant.objects.exists()
