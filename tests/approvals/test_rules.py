"""Auto-approve rules: a matching request is approved at once by the rule, audited and on the thread's
feed; a revoked rule stops at once; rules can be suggested from identical human approvals."""

from __future__ import annotations

import json
import threading
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection, transaction
from django.utils import timezone
from rest_framework.test import APIClient

from approvals import rules
from approvals.models import ApprovalRequest, ApprovalStatus, AutoApproveRule
from audit.models import AuditEntry
from checkpoints.models import Event
from quicksave_agents.keys import get_or_create_agent
from quicksave_agents.models import Run
from tests.approvals.factories import waiting
from tests.conftest import person
from tests.waiting import wait_until

pytestmark = pytest.mark.django_db

CONDITIONS: list[dict[str, Any]] = [
    {"path": "/price", "op": "lt", "value": 500},
    {"path": "/flight", "op": "in", "value": ["SK123"]},
]
SMALL_FLIGHTS = {"name": "Cheap flights", "agent": "travel", "action": "book_flight", "conditions": CONDITIONS,
                 "max_risk": "medium"}  # fmt: skip


def api_as(user: User) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def post(client: APIClient, url: str, body: Any) -> Any:
    return client.post(url, data=json.dumps(body), content_type="application/json")


@pytest.fixture
def ada(agent: Any) -> User:
    """An admin, with the travel agent registered."""
    return person("ada", "admin")


def ask(owner_client: APIClient, thread: Any, args: dict[str, Any], risk: str = "medium") -> dict[str, Any]:
    """The agent asks, over the API, as it would: a checkpoint at the head, then the request."""
    from checkpoints import storage

    head = thread.__class__.objects.get(pk=thread.pk).head_id
    checkpoint = storage.append_checkpoint(thread=thread, parent=head, state={"args": args},
                                           status="waiting_for_approval")  # fmt: skip
    body = {"checkpoint": str(checkpoint.pk), "action": "book_flight", "args": args, "risk": risk}
    response = post(owner_client, f"/api/v1/threads/{thread.pk}/approvals/", body)
    assert response.status_code == 201, response.content
    return dict(response.json())


def test_a_rule_fires_is_audited_is_revoked_and_stops(ada: User, owner_client: APIClient, thread: Any) -> None:
    made = post(api_as(ada), "/api/v1/policies/rules/", SMALL_FLIGHTS)
    assert made.status_code == 201, made.content
    rule = made.json()
    assert (rule["live"], rule["approved"], rule["created_by"]) == (True, 0, "ada")

    fired = ask(owner_client, thread, {"flight": "SK123", "price": 420})

    assert fired["status"] == "approved"
    assert fired["decision"]["rule"] == {"id": rule["id"], "name": "Cheap flights"}
    assert (fired["decision"]["decided_by"], fired["decision"]["args"]) == (None, {"flight": "SK123", "price": 420})
    entry = AuditEntry.objects.get(action="approval.approve", target_id=fired["id"])
    assert (entry.actor, entry.actor_name, entry.after["rule"]) == (None, f"rule:{rule['id']}", rule["id"])
    assert "Cheap flights" in entry.reason
    decided = Event.objects.get(thread=thread, type="approval.decided", data__approval=fired["id"])
    assert decided.data["rule"] == "Cheap flights"
    assert Run.objects.filter(approval_id=fired["id"]).count() == 1
    assert api_as(ada).get(f"/api/v1/policies/rules/{rule['id']}/").json()["approved"] == 1

    revoked = post(api_as(ada), f"/api/v1/policies/rules/{rule['id']}/revoke/", {"reason": "fares went up"})
    assert revoked.status_code == 200, revoked.content
    assert (revoked.json()["live"], revoked.json()["revoked_by"]) == (False, "ada")
    assert AuditEntry.objects.get(action="rule.revoke", target_id=str(rule["id"])).reason == "fares went up"

    stopped = ask(owner_client, thread, {"flight": "SK123", "price": 420})

    assert (stopped["status"], stopped["decision"]) == ("pending", None)
    again = post(api_as(ada), f"/api/v1/policies/rules/{rule['id']}/revoke/", {})
    assert (again.status_code, again.json()["error"]["code"]) == (409, "rule_revoked")


@pytest.mark.parametrize(
    ("agent", "args", "risk"),
    [
        ("travel", {"flight": "SK123", "price": 900}, "low"),  # a condition fails
        ("travel", {"flight": "SK999", "price": 100}, "low"),  # not `in` the list
        ("travel", {"flight": "SK123"}, "low"),  # the path is missing
        ("travel", {"flight": "SK123", "price": "100"}, "low"),  # a string is not less than a number
        ("travel", {"flight": "SK123", "price": 100}, "high"),  # above the risk ceiling
        ("code-review", {"flight": "SK123", "price": 100}, "low"),  # another agent
    ],
)
def test_requests_outside_the_rule_wait_for_a_person(ada: User, agent: str, args: Any, risk: str) -> None:
    rules.create_rule(name="Cheap flights", agent=get_or_create_agent(name="travel"), action="book_flight",
                      conditions=CONDITIONS, max_risk="medium", actor=ada)  # fmt: skip

    assert waiting(agent=agent, args=args, risk=risk).status == ApprovalStatus.PENDING


def test_an_expired_rule_approves_nothing(ada: User) -> None:
    rule = rules.create_rule(name="Until tonight", agent=None, action="book_flight", max_risk="high",
                             conditions=[{"path": "/price", "op": "le", "value": 500}], actor=ada,
                             expires_at=timezone.now() + timedelta(hours=1))  # fmt: skip
    assert waiting().rule == rule  # an agent-less rule applies to every agent
    AutoApproveRule.objects.filter(pk=rule.pk).update(expires_at=timezone.now() - timedelta(seconds=1))

    assert waiting().status == ApprovalStatus.PENDING


def test_a_json_schema_rule_approves_what_the_schema_accepts(ada: User) -> None:
    schema = {"type": "object", "properties": {"price": {"type": "integer", "maximum": 500}}, "required": ["price"]}
    rules.create_rule(name="Schema", agent=None, action="book_flight", args_schema=schema, max_risk="high",
                      actor=ada)  # fmt: skip

    assert waiting(args={"price": 499}).status == ApprovalStatus.APPROVED
    assert waiting(args={"price": 501}).status == ApprovalStatus.PENDING
    assert waiting(args={"price": True}).status == ApprovalStatus.PENDING


@pytest.mark.parametrize(
    ("condition", "args", "holds"),
    [
        ({"path": "/on", "op": "eq", "value": True}, {"on": True}, True),
        ({"path": "/on", "op": "eq", "value": True}, {"on": 1}, False),  # JSON: true is not 1
        ({"path": "/n", "op": "eq", "value": 1}, {"n": 1.0}, True),
        ({"path": "/n", "op": "ne", "value": 1}, {"n": 2}, True),
        ({"path": "/a~1b/0", "op": "ge", "value": "m"}, {"a/b": ["z"]}, True),  # RFC 6901 escapes, list index
        ({"path": "/list/01", "op": "eq", "value": 1}, {"list": [0, 1]}, False),  # no leading zeros
        ({"path": "", "op": "in", "value": [[1, 2]]}, [1, 2], True),  # the whole args
        ({"path": "/n", "op": "gt", "value": 1}, {"n": None}, False),
    ],
)
def test_conditions_compare_json_values(condition: dict[str, Any], args: Any, holds: bool) -> None:
    rule = AutoApproveRule(conditions=[condition], max_risk="high")
    assert rules.matches(rule, args=args, risk="low") is holds


@pytest.mark.parametrize(
    ("change", "field", "says"),
    [
        ({"conditions": [{"path": "price", "op": "lt", "value": 5}]}, "conditions", "conditions[0].path"),
        ({"conditions": [{"path": "/price", "op": "below", "value": 5}]}, "conditions", "conditions[0].op"),
        ({"conditions": [{"path": "/p", "op": "in", "value": 5}]}, "conditions", "must be a list"),
        ({"conditions": [], "args_schema": None}, "conditions", "at least one condition"),
        ({"args_schema": {"type": "nonsense"}}, "args_schema", "not a valid JSON Schema"),
        ({"agent": "nobody"}, "agent", "No agent is named"),
        ({"max_risk": "extreme"}, "max_risk", ""),
        ({"expires_at": "2001-01-01T00:00:00Z"}, "expires_at", "in the future"),
        ({"unknown": 1}, "unknown", "not a field here"),
    ],
)
def test_a_bad_rule_gets_a_400_naming_its_field_and_nothing_is_made(
    ada: User, change: dict[str, Any], field: str, says: str
) -> None:
    refused = post(api_as(ada), "/api/v1/policies/rules/", SMALL_FLIGHTS | change)

    assert refused.status_code == 400, refused.content
    error = refused.json()["error"]
    assert list(error["detail"]["fields"]) == [field]
    assert says in json.dumps(error["detail"]["fields"][field])
    assert not AutoApproveRule.objects.exists()


def test_only_admins_make_or_revoke_rules(ada: User, owner_client: APIClient) -> None:
    rule = post(api_as(ada), "/api/v1/policies/rules/", SMALL_FLIGHTS).json()
    reviewer = api_as(person("rita", "reviewer"))

    assert post(reviewer, "/api/v1/policies/rules/", SMALL_FLIGHTS).status_code == 403
    assert post(reviewer, f"/api/v1/policies/rules/{rule['id']}/revoke/", {}).status_code == 403
    assert reviewer.get("/api/v1/policies/rules/").status_code == 200
    assert owner_client.get("/api/v1/policies/rules/").status_code == 403
    assert AutoApproveRule.objects.get().revoked_at is None


def test_a_rule_is_suggested_from_the_last_identical_human_approvals(ada: User) -> None:
    rita = person("rita", "reviewer")
    from approvals.services import decide

    for _ in range(3):
        decide(approval=waiting(args={"flight": "SK123", "price": 420}, risk="medium"), user=rita, decision="approve")
    url = "/api/v1/policies/rules/suggest/?agent=travel&action=book_flight&last=3"

    suggested = api_as(ada).get(url).json()

    assert suggested["reason"] is None
    assert suggested["conditions"] == [{"path": "/flight", "op": "eq", "value": "SK123"},
                                       {"path": "/price", "op": "eq", "value": 420}]  # fmt: skip
    assert (suggested["max_risk"], len(suggested["based_on"])) == ("medium", 3)
    body = {"name": "Suggested", "agent": "travel", "action": "book_flight", "conditions": suggested["conditions"],
            "max_risk": suggested["max_risk"]}  # fmt: skip
    made = post(api_as(ada), "/api/v1/policies/rules/", body)
    assert made.status_code == 201
    assert waiting(args={"flight": "SK123", "price": 420}, risk="medium").status == ApprovalStatus.APPROVED

    decide(approval=waiting(args={"flight": "SK124", "price": 420}), user=rita, decision="reject", comment="no")
    refused = api_as(ada).get(url).json()
    assert refused["conditions"] == []
    assert "rejections" in refused["reason"]  # the rule's own approval is no human one; the rejection is


@pytest.mark.django_db(transaction=True)
def test_a_revocation_waits_for_a_match_being_committed_and_then_nothing_matches(ada: User) -> None:
    rule = rules.create_rule(name="Any price", agent=None, action="book_flight", max_risk="high",
                             conditions=[{"path": "/price", "op": "ge", "value": 0}], actor=ada)  # fmt: skip
    matched = threading.Event()
    release = threading.Event()
    filed: list[ApprovalRequest] = []

    def request_and_hold() -> None:
        try:
            with transaction.atomic():
                filed.append(waiting())
                matched.set()
                release.wait(30)
        finally:
            connection.close()

    requester = threading.Thread(target=request_and_hold)
    requester.start()
    assert matched.wait(30)
    revoked: list[AutoApproveRule] = []

    def revoke() -> None:
        try:
            revoked.append(rules.revoke_rule(rule=rule, actor=ada))
        finally:
            connection.close()

    revoker = threading.Thread(target=revoke)
    revoker.start()
    with connection.cursor() as cursor:

        def revoker_waits() -> bool:
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                           "AND query LIKE '%%approvals_autoapproverule%%'")  # fmt: skip
            row = cursor.fetchone()
            return bool(row and row[0])

        wait_until(revoker_waits, what="the revocation to wait on the request that matched the rule")
    assert not revoked
    release.set()
    requester.join(30)
    revoker.join(30)

    assert revoked and filed and filed[0].status == ApprovalStatus.APPROVED
    assert waiting().status == ApprovalStatus.PENDING
