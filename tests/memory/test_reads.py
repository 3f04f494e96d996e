"""Reads made from a thread, recorded: by the thread's id (the API, the SDK) or as a LangGraph run
names it (resolved by the read's own statement), with the version read; costing the read no
query; shown on the item's page."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from checkpoints import storage
from checkpoints.models import Thread
from memory import reads, selectors, store
from memory.access import EVERYTHING
from memory.models import ItemRead, Namespace
from quicksave_agents.models import Agent
from tests.conftest import person, signed_in

# The recording thread writes on a connection of its own: the tests' writes must be committed.
pytestmark = pytest.mark.django_db(transaction=True)

NS = ("users", "alice")


def put(value: Any, *, key: str = "prefs", **kwargs: Any) -> store.Written:
    kwargs.setdefault("author", store.Author.system("tests"))
    return store.put_item(namespace=NS, key=key, value=value, scope=EVERYTHING, **kwargs)


def recorded(key: str = "prefs") -> list[selectors.ReadBy]:
    assert reads.flush()
    return selectors.item_reads(namespace=NS, key=key, scope=EVERYTHING)


def test_a_get_naming_its_thread_and_checkpoint_is_recorded_with_the_version_it_read(agent: Agent) -> None:
    thread, _ = storage.create_thread(agent=agent)
    checkpoint = storage.append_checkpoint(thread=thread, parent=None, state={})
    put({"seat": "aisle"})
    put({"seat": "window"})

    found = selectors.get_item(namespace=NS, key="prefs", scope=EVERYTHING,
                               reader=reads.Reader(thread_id=thread.pk, checkpoint_id=checkpoint.pk))  # fmt: skip

    assert found is not None and found.value == {"seat": "window"}
    [read] = recorded()
    assert (read.version, read.thread_id, read.checkpoint_id) == (2, thread.pk, checkpoint.pk)


def test_a_read_without_a_thread_or_of_nothing_records_nothing(agent: Agent) -> None:
    thread, _ = storage.create_thread(agent=agent)
    put({"seat": "aisle"})
    store.delete_item(namespace=NS, key="gone", author=store.Author.system("tests"), scope=EVERYTHING)

    selectors.get_item(namespace=NS, key="prefs", scope=EVERYTHING)
    selectors.get_item(namespace=NS, key="missing", scope=EVERYTHING, reader=reads.Reader(thread_id=thread.pk))

    assert recorded() == []
    assert ItemRead.objects.count() == 0


def test_a_langgraph_read_names_the_runs_thread_and_its_head_then(agent: Agent) -> None:
    thread, _ = storage.create_thread(agent=agent, external_id="run-7")
    first = storage.append_checkpoint(thread=thread, parent=None, state={"step": 1})
    put({"seat": "aisle"})
    by_run = reads.Reader(agent_id=agent.pk, external_id="run-7")

    selectors.get_item(namespace=NS, key="prefs", scope=EVERYTHING, reader=by_run)
    second = storage.append_checkpoint(
        thread=thread, parent=first.pk, patch=[{"op": "replace", "path": "/step", "value": 2}]
    )
    selectors.search_items(scope=EVERYTHING, prefix=NS, reader=by_run)
    selectors.get_item(namespace=NS, key="prefs", scope=EVERYTHING,
                       reader=reads.Reader(agent_id=agent.pk, external_id="another run"))  # fmt: skip

    assert [(r.thread_id, r.checkpoint_id) for r in recorded()] == [(thread.pk, second.pk), (thread.pk, first.pk)]


def test_recording_a_read_costs_the_read_no_query(agent: Agent, django_assert_num_queries: Any) -> None:
    storage.create_thread(agent=agent, external_id="run-7")
    put({"seat": "aisle"})
    selectors.get_item(namespace=NS, key="prefs", scope=EVERYTHING)  # the namespace, remembered
    by_run = reads.Reader(agent_id=agent.pk, external_id="run-7")

    with django_assert_num_queries(1):
        selectors.get_item(namespace=NS, key="prefs", scope=EVERYTHING, reader=by_run)
    with django_assert_num_queries(1):
        selectors.search_items(scope=EVERYTHING, prefix=NS, reader=by_run)

    assert len(recorded()) == 1  # the same version by the same checkpoint, once per round


def test_an_items_page_lists_the_threads_that_read_it(agent: Agent) -> None:
    thread, _ = storage.create_thread(agent=agent)
    checkpoint = storage.append_checkpoint(thread=thread, parent=None, state={})
    put({"seat": "aisle"}, author=store.Author.agent(agent.pk))
    selectors.get_item(namespace=NS, key="prefs", scope=EVERYTHING,
                       reader=reads.Reader(thread_id=thread.pk, checkpoint_id=checkpoint.pk))  # fmt: skip
    assert reads.flush()

    body = signed_in(person("val", "viewer")).get("/memory/item/?ns=users&ns=alice&key=prefs").content.decode()

    reads_table = body.split('id="memory-reads"', 1)[1].split("</table>", 1)[0]
    assert f'data-thread="{thread.pk}"' in reads_table
    assert f"/threads/{thread.pk}/" in reads_table and f"/checkpoints/{checkpoint.pk}/" in reads_table


def test_reads_of_an_item_deleted_before_they_are_written_are_dropped(agent: Agent) -> None:
    thread, _ = storage.create_thread(agent=agent)
    written = put({"seat": "aisle"})

    reads.write([reads.Read(item_id=written.item_id, version=1, thread_id=thread.pk, checkpoint_id=None,
                            read_at=written.updated_at)])  # fmt: skip
    Namespace.objects.all().delete()
    reads.write([reads.Read(item_id=written.item_id, version=1, thread_id=thread.pk, checkpoint_id=None,
                            read_at=written.updated_at)])  # fmt: skip

    assert ItemRead.objects.count() == 0


def test_an_agents_api_read_naming_its_thread_is_recorded_and_a_foreign_thread_is_refused(
    owner_client: APIClient, foreign_client: APIClient, thread: Thread
) -> None:
    checkpoint = storage.append_checkpoint(thread=thread, parent=None, state={})
    url = "/api/v1/memory/namespaces/users.alice/items/prefs/"
    assert owner_client.put(url, {"value": {"seat": "aisle"}}, format="json").status_code == 201

    read = owner_client.get(url, {"thread": str(thread.pk), "checkpoint": str(checkpoint.pk)})
    foreign = foreign_client.put("/api/v1/memory/namespaces/theirs/items/k/", {"value": 1}, format="json")
    refused = foreign_client.get("/api/v1/memory/namespaces/theirs/items/k/", {"thread": str(thread.pk)})

    assert (read.status_code, foreign.status_code) == (200, 201)
    assert refused.status_code == 400 and refused.json()["error"]["message"].startswith("thread")
    [recorded_read] = recorded()
    assert (recorded_read.thread_id, recorded_read.checkpoint_id, recorded_read.version) == (
        thread.pk,
        checkpoint.pk,
        1,
    )


def test_an_api_search_and_an_as_of_read_naming_their_thread_are_recorded(
    owner_client: APIClient, thread: Thread
) -> None:
    checkpoint = storage.append_checkpoint(thread=thread, parent=None, state={})
    url = "/api/v1/memory/namespaces/users.alice/items/prefs/"
    assert owner_client.put(url, {"value": {"seat": "aisle"}}, format="json").status_code == 201
    between = owner_client.get(url).json()["updated_at"]
    assert owner_client.put(url, {"value": {"seat": "window"}}, format="json").status_code == 200
    named = {"thread": str(thread.pk), "checkpoint": str(checkpoint.pk)}

    searched = owner_client.get("/api/v1/memory/namespaces/users.alice/items/", named)
    as_of = owner_client.get(url, {"as_of": between, **named})

    assert [item["key"] for item in searched.json()["results"]] == ["prefs"]
    assert as_of.json()["value"] == {"seat": "aisle"}
    assert sorted((r.version, r.thread_id, r.checkpoint_id) for r in recorded()) == [
        (1, thread.pk, checkpoint.pk),
        (2, thread.pk, checkpoint.pk),
    ]
