"""Hostile input on the dashboard's pages and forms: a 4xx or the form back with its error, never a
500, and nothing written. tests/test_hostile_input.py covers the REST API."""

from __future__ import annotations

import base64
import json
from typing import Any
from urllib.parse import quote

import pytest
from django.test import Client

from approvals.models import ApprovalRequest, ApprovalStatus
from approvals.services import request_approval
from audit.models import AuditEntry
from checkpoints import storage
from checkpoints.models import Branch, Checkpoint, Event, Thread, ThreadStatus
from tests.conftest import person, signed_in

MODELS = (Branch, Checkpoint, Event, ApprovalRequest, AuditEntry)


def row_counts() -> dict[str, int]:
    return {model.__name__: model.objects.count() for model in MODELS}


def deep(levels: int) -> str:
    return "[" * levels + "]" * levels


def link(value: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).decode()


@pytest.fixture
def admin(db: Any) -> Client:
    return signed_in(person("ada", "admin"))


@pytest.fixture
def world(thread: Thread) -> dict[str, str]:
    first = storage.append_checkpoint(thread=thread, parent=None, state={"d": [0], "a": 1})
    approval = request_approval(thread=thread, checkpoint=first, action="deploy", args={"env": "prod"})
    return {"thread": str(thread.pk), "checkpoint": str(first.pk), "approval": str(approval.pk)}


# (case, path, form fields, the status the page answers with)
# fmt: off
POSTS: list[tuple[str, str, dict[str, str], int]] = [
    ("a cancel reason with a NUL", "/threads/{thread}/cancel/", {"reason": "stop\x00now"}, 400),
    ("a delete reason with a NUL", "/threads/{thread}/delete/", {"reason": "gone\x00"}, 400),
    ("a fork reason with a NUL", "/checkpoints/{checkpoint}/fork/", {"reason": "why\x00", "step": "confirm",
                                                                      "patch": "[]"}, 400),
    ("a rejection comment with a NUL", "/inbox/{approval}/", {"decision": "reject", "comment": "no\x00"}, 400),
    ("edited args with a NUL escape", "/inbox/{approval}/", {"decision": "edit", "args": '{"a": "\\u0000"}'}, 400),
    ("edited args nested 100000 deep", "/inbox/{approval}/", {"decision": "edit", "args": deep(100_000)}, 400),
    ("edited args of null, which would approve the original", "/inbox/{approval}/",
     {"decision": "edit", "args": "null"}, 400),
    ("a fork state nested 100000 deep", "/checkpoints/{checkpoint}/fork/", {"reason": "r", "state": deep(100_000)},
     400),
    ("a fork state with a NUL escape", "/checkpoints/{checkpoint}/fork/", {"reason": "r", "state": '{"a": "\\u0000"}'},
     400),
    ("a confirmed fork patch nested 100000 deep", "/checkpoints/{checkpoint}/fork/",
     {"reason": "r", "step": "confirm", "patch": deep(100_000)}, 400),
    ("a confirmed fork patch that doubles the state", "/checkpoints/{checkpoint}/fork/",
     {"reason": "r", "step": "confirm", "patch": json.dumps([{"op": "copy", "from": "/d", "path": "/d/-"}] * 60)}, 413),
]
# fmt: on


@pytest.mark.parametrize(("path", "fields", "status"), [case[1:] for case in POSTS], ids=[case[0] for case in POSTS])
def test_a_hostile_form_comes_back_with_an_error_and_writes_nothing(
    world: dict[str, str], admin: Client, path: str, fields: dict[str, str], status: int
) -> None:
    before = row_counts()

    response = admin.post(path.format(**world), fields)

    assert response.status_code == status, response.content[:300]
    assert row_counts() == before
    assert ApprovalRequest.objects.get(pk=world["approval"]).status == ApprovalStatus.PENDING
    assert Thread.objects.get(pk=world["thread"]).status != ThreadStatus.CANCELLED


@pytest.mark.parametrize(
    "query",
    [f"cursor={link(['2026-01-01T00:00:00', 1])}", f"cursor={link(['2026-01-01T00:00:00', [1]])}",
     f"cursor={link([1, 'x'])}", "since=" + quote("0001-01-01T00:00:00+01:00"),
     "until=" + quote("9999-12-31T23:59:59-00:01")],
)  # fmt: skip
def test_the_thread_list_answers_a_hostile_query_with_a_400(world: dict[str, str], admin: Client, query: str) -> None:
    assert admin.get(f"/?{query}").status_code == 400


@pytest.mark.parametrize(
    "query",
    [f"older={link(['2026-01-01T00:00:00', 1e999])}", f"older={link(['2026-01-01T00:00:00', '7'])}",
     "since=" + quote("0001-01-01T00:00:00+14:00"), "until=" + quote("9999-12-31T23:59:59-14:00")],
)  # fmt: skip
def test_the_audit_page_answers_a_hostile_query_with_a_400(db: Any, admin: Client, query: str) -> None:
    assert admin.get(f"/audit/?{query}").status_code == 400


def test_a_date_within_range_still_filters(world: dict[str, str], admin: Client) -> None:
    page = admin.get("/?since=" + quote("2000-01-01T00:00:00+01:00"))
    assert page.status_code == 200 and world["thread"] in page.content.decode()


@pytest.mark.parametrize("name", ["%00", "x", "A" * 64, "0" * 63])
def test_a_large_value_that_is_not_named_by_a_sha256_is_not_found(
    world: dict[str, str], admin: Client, name: str
) -> None:
    assert admin.get(f"/threads/{world['thread']}/blobs/{name}/").status_code == 404


HOSTILE = "<img src=x onerror=alert(1)>"
ESCAPED = "&lt;img src=x onerror=alert(1)&gt;"


@pytest.fixture
def hostile_thread(agent: Any) -> dict[str, str]:
    """A thread whose every agent-written text is markup: its name, a label, a state key and a long
    value (word-diffed), a branch name and a metadata value."""
    thread, _ = storage.create_thread(agent=agent, external_id=HOSTILE, metadata={HOSTILE: HOSTILE})
    prose = "The agent wrote a long note that is diffed word by word because it is longer than eighty characters. "
    first = storage.append_checkpoint(thread=thread, parent=None, label=HOSTILE,
                                    state={HOSTILE: HOSTILE, "note": prose, "log": []})  # fmt: skip
    second = storage.append_checkpoint(
        thread=thread, parent=first, label=HOSTILE,
        patch=[{"op": "replace", "path": "/note", "value": prose + HOSTILE},
               {"op": "add", "path": "/log/-", "value": HOSTILE}, {"op": "add", "path": "/" + HOSTILE, "value": 1}],
    )  # fmt: skip
    storage.start_branch(thread=thread, at=first, name=HOSTILE)
    return {"thread": str(thread.pk), "first": str(first.pk), "second": str(second.pk)}


@pytest.mark.parametrize(
    "page",
    ["/threads/{thread}/", f"/threads/{{thread}}/?branch={quote(HOSTILE)}&drawings=1",
     "/threads/{thread}/?kind=changes", "/checkpoints/{second}/",
     "/checkpoints/{second}/diff/", "/checkpoints/{second}/diff/?view=split", "/checkpoints/{second}/fork/"],
    ids=["timeline and its events", "the hostile branch selected, tree and chart", "events only", "state tree",
         "unified diff", "split diff", "fork form"],
)  # fmt: skip
def test_agent_written_markup_renders_as_text(hostile_thread: dict[str, str], admin: Client, page: str) -> None:
    response = admin.get(page.format(**hostile_thread))

    html = response.content.decode()
    assert response.status_code == 200
    assert HOSTILE not in html
    assert ESCAPED in html


def test_a_hostile_fork_form_is_echoed_escaped_with_the_field_and_limit_named(
    hostile_thread: dict[str, str], admin: Client
) -> None:
    response = admin.post(
        f"/checkpoints/{hostile_thread['second']}/fork/", {"reason": HOSTILE + "x" * 2_000, "branch": HOSTILE}
    )

    html = response.content.decode()
    assert response.status_code == 400
    assert HOSTILE not in html
    assert f"Keep the reason to 2000 characters (it has {len(HOSTILE) + 2_000})." in html
    assert "A branch name is 1 to 100 letters" in html
