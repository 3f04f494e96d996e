"""Approvals: request, decide exactly once, expire, and the resume run each decision queues."""

from __future__ import annotations

import json
import threading
from datetime import timedelta
from typing import Any

import httpx
import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from approvals.models import ApprovalRequest, ApprovalStatus
from checkpoints import storage
from checkpoints.models import Event, Thread, ThreadStatus
from quicksave_agents.models import Agent, Run, RunReason, RunStatus
from tests.conftest import person


def api_as(user: User) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def post(client: APIClient, url: str, body: Any) -> Any:
    return client.post(url, data=json.dumps(body), content_type="application/json")


@pytest.fixture
def reviewer(db: Any) -> User:
    return person("rita", "reviewer")


@pytest.fixture
def suspended(owner_client: APIClient, thread: Thread) -> dict[str, Any]:
    """A travel thread suspended at a checkpoint, waiting to book a flight."""
    checkpoint = storage.append_checkpoint(thread=thread, parent=None, state={"offer": {"price": 420}}, step=3,
                                         label="book_flight", status="waiting_for_approval")  # fmt: skip
    response = post(owner_client, f"/api/v1/threads/{thread.pk}/approvals/", {
        "checkpoint": str(checkpoint.pk), "action": "book_flight", "args": {"flight": "SK123", "price": 420},
        "message": "Book the cheapest direct flight?", "risk": "high",
    })  # fmt: skip
    assert response.status_code == 201, response.content
    return response.json()


def test_requesting_an_approval_suspends_the_thread(suspended: dict[str, Any], thread: Thread) -> None:
    assert suspended["status"] == "pending"
    assert suspended["decision"] is None
    assert (suspended["action"], suspended["agent"]) == ("book_flight", "travel")
    thread.refresh_from_db()
    assert thread.status == ThreadStatus.WAITING_FOR_APPROVAL
    assert Event.objects.filter(thread=thread, type="approval.requested").count() == 1


def test_a_second_pending_approval_on_one_thread_is_refused(
    owner_client: APIClient, suspended: dict[str, Any], thread: Thread
) -> None:
    again = post(owner_client, f"/api/v1/threads/{thread.pk}/approvals/",
                 {"checkpoint": suspended["checkpoint"], "action": "book_hotel"})  # fmt: skip
    assert again.status_code == 409
    assert again.json()["error"]["code"] == "approval_pending"


def test_approving_queues_exactly_one_resume_run(reviewer: User, suspended: dict[str, Any], thread: Thread) -> None:
    response = post(api_as(reviewer), f"/api/v1/approvals/{suspended['id']}/decide/", {"decision": "approve"})

    assert response.status_code == 200, response.content
    decision = response.json()["decision"]
    assert (decision["status"], decision["decided_by"], decision["args"]) == (
        "approved", "rita", {"flight": "SK123", "price": 420})  # fmt: skip
    run = Run.objects.get(thread=thread)
    assert (run.reason, run.status, str(run.checkpoint_id)) == (RunReason.APPROVAL, RunStatus.QUEUED,
                                                                suspended["checkpoint"])  # fmt: skip
    thread.refresh_from_db()
    assert thread.status == ThreadStatus.RUNNING
    types = list(Event.objects.filter(thread=thread).order_by("seq").values_list("type", flat=True))
    assert types[-2:] == ["approval.decided", "run.queued"]


def test_second_decision_gets_409_naming_who_and_when(reviewer: User, suspended: dict[str, Any]) -> None:
    url = f"/api/v1/approvals/{suspended['id']}/decide/"
    assert post(api_as(reviewer), url, {"decision": "approve"}).status_code == 200

    late = post(api_as(person("ravi", "admin")), url, {"decision": "reject", "comment": "too pricey"})

    assert late.status_code == 409
    error = late.json()["error"]
    assert error["code"] == "already_decided"
    assert error["detail"]["decided_by"] == "rita"
    assert error["detail"]["decided_at"]
    assert "rita already decided" in error["message"]
    assert Run.objects.count() == 1


def test_reject_needs_a_comment(reviewer: User, suspended: dict[str, Any]) -> None:
    url = f"/api/v1/approvals/{suspended['id']}/decide/"
    missing = post(api_as(reviewer), url, {"decision": "reject"})
    assert missing.status_code == 422
    assert missing.json()["error"]["detail"]["field"] == "comment"
    assert ApprovalRequest.objects.get(pk=suspended["id"]).status == ApprovalStatus.PENDING

    rejected = post(api_as(reviewer), url, {"decision": "reject", "comment": "Over budget"})
    assert rejected.json()["decision"]["comment"] == "Over budget"
    assert rejected.json()["decision"]["args"] is None


def test_edited_args_are_checked_against_the_agents_schema(
    reviewer: User, suspended: dict[str, Any], agent: Agent
) -> None:
    agent.action_schemas = {"book_flight": {
        "type": "object", "required": ["flight", "price"],
        "properties": {"flight": {"type": "string"}, "price": {"type": "number", "maximum": 500}},
    }}  # fmt: skip
    agent.save()
    url = f"/api/v1/approvals/{suspended['id']}/decide/"

    bad = post(api_as(reviewer), url, {"decision": "approve", "args": {"flight": "SK123", "price": 900}})
    assert bad.status_code == 422
    assert bad.json()["error"]["detail"]["errors"][0]["path"] == "/price"
    assert Run.objects.count() == 0

    good = post(api_as(reviewer), url, {"decision": "approve", "args": {"flight": "SK125", "price": 390}})
    assert good.status_code == 200
    assert good.json()["decision"] | {"decided_at": None} == {
        "status": "approved", "resolution": None, "args": {"flight": "SK125", "price": 390}, "args_edited": True,
        "comment": "", "decided_by": "rita", "decided_at": None, "rule": None,
    }  # fmt: skip


@pytest.mark.parametrize("role", ["viewer", None])
def test_people_without_the_reviewer_role_cannot_decide(suspended: dict[str, Any], role: str | None) -> None:
    response = post(api_as(person("vic", role)), f"/api/v1/approvals/{suspended['id']}/decide/",
                    {"decision": "approve"})  # fmt: skip
    assert response.status_code in (403, 404)  # a person with no role cannot even see it
    assert Run.objects.count() == 0


def test_an_agent_key_cannot_decide_its_own_approval(owner_client: APIClient, suspended: dict[str, Any]) -> None:
    response = post(owner_client, f"/api/v1/approvals/{suspended['id']}/decide/", {"decision": "approve"})
    assert response.status_code == 403
    assert Run.objects.count() == 0


def test_another_agents_approval_is_a_404(foreign_client: APIClient, suspended: dict[str, Any]) -> None:
    assert foreign_client.get(f"/api/v1/approvals/{suspended['id']}/").status_code == 404


def test_an_overdue_approval_expires_as_a_rejection_and_a_late_decision_gets_409(
    reviewer: User, suspended: dict[str, Any], thread: Thread
) -> None:
    ApprovalRequest.objects.filter(pk=suspended["id"]).update(expires_at=timezone.now() - timedelta(seconds=1))

    late = post(api_as(reviewer), f"/api/v1/approvals/{suspended['id']}/decide/", {"decision": "approve"})

    assert late.status_code == 409
    assert late.json()["error"]["code"] == "expired"
    approval = ApprovalRequest.objects.get(pk=suspended["id"])
    assert (approval.status, approval.decided_args) == (ApprovalStatus.EXPIRED, None)
    assert Run.objects.filter(thread=thread, approval=approval).count() == 1  # the agent learns it was refused


def test_expire_due_closes_overdue_approvals(suspended: dict[str, Any]) -> None:
    from approvals.services import expire_due

    ApprovalRequest.objects.filter(pk=suspended["id"]).update(expires_at=timezone.now() - timedelta(minutes=1))
    assert expire_due() == 1
    assert expire_due() == 0
    assert ApprovalRequest.objects.get(pk=suspended["id"]).status == ApprovalStatus.EXPIRED


def test_inbox_lists_pending_oldest_first_filtered_by_agent(
    owner_client: APIClient, reviewer: User, suspended: dict[str, Any]
) -> None:
    listed = api_as(reviewer).get("/api/v1/approvals/?status=pending").json()
    assert [item["id"] for item in listed["results"]] == [suspended["id"]]
    assert api_as(reviewer).get("/api/v1/approvals/?agent=code-review").json()["results"] == []
    assert api_as(reviewer).get("/api/v1/approvals/?status=nope").status_code == 400
    assert [item["id"] for item in api_as(reviewer).get("/api/v1/approvals/?limit=1").json()["results"]] == [
        suspended["id"]
    ]
    refused = api_as(reviewer).get("/api/v1/approvals/?limit=500")
    assert refused.status_code == 400
    assert refused.json()["error"]["detail"]["fields"]["limit"] == ["Ensure this value is less than or equal to 200."]


@pytest.mark.django_db(transaction=True)
def test_two_reviewers_deciding_at_the_same_moment_exactly_one_wins(live_server: Any, agent: Agent) -> None:
    thread, _ = storage.create_thread(agent=agent)
    checkpoint = storage.append_checkpoint(thread=thread, parent=None, state={"a": 1})
    from approvals.services import request_approval

    approval = request_approval(thread=thread, checkpoint=checkpoint, action="deploy", args={"env": "prod"})
    sessions = []
    for name in ("rita", "ravi"):
        user = person(name, "reviewer")
        browser = Client()
        browser.force_login(user)
        http = httpx.Client(base_url=live_server.url, cookies={"sessionid": browser.cookies["sessionid"].value})
        assert http.get("/").status_code == 200  # a page with a form sets the CSRF cookie
        sessions.append(http)
    barrier = threading.Barrier(2)
    results: list[httpx.Response] = []

    def decide(http: httpx.Client, decision: dict[str, str]) -> None:
        barrier.wait()
        results.append(http.post(f"/api/v1/approvals/{approval.pk}/decide/", json=decision,
                                 headers={"X-CSRFToken": http.cookies["csrftoken"]}))  # fmt: skip

    racers = [
        threading.Thread(target=decide, args=(sessions[0], {"decision": "approve"})),
        threading.Thread(target=decide, args=(sessions[1], {"decision": "reject", "comment": "not today"})),
    ]
    for racer in racers:
        racer.start()
    for racer in racers:
        racer.join()

    assert sorted(response.status_code for response in results) == [200, 409]
    loser = next(response for response in results if response.status_code == 409).json()["error"]
    winner = next(response for response in results if response.status_code == 200).json()["decision"]
    assert loser["code"] == "already_decided"
    assert loser["detail"]["decided_by"] == winner["decided_by"]
    assert Run.objects.filter(approval=approval).count() == 1


def test_the_documented_approval_schema_matches_what_the_api_returns(reviewer: User, suspended: dict[str, Any]) -> None:
    from approvals.serializers import ApprovalSchemaSerializer, DecisionSchemaSerializer

    assert set(suspended) == set(ApprovalSchemaSerializer().fields)
    decided = post(api_as(reviewer), f"/api/v1/approvals/{suspended['id']}/decide/", {"decision": "approve"}).json()
    assert set(decided["decision"]) == set(DecisionSchemaSerializer().fields)
