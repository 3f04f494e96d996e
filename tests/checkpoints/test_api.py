"""REST API v1: threads, checkpoints, diffs, tool results, errors and scoping by agent key."""

from __future__ import annotations

import json
from typing import Any

import pytest
from rest_framework.test import APIClient

from checkpoints import storage
from checkpoints.models import Checkpoint, Event, Thread, ToolResult
from checkpoints.storage.jsonpatch import apply_patch
from tests.conftest import message


def post(client: APIClient, url: str, body: Any) -> Any:
    return client.post(url, data=json.dumps(body), content_type="application/json")


def assert_error(response: Any, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.content
    body = response.json()
    assert set(body) == {"error"}
    assert body["error"]["code"] == code
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    assert isinstance(body["error"]["detail"], dict)
    return body["error"]


def new_thread(client: APIClient, **body: Any) -> dict[str, Any]:
    response = post(client, "/api/v1/threads/", body)
    assert response.status_code in (200, 201), response.content
    return response.json()


def checkpoint(client: APIClient, thread_id: str, **body: Any) -> Any:
    return post(client, f"/api/v1/threads/{thread_id}/checkpoints/", body)


# --------------------------------------------------------------------------- threads


def test_agent_creates_a_thread_then_gets_the_same_one_by_external_id(owner_client: APIClient) -> None:
    created = post(owner_client, "/api/v1/threads/", {"agent": "travel", "external_id": "trip-9", "metadata": {"a": 1}})
    assert created.status_code == 201
    body = created.json()
    assert (body["agent"], body["external_id"], body["status"], body["head"]) == ("travel", "trip-9", "running", None)
    assert [b["name"] for b in body["branches"]] == ["main"]

    again = post(owner_client, "/api/v1/threads/", {"agent": "travel", "external_id": "trip-9"})
    assert again.status_code == 200
    assert again.json()["id"] == body["id"]


def test_key_cannot_create_a_thread_for_another_agent(owner_client: APIClient) -> None:
    assert_error(post(owner_client, "/api/v1/threads/", {"agent": "code-review"}), 403, "permission_denied")


def test_thread_detail_has_head_and_branches(owner_client: APIClient) -> None:
    thread = new_thread(owner_client)
    written = checkpoint(owner_client, thread["id"], parent=None, state={"a": 1}, step=1, label="start").json()

    detail = owner_client.get(f"/api/v1/threads/{thread['id']}/").json()
    assert detail["head"]["id"] == written["id"]
    assert detail["head"]["label"] == "start"
    assert detail["step"] == 1
    assert detail["branches"][0]["head"] == written["id"]


def test_another_agents_thread_is_a_404(owner_client: APIClient, foreign_client: APIClient) -> None:
    thread = new_thread(owner_client)
    written = checkpoint(owner_client, thread["id"], parent=None, state={"secret": 1}).json()

    assert_error(foreign_client.get(f"/api/v1/threads/{thread['id']}/"), 404, "not_found")
    assert_error(foreign_client.get(f"/api/v1/checkpoints/{written['id']}/"), 404, "not_found")
    assert_error(checkpoint(foreign_client, thread["id"], parent=written["id"], state={}), 404, "not_found")
    assert_error(foreign_client.get(f"/api/v1/threads/{thread['id']}/tool-results/k/"), 404, "not_found")
    assert foreign_client.get("/api/v1/threads/").json()["results"] == []


def test_without_credentials_the_api_answers_401(anonymous_client: APIClient, db: Any) -> None:
    assert_error(anonymous_client.get("/api/v1/threads/"), 401, "not_authenticated")


def test_an_unknown_key_answers_401(anonymous_client: APIClient, db: Any) -> None:
    anonymous_client.credentials(HTTP_AUTHORIZATION="Bearer qs_abcdef123456_wrong")
    assert_error(anonymous_client.get("/api/v1/threads/"), 401, "authentication_failed")


def test_a_person_without_a_role_sees_no_threads(owner_client: APIClient, stranger_client: APIClient) -> None:
    new_thread(owner_client)
    assert stranger_client.get("/api/v1/threads/").json()["results"] == []


def test_thread_list_filters_and_paginates(owner_client: APIClient, viewer_client: APIClient) -> None:
    ids = []
    for n in range(5):
        thread = new_thread(owner_client, external_id=f"t{n}", metadata={"customer": "acme" if n % 2 else "globex"})
        checkpoint(
            owner_client, thread["id"], parent=None, state={}, step=n, status="completed" if n == 4 else "running"
        )
        ids.append(thread["id"])

    def listed(query: str, client: APIClient = owner_client) -> list[str]:
        response = client.get(f"/api/v1/threads/?{query}")
        assert response.status_code == 200, response.content
        return [t["id"] for t in response.json()["results"]]

    assert listed("") == ids[::-1]  # newest-updated first
    assert listed("status=completed") == [ids[4]]
    assert listed("step=2") == [ids[2]]
    assert listed("q=customer:acme") == [ids[3], ids[1]]
    assert listed('q={"customer": "globex"}') == [ids[4], ids[2], ids[0]]
    assert listed("agent=code-review") == []
    assert listed("since=2000-01-01T00:00:00Z&until=2999-01-01T00:00:00Z", viewer_client) == ids[::-1]

    page = owner_client.get("/api/v1/threads/?limit=2").json()
    assert len(page["results"]) == 2
    seen = [t["id"] for t in page["results"]]
    while page["next"]:
        page = owner_client.get(page["next"]).json()
        seen += [t["id"] for t in page["results"]]
    assert seen == ids[::-1]


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("status=sleeping", "status"), ("step=minus", "step"), ("since=yesterday", "since"), ("q=nocolon", "q"),
        ("limit=abc", "limit"), ("limit=0", "limit"), ("limit=201", "limit"), ("limit=2.5", "limit"),
    ],
)  # fmt: skip
def test_thread_list_rejects_malformed_filters(owner_client: APIClient, query: str, field: str) -> None:
    error = assert_error(owner_client.get(f"/api/v1/threads/?{query}"), 400, "invalid")
    assert field in error["message"]


# --------------------------------------------------------------------------- checkpoints


def test_checkpoints_by_state_and_by_patch(owner_client: APIClient) -> None:
    thread = new_thread(owner_client)
    first = checkpoint(owner_client, thread["id"], parent=None, state={"messages": [], "step": 0})
    assert first.status_code == 201
    ops = [{"op": "add", "path": "/messages/-", "value": message(1)}, {"op": "replace", "path": "/step", "value": 1}]
    second = checkpoint(
        owner_client, thread["id"], parent=first.json()["id"], patch=ops, step=1, label="plan",
        model={"name": "m", "temperature": 0.1, "seed": 3}, metadata={"k": "v"},
    )  # fmt: skip
    assert second.status_code == 201, second.content
    summary = second.json()
    assert (summary["seq"], summary["branch"], summary["parent"]) == (2, "main", first.json()["id"])
    assert summary["model"] == {"name": "m", "version": None, "temperature": 0.1, "top_p": None, "seed": 3}
    assert "state" not in summary

    detail = owner_client.get(f"/api/v1/checkpoints/{summary['id']}/").json()
    assert detail["state"] == {"messages": [message(1)], "step": 1}
    assert detail["integrity"]["status"] == "verified"


def test_stale_parent_gets_409_with_head(owner_client: APIClient) -> None:
    thread = new_thread(owner_client)
    first = checkpoint(owner_client, thread["id"], parent=None, state={"n": 0}).json()
    second = checkpoint(owner_client, thread["id"], parent=first["id"], state={"n": 1}).json()

    error = assert_error(
        checkpoint(owner_client, thread["id"], parent=first["id"], state={"n": 2}), 409, "stale_parent"
    )
    assert error["detail"]["head"] == second["id"]


def test_timeline_lists_summaries_oldest_first_with_after_seq_and_limit(owner_client: APIClient) -> None:
    thread = new_thread(owner_client)
    parent = None
    for n in range(7):
        parent = checkpoint(owner_client, thread["id"], parent=parent, state={"n": n}, step=n).json()["id"]
    url = f"/api/v1/threads/{thread['id']}/checkpoints/"

    page = owner_client.get(f"{url}?limit=3").json()
    assert [c["seq"] for c in page["results"]] == [1, 2, 3]
    assert all("state" not in c for c in page["results"])
    page = owner_client.get(page["next"]).json()
    assert [c["seq"] for c in page["results"]] == [4, 5, 6]
    page = owner_client.get(f"{url}?after_seq=6").json()
    assert ([c["seq"] for c in page["results"]], page["next"]) == ([7], None)
    assert_error(owner_client.get(f"{url}?branch=nope"), 404, "not_found")
    assert_error(owner_client.get(f"{url}?limit=0"), 400, "invalid")


def test_timeline_query_count_does_not_grow_with_the_page(
    owner_client: APIClient, django_assert_max_num_queries: Any
) -> None:
    thread = new_thread(owner_client)
    parent = None
    for n in range(30):
        parent = checkpoint(owner_client, thread["id"], parent=parent, state={"n": n}).json()["id"]
    with django_assert_max_num_queries(6):
        response = owner_client.get(f"/api/v1/threads/{thread['id']}/checkpoints/?limit=30")
    assert len(response.json()["results"]) == 30


@pytest.mark.parametrize(
    ("body", "status", "code", "fragment"),
    [
        ({"parent": None}, 400, "invalid", "exactly one"),
        ({"parent": None, "state": {}, "patch": []}, 400, "invalid", "exactly one"),
        ({"parent": "not-a-uuid", "state": {}}, 400, "invalid", "parent"),
        ({"parent": None, "state": [1, 2]}, 400, "invalid", "state"),
        ({"parent": None, "state": {}, "step": "ten"}, 400, "invalid", "step"),
        ({"parent": None, "state": {}, "status": "sleeping"}, 422, "invalid_state", "status"),
        ({"parent": None, "state": {}, "label": "x" * 201}, 422, "invalid_state", "label"),
        ({"parent": None, "state": {}, "step": True}, 400, "invalid", "step"),
        ({"parent": None, "state": {}, "patches": []}, 400, "invalid", "patches"),
        ({"state": {}}, 400, "invalid", "parent"),
        ({"parent": None, "state": {}, "tool_results": [{"result": 1}]}, 422, "invalid_state", "tool_results[0]"),
        ({"parent": None, "state": {}, "model": {"temperature": "hot"}}, 422, "invalid_state", "temperature"),
        ({"parent": None, "state": {}, "branch": "nope"}, 404, "not_found", "nope"),
        ({"parent": "PARENT", "patch": [{"op": "remove", "path": "/zzz"}]}, 422, "invalid_patch", "/zzz"),
        ({"parent": "PARENT", "patch": [{"op": "add", "path": "/a"}]}, 422, "invalid_patch", "value"),
    ],
)
def test_bad_checkpoint_input_gets_a_precise_error_and_writes_nothing(
    owner_client: APIClient, body: dict[str, Any], status: int, code: str, fragment: str
) -> None:
    thread = new_thread(owner_client)
    parent = checkpoint(owner_client, thread["id"], parent=None, state={"a": 1}).json()["id"]
    if body.get("parent") == "PARENT":
        body = {**body, "parent": parent}
    before = (Checkpoint.objects.count(), Event.objects.count())

    error = assert_error(checkpoint(owner_client, thread["id"], **body), status, code)

    assert fragment in error["message"]
    assert (Checkpoint.objects.count(), Event.objects.count()) == before


def test_malformed_json_nan_and_wrong_media_type_are_refused(owner_client: APIClient) -> None:
    thread = new_thread(owner_client)
    url = f"/api/v1/threads/{thread['id']}/checkpoints/"
    assert_error(owner_client.post(url, data="{not json", content_type="application/json"), 400, "malformed_json")
    nan = owner_client.post(url, data='{"parent": null, "state": {"x": NaN}}', content_type="application/json")
    assert_error(nan, 400, "malformed_json")
    deep = '{"parent": null, "state": ' + '{"a":' * 5000 + "1" + "}" * 5000 + "}"
    assert assert_error(owner_client.post(url, data=deep, content_type="application/json"), 400, "malformed_json")
    assert_error(owner_client.post(url, data="parent=", content_type="text/plain"), 415, "unsupported_media_type")
    assert Checkpoint.objects.count() == 0


def test_state_over_the_limit_is_a_413(owner_client: APIClient, settings: Any) -> None:
    settings.QUICKSAVE_MAX_STATE_BYTES = 2048
    thread = new_thread(owner_client)
    error = assert_error(checkpoint(owner_client, thread["id"], parent=None, state={"x": "y" * 3000}), 413,
                         "state_too_large")  # fmt: skip
    assert error["detail"]["limit"] == 2048


def test_nesting_over_64_levels_is_a_422(owner_client: APIClient) -> None:
    thread = new_thread(owner_client)
    deep: Any = 1
    for _ in range(70):
        deep = {"d": deep}
    error = assert_error(checkpoint(owner_client, thread["id"], parent=None, state=deep), 422, "invalid_state")
    assert "64" in error["message"]


def test_unknown_ids_are_json_404s(owner_client: APIClient) -> None:
    assert_error(owner_client.get("/api/v1/threads/00000000-0000-0000-0000-000000000000/"), 404, "not_found")
    assert_error(owner_client.get("/api/v1/checkpoints/not-a-uuid/"), 404, "not_found")
    assert_error(owner_client.get("/api/v1/nothing-here/"), 404, "not_found")


def test_a_viewer_reads_but_cannot_write(owner_client: APIClient, viewer_client: APIClient) -> None:
    thread = new_thread(owner_client)
    written = checkpoint(owner_client, thread["id"], parent=None, state={"a": 1}).json()
    assert viewer_client.get(f"/api/v1/checkpoints/{written['id']}/").json()["state"] == {"a": 1}
    assert_error(checkpoint(viewer_client, thread["id"], parent=written["id"], state={}), 403, "permission_denied")


# --------------------------------------------------------------------------- diffs


def test_diff_defaults_to_the_parent_and_accepts_any_base(owner_client: APIClient) -> None:
    thread = new_thread(owner_client)
    a = checkpoint(owner_client, thread["id"], parent=None, state={"messages": [], "city": "Oslo"}).json()
    b = checkpoint(owner_client, thread["id"], parent=a["id"], state={"messages": [message(1)], "city": "Oslo"}).json()
    c = checkpoint(owner_client, thread["id"], parent=b["id"], state={"messages": [message(1)], "city": "Rome"}).json()

    to_parent = owner_client.get(f"/api/v1/checkpoints/{b['id']}/diff/").json()
    assert to_parent == {"base": a["id"], "target": b["id"],
                         "patch": [{"op": "add", "path": "/messages/-", "value": message(1)}]}  # fmt: skip
    across = owner_client.get(f"/api/v1/checkpoints/{a['id']}/diff/?base={c['id']}").json()
    assert apply_patch({"messages": [message(1)], "city": "Rome"}, across["patch"]).doc == {
        "messages": [],
        "city": "Oslo",
    }
    assert_error(owner_client.get(f"/api/v1/checkpoints/{a['id']}/diff/"), 400, "invalid")
    assert_error(owner_client.get(f"/api/v1/checkpoints/{a['id']}/diff/?base=zzz"), 400, "invalid")


def test_diff_refuses_a_base_from_another_thread(owner_client: APIClient) -> None:
    one, two = new_thread(owner_client), new_thread(owner_client)
    a = checkpoint(owner_client, one["id"], parent=None, state={}).json()
    b = checkpoint(owner_client, two["id"], parent=None, state={}).json()
    assert_error(owner_client.get(f"/api/v1/checkpoints/{a['id']}/diff/?base={b['id']}"), 400, "invalid")


# --------------------------------------------------------------------------- tool results


def test_tool_result_put_is_idempotent_and_get_returns_the_first(owner_client: APIClient) -> None:
    thread = new_thread(owner_client)
    url = f"/api/v1/threads/{thread['id']}/tool-results/search-flights-1/"
    assert_error(owner_client.get(url), 404, "not_found")

    first = owner_client.put(url, data=json.dumps({"result": {"price": 420}, "tool": "search"}),
                             content_type="application/json")  # fmt: skip
    assert first.status_code == 201
    second = owner_client.put(url, data=json.dumps({"result": {"price": 999}}), content_type="application/json")
    assert second.status_code == 200
    assert second.json()["result"] == {"price": 420}
    assert owner_client.get(url).json()["result"] == {"price": 420}
    assert ToolResult.objects.count() == 1


def test_tool_results_can_ride_along_with_a_checkpoint(owner_client: APIClient) -> None:
    thread = new_thread(owner_client)
    written = checkpoint(owner_client, thread["id"], parent=None, state={"a": 1},
                         tool_results=[{"key": "k1", "tool": "search", "result": [1, 2]}]).json()  # fmt: skip
    stored = owner_client.get(f"/api/v1/threads/{thread['id']}/tool-results/k1/").json()
    assert (stored["result"], stored["checkpoint"]) == ([1, 2], written["id"])


def test_thread_model_is_scoped_by_the_store(agent: Any) -> None:
    thread, _ = storage.create_thread(agent=agent)
    assert Thread.objects.get(pk=thread.pk).active_branch is not None


# --------------------------------------------------------------------------- service


def test_healthz_reports_database_and_channel_layer(client: Any, db: Any) -> None:
    body = client.get("/healthz").json()
    assert body["database"]["status"] == "ok"
    assert set(body) == {"status", "database", "channel_layer"}


def test_openapi_schema_and_docs_are_served_without_a_cdn(client: Any, viewer: Any) -> None:
    client.force_login(viewer)
    schema = client.get("/api/schema/")
    assert schema.status_code == 200
    assert b"/api/v1/threads/{thread_id}/checkpoints/" in schema.content
    docs = client.get("/api/docs/")
    assert docs.status_code == 200
    html = docs.content.decode()
    assert "cdn" not in html.lower()
    assert "/static/drf_spectacular_sidecar/swagger-ui-dist/" in html


def test_the_documented_summary_schema_matches_what_the_api_returns(owner_client: APIClient) -> None:
    from checkpoints.serializers import CheckpointDetailSerializer, CheckpointSummarySerializer

    thread = new_thread(owner_client)
    written = checkpoint(owner_client, thread["id"], parent=None, state={"a": 1}).json()
    assert set(written) == set(CheckpointSummarySerializer().fields)
    detail = owner_client.get(f"/api/v1/checkpoints/{written['id']}/").json()
    assert set(detail) == set(CheckpointDetailSerializer().fields)
