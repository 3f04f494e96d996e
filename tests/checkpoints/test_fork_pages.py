"""The dashboard's admin actions: the "Rewind & branch" card and its two-step fork, re-run,
cancel and resume pages. Only admins see or use them; each confirms before it writes."""

from __future__ import annotations

import json
import re
import tracemalloc
from collections.abc import Callable
from html import unescape
from typing import Any

import pytest
from django.test import Client

from approvals.services import request_approval
from audit import trail
from audit.models import AuditEntry
from checkpoints import storage
from checkpoints.models import Branch, Checkpoint, Thread, ThreadKey, ThreadStatus
from quicksave_agents.models import Run, RunReason
from tests.conftest import person, signed_in

STATE = {"settings": {}, "migrated": ["users", "orders"], "log": ["users: 1200 rows"]}


@pytest.fixture
def admin(db: Any) -> Client:
    return signed_in(person("ada", "admin"))


@pytest.fixture
def checkpoints(thread: Thread) -> list[Checkpoint]:
    first = storage.append_checkpoint(thread=thread, parent=None, step=0, label="start", state=STATE)
    second = storage.append_checkpoint(thread=thread, parent=first, step=1, label="pick batch size",
                                     patch=[{"op": "add", "path": "/settings/batch_size", "value": 5000}])  # fmt: skip
    return [first, second]


def written(thread: Thread) -> tuple[int, int, int]:
    return (Branch.objects.filter(thread=thread).count(), Checkpoint.objects.filter(thread=thread).count(),
            AuditEntry.objects.filter(thread=thread).count())  # fmt: skip


def edited(**settings: Any) -> str:
    return json.dumps({**STATE, "settings": settings}, indent=2)


def errors_of(html: str, field: str) -> str:
    found = re.search(rf'<ul class="errorlist" id="{field}-errors" role="alert">(.*?)</ul>', html, re.S)
    return unescape(re.sub(r"<[^>]+>", "", found.group(1))) if found else ""


@pytest.mark.parametrize("role", ["viewer", "reviewer"])
def test_only_admins_see_the_rewind_card(role: str, admin: Client, checkpoints: list[Checkpoint]) -> None:
    url = f"/checkpoints/{checkpoints[0].pk}/"
    page = admin.get(url).content.decode()
    assert 'id="rewind"' in page and 'id="fork-form"' in page and 'id="rerun"' in page
    textarea = re.search(r'<textarea id="fork-state"[^>]*>(.*?)</textarea>', page, re.S)
    assert textarea is not None and json.loads(unescape(textarea.group(1))) == STATE
    assert 'placeholder="fork-1"' in page and "js/fork.js" in page

    other = signed_in(person("olga", role)).get(url).content.decode()
    for trace in ('id="rewind"', "fork-form", "Rewind &amp; branch", "/rerun/", "js/fork.js"):
        assert trace not in other


@pytest.mark.parametrize("role", ["viewer", "reviewer"])
def test_non_admins_get_403_from_every_action_and_nothing_is_written(
    role: str, thread: Thread, checkpoints: list[Checkpoint]
) -> None:
    client = signed_in(person("olga", role))
    before = written(thread)
    fork = f"/checkpoints/{checkpoints[0].pk}/fork/"
    for method, url, data in [
        ("get", fork, {}),
        ("post", fork, {"reason": "r", "step": "confirm", "patch": "[]"}),
        ("get", f"/checkpoints/{checkpoints[0].pk}/rerun/", {}),
        ("post", f"/checkpoints/{checkpoints[0].pk}/rerun/", {"reason": "r"}),
        ("get", f"/threads/{thread.pk}/cancel/", {}),
        ("post", f"/threads/{thread.pk}/cancel/", {"reason": "r"}),
        ("post", f"/threads/{thread.pk}/resume/", {"reason": "r"}),
    ]:
        assert getattr(client, method)(url, data).status_code == 403, (method, url)
    assert written(thread) == before


def test_a_fork_that_does_not_resume_opens_its_new_checkpoint(
    admin: Client, thread: Thread, checkpoints: list[Checkpoint]
) -> None:
    url = f"/checkpoints/{checkpoints[1].pk}/fork/"
    patch = [{"op": "replace", "path": "/settings/batch_size", "value": 500}]

    confirmed = admin.post(url, {"step": "confirm", "reason": "look first", "branch": "", "carry_approval": "",
                                 "patch": json.dumps(patch)})  # fmt: skip

    thread.refresh_from_db()
    assert confirmed.status_code == 302 and confirmed["Location"] == f"/checkpoints/{thread.head_id}/"
    assert not Run.objects.filter(checkpoint_id=str(thread.head_id)).exists()


def test_review_shows_the_patch_and_the_branch_then_confirm_forks_and_opens_the_thread_it_resumes(
    admin: Client, thread: Thread, checkpoints: list[Checkpoint]
) -> None:
    url = f"/checkpoints/{checkpoints[1].pk}/fork/"
    before = written(thread)
    review = admin.post(url, {"reason": "5000 locks the table", "state": edited(batch_size=500), "resume": "on"})
    assert review.status_code == 200
    page = review.content.decode()
    assert "Confirm the fork" in page and 'id="summary-branch">fork-1<' in page
    assert "/settings/batch_size" in page and "Resumes from the new checkpoint" in page
    assert written(thread) == before  # reviewing writes nothing

    patch = json.loads(unescape(re.search(r'name="patch" value="([^"]*)"', page).group(1)))  # type: ignore[union-attr]
    assert patch == [{"op": "replace", "path": "/settings/batch_size", "value": 500}]
    confirmed = admin.post(url, {"step": "confirm", "reason": "5000 locks the table", "resume": "on",
                                 "branch": "", "carry_approval": "", "patch": json.dumps(patch)})  # fmt: skip
    thread.refresh_from_db()
    # A resumed fork opens the thread's timeline, where the agent goes on (a paused one, its checkpoint).
    assert confirmed.status_code == 302 and confirmed["Location"] == f"/threads/{thread.pk}/"
    created = Checkpoint.objects.get(pk=str(thread.head_id))
    assert storage.get_branch_name(created.branch_id) == "fork-1" and created.parent_id == checkpoints[1].pk
    assert storage.state_at(created)["settings"] == {"batch_size": 500}
    assert Run.objects.get(checkpoint=created).reason == RunReason.FORK
    entry = AuditEntry.objects.get(thread=thread, action="thread.fork")
    assert entry.actor_name == "ada" and entry.address == "127.0.0.1" and trail.opened(entry).after["patch"] == patch

    new_page = admin.get(confirmed["Location"]).content.decode()
    assert "fork: 5000 locks the table" in new_page and "fork-1" in new_page


def test_bad_json_is_shown_next_to_the_editor_and_nothing_is_written(
    admin: Client, thread: Thread, checkpoints: list[Checkpoint]
) -> None:
    url = f"/checkpoints/{checkpoints[0].pk}/fork/"
    before = written(thread)
    broken = admin.post(url, {"reason": "r", "state": '{"settings": {"batch_size": }'})
    assert broken.status_code == 400
    page = broken.content.decode()
    assert "This is not valid JSON" in errors_of(page, "state")
    assert "{&quot;settings&quot;: {&quot;batch_size&quot;: }" in page  # the text is kept to fix
    not_object = admin.post(url, {"reason": "r", "state": "[1, 2]"})
    assert not_object.status_code == 400 and "must be a JSON object" in errors_of(not_object.content.decode(), "state")
    assert written(thread) == before


def test_a_missing_reason_and_a_taken_branch_name_come_back_inline(
    admin: Client, thread: Thread, checkpoints: list[Checkpoint]
) -> None:
    url = f"/checkpoints/{checkpoints[0].pk}/fork/"
    no_reason = admin.post(url, {"reason": "  ", "state": edited(batch_size=500)})
    assert no_reason.status_code == 400 and "Give a reason" in errors_of(no_reason.content.decode(), "reason")
    taken = admin.post(url, {"reason": "r", "branch": "main", "state": edited()})
    assert taken.status_code == 409
    assert "already has a branch named 'main'" in errors_of(taken.content.decode(), "branch")
    # The confirm step checks again: a name taken between review and confirm is refused there too.
    confirm = admin.post(url, {"step": "confirm", "reason": "r", "branch": "main", "patch": "[]"})
    assert confirm.status_code == 409 and "already has a branch" in errors_of(confirm.content.decode(), "branch")
    assert Branch.objects.filter(thread=thread).count() == 1


def test_back_to_editing_keeps_the_edited_state(admin: Client, checkpoints: list[Checkpoint]) -> None:
    patch = [{"op": "add", "path": "/settings/batch_size", "value": 500}]
    back = admin.post(f"/checkpoints/{checkpoints[0].pk}/fork/",
                      {"step": "edit", "reason": "keep me", "patch": json.dumps(patch)})  # fmt: skip
    assert back.status_code == 200
    page = back.content.decode()
    textarea = re.search(r'<textarea id="fork-state"[^>]*>(.*?)</textarea>', page, re.S)
    assert textarea is not None and json.loads(unescape(textarea.group(1)))["settings"] == {"batch_size": 500}
    assert ">keep me</textarea>" in page


def test_rerun_confirms_then_branches_and_resumes(admin: Client, thread: Thread, checkpoints: list[Checkpoint]) -> None:
    url = f"/checkpoints/{checkpoints[1].pk}/rerun/"
    page = admin.get(url).content.decode()
    assert "Re-run from" in page and "fork-1" in page and 'id="action-reason"' in page
    assert admin.post(url, {"reason": ""}).status_code == 400
    done = admin.post(url, {"reason": "the tool was flaky"})
    thread.refresh_from_db()
    assert done.status_code == 302 and done["Location"] == f"/checkpoints/{thread.head_id}/"
    assert AuditEntry.objects.filter(thread=thread, action="thread.rerun").count() == 1


def test_cancel_and_resume_pages_confirm_with_a_reason(
    admin: Client, thread: Thread, checkpoints: list[Checkpoint]
) -> None:
    cancel = f"/threads/{thread.pk}/cancel/"
    assert "Cancel this thread?" in admin.get(cancel).content.decode()
    missing = admin.post(cancel, {"reason": ""})
    assert missing.status_code == 400 and "Give a reason" in errors_of(missing.content.decode(), "reason")
    assert admin.post(cancel, {"reason": "not needed"})["Location"] == f"/threads/{thread.pk}/"
    thread.refresh_from_db()
    assert thread.status == ThreadStatus.CANCELLED
    # Nothing left to cancel: the page says why and offers no button.
    again = admin.get(cancel).content.decode()
    assert 'id="refusal"' in again and 'id="confirm-action"' not in again

    resume = f"/threads/{thread.pk}/resume/"
    assert "Only a failed or paused thread can be resumed" in admin.get(resume).content.decode()
    assert admin.post(resume, {"reason": "go"}).status_code == 409
    Thread.objects.filter(pk=thread.pk).update(status=ThreadStatus.FAILED)
    assert admin.post(resume, {"reason": "the lock is gone"})["Location"] == f"/threads/{thread.pk}/"
    assert Run.objects.get(thread=thread).reason == RunReason.MANUAL
    assert AuditEntry.objects.filter(thread=thread, action__in=["thread.cancel", "thread.resume"]).count() == 2


def test_the_thread_page_offers_resume_and_cancel_to_admins_only(db: Any) -> None:
    from quicksave_agents.demo import MigrationAgent
    from quicksave_agents.runtime import start_thread
    from quicksave_agents.worker import Worker

    thread = start_thread(agent_class=MigrationAgent, external_id="offer-actions")
    worker = Worker(name="pages")
    while worker.run_once():
        pass
    admin_page = signed_in(person("ada-offer", "admin")).get(f"/threads/{thread.pk}/").content.decode()
    viewer_page = signed_in(person("vic-offer", "viewer")).get(f"/threads/{thread.pk}/").content.decode()
    assert f"/threads/{thread.pk}/resume/" in admin_page and f"/threads/{thread.pk}/cancel/" in admin_page
    assert "/resume/" not in viewer_page and "/cancel/" not in viewer_page


def test_delete_confirms_then_removes_the_thread_shreds_its_key_and_audits(
    admin: Client, thread: Thread, checkpoints: list[Checkpoint]
) -> None:
    page = f"/threads/{thread.pk}/delete/"
    assert f'href="{page}"' in admin.get(f"/threads/{thread.pk}/").content.decode()
    confirm = admin.get(page).content.decode()
    assert "Delete this thread for good?" in confirm and "All 2 checkpoints" in confirm
    missing = admin.post(page, {"reason": " "})
    assert missing.status_code == 400 and "Give a reason" in errors_of(missing.content.decode(), "reason")
    assert Thread.objects.filter(pk=thread.pk).exists() and ThreadKey.objects.filter(thread_id=thread.pk).exists()

    done = admin.post(page, {"reason": "customer asked for erasure"}, follow=True)
    assert done.redirect_chain == [("/", 302)]
    assert "was deleted and its data key destroyed" in done.content.decode()
    assert not Thread.objects.filter(pk=thread.pk).exists()
    assert not Checkpoint.objects.filter(thread_id=thread.pk).exists()
    assert not ThreadKey.objects.filter(thread_id=thread.pk).exists()
    entry = AuditEntry.objects.get(action="thread.delete", target_id=str(thread.pk))
    assert (entry.actor_name, entry.reason) == ("ada", "customer asked for erasure")
    assert entry.before["checkpoints"] == 2 and entry.after == {"deleted": True, "data_key": "destroyed"}


def test_deleting_through_the_api_needs_a_reason_and_answers_204(
    admin: Client, thread: Thread, checkpoints: list[Checkpoint]
) -> None:
    url = f"/api/v1/threads/{thread.pk}/"
    missing = admin.delete(url, data=json.dumps({}), content_type="application/json")
    assert missing.status_code == 400 and "reason" in missing.json()["error"]["detail"]["fields"]
    assert Thread.objects.filter(pk=thread.pk).exists()
    gone = admin.delete(url, data=json.dumps({"reason": "test data"}), content_type="application/json")
    assert gone.status_code == 204
    assert admin.get(url).status_code == 404


@pytest.mark.parametrize("action", ["cancel", "resume", "delete"])
def test_confirmation_pages_keep_the_inbox_count_of_the_whole_site(
    admin: Client, thread: Thread, checkpoints: list[Checkpoint], action: str
) -> None:
    """The page counts this thread's pending approvals under a name of its own: it used to take
    the nav's name and so showed this thread's count (or none) as the inbox badge."""
    for trip in ("trip-2", "trip-3"):  # one pending approval a thread
        other = storage.create_thread(agent=thread.agent, external_id=trip)[0]
        head = storage.append_checkpoint(thread=other, parent=None, state={})
        request_approval(thread=other, checkpoint=head, action="book_flight", args={"flight": "AZ611"})

    page = admin.get(f"/threads/{thread.pk}/{action}/").content.decode()

    assert '<span class="nav-count" aria-label="2 pending">2</span>' in page


def doubling(ops: int) -> str:
    """A patch of a few bytes per op whose every op copies /d into itself: twice the list each time."""
    return json.dumps([{"op": "copy", "from": "/d", "path": "/d/-"}] * ops)


def peak_bytes_of(request: Callable[[], Any]) -> tuple[Any, int]:
    """What `request` returns the second time, and the most memory Python held at any moment of that
    time (the first loads the modules and templates it uses)."""
    request()
    tracemalloc.start()
    try:
        result = request()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_patch_that_doubles_the_state_is_refused_without_building_it(
    admin: Client, thread: Thread, settings: Any
) -> None:
    """60 copies of a list into itself would make 2**60 items; the store stops them at the state
    limit, and neither it nor the page builds that state's million lists to find out."""
    settings.QUICKSAVE_MAX_STATE_BYTES = 2 * 1024 * 1024
    first = storage.append_checkpoint(thread=thread, parent=None, state={"d": [0]})
    before = written(thread)

    response, peak = peak_bytes_of(lambda: admin.post(
        f"/checkpoints/{first.pk}/fork/", {"step": "confirm", "reason": "r", "patch": doubling(60)}
    ))  # fmt: skip

    assert response.status_code == 413
    error = errors_of(response.content.decode(), "state")
    assert "the limit is 2097152 bytes (QUICKSAVE_MAX_STATE_BYTES)" in error, error
    assert written(thread) == before
    assert peak < 2 * settings.QUICKSAVE_MAX_STATE_BYTES


def test_a_fork_form_that_comes_back_applies_its_patch_only_as_far_as_the_editor_shows(
    admin: Client, thread: Thread, settings: Any
) -> None:
    """A taken branch name sends the form back; the state its patch makes is within the state limit
    but too large for the editor, which says so without that state being written out as text."""
    settings.QUICKSAVE_MAX_STATE_BYTES = 4 * 1024 * 1024
    first = storage.append_checkpoint(thread=thread, parent=None, state={"d": [0]})

    response, peak = peak_bytes_of(lambda: admin.post(
        f"/checkpoints/{first.pk}/fork/",
        {"step": "confirm", "reason": "r", "branch": "main", "patch": doubling(19)},
    ))  # fmt: skip

    assert response.status_code == 409
    page = response.content.decode()
    assert "already has a branch named 'main'" in errors_of(page, "branch")
    assert 'id="fork-state"' not in page and "too large to edit here" in page
    assert peak < settings.QUICKSAVE_MAX_STATE_BYTES
