"""The thread list page: sign-in, roles, filters, counts, pages and bad input."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from checkpoints import storage
from quicksave_agents.keys import get_or_create_agent
from tests.conftest import person, signed_in


@pytest.fixture
def viewer_page(db: Any) -> Client:
    return signed_in(person("vera", "viewer"))


def seed(count: int, *, agent: str = "travel", **metadata: Any) -> list[Any]:
    owner = get_or_create_agent(name=agent)
    threads = []
    for n in range(count):
        thread, _ = storage.create_thread(agent=owner, metadata=metadata or {"n": n})
        storage.append_checkpoint(thread=thread, parent=None, state={"n": n}, step=n, label=f"step {n}")
        threads.append(thread)
    return threads


def test_anonymous_people_are_sent_to_sign_in(client: Client, db: Any) -> None:
    response = client.get("/")
    assert response.status_code == 302
    assert response["Location"] == "/login/?next=/"


def test_a_person_without_a_role_gets_403(db: Any) -> None:
    response = signed_in(person("sam", None)).get("/")
    assert response.status_code == 403
    assert b"grantrole" in response.content


@pytest.mark.parametrize("role", ["viewer", "reviewer", "admin"])
def test_every_role_sees_the_list(db: Any, role: str) -> None:
    seed(2)
    response = signed_in(person(f"user-{role}", role)).get("/")
    assert response.status_code == 200
    assert response.content.count(b'href="/threads/') == 2


def test_empty_install_shows_how_to_connect_an_agent(viewer_page: Client) -> None:
    body = viewer_page.get("/").content.decode()
    assert "createagentkey" in body
    assert "/api/v1" in body


def test_filters_and_counts(viewer_page: Client) -> None:
    acme = seed(2, customer="acme")
    seed(3, agent="code-review", customer="globex")
    head, _ = storage.latest_state(thread=acme[0])
    storage.append_checkpoint(thread=acme[0], parent=head, state={"done": True}, status="completed")

    page = viewer_page.get("/?q=customer:acme").content.decode()
    assert page.count('href="/threads/') == 2
    assert "Completed</span> <strong>1</strong>" in page

    page = viewer_page.get("/?agent=code-review").content.decode()
    assert page.count('href="/threads/') == 3
    page = viewer_page.get("/?status=completed").content.decode()
    assert page.count('href="/threads/') == 1
    assert viewer_page.get("/?step=1").content.decode().count('href="/threads/') == 2


def test_keyset_pages_walk_every_thread_once(viewer_page: Client) -> None:
    threads = seed(120)
    seen: list[str] = []
    url = "/?sort=created"
    while url:
        response = viewer_page.get(url)
        body = response.content.decode()
        seen += [t for t in (str(thread.pk) for thread in threads) if f'href="/threads/{t}/"' in body]
        next_link = response.context["next_query"]
        url = f"/?{next_link}" if next_link else ""
    assert sorted(seen) == sorted(str(thread.pk) for thread in threads)
    assert len(seen) == 120


@pytest.mark.parametrize("query", ["status=bogus", "step=abc", "since=yesterday", "q=nocolon", "cursor=%%%", "sort=x"])
def test_malformed_filters_give_a_400_page(viewer_page: Client, query: str) -> None:
    response = viewer_page.get(f"/?{query}")
    assert response.status_code == 400
    assert b"Those filters do not work" in response.content


def test_query_count_does_not_grow_with_the_page(viewer_page: Client, django_assert_max_num_queries: Any) -> None:
    seed(60)
    with django_assert_max_num_queries(9):
        response = viewer_page.get("/")
    assert response.content.decode().count('href="/threads/') == 50
