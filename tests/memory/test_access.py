"""Agent scoping: an agent uses its own namespaces and those a person granted it; grants and
revocations are audited and take effect at once."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User

from audit.models import AuditEntry
from memory import selectors, sharing, store
from memory.access import EVERYTHING, Scope
from memory.errors import ItemNotFound
from memory.models import Namespace
from quicksave_agents.models import Agent

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin(db: None) -> User:
    return User.objects.create_user("ada")


def put_as(agent: Agent, namespace: tuple[str, ...], key: str = "k", value: object = None) -> store.Written:
    return store.put_item(
        namespace=namespace, key=key, value=value or {"by": agent.name}, author=store.Author.agent(agent.pk),
        scope=Scope(agent.pk),
    )  # fmt: skip


def test_an_agent_sees_only_the_namespaces_it_made(agent: Agent, other_agent: Agent) -> None:
    put_as(agent, ("travel", "prefs"))
    put_as(other_agent, ("reviews",))
    mine, theirs = Scope(agent.pk), Scope(other_agent.pk)

    assert selectors.get_item(namespace=("travel", "prefs"), key="k", scope=theirs) is None
    assert selectors.item_history(namespace=("travel", "prefs"), key="k", scope=theirs) is None
    assert [f.namespace for f in selectors.search_items(scope=theirs)] == [("reviews",)]
    assert selectors.list_namespaces(scope=theirs) == [("reviews",)]
    assert selectors.list_namespaces(scope=mine) == [("travel", "prefs")]
    assert selectors.list_namespaces(scope=EVERYTHING) == [("reviews",), ("travel", "prefs")]


def test_an_agent_cannot_write_or_delete_in_another_agents_namespace(agent: Agent, other_agent: Agent) -> None:
    put_as(agent, ("travel",))

    with pytest.raises(ItemNotFound, match="belongs to another agent"):
        put_as(other_agent, ("travel",))
    gone = store.delete_item(
        namespace=("travel",), key="k", author=store.Author.agent(other_agent.pk), scope=Scope(other_agent.pk)
    )
    assert gone is None
    assert selectors.get_item(namespace=("travel",), key="k", scope=EVERYTHING) is not None


def test_a_grant_shares_every_namespace_under_its_prefix_until_revoked(
    agent: Agent, other_agent: Agent, admin: User
) -> None:
    put_as(agent, ("team", "plans"))
    grant = sharing.grant_namespace(prefix=("team",), agent=other_agent, user=admin, reason="they work together")
    theirs = Scope(other_agent.pk)

    assert selectors.get_item(namespace=("team", "plans"), key="k", scope=theirs) is not None
    put_as(other_agent, ("team", "plans"), key="k2")  # writes into the shared namespace
    put_as(other_agent, ("team", "notes"))  # and makes new ones under the prefix, which it owns
    assert selectors.list_namespaces(scope=theirs) == [("team", "notes"), ("team", "plans")]

    sharing.revoke_grant(grant=grant, user=admin, reason="project over")

    assert selectors.get_item(namespace=("team", "plans"), key="k", scope=theirs) is None
    assert selectors.list_namespaces(scope=theirs) == [("team", "notes")]
    actions = list(AuditEntry.objects.order_by("created_at").values_list("action", "actor_name", "reason"))
    assert actions == [("memory.grant", "ada", "they work together"), ("memory.revoke", "ada", "project over")]


def test_a_second_live_grant_of_the_same_prefix_is_refused(other_agent: Agent, admin: User) -> None:
    grant = sharing.grant_namespace(prefix=("team",), agent=other_agent, user=admin, reason="one")
    with pytest.raises(sharing.GrantExists):
        sharing.grant_namespace(prefix=("team",), agent=other_agent, user=admin, reason="two")
    sharing.revoke_grant(grant=grant, user=admin, reason="done")
    with pytest.raises(sharing.GrantRevoked):
        sharing.revoke_grant(grant=grant, user=admin, reason="again")
    sharing.grant_namespace(prefix=("team",), agent=other_agent, user=admin, reason="again")


def test_a_namespace_deleted_and_made_again_by_another_agent_is_that_agents(
    agent: Agent, other_agent: Agent, django_capture_on_commit_callbacks: Any
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        put_as(agent, ("shared", "desk"))  # this process now remembers the namespace as agent's
    Namespace.objects.filter(path=["shared", "desk"]).delete()  # as another process would

    written = put_as(other_agent, ("shared", "desk"), value={"by": "the new owner"})

    assert (written.version, written.created) == (1, True)
    assert Namespace.objects.get(path=["shared", "desk"]).agent_id == other_agent.pk
    found = selectors.get_item(namespace=("shared", "desk"), key="k", scope=Scope(other_agent.pk))
    assert found is not None and found.value == {"by": "the new owner"}
    assert selectors.get_item(namespace=("shared", "desk"), key="k", scope=Scope(agent.pk)) is None
