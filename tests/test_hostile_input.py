"""Hostile input on the REST API: each kind gets a precise 4xx in the error format and writes nothing.

tests/checkpoints/test_api.py covers the checkpoint body's own checks (types, `patches`, NaN, deep
nesting, state size); this table covers the rest of the API surface and the transport-level cases.
"""

from __future__ import annotations

import base64
import json
import uuid
from typing import Any

import pytest
from rest_framework.test import APIClient

from approvals.models import ApprovalRequest
from approvals.services import request_approval
from audit.models import AuditEntry
from checkpoints import storage
from checkpoints.models import Branch, Checkpoint, Event, Thread, ToolResult
from quicksave_agents.models import AgentKey, Run
from tests.conftest import person

MODELS = (Thread, Branch, Checkpoint, Event, ToolResult, ApprovalRequest, AuditEntry, Run, AgentKey)


def row_counts() -> dict[str, int]:
    return {model.__name__: model.objects.count() for model in MODELS}


def deep(levels: int) -> str:
    return '{"a":' * levels + "1" + "}" * levels


@pytest.fixture
def world(thread: Thread, agent_key: str) -> dict[str, str]:
    """A thread with one checkpoint and a pending approval; ids for the paths below."""
    checkpoint = storage.append_checkpoint(thread=thread, parent=None, state={"a": 1, "list": [1, 2]})
    approval = request_approval(thread=thread, checkpoint=checkpoint, action="deploy", args={"env": "prod"})
    return {"thread": str(thread.pk), "checkpoint": str(checkpoint.pk), "approval": str(approval.pk)}


@pytest.fixture
def reviewer_client(db: Any) -> APIClient:
    client = APIClient()
    client.force_authenticate(person("rita", "reviewer"))
    return client


CHECKPOINTS = "/api/v1/threads/{thread}/checkpoints/"
THREADS = "/api/v1/threads/"
TOOL = "/api/v1/threads/{thread}/tool-results/k1/"
APPROVALS = "/api/v1/threads/{thread}/approvals/"
DECIDE = "/api/v1/approvals/{approval}/decide/"
CLAIM = "/api/v1/runs/claim/"


def patch_body(*ops: Any) -> str:
    return json.dumps({"parent": "{checkpoint}", "patch": list(ops)})


# (case, method, path, raw body, status, code, fragment of the message)
# fmt: off
CASES: list[tuple[str, str, str, str | bytes, int, str, str]] = [
    # Numbers JSON does not have, or that overflow to one.
    ("Infinity", "post", THREADS, '{"metadata": {"x": Infinity}}', 400, "malformed_json", "Infinity"),
    ("-Infinity", "post", CHECKPOINTS, '{"parent": null, "state": {"x": -Infinity}}', 400, "malformed_json",
     "-Infinity"),
    ("1e400 overflows to infinity", "put", TOOL, '{"result": 1e400}', 400, "malformed_json", "too large"),
    ("an integer of 5000 digits", "post", THREADS, '{"metadata": {"x": ' + "9" * 5000 + "}}", 400,
     "malformed_json", "not valid JSON"),
    # Bytes that are not UTF-8, and text PostgreSQL cannot store.
    ("invalid UTF-8", "post", THREADS, b'{"metadata": {"x": "\xff\xfe"}}', 400, "malformed_json", "UTF-8"),
    ("a UTF-8-encoded surrogate", "post", THREADS, b'{"metadata": {"x": "\xed\xa0\x80"}}', 400, "malformed_json",
     "UTF-8"),
    ("a lone surrogate escape in a value", "post", CHECKPOINTS, '{"parent": null, "state": {"x": "\\ud800"}}', 400,
     "unsupported_text", "surrogate"),
    ("a lone low surrogate in a key", "post", THREADS, '{"metadata": {"\\uDC00": 1}}', 400, "unsupported_text",
     "surrogate"),
    ("a reversed surrogate pair", "put", TOOL, '{"result": "\\ude00\\ud83d"}', 400, "unsupported_text",
     "surrogate"),
    ("a NUL escape", "post", APPROVALS, '{"checkpoint": "{checkpoint}", "action": "x", "args": {"a": "\\u0000"}}',
     400, "unsupported_text", "NUL"),
    # Nesting past what the parser will recurse into, on bodies other than a checkpoint's.
    ("nesting 100000 deep", "post", THREADS, '{"metadata": ' + deep(100_000) + "}", 400, "malformed_json",
     "nested too deeply"),
    ("metadata nested past QUICKSAVE_MAX_DEPTH", "post", THREADS, '{"metadata": ' + deep(100) + "}", 422,
     "invalid_state", "64"),
    ("thread metadata past QUICKSAVE_MAX_METADATA_BYTES", "post", THREADS,
     '{"agent": "travel", "metadata": {"x": "' + "y" * 300_000 + '"}}', 422, "invalid_state",
     "the limit is 262144 bytes (QUICKSAVE_MAX_METADATA_BYTES)"),
    ("checkpoint metadata past QUICKSAVE_MAX_METADATA_BYTES", "post", CHECKPOINTS,
     '{"parent": null, "state": {}, "metadata": {"x": "' + "y" * 300_000 + '"}}', 422, "invalid_state",
     "QUICKSAVE_MAX_METADATA_BYTES"),
    # Invalid patch operations.
    ("an unknown op", "post", CHECKPOINTS, patch_body({"op": "explode", "path": "/a"}), 422, "invalid_patch",
     "explode"),
    ("a path without a leading slash", "post", CHECKPOINTS, patch_body({"op": "replace", "path": "a", "value": 2}),
     422, "invalid_patch", "a"),
    ("an op that is not an object", "post", CHECKPOINTS, patch_body(1), 422, "invalid_patch", "0"),
    ("a failing test op", "post", CHECKPOINTS, patch_body({"op": "test", "path": "/a", "value": 2}), 422,
     "invalid_patch", "/a"),
    ("a move from a missing path", "post", CHECKPOINTS, patch_body({"op": "move", "from": "/zzz", "path": "/b"}),
     422, "invalid_patch", "/zzz"),
    ("an array index past the end", "post", CHECKPOINTS,
     patch_body({"op": "add", "path": "/list/9", "value": 0}), 422, "invalid_patch", "/list/9"),
    ("a second op that fails after a good one", "post", CHECKPOINTS,
     patch_body({"op": "replace", "path": "/a", "value": 2}, {"op": "remove", "path": "/nope"}), 422,
     "invalid_patch", "/nope"),
    # Wrong types.
    ("a body that is an array", "post", THREADS, "[]", 400, "invalid", "dictionary"),
    ("a body that is a string", "put", TOOL, '"result"', 400, "invalid", "dictionary"),
    ("metadata that is a list", "post", THREADS, '{"metadata": [1]}', 400, "invalid", "metadata"),
    ("a decision that is a number", "post", DECIDE, '{"decision": 1}', 400, "invalid", "decision"),
    ("a wait that is a word", "post", CLAIM, '{"wait": "soon"}', 400, "invalid", "wait"),
    # float() reads these strings, and NaN passes every range check: the claim would wait for ever.
    ("a wait of NaN", "post", CLAIM, '{"wait": "NaN"}', 400, "invalid", "finite"),
    ("a wait of Infinity", "post", CLAIM, '{"wait": "-Infinity"}', 400, "invalid", "finite"),
    ("a temperature of NaN", "post", CHECKPOINTS, '{"parent": null, "state": {}, "model": {"temperature": "nan"}}',
     422, "invalid_state", "finite"),
    ("a step past 32 bits", "post", CHECKPOINTS, '{"parent": null, "state": {}, "step": 9223372036854775808}', 422,
     "invalid_state", "step"),
    ("a temperature no double holds", "post", CHECKPOINTS,
     '{"parent": null, "state": {}, "model": {"temperature": 1' + "0" * 400 + "}}", 422, "invalid_state",
     "model.temperature"),
    ("a top_p no double holds", "post", CHECKPOINTS, '{"parent": null, "state": {}, "model": {"top_p": -' + "9" * 309
     + "}}", 422, "invalid_state", "model.top_p"),
    ("a cached tool name past 200 characters", "post", CHECKPOINTS,
     '{"parent": null, "state": {}, "tool_results": [{"key": "k", "tool": "' + "t" * 201 + '", "result": 1}]}', 422,
     "invalid_state", "200"),
    ("a checkpoint id that is not a UUID", "post", APPROVALS, '{"checkpoint": "abc", "action": "x"}', 400,
     "invalid", "checkpoint"),
    # Unknown fields are refused, not ignored.
    ("an unknown thread field", "post", THREADS, '{"agnet": "travel"}', 400, "invalid", "agnet"),
    ("an unknown tool-result field", "put", TOOL, '{"result": 1, "ttl": 60}', 400, "invalid", "ttl"),
    ("an unknown approval field", "post", APPROVALS, '{"checkpoint": "{checkpoint}", "action": "x", "argz": {}}',
     400, "invalid", "argz"),
    ("an unknown decision field", "post", DECIDE, '{"decision": "approve", "coment": "ok"}', 400, "invalid",
     "coment"),
    ("an unknown claim field", "post", CLAIM, '{"wiat": 5}', 400, "invalid", "wiat"),
]
# fmt: on


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "code", "fragment"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_hostile_body_gets_a_precise_error_and_writes_nothing(
    world: dict[str, str], owner_client: APIClient, reviewer_client: APIClient,
    method: str, path: str, body: str | bytes, status: int, code: str, fragment: str,
) -> None:  # fmt: skip
    client = reviewer_client if path == DECIDE else owner_client
    raw = body if isinstance(body, bytes) else body.replace("{checkpoint}", world["checkpoint"]).encode()
    before = row_counts()

    response = getattr(client, method)(path.format(**world), data=raw, content_type="application/json")

    assert_error(response, status, code, fragment)
    assert row_counts() == before


def assert_error(response: Any, status: int, code: str, fragment: str = "") -> dict[str, Any]:
    assert response.status_code == status, response.content[:500]
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"code", "message", "detail"}
    assert body["error"]["code"] == code, body
    assert isinstance(body["error"]["message"], str) and fragment in body["error"]["message"], body
    assert isinstance(body["error"]["detail"], dict)
    return body["error"]


def test_a_body_over_the_request_limit_is_a_413(world: dict[str, str], owner_client: APIClient, settings: Any) -> None:
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 4096
    body = json.dumps({"parent": None, "state": {"x": "y" * 5000}})
    before = row_counts()

    response = owner_client.post(CHECKPOINTS.format(**world), data=body, content_type="application/json")

    error = assert_error(response, 413, "payload_too_large", "4096")
    assert error["detail"] == {"limit": 4096}
    assert row_counts() == before


@pytest.mark.parametrize(
    "path", ["/api/v1/threads/", "/api/v1/approvals/", "/api/v1/threads/{thread}/checkpoints/", "/api/v1/nothing/"]
)
def test_a_100_kb_query_string_is_a_414(world: dict[str, str], owner_client: APIClient, path: str) -> None:
    response = owner_client.get(path.format(**world) + "?q=" + "a" * 100_000)
    error = assert_error(response, 414, "uri_too_long", "limit")
    assert error["detail"]["limit"] == 8192


def test_a_100_kb_query_string_on_a_page_is_a_414_page(admin_client: Any) -> None:
    response = admin_client.get("/?q=" + "a" * 100_000)
    assert response.status_code == 414
    assert "The query string is" in response.content.decode()


def test_too_many_query_fields_are_a_400(world: dict[str, str], owner_client: APIClient) -> None:
    response = owner_client.get("/api/v1/threads/?" + "&".join(["a=1"] * 1500))
    assert_error(response, 400, "bad_request")


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("after_seq=99999999999999999999999", "after_seq"),
        ("limit=99999999999999999999999", "limit"),
        ("branch=%00", "branch"),
    ],
)
def test_out_of_range_query_values_are_a_400(
    world: dict[str, str], owner_client: APIClient, query: str, field: str
) -> None:
    response = owner_client.get(f"{CHECKPOINTS.format(**world)}?{query}")
    assert field in assert_error(response, 400, "invalid")["message"]


@pytest.mark.parametrize(
    ("path", "query", "field"),
    [(THREADS, "step=99999999999999999999999", "step"), (THREADS, "q=a:%00", "q"), (THREADS, "cursor=%00", "cursor"),
     (THREADS, "cursor=abc", "cursor"),
     ("/api/v1/approvals/", "cursor=abc", "cursor"),
     ("/api/v1/approvals/", "agent=%00", "agent")],
)  # fmt: skip
def test_hostile_list_filters_are_a_400(owner_client: APIClient, path: str, query: str, field: str) -> None:
    response = owner_client.get(f"{path}?{query}")
    assert field in assert_error(response, 400, "invalid")["message"]


@pytest.mark.parametrize(
    "q",
    ['{"k": NaN}', '{"k": 1e999}', '{"k\\u0000": 1}', '{"k": "\\udc00"}', 'k:"a\\u0000b"', 'k:"\\ud800"'],
)  # fmt: skip
def test_a_metadata_filter_postgresql_cannot_hold_is_a_400(
    world: dict[str, str], owner_client: APIClient, q: str
) -> None:
    response = owner_client.get(THREADS, {"q": q})
    error = assert_error(response, 400, "invalid", "q")
    assert "NUL character or lone surrogate" in error["message"]


def test_a_metadata_filter_that_postgresql_can_hold_still_filters(owner_client: APIClient, thread: Thread) -> None:
    thread.metadata = {"k": 1.5, "n": "x", "v": "NaN"}
    thread.save(update_fields=["metadata"])
    found = owner_client.get(THREADS, {"q": "k:1.5"}).json()["results"]
    assert [t["id"] for t in found] == [str(thread.pk)]
    assert owner_client.get(THREADS, {"q": '{"n": "x"}'}).json()["results"][0]["id"] == str(thread.pk)
    # A value that is not JSON is text: `v:NaN` looks for the string, as `v:1e400` would.
    assert [t["id"] for t in owner_client.get(THREADS, {"q": "v:NaN"}).json()["results"]] == [str(thread.pk)]
    assert owner_client.get(THREADS, {"q": "k:1e400"}).json()["results"] == []


def cursor(querystring: str) -> str:
    return base64.b64encode(querystring.encode()).decode()


@pytest.mark.parametrize("path", [THREADS, "/api/v1/approvals/"])
@pytest.mark.parametrize(
    "made_up",
    [cursor("p=notadate"), cursor("p=0000-01-01"), cursor("p=2020-01-01 00:00:00"), cursor("p=a\x00b"),
     cursor("r=1&p=9999-99-99"), "!!!", "enpa", cursor("o=0"), cursor("x=1")],
)  # fmt: skip
def test_a_made_up_cursor_is_a_400(world: dict[str, str], owner_client: APIClient, path: str, made_up: str) -> None:
    response = owner_client.get(path, {"cursor": made_up})
    assert "Not a cursor this list handed out" in assert_error(response, 400, "invalid", "cursor")["message"]


def test_the_cursors_a_list_hands_out_still_page_through_it(owner_client: APIClient, agent: Any) -> None:
    made = {str(storage.create_thread(agent=agent, external_id=f"t{n}")[0].pk) for n in range(5)}
    seen: list[str] = []
    page = owner_client.get(THREADS, {"limit": 2}).json()
    while True:
        seen += [t["id"] for t in page["results"]]
        if page["next"] is None:
            break
        page = owner_client.get(page["next"]).json()
    assert len(seen) == 5 and set(seen) == made


def test_a_tool_result_key_with_a_nul_is_not_found_and_cannot_be_stored(
    world: dict[str, str], owner_client: APIClient
) -> None:
    path = f"/api/v1/threads/{world['thread']}/tool-results/a%00b/"
    before = row_counts()

    assert_error(owner_client.get(path), 404, "not_found")
    response = owner_client.put(path, data='{"result": 1}', content_type="application/json")

    error = assert_error(response, 422, "invalid_state", "NUL")
    assert error["detail"] == {"field": "key", "limit": 128}
    assert row_counts() == before


def test_an_audited_action_from_an_address_that_is_no_ip_is_recorded_without_one(
    world: dict[str, str], reviewer_client: APIClient
) -> None:
    # What a server that trusts a local proxy's X-Forwarded-For makes of `X-Forwarded-For: not-an-ip`.
    response = reviewer_client.post(
        DECIDE.format(**world), data='{"decision": "approve"}', content_type="application/json",
        REMOTE_ADDR="not-an-ip",
    )  # fmt: skip

    assert response.status_code == 200, response.content
    entry = AuditEntry.objects.get(target_type="approval")
    assert entry.address is None


def test_an_audited_action_records_the_callers_ip(world: dict[str, str], reviewer_client: APIClient) -> None:
    response = reviewer_client.post(
        DECIDE.format(**world), data='{"decision": "approve"}', content_type="application/json",
        REMOTE_ADDR="2001:db8::1",
    )  # fmt: skip

    assert response.status_code == 200, response.content
    assert AuditEntry.objects.get(target_type="approval").address == "2001:db8::1"


def test_another_agents_checkpoint_as_parent_reads_as_an_unknown_one(
    thread: Thread, other_agent: Any, owner_client: APIClient
) -> None:
    foreign_thread, _ = storage.create_thread(agent=other_agent)
    foreign = storage.append_checkpoint(thread=foreign_thread, parent=None, state={"secret": 1})
    unknown = uuid.uuid4()
    path = CHECKPOINTS.format(thread=thread.pk)

    def refusal(parent: uuid.UUID) -> dict[str, Any]:
        body = json.dumps({"parent": str(parent), "state": {}})
        return assert_error(owner_client.post(path, data=body, content_type="application/json"), 404, "not_found")

    answers = [refusal(foreign.pk), refusal(unknown)]

    assert answers[0]["message"].replace(str(foreign.pk), "X") == answers[1]["message"].replace(str(unknown), "X")
    assert answers[0]["detail"] == answers[1]["detail"] == {"field": "parent"}


def test_a_patch_that_doubles_the_state_with_each_op_is_stopped_at_the_state_limit(
    world: dict[str, str], owner_client: APIClient, settings: Any
) -> None:
    """40 ops of 40 bytes each would make a list of a trillion items: the patch stops at the limit."""
    settings.QUICKSAVE_MAX_STATE_BYTES = 100_000
    body = patch_body(*[{"op": "copy", "from": "/list", "path": "/list/-"}] * 40).replace(
        "{checkpoint}", world["checkpoint"]
    )
    before = row_counts()

    response = owner_client.post(CHECKPOINTS.format(**world), data=body, content_type="application/json")

    error = assert_error(response, 413, "state_too_large", "grow past its limit")
    assert error["detail"] == {"field": "patch", "limit": 100_000}
    assert row_counts() == before


@pytest.mark.parametrize(
    "url",
    ["/admin/audit/auditentry/?action=%00", "/admin/audit/auditentry/?q=a%00b", "/admin/auth/user/?q=%00"],
)
def test_a_nul_in_a_django_admin_filter_is_a_400_page(admin_client: Any, url: str) -> None:
    response = admin_client.get(url)
    assert response.status_code == 400
    assert "holds a NUL character" in response.content.decode()
