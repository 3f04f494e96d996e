"""Who may call what: every API endpoint, page and websocket route, for each named principal.

One row per (route, method); the expected statuses are listed per principal in the order of
PRINCIPALS. A route that forgets its permission check makes at least one row fail.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User
from django.db import transaction
from django.test import Client
from rest_framework.test import APIClient

from approvals import policies, rules
from approvals.services import request_approval
from checkpoints import storage
from checkpoints.storage.tool_results import put_tool_result
from memory import boards, sharing
from memory import store as memory_store
from memory.access import Scope
from notifications import dispatch
from notifications.endpoints import SubscriptionSpec, create_endpoint
from notifications.models import Delivery
from quicksave_agents import runs, tool_calls
from quicksave_agents.keys import create_agent_key, get_or_create_agent
from tests.conftest import handshake, person

OWNER, FOREIGN, VIEWER, REVIEWER, ADMIN, ANONYMOUS = "owner-key", "foreign-key", "viewer", "reviewer", "admin", "anon"
PRINCIPALS = (OWNER, FOREIGN, VIEWER, REVIEWER, ADMIN, ANONYMOUS)
ACCEPT = "accept"

CHECKPOINT = {"parent": "{head}", "state": {"n": 3}}
CHANNEL = {"name": "new", "kind": "webhook", "url": "https://hooks.example.com/q"}
CHANNEL_FORM = {"name": "new", "kind": "email", "recipients": "a@example.com", "events": "approval.requested"}
APPROVAL = {"checkpoint": "{head}", "action": "pay"}
LEASE = {"key": "t1", "holder": "w", "ttl_seconds": 30}
RENEW = {"key": "t1", "fencing_token": 999, "ttl_seconds": 30}
RELEASE = {"key": "t1", "fencing_token": 999}
GRANT = {"prefix": ["world"], "agent": "code-review", "reason": "pair"}
RULE = {"name": "small refunds", "action": "refund", "conditions": [{"path": "/amount", "op": "lt", "value": 20}]}
POLICY_FORM = {"action": "book", "approvals_needed": 1, "rejections_needed": 1, "at_deadline": "reject"}
RULE_FORM = {"name": "small refunds", "action": "refund", "max_risk": "low",
             "conditions": '[{"path": "/amount", "op": "lt", "value": 20}]'}  # fmt: skip

# (method, path, body): statuses for owner key, foreign key, viewer, reviewer, admin, anonymous.
# The thread belongs to the owner key's agent; it has checkpoints {first} -> {head}, a pending
# approval on {head}, a cached tool result "{tool}", a call started without a result "{call}" and a
# run leased to the owner key; a notification endpoint "{endpoint}" with a subscription "{subscription}" and
# a delivery "{delivery}" of the approval's request, whose message carries the decision link "{token}".
API: list[tuple[str, str, dict[str, Any] | None, tuple[int, ...]]] = [
    ("GET", "/api/v1/threads/", None, (200, 200, 200, 200, 200, 401)),
    ("POST", "/api/v1/threads/", {"agent": "travel", "external_id": "new"}, (201, 403, 403, 403, 201, 401)),
    ("GET", "/api/v1/threads/{thread}/", None, (200, 404, 200, 200, 200, 401)),
    ("GET", "/api/v1/threads/{thread}/checkpoints/", None, (200, 404, 200, 200, 200, 401)),
    ("POST", "/api/v1/threads/{thread}/checkpoints/", CHECKPOINT, (201, 404, 403, 403, 201, 401)),
    ("GET", "/api/v1/threads/{thread}/export/", None, (200, 404, 200, 200, 200, 401)),
    ("GET", "/api/v1/threads/{thread}/history/?path=/n", None, (200, 404, 200, 200, 200, 401)),
    # Training exports: every reader gets a file, scoped to the threads it may read (tested in test_trajectories).
    ("GET", "/api/v1/exports/fine-tuning/", None, (200, 200, 200, 200, 200, 401)),
    ("GET", "/api/v1/exports/preferences/", None, (200, 200, 200, 200, 200, 401)),
    ("GET", "/api/v1/checkpoints/{head}/", None, (200, 404, 200, 200, 200, 401)),
    ("GET", "/api/v1/checkpoints/{head}/diff/", None, (200, 404, 200, 200, 200, 401)),
    ("POST", "/api/v1/checkpoints/{first}/fork/", {"reason": "try again"}, (403, 404, 403, 403, 201, 401)),
    ("GET", "/api/v1/threads/{thread}/tool-results/{tool}/", None, (200, 404, 200, 200, 200, 401)),
    ("PUT", "/api/v1/threads/{thread}/tool-results/new/", {"result": {"ok": True}}, (201, 404, 403, 403, 201, 401)),
    ("GET", "/api/v1/threads/{thread}/tool-calls/{call}/", None, (200, 404, 200, 200, 200, 401)),
    ("PUT", "/api/v1/threads/{thread}/tool-calls/new/", {"tool": "send"}, (201, 404, 403, 403, 201, 401)),
    ("PUT", "/api/v1/threads/{thread}/tool-calls/{call}/result/", {"result": 1}, (200, 404, 403, 403, 200, 401)),
    ("POST", "/api/v1/threads/{thread}/cancel/", {"reason": "stop"}, (403, 404, 403, 403, 200, 401)),
    ("POST", "/api/v1/threads/{thread}/resume/", {"reason": "go"}, (403, 404, 403, 403, 409, 401)),
    # The world's run is leased to a worker, so even an admin's delete is refused (409) until it ends.
    ("DELETE", "/api/v1/threads/{thread}/", {"reason": "erase"}, (403, 404, 403, 403, 409, 401)),
    ("POST", "/api/v1/threads/{thread}/approvals/", APPROVAL, (409, 404, 403, 403, 409, 401)),
    ("GET", "/api/v1/approvals/", None, (200, 200, 200, 200, 200, 401)),
    ("GET", "/api/v1/approvals/{approval}/", None, (200, 404, 200, 200, 200, 401)),
    ("POST", "/api/v1/approvals/{approval}/decide/", {"decision": "approve"}, (403, 404, 403, 200, 200, 401)),
    ("GET", "/api/v1/policies/", None, (403, 403, 200, 200, 200, 401)),
    ("POST", "/api/v1/policies/", {"agent": "travel", "action": "book"}, (403, 403, 403, 403, 201, 401)),
    ("GET", "/api/v1/policies/{policy}/", None, (403, 403, 200, 200, 200, 401)),
    ("PUT", "/api/v1/policies/{policy}/", {"approvals_needed": 1}, (403, 403, 403, 403, 200, 401)),
    ("DELETE", "/api/v1/policies/{policy}/", {}, (403, 403, 403, 403, 200, 401)),
    ("GET", "/api/v1/policies/rules/", None, (403, 403, 200, 200, 200, 401)),
    ("POST", "/api/v1/policies/rules/", RULE, (403, 403, 403, 403, 201, 401)),
    ("GET", "/api/v1/policies/rules/{rule}/", None, (403, 403, 200, 200, 200, 401)),
    ("POST", "/api/v1/policies/rules/{rule}/revoke/", {}, (403, 403, 403, 403, 200, 401)),
    ("GET", "/api/v1/policies/rules/suggest/?agent=travel&action=deploy", None, (403, 403, 403, 403, 200, 401)),
    ("POST", "/api/v1/runs/claim/", {}, (204, 204, 403, 403, 403, 401)),
    ("POST", "/api/v1/runs/{run}/heartbeat/", {}, (200, 404, 403, 403, 403, 401)),
    ("POST", "/api/v1/runs/{run}/complete/", {}, (200, 404, 403, 403, 403, 401)),
    ("POST", "/api/v1/runs/{run}/fail/", {"error": "boom"}, (200, 404, 403, 403, 403, 401)),
    ("GET", "/api/v1/notifications/endpoints/", None, (403, 403, 403, 403, 200, 401)),
    ("POST", "/api/v1/notifications/endpoints/", CHANNEL, (403, 403, 403, 403, 201, 401)),
    ("GET", "/api/v1/notifications/endpoints/{endpoint}/", None, (403, 403, 403, 403, 200, 401)),
    ("PATCH", "/api/v1/notifications/endpoints/{endpoint}/", {"enabled": False}, (403, 403, 403, 403, 200, 401)),
    ("DELETE", "/api/v1/notifications/endpoints/{endpoint}/", None, (403, 403, 403, 403, 204, 401)),
    ("POST", "/api/v1/notifications/endpoints/{endpoint}/rotate-secret/", None, (403, 403, 403, 403, 200, 401)),
    ("GET", "/api/v1/notifications/deliveries/", None, (403, 403, 403, 403, 200, 401)),
    ("GET", "/api/v1/notifications/deliveries/{delivery}/", None, (403, 403, 403, 403, 200, 401)),
    ("POST", "/api/v1/notifications/deliveries/{delivery}/redeliver/", None, (403, 403, 403, 403, 201, 401)),
    # Memory: the world's owner agent wrote world.notes/k and made the board world.board.
    ("GET", "/api/v1/memory/namespaces/", None, (200, 200, 200, 200, 200, 401)),
    ("GET", "/api/v1/memory/items/", None, (200, 200, 200, 200, 200, 401)),
    ("GET", "/api/v1/memory/namespaces/world.notes/items/", None, (200, 200, 200, 200, 200, 401)),
    ("GET", "/api/v1/memory/namespaces/world.notes/items/k/", None, (200, 404, 200, 200, 200, 401)),
    ("PUT", "/api/v1/memory/namespaces/world.notes/items/k/", {"value": 2}, (200, 404, 403, 403, 200, 401)),
    ("DELETE", "/api/v1/memory/namespaces/world.notes/items/k/", None, (200, 404, 403, 403, 200, 401)),
    ("GET", "/api/v1/memory/namespaces/world.notes/items/k/history/", None, (200, 404, 200, 200, 200, 401)),
    ("POST", "/api/v1/memory/boards/", {"namespace": ["world", "board"]}, (200, 404, 403, 403, 200, 401)),
    ("GET", "/api/v1/memory/boards/world.board/", None, (200, 404, 200, 200, 200, 401)),
    ("GET", "/api/v1/memory/boards/world.board/events/", None, (200, 404, 200, 200, 200, 401)),
    ("GET", "/api/v1/memory/boards/world.board/leases/", None, (200, 404, 200, 200, 200, 401)),
    ("POST", "/api/v1/memory/boards/world.board/leases/", LEASE, (201, 404, 403, 403, 201, 401)),
    ("POST", "/api/v1/memory/boards/world.board/leases/renew/", RENEW, (409, 404, 403, 403, 409, 401)),
    ("POST", "/api/v1/memory/boards/world.board/leases/release/", RELEASE, (409, 404, 403, 403, 409, 401)),
    ("GET", "/api/v1/memory/grants/", None, (200, 200, 200, 200, 200, 401)),
    ("POST", "/api/v1/memory/grants/", GRANT, (403, 403, 403, 403, 201, 401)),
    ("POST", "/api/v1/memory/grants/{grant}/revoke/", {"reason": "done"}, (403, 403, 403, 403, 200, 401)),
]  # fmt: skip

# Pages use the session only: an agent key opens no page (it is sent to the login page).
PAGES: list[tuple[str, str, dict[str, Any] | None, tuple[int, ...]]] = [
    ("GET", "/", None, (302, 302, 200, 200, 200, 302)),
    ("GET", "/threads/{thread}/", None, (302, 302, 200, 200, 200, 302)),
    ("GET", "/checkpoints/{head}/", None, (302, 302, 200, 200, 200, 302)),
    ("GET", "/checkpoints/{head}/diff/", None, (302, 302, 200, 200, 200, 302)),
    ("GET", "/threads/{thread}/history/?path=/n", None, (302, 302, 200, 200, 200, 302)),
    ("GET", "/checkpoints/{first}/fork/", None, (302, 302, 403, 403, 200, 302)),
    ("POST", "/checkpoints/{first}/fork/", {"reason": "try again", "step": "review"}, (302, 302, 403, 403, 200, 302)),
    ("GET", "/checkpoints/{first}/rerun/", None, (302, 302, 403, 403, 200, 302)),
    ("POST", "/checkpoints/{first}/rerun/", {"reason": "again"}, (302, 302, 403, 403, 302, 302)),
    ("GET", "/threads/{thread}/cancel/", None, (302, 302, 403, 403, 200, 302)),
    ("POST", "/threads/{thread}/cancel/", {"reason": "stop"}, (302, 302, 403, 403, 302, 302)),
    ("GET", "/threads/{thread}/resume/", None, (302, 302, 403, 403, 200, 302)),
    ("POST", "/threads/{thread}/resume/", {"reason": "go"}, (302, 302, 403, 403, 409, 302)),
    ("GET", "/threads/{thread}/delete/", None, (302, 302, 403, 403, 200, 302)),
    ("POST", "/threads/{thread}/delete/", {"reason": "erase"}, (302, 302, 403, 403, 409, 302)),
    # A digest the thread has no blob for: who may read the thread gets to the 404, nobody else.
    ("GET", "/threads/{thread}/blobs/{digest}/", None, (302, 302, 404, 404, 404, 302)),
    ("GET", "/inbox/", None, (302, 302, 200, 200, 200, 302)),
    ("GET", "/inbox/{approval}/", None, (302, 302, 200, 200, 200, 302)),
    ("POST", "/inbox/{approval}/", {"decision": "approve"}, (302, 302, 403, 302, 302, 302)),
    # The world's approval is high-risk: nothing to approve together, a 400 for those who may decide.
    ("GET", "/inbox/bulk/?approval={approval}", None, (302, 302, 403, 400, 400, 302)),
    ("POST", "/inbox/bulk/", {"approval": "{approval}"}, (302, 302, 403, 400, 400, 302)),
    ("GET", "/audit/", None, (302, 302, 403, 403, 200, 302)),
    ("GET", "/memory/", None, (302, 302, 200, 200, 200, 302)),
    ("GET", "/memory/item/?ns=nowhere&key=k", None, (302, 302, 404, 404, 404, 302)),
    ("GET", "/memory/item/rollback/?ns=nowhere&key=k&to=1", None, (302, 302, 403, 403, 404, 302)),
    ("GET", "/training-data/", None, (302, 302, 403, 403, 200, 302)),
    ("GET", "/policies/", None, (302, 302, 403, 403, 200, 302)),
    ("GET", "/policies/new/", None, (302, 302, 403, 403, 200, 302)),
    ("POST", "/policies/new/", POLICY_FORM, (302, 302, 403, 403, 302, 302)),
    ("GET", "/policies/{policy}/", None, (302, 302, 403, 403, 200, 302)),
    ("POST", "/policies/{policy}/", POLICY_FORM, (302, 302, 403, 403, 302, 302)),
    ("GET", "/policies/{policy}/retire/", None, (302, 302, 403, 403, 200, 302)),
    ("POST", "/policies/{policy}/retire/", {"reason": "gone"}, (302, 302, 403, 403, 302, 302)),
    ("GET", "/policies/rules/new/", None, (302, 302, 403, 403, 200, 302)),
    ("POST", "/policies/rules/new/", RULE_FORM, (302, 302, 403, 403, 302, 302)),
    ("GET", "/policies/rules/{rule}/", None, (302, 302, 403, 403, 200, 302)),
    ("GET", "/policies/rules/{rule}/revoke/", None, (302, 302, 403, 403, 200, 302)),
    ("POST", "/policies/rules/{rule}/revoke/", {"reason": "gone"}, (302, 302, 403, 403, 302, 302)),
    ("GET", "/notifications/", None, (302, 302, 403, 403, 200, 302)),
    ("POST", "/notifications/new/", CHANNEL_FORM, (302, 302, 403, 403, 302, 302)),
    ("GET", "/notifications/{endpoint}/", None, (302, 302, 403, 403, 200, 302)),
    ("POST", "/notifications/{endpoint}/", {"name": "ops"}, (302, 302, 403, 403, 302, 302)),
    ("POST", "/notifications/{endpoint}/subscriptions/", {"events": "thread.failed"}, (302, 302, 403, 403, 302, 302)),
    ("POST", "/notifications/{endpoint}/subscriptions/{subscription}/remove/", {}, (302, 302, 403, 403, 302, 302)),
    ("GET", "/notifications/{endpoint}/secret/", None, (302, 302, 403, 403, 200, 302)),
    ("POST", "/notifications/{endpoint}/secret/", {}, (302, 302, 403, 403, 200, 302)),
    ("GET", "/notifications/{endpoint}/delete/", None, (302, 302, 403, 403, 200, 302)),
    ("POST", "/notifications/{endpoint}/delete/", {}, (302, 302, 403, 403, 302, 302)),
    ("GET", "/notifications/deliveries/{delivery}/", None, (302, 302, 403, 403, 200, 302)),
    ("POST", "/notifications/deliveries/{delivery}/send-again/", {}, (302, 302, 403, 403, 302, 302)),
    # A decision link: anyone who may decide, once signed in (an agent key is no sign-in).
    ("GET", "/notifications/decide/{token}/", None, (302, 302, 403, 200, 200, 302)),
    ("POST", "/notifications/decide/{token}/", {}, (302, 302, 403, 302, 302, 302)),
    # People: admins only ({person} is an active viewer); choosing one's own password: anyone signed in.
    ("GET", "/people/", None, (302, 302, 403, 403, 200, 302)),
    ("GET", "/people/new/", None, (302, 302, 403, 403, 200, 302)),
    ("POST", "/people/new/", {"username": "newcomer", "role": "viewer"}, (302, 302, 403, 403, 200, 302)),
    ("GET", "/people/{person}/", None, (302, 302, 403, 403, 200, 302)),
    ("POST", "/people/{person}/role/", {"role": "reviewer"}, (302, 302, 403, 403, 302, 302)),
    ("GET", "/people/{person}/deactivate/", None, (302, 302, 403, 403, 200, 302)),
    ("POST", "/people/{person}/deactivate/", {}, (302, 302, 403, 403, 302, 302)),
    ("GET", "/people/{person}/reactivate/", None, (302, 302, 403, 403, 200, 302)),
    ("GET", "/people/{person}/reset-password/", None, (302, 302, 403, 403, 200, 302)),
    ("POST", "/people/{person}/reset-password/", {}, (302, 302, 403, 403, 200, 302)),
    ("GET", "/password/", None, (302, 302, 200, 200, 200, 302)),
    ("POST", "/password/", {}, (302, 302, 400, 400, 400, 302)),
]  # fmt: skip

# Websockets: ACCEPT, or the close code the consumer answers with.
SOCKETS: list[tuple[str, tuple[str | int, ...]]] = [
    ("/ws/threads/{thread}/", (ACCEPT, 4404, ACCEPT, ACCEPT, ACCEPT, 4401)),
    ("/ws/inbox/", (ACCEPT, ACCEPT, ACCEPT, ACCEPT, ACCEPT, 4401)),
    ("/ws/memory/boards/world.board/", (ACCEPT, 4404, ACCEPT, ACCEPT, ACCEPT, 4401)),
    ("/ws/memory/?ns=world&since=2026-01-01T00:00:00%2B00:00", (4403, 4403, ACCEPT, ACCEPT, ACCEPT, 4401)),
]


@pytest.fixture(autouse=True)
def _fast_passwords(settings: Any) -> None:
    # Named people get real passwords; hashing 230 of them properly would be most of the run.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    # Every row looks its key up in the database, as it would with a key it had never seen: the
    # world, and so its keys, is shared by the module's rows (see `world`).
    settings.QUICKSAVE_KEY_CACHE_SECONDS = 0


def _rows(table: list[Any]) -> list[Any]:
    return [
        pytest.param(
            *row[:-1], principal, expected, id=" ".join([*(p for p in row[:-1] if isinstance(p, str)), principal])
        )
        for row in table
        for principal, expected in zip(PRINCIPALS, row[-1], strict=True)
    ]


@dataclass
class World:
    ids: dict[str, str]
    keys: dict[str, str]

    def fill(self, value: Any) -> Any:
        """The path or body with {thread}, {head}, ... replaced by this world's ids."""
        if isinstance(value, str):
            return value.format(**self.ids)
        if isinstance(value, dict):
            return {key: self.fill(item) for key, item in value.items()}
        return value


def build_world() -> World:
    agent = get_or_create_agent(name="travel")
    owner_key, owner_secret = create_agent_key(agent=agent, label="owner")
    foreign_secret = create_agent_key(agent=get_or_create_agent(name="code-review"), label="foreign")[1]
    thread, _ = storage.create_thread(agent=agent, external_id="trip-1")
    first = storage.append_checkpoint(thread=thread, parent=None, state={"n": 1}, label="first")
    head = storage.append_checkpoint(thread=thread, parent=first.pk, state={"n": 2}, label="head")
    put_tool_result(thread=thread, key="search-1", result={"hits": 3}, checkpoint=head)
    tool_calls.begin(thread_id=thread.pk, key="call-1", tool="send", args={"to": "a@b.c"})
    endpoint, _ = create_endpoint(name="ops", kind="webhook", url="http://127.0.0.1:9/unused", decision_links=True,
                                  subscriptions=[SubscriptionSpec(events=["approval.requested"])],
                                  actor=User.objects.create_user("world-admin"))  # fmt: skip
    approval = request_approval(thread=thread, checkpoint=head, action="deploy", args={"env": "prod"})
    dispatch.fan_out()
    delivery = Delivery.objects.get()
    runs.enqueue_run(thread=thread, checkpoint=head, reason="test")
    # Leased for longer than the module's rows take, which share one world.
    run = runs.claim_run(agents=[agent], worker=f"key:{owner_key.prefix}", lease_seconds=3600)
    assert run is not None
    # A policy and a rule for another action than the world's approval, which stays any reviewer's to decide.
    maker = User.objects.create_user("policy-maker")
    version = policies.create_policy(agent=agent, action="refund", terms=policies.Terms(), actor=maker)
    rule = rules.create_rule(name="tiny refunds", agent=agent, action="refund", actor=maker,
                             conditions=[{"path": "/amount", "op": "lt", "value": 5}])  # fmt: skip
    owner_scope = Scope(agent.pk)
    memory_store.put_item(namespace=("world", "notes"), key="k", value=1, scope=owner_scope,
                          author=memory_store.Author.agent(agent.pk))  # fmt: skip
    boards.make_board(namespace=("world", "board"), scope=owner_scope)
    # A grant of another prefix than the world's, so that granting "world" stays possible.
    grant = sharing.grant_namespace(prefix=("elsewhere",), agent=get_or_create_agent(name="code-review"),
                                    user=maker, reason="world")  # fmt: skip
    ids = {"thread": thread.pk, "grant": grant.pk,
           "first": first.pk, "head": head.pk, "approval": approval.pk, "run": run.pk,
           "policy": version.policy_id, "rule": rule.pk, "endpoint": endpoint.pk,
           "subscription": endpoint.subscriptions.get().pk, "delivery": delivery.pk,
           "token": delivery.body["approval"]["decide"]["approve"].rstrip("/").rpartition("/")[2],
           "person": person("teammate", "viewer").pk}  # fmt: skip
    return World(
        ids={
            **{name: str(value) for name, value in ids.items()},
            "tool": "search-1",
            "call": "call-1",
            "digest": "0" * 64,
        },
        keys={OWNER: owner_secret, FOREIGN: foreign_secret},
    )


@pytest.fixture(scope="module")
def world(django_db_setup: Any, django_db_blocker: Any) -> Iterator[World]:
    """One world for all the rows of the module, as Django's TestCase.setUpTestData makes one per
    class: built once in a transaction that each row's own (a savepoint in it) rolls back to, so
    each row starts from the same world, and rolled back after the last row. Building it took most
    of each row's time."""
    with django_db_blocker.unblock(), transaction.atomic():
        built = build_world()
        with django_db_blocker.block():
            yield built
        transaction.set_rollback(True)


def api_client(world: World, principal: str) -> APIClient:
    client = APIClient()
    if principal in world.keys:
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {world.keys[principal]}")
    elif principal != ANONYMOUS:
        client.force_login(person(principal, principal))
    return client


def page_client(world: World, principal: str) -> Client:
    if principal in world.keys:
        return Client(HTTP_AUTHORIZATION=f"Bearer {world.keys[principal]}")
    client = Client()
    if principal != ANONYMOUS:
        client.force_login(person(principal, principal))
    return client


@pytest.mark.django_db
@pytest.mark.parametrize(("method", "path", "body", "principal", "expected"), _rows(API))
def test_api(world: World, method: str, path: str, body: dict[str, Any] | None, principal: str, expected: int) -> None:
    client = api_client(world, principal)
    response = client.generic(method, world.fill(path), **_json(world.fill(body)))
    assert response.status_code == expected, response.content[:300]


def _json(body: dict[str, Any] | None) -> dict[str, Any]:
    if body is None:
        return {}
    return {"data": json.dumps(body), "content_type": "application/json"}


@pytest.mark.django_db
@pytest.mark.parametrize(("method", "path", "body", "principal", "expected"), _rows(PAGES))
def test_page(world: World, method: str, path: str, body: dict[str, Any] | None, principal: str, expected: int) -> None:
    client = page_client(world, principal)
    url = world.fill(path)
    response = client.post(url, body or {}) if method == "POST" else client.get(url)
    assert response.status_code == expected, response.content[:300]
    if expected == 302 and principal in (OWNER, FOREIGN, ANONYMOUS):
        assert response["Location"].startswith("/login/")


@pytest.fixture
def application() -> Any:
    from channels.auth import AuthMiddlewareStack
    from channels.routing import URLRouter

    from approvals.routing import websocket_urlpatterns as inbox_routes
    from checkpoints.routing import websocket_urlpatterns as thread_routes
    from memory.routing import websocket_urlpatterns as memory_routes
    from quicksave_agents.ws_auth import AgentKeyAuthMiddleware

    return AuthMiddlewareStack(AgentKeyAuthMiddleware(URLRouter([*thread_routes, *inbox_routes, *memory_routes])))


def _handshake_headers(world: World, principal: str) -> list[tuple[bytes, bytes]]:
    """What a real client sends: the key in the Authorization header, or the session cookie."""
    if principal in world.keys:
        return [(b"authorization", f"Bearer {world.keys[principal]}".encode())]
    if principal == ANONYMOUS:
        return []
    client = Client()
    client.force_login(person(principal, principal))
    return [(b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode())]


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("path", "principal", "expected"), _rows(SOCKETS))
async def test_websocket(application: Any, path: str, principal: str, expected: str | int) -> None:
    world = await sync_to_async(build_world)()
    headers = await sync_to_async(_handshake_headers)(world, principal)
    communicator = WebsocketCommunicator(application, world.fill(path), headers=headers)
    refused = await handshake(communicator)
    try:
        assert (ACCEPT if refused is None else refused) == expected
    finally:
        await communicator.disconnect()


@pytest.mark.django_db
@pytest.mark.parametrize(
    "path", ["/api/v1/threads/", "/api/v1/approvals/", "/api/v1/memory/namespaces/", "/api/v1/memory/items/"]
)
def test_a_foreign_key_lists_none_of_the_owners_rows(world: World, path: str) -> None:
    owner = api_client(world, OWNER).get(path).json()["results"]
    foreign = api_client(world, FOREIGN).get(path).json()["results"]
    assert owner and not foreign
