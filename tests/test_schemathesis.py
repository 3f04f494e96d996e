"""Schemathesis against /api/schema/: generated requests, valid and invalid, to every operation of a
running server, signed with an agent key (and the policies' and notifications' operations again as an
admin). No answer may be a 5xx, a 2xx must match its documented schema, and every 4xx must be in the
error format."""

from __future__ import annotations

from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import content_type_conformance, response_schema_conformance

from approvals.services import request_approval
from checkpoints import storage
from quicksave_agents.api import MAX_WAIT_SECONDS
from quicksave_agents.keys import create_agent_key, get_or_create_agent
from quicksave_agents.models import RunReason
from quicksave_agents.runs import enqueue_run

pytestmark = pytest.mark.django_db(transaction=True)

# Per operation; about twenty operations, so this bounds the whole run (well under a minute on 2 cores).
EXAMPLES_PER_OPERATION = 20


@pytest.fixture
def world(transactional_db: Any) -> dict[str, str]:
    """Committed rows for the server process: an agent key, a thread with two checkpoints, an approval, a run."""
    agent = get_or_create_agent(name="travel")
    _, key = create_agent_key(agent=agent, label="schemathesis")
    thread, _ = storage.create_thread(agent=agent, external_id="fuzzed")
    first = storage.append_checkpoint(thread=thread, parent=None, state={"a": 1, "items": [1, 2]})
    checkpoint = storage.append_checkpoint(thread=thread, parent=first.pk, state={"a": 2, "items": [1, 2, 3]})
    approval = request_approval(thread=thread, checkpoint=checkpoint, action="deploy", args={"env": "prod"})
    run = enqueue_run(thread=thread, checkpoint=checkpoint, reason=RunReason.START)
    return {
        "key": key,
        "thread_id": str(thread.pk),
        "checkpoint_id": str(checkpoint.pk),
        "approval_id": str(approval.pk),
        "run_id": str(run.pk),
    }


@pytest.fixture
def api_schema(server_url: str, world: dict[str, str]) -> Any:
    # The schema is served to signed-in people and agent keys only.
    headers = {"Authorization": f"Bearer {world['key']}"}
    return schemathesis.openapi.from_url(f"{server_url}/api/schema/?format=json", headers=headers)


schema = schemathesis.pytest.from_fixture("api_schema")


# Every operation of the API is a subtest of this one test: 83 s alone without coverage, past the
# suite's 120 s under coverage on a busy machine (it did so once, on the POST checkpoints operation).
@pytest.mark.timeout(360)
@schema.parametrize()
@settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))  # fmt: skip
def test_generated_requests_get_no_5xx_and_answers_match_the_schema(case: Any, world: dict[str, str]) -> None:
    # Real ids in the path, so generated bodies and queries reach the views rather than a 404.
    for name, value in world.items():
        if name in (case.path_parameters or {}):
            case.path_parameters[name] = value
    response = case.call_and_validate(
        headers={"Authorization": f"Bearer {world['key']}"},
        checks=[not_a_server_error, response_schema_conformance, content_type_conformance],
        # A generated claim may long-poll for up to MAX_WAIT_SECONDS: wait longer than that for
        # its answer (the client's default of 10 s failed a valid `{"wait": 10.0}` at 10.0x s).
        timeout=MAX_WAIT_SECONDS + 15,
    )
    if response.status_code >= 400:
        assert_error_format(response.json())


def assert_error_format(body: Any) -> None:
    assert isinstance(body, dict) and set(body) == {"error"}, body
    error = body["error"]
    assert set(error) == {"code", "message", "detail"}, body
    assert isinstance(error["code"], str) and error["code"].islower(), body
    assert isinstance(error["message"], str) and error["message"], body
    assert isinstance(error["detail"], dict), body


@pytest.fixture
def admin_session(world: dict[str, str], server_url: str) -> dict[str, str]:
    """An admin's browser session on the server, with its CSRF token: the policies API changes only
    for admins, so an agent key's calls stop at the 403 before any input is read. A policy and a rule
    exist, with their ids in the world, so generated calls reach them."""
    import httpx
    from django.test import Client

    from approvals import policies, rules
    from tests.conftest import person

    admin = person("ada", "admin")
    agent = get_or_create_agent(name="travel")
    world["policy_id"] = str(policies.create_policy(agent=agent, action="refund", terms=policies.Terms(),
                                                    actor=admin).policy_id)  # fmt: skip
    world["rule_id"] = str(rules.create_rule(name="tiny", agent=agent, action="refund", actor=admin,
                                             conditions=[{"path": "/n", "op": "lt", "value": 5}]).pk)  # fmt: skip
    # A notification channel with one delivery, for the notifications API (nothing sends it: the
    # server runs no dispatcher).
    from notifications import dispatch
    from notifications.endpoints import SubscriptionSpec, create_endpoint
    from notifications.models import Delivery

    endpoint, _ = create_endpoint(name="ops", kind="webhook", url="http://127.0.0.1:9/unused", actor=admin,
                                  subscriptions=[SubscriptionSpec(events=["approval.requested"])])  # fmt: skip
    thread, _ = storage.create_thread(agent=agent, external_id="noticed")
    head = storage.append_checkpoint(thread=thread, parent=None, state={"a": 1})
    request_approval(thread=thread, checkpoint=head, action="deploy", args={"env": "prod"})
    dispatch.fan_out()
    world["endpoint_id"], world["delivery_id"] = str(endpoint.pk), str(Delivery.objects.get().pk)
    browser = Client()
    browser.force_login(admin)
    session = browser.cookies["sessionid"].value
    with httpx.Client(base_url=server_url, cookies={"sessionid": session}) as http:
        assert http.get("/policies/").status_code == 200  # a page with a form sets the CSRF cookie
        token = http.cookies["csrftoken"]
    return {"sessionid": session, "csrftoken": token}


@schema.include(path_regex="^/api/v1/(policies|notifications)/").parametrize()
@settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))  # fmt: skip
def test_generated_policy_and_notification_requests_as_an_admin_get_no_5xx_and_answers_match_the_schema(
    case: Any, world: dict[str, str], admin_session: dict[str, str]
) -> None:
    for name, value in world.items():
        if name in (case.path_parameters or {}):
            case.path_parameters[name] = value
    response = case.call_and_validate(
        cookies=admin_session, headers={"X-CSRFToken": admin_session["csrftoken"]},
        checks=[not_a_server_error, response_schema_conformance, content_type_conformance],
    )  # fmt: skip
    if response.status_code >= 400:
        assert_error_format(response.json())
