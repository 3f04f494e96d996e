"""Rewind, edit and branch: forks (API and domain), re-runs, resuming a failed thread, cancelling
one, carried-over decisions, and a fork racing agents that keep writing the old branch from other
OS processes."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap
import time
from typing import Any

import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from approvals.models import ApprovalRequest, ApprovalStatus
from approvals.services import decide
from audit import trail
from audit.models import AuditEntry
from checkpoints import forks, storage
from checkpoints.models import Branch, Checkpoint, CheckpointSource, Event, Thread, ThreadStatus
from checkpoints.storage.errors import InvalidPatch, StaleParent
from quicksave_agents.demo import MigrationAgent, TravelAgent
from quicksave_agents.models import Run, RunReason, RunStatus
from quicksave_agents.runtime import start_thread
from quicksave_agents.worker import Worker
from tests.conftest import person
from tests.processes import ROOT, database_url
from tests.waiting import wait_until


def api(user: User) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


@pytest.fixture
def ada(db: Any) -> User:
    """An admin."""
    return person("ada", "admin")


@pytest.fixture
def admin_client(ada: User) -> APIClient:
    return api(ada)


@pytest.fixture
def steps(thread: Thread) -> list[Checkpoint]:
    """Four checkpoints on main: a migration that picked a batch size at step 2."""
    first = storage.append_checkpoint(thread=thread, parent=None, step=0, label="start",
                                    state={"settings": {}, "migrated": [], "log": []})  # fmt: skip
    made = [first]
    changes: list[list[dict[str, Any]]] = [
        [{"op": "add", "path": "/migrated/-", "value": "users"}],
        [{"op": "add", "path": "/settings/batch_size", "value": 5000}],
        [{"op": "add", "path": "/log/-", "value": "orders: lock timeout"}],
    ]
    for step, change in enumerate(changes, start=1):
        made.append(storage.append_checkpoint(thread=thread, parent=made[-1], step=step, label=f"step {step}",
                                            patch=change))  # fmt: skip
    return made


def writes(thread: Thread) -> tuple[int, int, int, int, int]:
    """Counts of everything a fork writes, to prove a refused fork wrote nothing."""
    return (
        Branch.objects.filter(thread=thread).count(),
        Checkpoint.objects.filter(thread=thread).count(),
        Event.objects.filter(thread=thread).count(),
        AuditEntry.objects.filter(thread=thread).count(),
        Run.objects.filter(thread=thread).count(),
    )


def drain() -> None:
    worker = Worker(name="fork-tests")
    while worker.run_once():
        pass


# --------------------------------------------------------------------------- the API


def test_an_admin_forks_with_an_edited_state_and_the_head_moves_to_the_new_branch(
    admin_client: APIClient, thread: Thread, steps: list[Checkpoint]
) -> None:
    patch = [{"op": "add", "path": "/settings/batch_size", "value": 500}]
    response = admin_client.post(f"/api/v1/checkpoints/{steps[1].pk}/fork/",
                                 {"reason": "5000 rows lock the table", "patch": patch}, format="json")  # fmt: skip

    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["branch"] == "fork-1" and body["seq"] == 1 and body["parent"] == str(steps[1].pk)
    assert body["source"] == "human" and body["step"] == 1 and body["status"] == "paused"
    assert body["label"] == "fork: 5000 rows lock the table"
    assert body["metadata"]["author"] == "ada" and body["metadata"]["reason"] == "5000 rows lock the table"
    assert body["run"] is None
    assert storage.state_at(body["id"]) == {"settings": {"batch_size": 500}, "migrated": ["users"], "log": []}

    thread.refresh_from_db()
    assert thread.active_branch is not None and thread.active_branch.name == "fork-1"
    assert str(thread.head_id) == body["id"] and thread.status == ThreadStatus.PAUSED and thread.step == 1
    # The old branch is untouched and still browsable.
    main = admin_client.get(f"/api/v1/threads/{thread.pk}/checkpoints/?branch=main").json()["results"]
    assert [row["id"] for row in main] == [str(step.pk) for step in steps]
    forked = Event.objects.get(thread=thread, type="branch.forked")
    assert forked.data["branch"] == "fork-1" and forked.data["fork_point"] == str(steps[1].pk)
    entry = AuditEntry.objects.get(thread=thread, action="thread.fork")
    assert entry.actor_name == "ada" and entry.reason == "5000 rows lock the table"
    assert entry.target_id == str(steps[1].pk)
    assert entry.before["branch"] == "main" and entry.before["head"] == str(steps[-1].pk)
    assert trail.opened(entry).after["patch"] == patch  # stored sealed under the thread's key
    assert entry.after["branch"] == "fork-1" and entry.after["head"] == body["id"]


@pytest.mark.parametrize("role", ["reviewer", "viewer"])
def test_reviewers_and_viewers_get_403_and_nothing_is_written(
    role: str, thread: Thread, steps: list[Checkpoint]
) -> None:
    client = api(person("rita", role))
    before = writes(thread)
    fork = client.post(f"/api/v1/checkpoints/{steps[1].pk}/fork/", {"reason": "try"}, format="json")
    cancel = client.post(f"/api/v1/threads/{thread.pk}/cancel/", {"reason": "stop"}, format="json")
    resume = client.post(f"/api/v1/threads/{thread.pk}/resume/", {"reason": "go"}, format="json")
    for response in (fork, cancel, resume):
        assert response.status_code == 403
        assert response.json()["error"]["code"] == "permission_denied"
    assert writes(thread) == before


def test_an_agent_key_cannot_fork_its_own_thread(
    owner_client: APIClient, foreign_client: APIClient, thread: Thread, steps: list[Checkpoint]
) -> None:
    before = writes(thread)
    own = owner_client.post(f"/api/v1/checkpoints/{steps[1].pk}/fork/", {"reason": "me"}, format="json")
    assert own.status_code == 403 and own.json()["error"]["code"] == "permission_denied"
    assert owner_client.post(f"/api/v1/threads/{thread.pk}/cancel/", {"reason": "x"}, format="json").status_code == 403
    # Another agent's checkpoint does not exist as far as this key can tell.
    foreign = foreign_client.post(f"/api/v1/checkpoints/{steps[1].pk}/fork/", {"reason": "me"}, format="json")
    assert foreign.status_code == 404
    assert writes(thread) == before


@pytest.mark.parametrize("body", [{}, {"reason": ""}, {"reason": "   "}])
def test_a_fork_needs_a_reason(admin_client: APIClient, thread: Thread, steps: list[Checkpoint], body: Any) -> None:
    before = writes(thread)
    response = admin_client.post(f"/api/v1/checkpoints/{steps[1].pk}/fork/", body, format="json")
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid" and "reason" in error["detail"]["fields"]
    assert writes(thread) == before


def test_an_unknown_field_is_refused_rather_than_ignored(
    admin_client: APIClient, thread: Thread, steps: list[Checkpoint]
) -> None:
    response = admin_client.post(f"/api/v1/checkpoints/{steps[1].pk}/fork/",
                                 {"reason": "r", "resume_agent": True}, format="json")  # fmt: skip
    assert response.status_code == 400 and "resume_agent" in response.json()["error"]["message"]


@pytest.mark.parametrize(
    ("patch", "op", "path"),
    [
        (
            [
                {"op": "add", "path": "/settings/batch_size", "value": 1},
                {"op": "replace", "path": "/nothing/here", "value": 2},
            ],
            1,
            "/nothing/here",
        ),
        ([{"op": "test", "path": "/migrated/0", "value": "orders"}], 0, "/migrated/0"),
        ([{"op": "frobnicate", "path": "/x"}], 0, None),
    ],
)
def test_a_patch_that_does_not_apply_is_422_naming_the_op_and_nothing_is_written(
    admin_client: APIClient, thread: Thread, steps: list[Checkpoint], patch: Any, op: int, path: str | None
) -> None:
    before = writes(thread)
    response = admin_client.post(f"/api/v1/checkpoints/{steps[1].pk}/fork/",
                                 {"reason": "edit", "patch": patch, "resume": True}, format="json")  # fmt: skip
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["code"] == "invalid_patch" and error["detail"]["op"] == op
    if path is not None:
        assert error["detail"]["path"] == path
    assert writes(thread) == before
    thread.refresh_from_db()
    assert thread.active_branch is not None and thread.active_branch.name == "main"


def test_a_patch_that_makes_the_state_not_an_object_is_422(
    admin_client: APIClient, thread: Thread, steps: list[Checkpoint]
) -> None:
    response = admin_client.post(f"/api/v1/checkpoints/{steps[1].pk}/fork/",
                                 {"reason": "r", "patch": [{"op": "replace", "path": "", "value": [1]}]},
                                 format="json")  # fmt: skip
    assert response.status_code == 422 and response.json()["error"]["code"] == "invalid_state"


def test_branch_names_are_generated_unique_and_a_taken_one_is_409(
    admin_client: APIClient, thread: Thread, steps: list[Checkpoint]
) -> None:
    url = f"/api/v1/checkpoints/{steps[1].pk}/fork/"
    assert admin_client.post(url, {"reason": "a"}, format="json").json()["branch"] == "fork-1"
    assert admin_client.post(url, {"reason": "b", "branch": "try-500"}, format="json").json()["branch"] == "try-500"
    assert admin_client.post(url, {"reason": "c", "branch": ""}, format="json").json()["branch"] == "fork-3"

    before = writes(thread)
    taken = admin_client.post(url, {"reason": "d", "branch": "try-500"}, format="json")
    assert taken.status_code == 409
    error = taken.json()["error"]
    assert error["code"] == "branch_exists" and "try-500" in error["message"]
    assert error["detail"] == {"field": "branch", "branch": "try-500", "suggestion": "fork-4"}
    main = admin_client.post(url, {"reason": "e", "branch": "main"}, format="json")
    assert main.status_code == 409
    bad = admin_client.post(url, {"reason": "f", "branch": "no spaces please"}, format="json")
    assert bad.status_code == 400 and "branch" in bad.json()["error"]["detail"]["fields"]
    assert writes(thread) == before


def test_forking_a_checkpoint_on_an_old_branch_works_and_keeps_its_parent(
    admin_client: APIClient, thread: Thread, steps: list[Checkpoint]
) -> None:
    first = admin_client.post(f"/api/v1/checkpoints/{steps[2].pk}/fork/", {"reason": "a"}, format="json").json()
    second = admin_client.post(f"/api/v1/checkpoints/{steps[0].pk}/fork/", {"reason": "b"}, format="json").json()
    fork_of_fork = admin_client.post(f"/api/v1/checkpoints/{first['id']}/fork/", {"reason": "c"}, format="json")
    assert fork_of_fork.status_code == 201
    assert (second["parent"], fork_of_fork.json()["parent"]) == (str(steps[0].pk), first["id"])
    detail = admin_client.get(f"/api/v1/threads/{thread.pk}/").json()
    assert detail["active_branch"] == "fork-3"
    assert {branch["name"]: branch["fork_point"] for branch in detail["branches"]} == {
        "main": None, "fork-1": str(steps[2].pk), "fork-2": str(steps[0].pk), "fork-3": first["id"],
    }  # fmt: skip


def test_the_agent_that_owns_an_old_branch_still_writes_there_without_moving_the_head(
    admin_client: APIClient, owner_client: APIClient, thread: Thread, steps: list[Checkpoint]
) -> None:
    forked = admin_client.post(f"/api/v1/checkpoints/{steps[1].pk}/fork/", {"reason": "r"}, format="json").json()
    late = owner_client.post(f"/api/v1/threads/{thread.pk}/checkpoints/", {
        "parent": str(steps[-1].pk), "step": 4, "label": "late write", "patch": [],
    }, format="json")  # fmt: skip
    assert late.status_code == 201 and late.json()["branch"] == "main" and late.json()["seq"] == 5
    stale = owner_client.post(f"/api/v1/threads/{thread.pk}/checkpoints/",
                              {"parent": str(steps[1].pk), "patch": []}, format="json")  # fmt: skip
    assert stale.status_code == 409 and stale.json()["error"]["detail"]["head"] == late.json()["id"]
    thread.refresh_from_db()
    assert str(thread.head_id) == forked["id"]


# --------------------------------------------------------------------------- resuming on the new branch


def test_resume_queues_one_fork_run_and_the_agent_completes_on_the_new_branch(ada: User) -> None:
    thread = start_thread(agent_class=MigrationAgent, external_id="migrate")
    drain()
    thread.refresh_from_db()
    assert thread.status == ThreadStatus.FAILED and thread.step == 20
    step_14 = Checkpoint.objects.get(thread=thread, branch__name="main", step=14)
    assert step_14.seq == 15

    created = forks.fork(checkpoint=step_14, user=ada, reason="batch_size 5000 locks table_20", resume=True,
                         patch=[{"op": "add", "path": "/settings/batch_size", "value": 500}])  # fmt: skip
    runs = list(Run.objects.filter(thread=thread, status=RunStatus.QUEUED))
    assert [(run.reason, run.checkpoint_id, run.approval_id) for run in runs] == [(RunReason.FORK, created.pk, None)]
    assert Run.objects.filter(thread=thread, reason=RunReason.FORK).count() == 1
    thread.refresh_from_db()
    assert thread.status == ThreadStatus.RUNNING

    drain()
    thread.refresh_from_db()
    assert thread.status == ThreadStatus.COMPLETED and thread.active_branch is not None
    assert thread.active_branch.name == "fork-1"
    head = Checkpoint.objects.get(pk=str(thread.head_id))
    assert head.branch_id == thread.active_branch_id and head.label == "migration complete"
    state = storage.state_at(head)
    assert state["settings"] == {"batch_size": 500} and len(state["migrated"]) == 20
    old_head = Checkpoint.objects.filter(thread=thread, branch__name="main").order_by("-seq").first()
    assert old_head is not None and old_head.status == "failed" and old_head.step == 20


def test_decisions_on_the_old_branch_are_not_replayed_unless_carried_over(ada: User) -> None:
    reviewer = person("rita", "reviewer")
    thread = start_thread(agent_class=TravelAgent, external_id="trip-carry", destination="FCO")
    drain()
    asked = ApprovalRequest.objects.get(thread=thread, status=ApprovalStatus.PENDING)
    decide(approval=asked, user=reviewer, decision="approve")
    drain()
    thread.refresh_from_db()
    assert thread.status == ThreadStatus.COMPLETED
    before_asking = Checkpoint.objects.get(pk=str(asked.checkpoint.parent_id))  # the search, phase "approve"

    # Not carried: the agent on the new branch asks a person again.
    again = forks.fork(checkpoint=before_asking, user=ada, reason="ask again", resume=True)
    drain()
    fresh = ApprovalRequest.objects.get(thread=thread, status=ApprovalStatus.PENDING)
    assert fresh.pk != asked.pk and fresh.checkpoint.branch_id == again.branch_id
    thread.refresh_from_db()
    assert thread.status == ThreadStatus.WAITING_FOR_APPROVAL

    # Carried: the new run hands the agent the earlier decision, and it books without asking.
    carried = forks.fork(checkpoint=before_asking, user=ada, reason="same decision", resume=True,
                         carry_approval=asked.pk)  # fmt: skip
    fresh.refresh_from_db()
    assert fresh.status == ApprovalStatus.CANCELLED  # it belonged to the branch left behind
    run = Run.objects.get(checkpoint=carried)
    assert run.approval_id == asked.pk and run.reason == RunReason.FORK
    drain()
    thread.refresh_from_db()
    assert thread.status == ThreadStatus.COMPLETED and thread.active_branch_id == carried.branch_id
    assert not ApprovalRequest.objects.filter(thread=thread, checkpoint__branch_id=carried.branch_id).exists()
    carried_branch = storage.get_branch_name(carried.branch_id)
    assert storage.latest_state(thread=thread, branch=carried_branch)[1]["phase"] == "booked"
    entry = AuditEntry.objects.get(thread=thread, action="thread.fork", after__branch="fork-2")
    assert entry.after["carry_approval"] == str(asked.pk) and entry.after["cancelled_approvals"] == [str(fresh.pk)]


def test_only_a_decided_approval_of_the_same_thread_can_be_carried_over(
    admin_client: APIClient, thread: Thread, steps: list[Checkpoint]
) -> None:
    other = storage.create_thread(agent=thread.agent, external_id="other")[0]
    other_first = storage.append_checkpoint(thread=other, parent=None, state={})
    foreign = ApprovalRequest.objects.create(thread=other, checkpoint=other_first, action="x",
                                             status=ApprovalStatus.APPROVED)  # fmt: skip
    pending = ApprovalRequest.objects.create(thread=thread, checkpoint=steps[-1], action="x")
    decided = ApprovalRequest.objects.create(thread=thread, checkpoint=steps[2], action="x",
                                             status=ApprovalStatus.REJECTED, comment="no")  # fmt: skip
    url = f"/api/v1/checkpoints/{steps[1].pk}/fork/"
    before = writes(thread)
    for approval, status, code in [(foreign, 422, "invalid_approval"), (pending, 422, "invalid_approval")]:
        response = admin_client.post(url, {"reason": "r", "resume": True, "carry_approval": str(approval.pk)},
                                     format="json")  # fmt: skip
        assert (response.status_code, response.json()["error"]["code"]) == (status, code)
        assert response.json()["error"]["detail"]["field"] == "carry_approval"
    without_resume = admin_client.post(url, {"reason": "r", "carry_approval": str(decided.pk)}, format="json")
    assert without_resume.status_code == 400
    assert writes(thread) == before

    carried = admin_client.post(url, {"reason": "r", "resume": True, "carry_approval": str(decided.pk)}, format="json")
    assert carried.status_code == 201
    assert Run.objects.get(pk=carried.json()["run"]).approval_id == decided.pk


def test_a_fork_supersedes_the_old_branch_s_pending_approval_and_queued_runs(
    ada: User, thread: Thread, steps: list[Checkpoint]
) -> None:
    from approvals.services import request_approval
    from quicksave_agents.runs import enqueue_run

    asked = request_approval(thread=thread, checkpoint=steps[-1], action="drop_table", args={"table": "orders"})
    queued = enqueue_run(thread=thread, checkpoint=steps[-1], reason=RunReason.MANUAL)
    forks.fork(checkpoint=steps[1], user=ada, reason="start over")
    asked.refresh_from_db()
    queued.refresh_from_db()
    assert asked.status == ApprovalStatus.CANCELLED and "start over" in asked.comment
    assert queued.status == RunStatus.CANCELLED
    # The new branch may ask again: the thread no longer waits on the old branch's decision.
    request_approval(thread=thread, checkpoint=Checkpoint.objects.get(pk=str(Thread.objects.get(pk=thread.pk).head_id)),
                     action="drop_table", args={"table": "orders"})  # fmt: skip


def test_rerun_is_an_unedited_fork_that_resumes(ada: User, thread: Thread, steps: list[Checkpoint]) -> None:
    created = forks.rerun(checkpoint=steps[2], user=ada, reason="flaky tool")
    assert storage.state_at(created) == storage.state_at(steps[2])
    assert created.source == CheckpointSource.HUMAN and created.label == "re-run: flaky tool"
    assert Run.objects.get(checkpoint=created).reason == RunReason.FORK
    entry = AuditEntry.objects.get(thread=thread, action="thread.rerun")
    assert trail.opened(entry).after["patch"] == [] and entry.after["resume"] is True


def test_a_rolled_back_fork_leaves_no_branch_behind_in_the_store_s_cache(
    ada: User, thread: Thread, steps: list[Checkpoint], monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(**kwargs: Any) -> None:
        raise RuntimeError("the audit table is down")

    monkeypatch.setattr(trail, "record", broken)
    with pytest.raises(RuntimeError):
        forks.fork(checkpoint=steps[1], user=ada, reason="first try", branch="retry")
    assert not Branch.objects.filter(thread=thread, name="retry").exists()
    monkeypatch.undo()
    created = forks.fork(checkpoint=steps[1], user=ada, reason="second try", branch="retry")
    assert storage.get_branch_name(created.branch_id) == "retry"


def test_domain_functions_refuse_people_without_the_admin_role(thread: Thread, steps: list[Checkpoint]) -> None:
    from django.core.exceptions import PermissionDenied

    reviewer = person("rita", "reviewer")
    with pytest.raises(PermissionDenied):
        forks.fork(checkpoint=steps[1], user=reviewer, reason="r")
    with pytest.raises(PermissionDenied):
        forks.cancel(thread=thread, user=reviewer, reason="r")


# --------------------------------------------------------------------------- cancel and resume


def test_cancel_cancels_pending_approvals_and_queued_runs(admin_client: APIClient, ada: User) -> None:
    thread = start_thread(agent_class=TravelAgent, external_id="trip-cancel", destination="LIS")
    drain()
    asked = ApprovalRequest.objects.get(thread=thread, status=ApprovalStatus.PENDING)
    from quicksave_agents.runs import enqueue_run

    queued = enqueue_run(thread=thread, checkpoint=asked.checkpoint, reason=RunReason.MANUAL)

    response = admin_client.post(f"/api/v1/threads/{thread.pk}/cancel/", {"reason": "trip called off"},
                                 format="json")  # fmt: skip
    assert response.status_code == 200 and response.json()["status"] == "cancelled"
    asked.refresh_from_db()
    queued.refresh_from_db()
    assert asked.status == ApprovalStatus.CANCELLED and queued.status == RunStatus.CANCELLED
    assert Event.objects.filter(thread=thread, type="thread.cancelled").count() == 1
    entry = AuditEntry.objects.get(thread=thread, action="thread.cancel")
    assert entry.reason == "trip called off" and entry.before["status"] == "waiting_for_approval"
    assert entry.after == {**entry.before, "status": "cancelled", "cancelled_approvals": [str(asked.pk)],
                           "cancelled_runs": [str(queued.pk)]}  # fmt: skip
    drain()  # nothing left to run
    assert not Checkpoint.objects.filter(thread=thread, created_at__gt=entry.created_at).exists()

    again = admin_client.post(f"/api/v1/threads/{thread.pk}/cancel/", {"reason": "twice"}, format="json")
    assert again.status_code == 409 and again.json()["error"]["code"] == "invalid_thread_status"
    assert admin_client.post(f"/api/v1/threads/{thread.pk}/cancel/", {}, format="json").status_code == 400


def cancel(client: APIClient, thread: Thread) -> None:
    assert client.post(f"/api/v1/threads/{thread.pk}/cancel/", {"reason": "stop"}, format="json").status_code == 200


def test_an_agent_still_writing_after_a_cancellation_does_not_undo_it(
    admin_client: APIClient, owner_client: APIClient, thread: Thread, steps: list[Checkpoint]
) -> None:
    assert (
        admin_client.post(f"/api/v1/threads/{thread.pk}/cancel/", {"reason": "stop"}, format="json").status_code == 200
    )
    url = f"/api/v1/threads/{thread.pk}/checkpoints/"

    late = owner_client.post(url, {"parent": str(steps[-1].pk), "state": {"late": 1}}, format="json")
    done = owner_client.post(url, {"parent": late.json()["id"], "state": {}, "status": "completed"}, format="json")

    assert (late.status_code, done.status_code) == (201, 201)  # kept on the timeline, as written
    thread.refresh_from_db()
    assert thread.status == ThreadStatus.CANCELLED and str(thread.head_id) == done.json()["id"]


def test_a_cancelled_thread_takes_no_approval_request(
    admin_client: APIClient, owner_client: APIClient, thread: Thread, steps: list[Checkpoint]
) -> None:
    assert (
        admin_client.post(f"/api/v1/threads/{thread.pk}/cancel/", {"reason": "stop"}, format="json").status_code == 200
    )

    response = owner_client.post(
        f"/api/v1/threads/{thread.pk}/approvals/", {"checkpoint": str(steps[-1].pk), "action": "deploy"}, format="json"
    )

    assert response.status_code == 409 and response.json()["error"]["code"] == "thread_cancelled"
    assert not ApprovalRequest.objects.filter(thread=thread).exists()
    thread.refresh_from_db()
    assert thread.status == ThreadStatus.CANCELLED


def test_a_persons_fork_of_a_cancelled_thread_sets_it_going_again(
    admin_client: APIClient, thread: Thread, steps: list[Checkpoint]
) -> None:
    assert (
        admin_client.post(f"/api/v1/threads/{thread.pk}/cancel/", {"reason": "stop"}, format="json").status_code == 200
    )

    forked = admin_client.post(f"/api/v1/checkpoints/{steps[1].pk}/fork/", {"reason": "try again"}, format="json")

    assert forked.status_code == 201, forked.content
    thread.refresh_from_db()
    assert thread.status != ThreadStatus.CANCELLED


def test_resume_is_only_for_a_failed_thread_and_queues_one_manual_run_from_the_head(
    admin_client: APIClient, ada: User
) -> None:
    done = start_thread(agent_class=MigrationAgent, external_id="done")
    Thread.objects.filter(pk=done.pk).update(status=ThreadStatus.COMPLETED)
    refused = admin_client.post(f"/api/v1/threads/{done.pk}/resume/", {"reason": "go"}, format="json")
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "invalid_thread_status"
    Thread.objects.filter(pk=done.pk).update(status=ThreadStatus.RUNNING)
    assert admin_client.post(f"/api/v1/threads/{done.pk}/resume/", {"reason": "go"}, format="json").status_code == 409

    thread = start_thread(agent_class=MigrationAgent, external_id="failing")
    Run.objects.filter(thread=done).delete()
    drain()
    thread.refresh_from_db()
    assert thread.status == ThreadStatus.FAILED
    response = admin_client.post(f"/api/v1/threads/{thread.pk}/resume/", {"reason": "the lock is gone"},
                                 format="json")  # fmt: skip
    assert response.status_code == 200, response.json()
    body = response.json()
    assert body["status"] == "running"
    run = Run.objects.get(pk=body["run"])
    assert (run.reason, run.checkpoint_id, run.status) == (RunReason.MANUAL, thread.head_id, RunStatus.QUEUED)
    twice = admin_client.post(f"/api/v1/threads/{thread.pk}/resume/", {"reason": "again"}, format="json")
    assert twice.status_code == 409  # the thread is running now
    entry = AuditEntry.objects.get(thread=thread, action="thread.resume")
    assert entry.before["status"] == "failed" and entry.after["run"] == str(run.pk)
    assert Event.objects.filter(thread=thread, type="thread.resumed").count() == 1


def test_a_second_resume_while_a_run_is_queued_is_409(ada: User) -> None:
    thread = start_thread(agent_class=MigrationAgent, external_id="failing")
    drain()
    forks.resume_failed(thread=thread, user=ada, reason="retry")
    Thread.objects.filter(pk=thread.pk).update(status=ThreadStatus.FAILED)  # as if the status raced back
    with pytest.raises(forks.RunPending):
        forks.resume_failed(thread=thread, user=ada, reason="retry again")
    assert Run.objects.filter(thread=thread, reason=RunReason.MANUAL).count() == 1


def test_a_paused_fork_can_be_resumed(ada: User, thread: Thread, steps: list[Checkpoint]) -> None:
    created = forks.fork(checkpoint=steps[1], user=ada, reason="look first")
    run = forks.resume_failed(thread=thread, user=ada, reason="looks right")
    assert run.checkpoint_id == created.pk and run.reason == RunReason.MANUAL


# --------------------------------------------------------------------------- racing real processes

WRITER = textwrap.dedent(
    """
    import json, sys
    from uuid import UUID
    import django
    django.setup()
    from checkpoints import storage
    from checkpoints.storage.errors import StaleParent
    from checkpoints.models import Thread

    thread = Thread.objects.get(pk=sys.argv[1])
    name, count = sys.argv[2], int(sys.argv[3])
    head = storage.branch_head(thread_id=thread.pk, branch_id=thread.branches.get(name="main").pk)[0]
    written = stale = 0
    while written < count:
        try:
            made = storage.append_checkpoint(
                thread=thread, parent=head, label=f"{name} {written}", metadata={"writer": name},
                patch=[{"op": "add", "path": "/log/-", "value": f"{name}-{written}"}],
                # Half the writes name the branch, half let it follow the parent, as agents do.
                branch="main" if written % 2 else None,
            )
        except StaleParent as exc:
            stale += 1
            head = UUID(exc.detail["head"])  # re-read the head of the branch this agent writes, and retry
            continue
        head = made.pk
        written += 1
    print(json.dumps({"written": written, "stale": stale}))
    """
)
WRITERS = ("agent-a", "agent-b")
WRITES_EACH = 80


@pytest.mark.django_db(transaction=True)
def test_forking_while_agents_write_the_old_branch_keeps_every_branch_consistent() -> None:
    ada = person("ada", "admin")
    from quicksave_agents.keys import get_or_create_agent

    thread = storage.create_thread(agent=get_or_create_agent(name="migration"), external_id="race")[0]
    storage.append_checkpoint(thread=thread, parent=None, state={"log": []}, label="start")
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "quicksave.settings", "DATABASE_URL": database_url()}
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(thread.pk), name, str(WRITES_EACH)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for name in WRITERS
    ]
    try:
        randomly = random.Random(6)
        main = Branch.objects.get(thread=thread, name="main")
        deadline = time.monotonic() + 60
        wait_until(lambda: Checkpoint.objects.filter(thread=thread, branch=main).count() >= 10,
                   what="the writers to put 10 checkpoints on main", timeout=60, every=0.02)  # fmt: skip
        forked: list[Checkpoint] = []
        while any(writer.poll() is None for writer in writers) or len(forked) < 6:
            on_main = list(Checkpoint.objects.filter(thread=thread, branch=main).defer("payload").order_by("-seq")[:20])
            # Mostly from main's newest checkpoints (racing its writers), sometimes from the last fork.
            source = forked[-1] if forked and randomly.random() < 0.3 else randomly.choice(on_main)
            made = forks.fork(checkpoint=source, user=ada, reason=f"fork {len(forked) + 1}",
                              patch=[{"op": "add", "path": "/log/-", "value": "edited"}])  # fmt: skip
            parent = made
            for _ in range(2):  # the new branch's own agent writes after the fork
                parent = storage.append_checkpoint(thread=thread, parent=parent, patch=[], metadata={"writer": "fork"})
            forked.append(made)
            time.sleep(randomly.uniform(0.0, 0.05))  # jitter: forks land at varied points of the writers' runs
            if time.monotonic() > deadline:
                break
        results = []
        for writer in writers:
            out, err = writer.communicate(timeout=60)
            assert writer.returncode == 0, err.decode()
            results.append(json.loads(out))
    finally:
        for writer in writers:
            if writer.poll() is None:
                writer.kill()
                writer.wait()

    assert [result["written"] for result in results] == [WRITES_EACH] * len(WRITERS)
    rows = list(Checkpoint.objects.filter(thread=thread).select_related("branch").defer("payload"))
    by_id = {row.pk: row for row in rows}
    branches = list(Branch.objects.filter(thread=thread).order_by("created_at", "id"))
    assert len(branches) == len(forked) + 1
    for branch in branches:
        seqs = sorted(row.seq for row in rows if row.branch_id == branch.pk)
        assert seqs == list(range(1, len(seqs) + 1)), f"{branch.name} has gaps: {seqs}"
    for row in rows:
        if row.seq == 1:
            assert row.parent_id == row.branch.fork_point_id, f"{row.branch.name} #1 does not follow its fork point"
        else:
            assert row.parent_id is not None
            parent = by_id[row.parent_id]
            assert (parent.branch_id, parent.seq) == (row.branch_id, row.seq - 1), f"{row.branch.name} #{row.seq}"
    # Every write of the agents on the old branch landed there; none reached a fork branch.
    agent_rows = [row for row in rows if row.metadata.get("writer") in WRITERS]
    assert len(agent_rows) == WRITES_EACH * len(WRITERS)
    assert {row.branch.name for row in agent_rows} == {"main"}
    thread.refresh_from_db()
    latest = branches[-1]
    assert thread.active_branch_id == latest.pk and latest.name == f"fork-{len(forked)}"
    assert thread.head_id is not None
    head = by_id[thread.head_id]
    assert head.branch_id == latest.pk and head.seq == max(row.seq for row in rows if row.branch_id == latest.pk)
    events = [seq for seq, _, _ in storage.events_after(thread_id=thread.pk, seq=0, limit=100_000)]
    assert events == list(range(1, thread.event_seq + 1))
    storage.clear_caches()  # replay every branch head from the database, checking each row's MAC
    for branch in branches:
        assert storage.latest_state(thread=thread, branch=branch.name)[0] is not None
    print(f"stale-parent retries in the writers: {[result['stale'] for result in results]}; forks: {len(forked)}")


def test_stale_parent_is_what_an_agent_gets_for_an_old_parent_after_a_fork(
    ada: User, thread: Thread, steps: list[Checkpoint]
) -> None:
    forks.fork(checkpoint=steps[1], user=ada, reason="r")
    with pytest.raises(StaleParent):
        storage.append_checkpoint(thread=thread, parent=steps[1], patch=[])  # main's head is steps[-1]
    with pytest.raises(InvalidPatch):
        forks.fork(checkpoint=steps[1], user=ada, reason="r", patch=[{"op": "remove", "path": "/gone"}])
