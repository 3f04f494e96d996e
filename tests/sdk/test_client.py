"""The Python SDK against a live Quicksave server process (uvicorn on the test database, real HTTP)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
from django.contrib.auth.models import User
from django.db.models import F
from django.utils import timezone
from quicksave_sdk import (
    AuthenticationFailed,
    CallInDoubt,
    Client,
    Conflict,
    InvalidInput,
    LeaseLost,
    NotFound,
    PermissionDenied,
    StaleParent,
    call_key,
    make_patch,
    tool_key,
)

from approvals import services
from approvals.models import ApprovalRequest
from checkpoints import storage
from checkpoints.models import Checkpoint, Thread
from checkpoints.storage import jsonpatch, tool_results
from quicksave.roles import grant_role
from quicksave_agents.keys import create_agent_key, get_or_create_agent
from quicksave_agents.models import Run, RunStatus
from quicksave_agents.runs import RunReason, enqueue_run

live = pytest.mark.django_db(transaction=True)


class RecordingTransport(httpx.HTTPTransport):
    """A real HTTP transport that keeps each request, to check what the SDK put on the wire."""

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[httpx.Request] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return super().handle_request(request)

    def bodies(self, method: str, path_end: str) -> list[dict[str, Any]]:
        return [json.loads(r.content) for r in self.requests if r.method == method and r.url.path.endswith(path_end)]


@pytest.fixture
def api_key(transactional_db: Any) -> str:
    return create_agent_key(agent=get_or_create_agent(name="travel"))[1]


@pytest.fixture
def transport() -> RecordingTransport:
    return RecordingTransport()


@pytest.fixture
def client(server_url: str, api_key: str, transport: RecordingTransport) -> Iterator[Client]:
    with Client(server_url, api_key, timeout=15, transport=transport) as sdk:
        yield sdk


def messages(count: int) -> list[dict[str, str]]:
    return [{"role": "assistant", "content": f"message {i} " + "lorem ipsum " * 20} for i in range(count)]


@live
def test_thread_is_got_or_created_by_external_id_and_loaded_at_its_head(client: Client) -> None:
    first = client.thread(external_id="trip-7", metadata={"customer": "ada"})
    assert first.head is None and first.state == {}
    first.checkpoint({"city": "Lisbon"})

    again = client.thread(external_id="trip-7")
    other = client.thread()

    assert again.id == first.id and again.metadata == {"customer": "ada"} and again.agent == "travel"
    assert again.head == first.head and again.state == {"city": "Lisbon"}
    assert other.id != first.id and other.external_id is None


@live
def test_checkpoints_are_sent_as_client_computed_patches_and_stored_as_deltas(
    client: Client, transport: RecordingTransport
) -> None:
    thread = client.thread(external_id="trip-8")
    state: dict[str, Any] = {"messages": messages(20), "plan": {"city": "Lisbon", "nights": 2}}
    first = thread.checkpoint(state, step=1, label="plan")
    state["messages"].append({"role": "user", "content": "make it three nights"})
    state["plan"]["nights"] = 3
    second = thread.checkpoint(state, step=2, label="replan", model={"name": "gpt-x", "temperature": 0.2})

    sent = transport.bodies("POST", f"/threads/{thread.id}/checkpoints/")
    first_state = {"messages": messages(20), "plan": {"city": "Lisbon", "nights": 2}}
    assert sent[0]["parent"] is None and sent[0]["state"] == first_state
    assert "state" not in sent[1] and sent[1]["parent"] == first.id
    assert sent[1]["patch"] == [
        {"op": "add", "path": "/messages/-", "value": {"role": "user", "content": "make it three nights"}},
        {"op": "replace", "path": "/plan/nights", "value": 3},
    ]
    assert (first.storage, second.storage) == ("snapshot", "delta")
    assert (second.parent_id, second.seq, second.step) == (first.id, 2, 2)
    assert second.model is not None and second.model["temperature"] == 0.2
    assert thread.head == second.id
    assert client.checkpoint(second.id).state == thread.state == state


@live
def test_the_state_copy_is_private_so_edits_in_place_still_make_a_patch(client: Client) -> None:
    thread = client.thread()
    state: dict[str, Any] = {"log": ["a"]}
    thread.checkpoint(state)
    state["log"].append("b")
    thread.state["log"].append("not saved")  # a copy: changes nothing
    checkpoint = thread.checkpoint(state)

    assert client.checkpoint(checkpoint.id).state == {"log": ["a", "b"]} == thread.state
    unchanged = thread.checkpoint(thread.state, label="no-op")  # an empty patch is a valid step
    assert unchanged.parent_id == checkpoint.id and client.checkpoint(unchanged.id).state == {"log": ["a", "b"]}


@live
def test_writing_after_a_stale_head_raises_stale_parent_with_the_head(client: Client) -> None:
    mine = client.thread(external_id="trip-9")
    mine.checkpoint({"step": 1})
    theirs = client.thread_by_id(mine.id)
    assert theirs.head == mine.head

    winner = mine.checkpoint({"step": 2, "by": "mine"})
    with pytest.raises(StaleParent) as raised:
        theirs.checkpoint({"step": 2, "by": "theirs"})

    assert raised.value.head == winner.id and raised.value.status == 409 and raised.value.code == "stale_parent"
    assert theirs.state == {"step": 1}  # left as it was: the caller decides
    theirs.refresh()
    assert (theirs.head, theirs.state) == (winner.id, {"step": 2, "by": "mine"})
    assert theirs.checkpoint({"step": 3}).parent_id == winner.id


@live
def test_a_call_runs_once_and_a_replay_from_the_same_checkpoint_gets_its_result(client: Client) -> None:
    calls: list[str] = []

    def search_flights(city: str, day: str, idempotency_key: str) -> dict[str, Any]:
        calls.append(idempotency_key)
        return {"flights": [f"TP{len(calls)}"], "city": city}

    args = {"city": "Lisbon", "day": "2025-06-01"}
    mine = client.thread(external_id="trip-10")
    mine.checkpoint({"step": 1})
    replay = client.thread(external_id="trip-10")  # another process, replaying the step from the same head

    first = mine.tool("search_flights", args, search_flights)
    again = replay.tool("search_flights", args, search_flights)

    key = call_key(mine.id, mine.head, 0)
    assert calls == [key] and first == again == {"flights": ["TP1"], "city": "Lisbon"}
    logged = replay.tool_call(key)
    assert logged is not None and (logged.state, logged.tool, logged.starts) == ("done", "search_flights", 1)
    assert mine.tool("echo", "not a dict", lambda text: text.upper()) == "NOT A DICT"  # the next position
    mine.checkpoint({"step": 2})
    assert mine.tool("echo", "not a dict", lambda text: text.lower()) == "not a dict"  # a new step, a new key


@live
def test_a_call_started_elsewhere_without_a_result_goes_to_a_person_and_is_not_repeated(client: Client) -> None:
    dead = client.thread(external_id="trip-11")
    dead.checkpoint({"step": 1})
    key = call_key(dead.id, dead.head, 0)
    # An attempt logged its intent and died before recording a result.
    client.request("PUT", f"/threads/{dead.id}/tool-calls/{key}/", {"tool": "send_email", "args": {"to": "a@b.c"}})
    replay = client.thread(external_id="trip-11")
    sent: list[str] = []

    with pytest.raises(CallInDoubt) as raised:
        replay.tool("send_email", {"to": "a@b.c"}, lambda to: sent.append(to))
    assert sent == [] and raised.value.status == 409 and raised.value.approval is not None
    item = ApprovalRequest.objects.get(pk=raised.value.approval)
    assert (item.kind, item.action, item.args, item.status) == ("in_doubt", "send_email", {"to": "a@b.c"}, "pending")
    assert Thread.objects.get(pk=dead.id).status == "waiting_for_approval"

    person = User.objects.create_user("rita")
    grant_role(user=person, role="reviewer")
    services.resolve_in_doubt(approval=item, user=person, resolution="happened", result={"id": "msg-1"})
    assert client.thread(external_id="trip-11").tool("send_email", {"to": "a@b.c"}, sent.append) == {"id": "msg-1"}
    assert sent == []


@live
def test_an_idempotent_call_without_a_result_runs_again_under_the_same_key(client: Client) -> None:
    dead = client.thread(external_id="trip-13")
    dead.checkpoint({"step": 1})
    key = call_key(dead.id, dead.head, 0)
    client.request("PUT", f"/threads/{dead.id}/tool-calls/{key}/",
                   {"tool": "charge", "args": {"cents": 500}, "idempotent": True})  # fmt: skip
    keys: list[str] = []

    def charge(cents: int, idempotency_key: str) -> str:
        keys.append(idempotency_key)
        return "ch_1"

    assert client.thread(external_id="trip-13").tool("charge", {"cents": 500}, charge, idempotent=True) == "ch_1"
    logged = dead.tool_call(key)
    assert keys == [key] and logged is not None and (logged.state, logged.starts) == ("done", 2)


@live
def test_a_replay_that_calls_something_else_in_the_same_place_is_refused(client: Client) -> None:
    first = client.thread(external_id="trip-14")
    first.checkpoint({"step": 1})
    first.tool("quote", {"route": "LIS-OPO"}, lambda route: "EUR 120")
    with pytest.raises(Conflict) as raised:
        client.thread(external_id="trip-14").tool("quote", {"route": "LIS-FAO"}, lambda route: "EUR 90")
    assert raised.value.code == "tool_call_mismatch"


@live
def test_an_attempt_that_lost_its_run_is_refused_and_the_sdk_loop_goes_on(
    client: Client, server_url: str, api_key: str
) -> None:
    thread = client.thread(external_id="trip-15")
    head = thread.checkpoint({"step": 1})
    row = Thread.objects.get(pk=thread.id)
    enqueue_run(thread=row, checkpoint=Checkpoint.objects.get(pk=head.id), reason=RunReason.MANUAL)
    frozen = client.claim()
    assert frozen is not None and frozen.fence == f"{frozen.id}:1"
    Run.objects.filter(pk=frozen.id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    with Client(server_url, api_key, timeout=15) as other:
        taken = other.claim()
    assert taken is not None and taken.id == frozen.id and taken.fence == f"{frozen.id}:2"

    stale = frozen.thread()
    for write in (
        lambda: stale.checkpoint({"step": 2}),
        lambda: stale.tool("send_email", {"to": "a@b.c"}, lambda to: pytest.fail("the effect ran")),
        lambda: stale.request_approval("pay", {"cents": 1}),
        frozen.heartbeat,
        frozen.complete,
    ):
        with pytest.raises(LeaseLost):
            write()
    assert Checkpoint.objects.filter(thread_id=thread.id).count() == 1

    # The loop: a handler whose run was taken over ends that run and goes on to the next.
    enqueue_run(thread=row, checkpoint=Checkpoint.objects.get(pk=head.id), reason=RunReason.MANUAL)
    handled: list[str] = []

    def handle(run: Any) -> None:
        handled.append(run.id)
        Run.objects.filter(pk=run.id).update(attempts=F("attempts") + 1)  # another worker took it over
        run.thread().checkpoint({"step": 3})

    assert client.serve(handle, wait=0, max_runs=1) == 1
    assert len(handled) == 1 and Run.objects.get(pk=handled[0]).status == RunStatus.RUNNING


def test_the_tool_key_is_the_servers() -> None:
    for name, args in [("search", {"b": 1, "a": ["ü", 2.5, None]}), ("echo", "x"), ("none", None)]:
        assert tool_key(name, args) == tool_results.tool_key(name, args)


@live
def test_an_approved_request_is_claimed_as_a_run_that_resumes_from_its_checkpoint(client: Client) -> None:
    thread = client.thread(external_id="trip-12")
    thread.checkpoint({"itinerary": ["LIS", "OPO"], "booked": False})
    requested = thread.request_approval("book_flight", {"flight": "TP123"}, message="Book TP123?", risk="high")
    assert requested.status == "pending" and requested.decision is None
    assert requested.checkpoint_id == thread.head and thread.status == "waiting_for_approval"
    assert client.claim() is None  # nothing to resume before a decision

    reviewer = User.objects.create_user("rita")
    grant_role(user=reviewer, role="reviewer")
    services.decide(approval=ApprovalRequest.objects.get(pk=requested.id), user=reviewer, decision="approve")
    assert client.approval(requested.id).status == "approved"

    run = client.claim(wait=5)
    assert run is not None and run.approval is not None
    assert (run.reason, run.thread_id, run.checkpoint_id) == ("approval", thread.id, requested.checkpoint_id)
    assert run.approval.decision is not None and run.approval.decision["status"] == "approved"
    assert run.approval.decision["args"] == {"flight": "TP123"} and run.approval.decision["decided_by"] == "rita"
    resumed = run.thread()
    assert (resumed.head, resumed.state) == (requested.checkpoint_id, {"itinerary": ["LIS", "OPO"], "booked": False})

    lease = run.lease_expires_at  # set at the claim, some HTTP round trips ago
    run.heartbeat()
    assert run.status == "running" and lease is not None and run.lease_expires_at is not None
    assert run.lease_expires_at > lease
    resumed.checkpoint(resumed.state | {"booked": True}, status="completed")
    run.complete()
    assert run.status == "completed" and Run.objects.get(pk=run.id).status == RunStatus.COMPLETED
    with pytest.raises(Conflict) as raised:
        run.complete()
    assert raised.value.code == "run_finished"


@live
def test_a_failed_run_records_its_error(client: Client) -> None:
    thread = client.thread()
    head = thread.checkpoint({"step": 1})
    row = Thread.objects.get(pk=thread.id)
    enqueue_run(thread=row, checkpoint=Checkpoint.objects.get(pk=head.id), reason=RunReason.MANUAL)

    run = client.claim()
    assert run is not None and run.reason == "manual"
    run.fail("tool timed out")
    assert run.status == "failed" and Run.objects.get(pk=run.id).error == "tool timed out"


@live
def test_claiming_from_an_empty_queue_returns_none_at_once(client: Client) -> None:
    started = time.monotonic()
    assert client.claim(wait=0) is None
    assert time.monotonic() - started < 2


@live
def test_server_errors_become_typed_exceptions(server_url: str, client: Client) -> None:
    with (
        Client(server_url, "qs_abcdef012345_not-the-secret") as stranger,
        pytest.raises(AuthenticationFailed) as bad,
    ):
        stranger.thread()
    assert (bad.value.status, bad.value.code) == (401, "authentication_failed")

    foreign, _ = storage.create_thread(agent=get_or_create_agent(name="code-review"), external_id="review-1")
    with pytest.raises(NotFound) as missing:
        client.thread_by_id(str(foreign.pk))
    assert (missing.value.status, missing.value.code) == (404, "not_found")

    with pytest.raises(PermissionDenied):
        client.thread(agent="code-review")

    thread = client.thread()
    thread.checkpoint({"a": 1})
    with pytest.raises(InvalidInput) as invalid:
        thread.request_approval("book", {}, risk="extreme")
    assert invalid.value.status == 400 and "risk" in invalid.value.detail["fields"]


@pytest.mark.parametrize(
    ("base", "target"),
    [
        ({"a": 1}, {"a": 1}),
        ({"a": 1, "b": {"c": [1, 2]}}, {"b": {"c": [1, 2, 3], "d": None}, "e/f~": True}),
        ({"log": [1, 2, 3, 4]}, {"log": [0, 1, 2, 3, 4]}),
        ({"log": [1, 2, 3, 4]}, {"log": [1, 2]}),
        ({"log": [{"x": 1}, {"x": 2}]}, {"log": [{"x": 1}, {"x": 3}, {"x": 4}]}),
        ({"flag": 1}, {"flag": True}),
        ({"v": [1]}, {"v": {"0": 1}}),
        ({"n": "1"}, {"n": 1.5}),
    ],
)
def test_make_patch_turns_base_into_target(base: dict[str, Any], target: dict[str, Any]) -> None:
    patched = jsonpatch.apply_patch(base, make_patch(base, target)).doc
    assert jsonpatch.json_equal(patched, target)


def test_make_patch_appends_with_dash_and_recurses_into_objects() -> None:
    base = {"messages": [{"i": 0}], "plan": {"city": "Lisbon", "nights": 2}}
    target = {"messages": [{"i": 0}, {"i": 1}], "plan": {"city": "Lisbon", "nights": 3}}
    assert make_patch(base, target) == [
        {"op": "add", "path": "/messages/-", "value": {"i": 1}},
        {"op": "replace", "path": "/plan/nights", "value": 3},
    ]
    assert make_patch(base, base) == []


@live
def test_a_tool_that_returns_nothing_is_recorded_and_not_run_again(client: Client) -> None:
    thread = client.thread(external_id="trip-16")
    thread.checkpoint({"step": 1})
    sent: list[str] = []

    def notify(to: str) -> None:
        sent.append(to)

    assert thread.tool("notify", {"to": "ops"}, notify) is None
    assert client.thread(external_id="trip-16").tool("notify", {"to": "ops"}, notify) is None
    assert sent == ["ops"]
