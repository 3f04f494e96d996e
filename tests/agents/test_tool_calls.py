"""The tool-call log in one process: intents committed before the effect, keys stable across replays,
calls in doubt answered by a person over the API, decisions bound to their call, fences on writes.

What happens when a real worker process dies at each boundary is test_exactly_once's subject.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

import psycopg
import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from rest_framework.test import APIClient

from approvals.models import ApprovalKind, ApprovalRequest, ApprovalStatus
from approvals.services import decide, request_approval
from checkpoints import storage
from checkpoints.models import Checkpoint, Thread, ThreadStatus
from checkpoints.storage import crypto
from checkpoints.storage.errors import InvalidState
from quicksave_agents import tool_calls
from quicksave_agents.fencing import Fence, LeaseLost
from quicksave_agents.keys import get_or_create_agent
from quicksave_agents.models import Agent as AgentRecord
from quicksave_agents.models import Run, RunStatus, ToolCall, ToolCallState
from quicksave_agents.runs import CHANNEL, claim_run, run_notifications
from quicksave_agents.runtime import Agent, Context, Continue, Done, StepResult, register, start_thread
from quicksave_agents.worker import Worker
from tests.conftest import person, signed_in
from tests.processes import database_url

EFFECTS: list[tuple[str, str]] = []  # (what, idempotency key): what the tools did, in this process


def send(args: dict[str, Any], idempotency_key: str) -> dict[str, Any]:
    EFFECTS.append((f"send {args['to']}", idempotency_key))
    return {"sent_to": args["to"]}


@register
class MailAgent(Agent):
    """Sends one email, then finishes."""

    name = "mail-test"

    def step(self, ctx: Context) -> StepResult:
        if ctx.state.get("sent"):
            return Done("done")
        ctx.state["sent"] = ctx.tool("send_email", {"to": ctx.state["to"]}, send)
        return Continue("sent")


@register
class PayAgent(Agent):
    """Asks before paying AMOUNT; pays what was approved."""

    name = "pay-test"
    AMOUNT: ClassVar[int] = 100

    def step(self, ctx: Context) -> StepResult:
        if ctx.state.get("paid"):
            return Done("done")
        decision = ctx.request_approval("pay", {"cents": PayAgent.AMOUNT}, "Pay?")
        if not decision.approved:
            return Done("declined")
        ctx.state["paid"] = ctx.tool("pay", decision.args, send_payment)
        return Continue("paid")


def send_payment(args: dict[str, Any]) -> str:
    EFFECTS.append((f"pay {args['cents']}", ""))
    return "paid"


@pytest.fixture(autouse=True)
def _effects() -> None:
    EFFECTS.clear()
    PayAgent.AMOUNT = 100


def drain() -> None:
    worker = Worker(agent_names=[MailAgent.name, PayAgent.name], name="test-worker")
    while worker.run_once():
        pass


@pytest.fixture
def reviewer(db: Any) -> User:
    return person("rita", "reviewer")


def api_as(user: User) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def decide_over_api(user: User, approval: ApprovalRequest, body: dict[str, Any]) -> Any:
    url = f"/api/v1/approvals/{approval.pk}/decide/"
    return api_as(user).post(url, data=json.dumps(body), content_type="application/json")


def mail_thread(external_id: str = "mail-1") -> Thread:
    return start_thread(agent_class=MailAgent, external_id=external_id, to="ada@example.com")


def first_call_key(thread: Thread) -> str:
    start = Checkpoint.objects.get(thread=thread, seq=1)
    return tool_calls.call_key(thread_id=thread.pk, checkpoint_id=start.pk, position=0)


def died_mid_call(thread: Thread) -> str:
    """Record the first call's intent as an attempt that died before its result would have."""
    key = first_call_key(thread)
    tool_calls.begin(thread_id=thread.pk, key=key, tool="send_email", args={"to": "ada@example.com"})
    return key


@pytest.mark.django_db(transaction=True)
def test_the_intent_is_committed_before_the_tool_runs_and_the_tool_gets_the_calls_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    thread = mail_thread()
    seen: list[tuple[str, Any]] = []
    real_send = send

    def observed_send(args: dict[str, Any], idempotency_key: str) -> dict[str, Any]:
        # Read from a connection of its own: only what is committed is there.
        with psycopg.connect(database_url()) as other:
            row = other.execute("SELECT state FROM agents_toolcall WHERE key = %s", [idempotency_key]).fetchone()
        seen.append((idempotency_key, row))
        return real_send(args, idempotency_key)

    monkeypatch.setitem(globals(), "send", observed_send)
    drain()
    assert seen == [(first_call_key(thread), ("pending",))]
    call = ToolCall.objects.get(thread=thread)
    assert (call.state, call.result, call.attempt, call.starts) == (ToolCallState.DONE, {"sent_to": "ada@example.com"},
                                                                    1, 1)  # fmt: skip
    assert Thread.objects.get(pk=thread.pk).status == ThreadStatus.COMPLETED


@pytest.mark.django_db
def test_a_call_another_attempt_left_without_a_result_is_put_to_a_person_not_run(reviewer: User) -> None:
    thread = mail_thread()
    key = died_mid_call(thread)
    drain()

    assert EFFECTS == []
    item = ApprovalRequest.objects.get(thread=thread)
    assert (item.kind, item.status, item.action, item.args) == (
        ApprovalKind.IN_DOUBT, ApprovalStatus.PENDING, "send_email", {"to": "ada@example.com"},
    )  # fmt: skip
    assert item.tool_call is not None and item.tool_call.key == key and item.tool_call.state == ToolCallState.IN_DOUBT
    thread.refresh_from_db()
    assert thread.status == ThreadStatus.WAITING_FOR_APPROVAL
    listed = api_as(reviewer).get("/api/v1/approvals/?status=pending").json()["results"]
    assert [(entry["kind"], entry["tool_call"]["key"]) for entry in listed] == [("in_doubt", key)]


@pytest.mark.django_db
def test_it_did_not_happen_runs_the_call_once_under_the_same_key(reviewer: User) -> None:
    thread = mail_thread()
    key = died_mid_call(thread)
    drain()
    item = ApprovalRequest.objects.get(thread=thread)

    answered = decide_over_api(reviewer, item, {"decision": "not_happened"})
    assert answered.status_code == 200, answered.content
    assert answered.json()["decision"]["resolution"] == "not_happened"
    drain()

    assert [("send ada@example.com", key)] == EFFECTS
    assert Thread.objects.get(pk=thread.pk).status == ThreadStatus.COMPLETED
    assert ToolCall.objects.get(thread=thread).starts == 2


@pytest.mark.django_db
def test_it_happened_hands_the_agent_the_recorded_result_without_calling_the_tool(reviewer: User) -> None:
    thread = mail_thread()
    died_mid_call(thread)
    drain()
    item = ApprovalRequest.objects.get(thread=thread)

    answered = decide_over_api(reviewer, item, {"decision": "happened", "result": {"sent_to": "by hand"}})
    assert answered.status_code == 200, answered.content
    drain()

    assert EFFECTS == []
    assert storage.latest_state(thread=thread)[1]["sent"] == {"sent_to": "by hand"}
    assert Thread.objects.get(pk=thread.pk).status == ThreadStatus.COMPLETED
    again = decide_over_api(reviewer, item, {"decision": "not_happened"})
    assert again.status_code == 409 and again.json()["error"]["code"] == "already_decided"


@pytest.mark.django_db
def test_failing_an_in_doubt_thread_needs_a_reason_and_queues_nothing(reviewer: User) -> None:
    thread = mail_thread()
    died_mid_call(thread)
    drain()
    item = ApprovalRequest.objects.get(thread=thread)

    bare = decide_over_api(reviewer, item, {"decision": "fail"})
    assert bare.status_code == 422 and bare.json()["error"]["detail"]["field"] == "comment"
    wrong = decide_over_api(reviewer, item, {"decision": "approve"})
    assert wrong.status_code == 422 and wrong.json()["error"]["detail"]["field"] == "decision"
    assert decide_over_api(reviewer, item, {"decision": "fail", "comment": "mail server down"}).status_code == 200

    assert Thread.objects.get(pk=thread.pk).status == ThreadStatus.FAILED
    assert not Run.objects.filter(thread=thread, status=RunStatus.QUEUED).exists()
    assert EFFECTS == []


@pytest.mark.django_db
def test_the_in_doubt_page_records_a_result_and_the_agent_resumes_with_it(reviewer: User) -> None:
    thread = mail_thread()
    died_mid_call(thread)
    drain()
    item = ApprovalRequest.objects.get(thread=thread)
    browser = signed_in(reviewer)

    page = browser.get(f"/inbox/{item.pk}/")
    assert page.status_code == 200
    assert b"It happened" in page.content and b"It did not happen" in page.content
    bad = browser.post(f"/inbox/{item.pk}/", {"decision": "happened", "result": "{not json"})
    assert bad.status_code == 400 and b"not valid JSON" in bad.content
    done = browser.post(f"/inbox/{item.pk}/", {"decision": "happened", "result": '{"sent_to": "by hand"}'})
    assert done.status_code == 302
    drain()
    assert EFFECTS == [] and storage.latest_state(thread=thread)[1]["sent"] == {"sent_to": "by hand"}


@pytest.mark.django_db
def test_an_idempotent_call_left_without_a_result_runs_again_under_the_same_key(db: Any) -> None:
    thread = Thread.objects.get(pk=mail_thread().pk)
    key = first_call_key(thread)
    tool_calls.begin(thread_id=thread.pk, key=key, tool="charge", args={"cents": 5}, idempotent=True)
    again = tool_calls.begin(thread_id=thread.pk, key=key, tool="charge", args={"cents": 5}, idempotent=True)
    assert again.outcome is tool_calls.Outcome.RUN and again.call.starts == 2


@pytest.mark.django_db
def test_a_replay_that_asks_for_another_call_in_the_same_place_is_refused(db: Any) -> None:
    thread = mail_thread()
    key = first_call_key(thread)
    tool_calls.begin(thread_id=thread.pk, key=key, tool="send_email", args={"to": "ada@example.com"})
    with pytest.raises(tool_calls.ToolCallMismatch):
        tool_calls.begin(thread_id=thread.pk, key=key, tool="send_email", args={"to": "bob@example.com"})


@pytest.mark.django_db
def test_a_decision_applies_only_to_the_call_it_was_made_on(reviewer: User) -> None:
    thread = start_thread(agent_class=PayAgent, external_id="pay-1")
    drain()
    decide(approval=ApprovalRequest.objects.get(thread=thread), user=reviewer, decision="approve")
    PayAgent.AMOUNT = 999  # the resumed step asks for something else than what was approved
    drain()

    assert EFFECTS == []
    thread.refresh_from_db()
    assert thread.status == ThreadStatus.FAILED
    head = Checkpoint.objects.filter(thread=thread).order_by("-seq").first()
    assert head is not None and "not acting on it" in head.metadata["error"]


@pytest.mark.django_db
def test_a_decision_on_the_same_call_resumes_and_acts(reviewer: User) -> None:
    thread = start_thread(agent_class=PayAgent, external_id="pay-2")
    drain()
    decide(approval=ApprovalRequest.objects.get(thread=thread), user=reviewer, decision="approve")
    drain()
    assert EFFECTS == [("pay 100", "")]
    assert Thread.objects.get(pk=thread.pk).status == ThreadStatus.COMPLETED


@pytest.mark.django_db
def test_every_write_of_a_superseded_attempt_is_refused(db: Any) -> None:
    thread = mail_thread()
    run = claim_run(agents=[thread.agent], worker="first")
    assert run is not None
    stale = Fence(run.pk, run.attempts)
    Run.objects.filter(pk=run.pk).update(attempts=run.attempts + 1)  # another worker claimed it
    head = Checkpoint.objects.get(thread=thread, seq=1)

    with pytest.raises(LeaseLost):
        storage.append_checkpoint(thread=thread, parent=head.pk, state={"x": 1}, fence=stale)
    with pytest.raises(LeaseLost):
        tool_calls.begin(thread_id=thread.pk, key="k", tool="send_email", args={}, fence=stale)
    with pytest.raises(LeaseLost):
        request_approval(thread=thread, checkpoint=head, action="pay", args={}, fence=stale)
    assert Checkpoint.objects.filter(thread=thread).count() == 1
    assert not ToolCall.objects.filter(thread=thread).exists()
    assert not ApprovalRequest.objects.filter(thread=thread).exists()
    storage.append_checkpoint(thread=thread, parent=head.pk, state={"x": 1}, fence=Fence(run.pk, run.attempts + 1))


@pytest.mark.django_db
def test_a_malformed_fence_is_a_400_naming_it(owner_client: APIClient, thread: Thread) -> None:
    response = owner_client.post(f"/api/v1/threads/{thread.pk}/checkpoints/",
                                 {"parent": None, "state": {}, "fence": "not-a-fence"}, format="json")  # fmt: skip
    assert response.status_code == 400 and "fence" in response.json()["error"]["detail"]["fields"]


@pytest.mark.django_db
@pytest.mark.parametrize("damage", ["args", "data_key"])
def test_an_unreadable_approval_shows_as_unreadable_and_everything_else_works(reviewer: User, damage: str) -> None:
    ok_thread = storage.create_thread(agent=mail_agent(), external_id="fine")[0]
    bad_thread = storage.create_thread(agent=mail_agent(), external_id="broken")[0]
    fine = request_approval(thread=ok_thread, checkpoint=storage.append_checkpoint(thread=ok_thread, parent=None,
                            state={}), action="pay", args={"cents": 1})  # fmt: skip
    broken = request_approval(thread=bad_thread, checkpoint=storage.append_checkpoint(thread=bad_thread, parent=None,
                              state={}), action="pay", args={"cents": 2})  # fmt: skip
    with connection.cursor() as cursor:
        if damage == "args":
            cursor.execute("UPDATE approvals_approvalrequest SET args = set_byte(args, 20, get_byte(args, 20) # 1)"
                           " WHERE id = %s", [broken.pk])  # fmt: skip
        else:
            cursor.execute("UPDATE checkpoints_threadkey SET wrapped = set_byte(wrapped, 20, get_byte(wrapped, 20) # 1)"
                           " WHERE thread_id = %s", [bad_thread.pk])  # fmt: skip
    storage.clear_caches()
    crypto.forget_keys()
    browser: Client = signed_in(reviewer)

    inbox = browser.get("/inbox/")
    assert inbox.status_code == 200 and b"Unreadable" in inbox.content and b"&quot;cents&quot;: 1" in inbox.content
    listed = {entry["id"]: entry for entry in api_as(reviewer).get("/api/v1/approvals/").json()["results"]}
    assert listed[str(fine.pk)]["args"] == {"cents": 1} and listed[str(fine.pk)]["unreadable"] is None
    assert listed[str(broken.pk)]["args"] is None and listed[str(broken.pk)]["unreadable"]
    page = browser.get(f"/inbox/{broken.pk}/")
    assert page.status_code == 200 and str(broken.pk).encode() in page.content and b"do not open" in page.content
    refused = decide_over_api(reviewer, broken, {"decision": "approve"})
    assert refused.status_code == 422 and refused.json()["error"]["detail"]["field"] == "args"
    posted = browser.post(f"/inbox/{broken.pk}/", {"decision": "approve"})
    assert posted.status_code == 400 and b"cannot be decided" in posted.content
    assert browser.get(f"/inbox/{fine.pk}/").status_code == 200


def mail_agent() -> AgentRecord:
    return get_or_create_agent(name=MailAgent.name)


def first_pay_key(thread: Thread) -> str:
    """The key of the pay call in the step that asked for approval (it began at the checkpoint before)."""
    waiting = ApprovalRequest.objects.get(thread=thread, kind=ApprovalKind.APPROVAL).checkpoint
    assert waiting.parent_id is not None
    return tool_calls.call_key(thread_id=thread.pk, checkpoint_id=waiting.parent_id, position=0)


@pytest.mark.django_db
@pytest.mark.parametrize("answer", ["happened", "not_happened"])
def test_a_call_after_an_approval_that_went_in_doubt_is_not_repeated_under_another_key(
    reviewer: User, answer: str
) -> None:
    thread = start_thread(agent_class=PayAgent, external_id=f"pay-doubt-{answer}")
    drain()
    decide(approval=ApprovalRequest.objects.get(thread=thread), user=reviewer, decision="approve")
    key = first_pay_key(thread)
    # The resumed attempt recorded its intent to pay and died before recording whether it paid.
    tool_calls.begin(thread_id=thread.pk, key=key, tool="pay", args={"cents": 100})
    drain()
    item = ApprovalRequest.objects.get(thread=thread, kind=ApprovalKind.IN_DOUBT)
    assert item.tool_call is not None and item.tool_call.key == key

    body: dict[str, Any] = {"decision": answer} | ({"result": "paid by hand"} if answer == "happened" else {})
    assert decide_over_api(reviewer, item, body).status_code == 200
    drain()

    thread.refresh_from_db()
    assert thread.status == ThreadStatus.COMPLETED
    assert ApprovalRequest.objects.filter(thread=thread).count() == 2  # not asked to approve again
    assert list(ToolCall.objects.filter(thread=thread).values_list("key", flat=True)) == [key]
    if answer == "happened":
        assert EFFECTS == [] and storage.latest_state(thread=thread)[1]["paid"] == "paid by hand"
    else:
        assert EFFECTS == [("pay 100", "")]


@pytest.mark.django_db
def test_a_tool_that_returns_nothing_is_recorded_over_the_api(owner_client: APIClient, thread: Thread) -> None:
    url = f"/api/v1/threads/{thread.pk}/tool-calls/notify-1/"
    assert owner_client.put(url, {"tool": "notify", "args": {}}, format="json").status_code == 201
    done = owner_client.put(url + "result/", {"result": None}, format="json")
    assert done.status_code == 200 and (done.json()["state"], done.json()["result"]) == ("done", None)
    replay = owner_client.put(url, {"tool": "notify", "args": {}}, format="json")
    assert replay.status_code == 200 and replay.json()["proceed"] is False


@pytest.mark.django_db
def test_a_retried_result_of_the_same_attempt_gets_the_stored_result(db: Any) -> None:
    thread = mail_thread()
    run = claim_run(agents=[thread.agent], worker="w")
    assert run is not None
    fence = Fence(run.pk, run.attempts)
    tool_calls.begin(thread_id=thread.pk, key="k", tool="send_email", args={}, fence=fence)
    assert tool_calls.finish(thread_id=thread.pk, key="k", result={"id": 1}, fence=fence) == {"id": 1}
    assert tool_calls.finish(thread_id=thread.pk, key="k", result={"id": 2}, fence=fence) == {"id": 1}
    with pytest.raises(InvalidState):
        tool_calls.finish(thread_id=thread.pk, key="never-begun", result=1, fence=fence)


@pytest.mark.django_db
def test_a_tool_that_exits_fails_its_thread_and_not_the_worker(db: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    def exits(args: dict[str, Any], idempotency_key: str) -> None:
        raise SystemExit(3)

    monkeypatch.setitem(globals(), "send", exits)
    thread = mail_thread()
    drain()
    thread.refresh_from_db()
    assert thread.status == ThreadStatus.FAILED
    assert Run.objects.get(thread=thread).status == RunStatus.FAILED  # the run ended with its agent failed


@pytest.mark.django_db(transaction=True)
def test_a_broken_listen_connection_is_opened_again_and_the_worker_goes_on(db: Any) -> None:
    worker = Worker(agent_names=[MailAgent.name], name="listener", poll_seconds=0.05)
    with run_notifications() as notifications:
        worker._wait(notifications)
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query = %s",
                           [f"LISTEN {CHANNEL}"])  # fmt: skip
        worker._wait(notifications)  # the broken connection: logged, closed
        worker._wait(notifications)  # opened again
        thread = mail_thread()  # queues a run: its NOTIFY reaches the new connection
        assert notifications.wait(5) is True
    assert thread.pk


@pytest.mark.django_db
def test_an_in_doubt_call_on_a_cancelled_thread_ends_the_run_as_cancelled(db: Any) -> None:
    thread = mail_thread()
    died_mid_call(thread)
    Thread.objects.filter(pk=thread.pk).update(status=ThreadStatus.CANCELLED)
    drain()
    assert Run.objects.get(thread=thread).status == RunStatus.CANCELLED
    assert not ApprovalRequest.objects.filter(thread=thread).exists()


@pytest.mark.django_db
def test_a_call_whose_result_does_not_open_shows_as_unreadable_in_the_approvals_api(reviewer: User) -> None:
    thread = mail_thread()
    died_mid_call(thread)
    drain()
    item = ApprovalRequest.objects.get(thread=thread)
    decide_over_api(reviewer, item, {"decision": "happened", "result": {"sent_to": "by hand"}})
    with connection.cursor() as cursor:
        cursor.execute("UPDATE agents_toolcall SET result = set_byte(result, 20, get_byte(result, 20) # 1)"
                       " WHERE thread_id = %s", [thread.pk])  # fmt: skip

    listed = api_as(reviewer).get("/api/v1/approvals/?status=resolved")
    assert listed.status_code == 200
    (entry,) = listed.json()["results"]
    assert entry["tool_call"]["result"] is None and entry["tool_call"]["unreadable"]
    assert api_as(reviewer).get(f"/api/v1/approvals/{item.pk}/").status_code == 200
