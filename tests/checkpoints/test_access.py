"""Rows of the threads a caller may read, narrowed without a join of every thread for a person who
may read them all."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import AnonymousUser, User
from django.db import connection
from django.test.utils import CaptureQueriesContext

from approvals.models import ApprovalRequest
from checkpoints.access import of_visible_threads, visible_threads
from quicksave_agents.auth import AgentPrincipal
from quicksave_agents.keys import create_agent_key, find_agent_key
from quicksave_agents.models import Agent
from tests.approvals.factories import waiting
from tests.conftest import password_hash, person

pytestmark = pytest.mark.django_db


def key_of(agent: Agent) -> AgentPrincipal:
    _, raw = create_agent_key(agent=agent)
    key = find_agent_key(raw)
    assert key is not None
    return AgentPrincipal(key)


def test_each_caller_gets_the_rows_of_the_threads_it_may_read(agent: Agent) -> None:
    travel, review = waiting(agent="travel"), waiting(agent="code-review")
    callers: list[tuple[Any, set[ApprovalRequest]]] = [
        (person("vera", "viewer"), {travel, review}),
        (key_of(agent), {travel}),
        (User.objects.create(username="sam", password=password_hash("sam-password-1")), set()),  # no role
        (AnonymousUser(), set()),
    ]

    for caller, readable in callers:
        assert set(of_visible_threads(ApprovalRequest.objects.all(), caller)) == readable
        assert set(ApprovalRequest.objects.filter(thread__in=visible_threads(caller))) == readable


def test_a_person_who_reads_every_thread_is_not_filtered_through_the_thread_table() -> None:
    waiting()
    with CaptureQueriesContext(connection) as captured:
        list(of_visible_threads(ApprovalRequest.objects.all(), person("vera", "viewer")))
    assert "checkpoints_thread" not in captured.captured_queries[-1]["sql"]
