"""Blackboards: compare-and-set with exactly one winner among racing writers on real PostgreSQL,
leases by the database's clock with fencing tokens, and every change an event in order."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection, connections

from audit.models import AuditEntry
from memory import boards, heads, selectors, sharing, store
from memory.access import EVERYTHING, Scope
from memory.errors import InvalidValue, ItemNotFound, LeaseHeld, LeaseLost, NotABoard, VersionConflict
from memory.models import BoardEvent, ItemVersion, Namespace
from quicksave_agents.models import Agent
from tests.waiting import wait_until

pytestmark = pytest.mark.django_db

BOARD = ("team", "tasks")
SYSTEM = store.Author.system("tests")


def put(key: str, value: Any, **kwargs: Any) -> store.Written:
    kwargs.setdefault("author", SYSTEM)
    kwargs.setdefault("scope", EVERYTHING)
    return store.put_item(namespace=BOARD, key=key, value=value, **kwargs)


def events() -> list[tuple[int, str, str]]:
    return list(BoardEvent.objects.order_by("seq").values_list("seq", "kind", "key"))


def expire(key: str) -> None:
    """End a lease now, as its time-to-live running out would (the database's clock decides)."""
    with connection.cursor() as cursor:
        cursor.execute("UPDATE memory_lease SET expires_at = clock_timestamp() - interval '1 ms' WHERE key = %s", [key])


def race(*writers: Callable[[], Any]) -> list[Any]:
    """Run the writers in threads (each with its own connection) released at the same moment;
    what each returned or raised."""
    barrier = threading.Barrier(len(writers))
    outcomes: list[Any] = [None] * len(writers)

    def run(position: int, writer: Callable[[], Any]) -> None:
        try:
            barrier.wait(timeout=10)
            outcomes[position] = writer()
        except BaseException as exc:  # reported by the test
            outcomes[position] = exc
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(n, writer)) for n, writer in enumerate(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    return outcomes


def test_a_board_is_made_once_and_a_plain_namespace_never_becomes_one(agent: Agent) -> None:
    space, created = boards.make_board(namespace=BOARD, scope=Scope(agent.pk))
    again, created_again = boards.make_board(namespace=list(BOARD), scope=Scope(agent.pk))
    store.put_item(namespace=("plain",), key="k", value=1, author=SYSTEM, scope=EVERYTHING)

    assert (created, created_again, space.board, again.id) == (True, False, True, space.id)
    with pytest.raises(NotABoard, match="already holds plain memory"):
        boards.make_board(namespace=("plain",), scope=EVERYTHING)
    with pytest.raises(NotABoard):
        boards.acquire_lease(namespace=("plain",), key="k", holder="w", ttl_seconds=5, scope=EVERYTHING)


def test_a_person_making_a_board_is_audited(agent: Agent) -> None:
    ada = User.objects.create_user("ada")
    boards.make_board(namespace=BOARD, scope=EVERYTHING, user=ada, address="10.0.0.1")
    assert list(AuditEntry.objects.values_list("action", "actor_name", "target_id")) == [
        ("memory.board", "ada", "team.tasks")
    ]


def test_another_agents_board_does_not_exist_for_it(agent: Agent, other_agent: Agent) -> None:
    boards.make_board(namespace=BOARD, scope=Scope(agent.pk))
    with pytest.raises(ItemNotFound):
        boards.make_board(namespace=BOARD, scope=Scope(other_agent.pk))
    with pytest.raises(ItemNotFound):
        boards.acquire_lease(namespace=BOARD, key="t1", holder="w", ttl_seconds=5, scope=Scope(other_agent.pk))


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("namespace", [BOARD, ("plain", "counter")], ids=["board", "plain namespace"])
def test_two_racing_compare_and_set_writers_have_exactly_one_winner(namespace: tuple[str, ...]) -> None:
    if namespace == BOARD:
        boards.make_board(namespace=BOARD, scope=EVERYTHING)
    store.put_item(namespace=namespace, key="counter", value={"n": 0}, author=SYSTEM, scope=EVERYTHING)
    for round_ in range(1, 11):

        def writer(name: str, expected: int = round_) -> Callable[[], store.Written]:
            def write() -> store.Written:
                heads.clear()  # as separate processes: neither knows the other's write
                return store.put_item(
                    namespace=namespace, key="counter", value={"n": expected, "by": name}, author=SYSTEM,
                    scope=EVERYTHING, expected_version=expected,
                )  # fmt: skip

            return write

        outcomes = race(writer("a"), writer("b"))

        won = [o for o in outcomes if isinstance(o, store.Written)]
        lost = [o for o in outcomes if isinstance(o, VersionConflict)]
        assert len(won) == 1 and len(lost) == 1, outcomes
        assert won[0].version == round_ + 1
        assert lost[0].detail == {"current_version": round_ + 1, "expected_version": round_}
    assert ItemVersion.objects.count() == 11
    assert selectors.verify_item(namespace=namespace, key="counter", scope=EVERYTHING) == 11
    if namespace == BOARD:
        assert [seq for seq, _, _ in events()] == list(range(1, 12))  # one event per winning write, no gaps


@pytest.mark.django_db(transaction=True)
def test_two_racing_acquirers_of_one_key_get_one_lease() -> None:
    boards.make_board(namespace=BOARD, scope=EVERYTHING)

    def acquire(holder: str) -> Callable[[], boards.Lease]:
        return lambda: boards.acquire_lease(namespace=BOARD, key="t1", holder=holder, ttl_seconds=30, scope=EVERYTHING)

    outcomes = race(acquire("a"), acquire("b"), acquire("c"))

    leases = [o for o in outcomes if isinstance(o, boards.Lease)]
    held = [o for o in outcomes if isinstance(o, LeaseHeld)]
    assert len(leases) == 1 and len(held) == 2, outcomes
    assert {h.detail["holder"] for h in held} == {leases[0].holder}


def test_a_late_holders_write_is_refused_by_its_fencing_token() -> None:
    boards.make_board(namespace=BOARD, scope=EVERYTHING)
    put("t1", {"status": "open"})
    first = boards.acquire_lease(namespace=BOARD, key="t1", holder="slow", ttl_seconds=30, scope=EVERYTHING)
    put("t1", {"status": "working", "by": "slow"}, fencing_token=first.token)
    expire("t1")  # the slow holder paused past its time-to-live

    second = boards.acquire_lease(namespace=BOARD, key="t1", holder="fast", ttl_seconds=30, scope=EVERYTHING)
    put("t1", {"status": "done", "by": "fast"}, fencing_token=second.token)
    with pytest.raises(LeaseLost, match="took it since") as late:
        put("t1", {"status": "done", "by": "slow"}, fencing_token=first.token)
    with pytest.raises(LeaseLost):
        store.delete_item(namespace=BOARD, key="t1", author=SYSTEM, scope=EVERYTHING, fencing_token=first.token)

    assert second.token > first.token and second.took_over_from == "slow"
    assert late.value.detail == {"key": "t1", "fencing_token": first.token, "holder": "fast"}
    found = selectors.get_item(namespace=BOARD, key="t1", scope=EVERYTHING)
    assert found is not None and found.value == {"status": "done", "by": "fast"}


def test_while_a_key_is_held_a_write_naming_no_lease_is_refused_and_after_release_it_is_not() -> None:
    boards.make_board(namespace=BOARD, scope=EVERYTHING)
    lease = boards.acquire_lease(namespace=BOARD, key="t1", holder="w1", ttl_seconds=30, scope=EVERYTHING)

    with pytest.raises(LeaseHeld, match="leased to 'w1'") as held:
        put("t1", {"status": "stolen"})
    put("t2", {"status": "open"})  # another key is free
    boards.release_lease(namespace=BOARD, key="t1", fencing_token=lease.token, scope=EVERYTHING)
    put("t1", {"status": "open"})

    assert held.value.detail["holder"] == "w1" and "fencing_token" not in held.value.detail
    with pytest.raises(LeaseLost, match="was released"):
        put("t1", {"status": "late"}, fencing_token=lease.token)
    with pytest.raises(LeaseLost, match="was released"):
        boards.release_lease(namespace=BOARD, key="t1", fencing_token=lease.token, scope=EVERYTHING)


def test_a_holder_that_dies_loses_the_lease_after_its_time_to_live() -> None:
    boards.make_board(namespace=BOARD, scope=EVERYTHING)
    boards.acquire_lease(namespace=BOARD, key="t1", holder="dead", ttl_seconds=0.3, scope=EVERYTHING)
    with pytest.raises(LeaseHeld):
        boards.acquire_lease(namespace=BOARD, key="t1", holder="next", ttl_seconds=30, scope=EVERYTHING)

    def taken() -> boards.Lease | None:
        try:
            return boards.acquire_lease(namespace=BOARD, key="t1", holder="next", ttl_seconds=30, scope=EVERYTHING)
        except LeaseHeld:
            return None

    lease = wait_until(taken, what="the dead holder's lease to run out", timeout=10)
    assert lease.took_over_from == "dead"
    assert [(h.key, h.holder) for h in boards.live_leases(namespace=BOARD, scope=EVERYTHING)] == [("t1", "next")]


def test_renewing_extends_a_live_lease_and_refuses_an_ended_one() -> None:
    boards.make_board(namespace=BOARD, scope=EVERYTHING)
    lease = boards.acquire_lease(namespace=BOARD, key="t1", holder="w", ttl_seconds=5, scope=EVERYTHING)
    renewed = boards.renew_lease(namespace=BOARD, key="t1", fencing_token=lease.token, ttl_seconds=60,
                                 scope=EVERYTHING)  # fmt: skip
    assert renewed.token == lease.token and renewed.expires_at > lease.expires_at

    expire("t1")
    with pytest.raises(LeaseLost, match="expired"):
        boards.renew_lease(namespace=BOARD, key="t1", fencing_token=lease.token, ttl_seconds=60, scope=EVERYTHING)
    with pytest.raises(LeaseLost, match="never leased"):
        boards.renew_lease(namespace=BOARD, key="t9", fencing_token=lease.token, ttl_seconds=60, scope=EVERYTHING)


@pytest.mark.parametrize(
    ("field", "call"),
    [
        ("ttl_seconds", {"ttl_seconds": 0}),
        ("ttl_seconds", {"ttl_seconds": 10**9}),
        ("ttl_seconds", {"ttl_seconds": True}),
        ("holder", {"holder": ""}),
        ("holder", {"holder": "x" * 201}),
    ],
)
def test_a_lease_with_bad_terms_is_refused_naming_the_field(field: str, call: dict[str, Any]) -> None:
    boards.make_board(namespace=BOARD, scope=EVERYTHING)
    args: dict[str, Any] = {"holder": "w", "ttl_seconds": 5, **call}
    with pytest.raises(InvalidValue) as refused:
        boards.acquire_lease(namespace=BOARD, key="t1", scope=EVERYTHING, **args)
    assert refused.value.detail["field"] == field
    assert not BoardEvent.objects.exists()


def test_a_fencing_token_on_a_plain_namespace_and_a_ttl_on_a_board_are_refused() -> None:
    boards.make_board(namespace=BOARD, scope=EVERYTHING)
    with pytest.raises(NotABoard, match="not one"):
        store.put_item(namespace=("plain",), key="k", value=1, author=SYSTEM, scope=EVERYTHING, fencing_token=3)
    with pytest.raises(InvalidValue, match="do not expire"):
        put("t1", {"status": "open"}, ttl_minutes=5)
    assert not ItemVersion.objects.exists()


def test_every_change_on_a_board_is_an_event_numbered_in_order_and_refusals_are_none() -> None:
    boards.make_board(namespace=BOARD, scope=EVERYTHING)
    put("t1", {"status": "open"})
    lease = boards.acquire_lease(namespace=BOARD, key="t1", holder="w", ttl_seconds=30, scope=EVERYTHING)
    with pytest.raises(LeaseHeld):
        put("t1", {"status": "stolen"})
    with pytest.raises(VersionConflict):
        put("t1", {"status": "done"}, fencing_token=lease.token, expected_version=7)
    put("t1", {"status": "done"}, fencing_token=lease.token, expected_version=1)
    boards.release_lease(namespace=BOARD, key="t1", fencing_token=lease.token, scope=EVERYTHING)
    store.delete_item(namespace=BOARD, key="t1", author=SYSTEM, scope=EVERYTHING)
    assert store.delete_item(namespace=BOARD, key="t1", author=SYSTEM, scope=EVERYTHING) is None

    assert events() == [
        (1, "item.written", "t1"), (2, "lease.acquired", "t1"), (3, "item.written", "t1"),
        (4, "lease.released", "t1"), (5, "item.deleted", "t1"),
    ]  # fmt: skip
    space = boards.board_for(BOARD, EVERYTHING)
    replay = boards.events_after(space=space, seq=3, limit=10)
    assert [(e["seq"], e["type"], e["board"]) for e in replay] == [
        (4, "lease.released", "team.tasks"),
        (5, "item.deleted", "team.tasks"),
    ]
    written = boards.events_after(space=space, seq=2, limit=1)[0]
    assert written["data"] == {"version": 2, "writer": "system", "agent": None, "user": None}


def test_a_write_expecting_the_current_version_is_not_refused_by_a_head_this_process_had_wrong() -> None:
    store.put_item(namespace=("plain",), key="k", value={"v": 1}, author=SYSTEM, scope=EVERYTHING)
    namespace_id = Namespace.objects.get(path=["plain"]).pk
    stale = heads.get(namespace_id, "k")
    store.put_item(namespace=("plain",), key="k", value={"v": 2}, author=SYSTEM, scope=EVERYTHING)
    assert stale is not None
    heads.keep(namespace_id, "k", stale)  # what a process that missed version 2 knows

    written = store.put_item(
        namespace=("plain",), key="k", value={"v": 3}, author=SYSTEM, scope=EVERYTHING, expected_version=2
    )
    assert written.version == 3


def test_another_agent_naming_a_leases_token_is_refused_though_it_may_use_the_board(
    agent: Agent, other_agent: Agent
) -> None:
    ada = User.objects.create_user("ada")
    owner, other = Scope(agent.pk), Scope(other_agent.pk)
    boards.make_board(namespace=BOARD, scope=owner)
    sharing.grant_namespace(prefix=("team",), agent=other_agent, user=ada, reason="they share the board")
    lease = boards.acquire_lease(namespace=BOARD, key="t1", holder="w1", ttl_seconds=30, scope=owner)
    theirs = store.Author.agent(other_agent.pk)

    # The token is the number of the acquire's event, which the feed shows everyone who follows it.
    with pytest.raises(LeaseHeld):
        put("t1", {"status": "hijacked"}, author=theirs, scope=other, fencing_token=lease.token)
    with pytest.raises(LeaseHeld):
        boards.renew_lease(namespace=BOARD, key="t1", fencing_token=lease.token, ttl_seconds=60, scope=other)
    with pytest.raises(LeaseHeld):
        boards.release_lease(namespace=BOARD, key="t1", fencing_token=lease.token, scope=other)

    put("t1", {"status": "done"}, author=store.Author.agent(agent.pk), scope=owner, fencing_token=lease.token)
    boards.release_lease(namespace=BOARD, key="t1", fencing_token=lease.token, scope=owner)
    assert [kind for _, kind, _ in events()] == ["lease.acquired", "item.written", "lease.released"]
