"""The memory store's writes: versions with who, where and when; sealed values; the integrity chain;
deltas for large values; as-of reads; compare-and-set; TTL and its sweep."""

from __future__ import annotations

import hashlib
import threading
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, connections, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from checkpoints import storage
from checkpoints.storage.errors import IntegrityFailure
from memory import heads, selectors, store
from memory.access import EVERYTHING
from memory.errors import InvalidNamespace, InvalidValue, ValueTooLarge, VersionConflict
from memory.models import Item, ItemVersion, Namespace, VersionKind, Writer
from quicksave_agents.models import Agent

pytestmark = pytest.mark.django_db

NS = ("users", "alice")
SYSTEM = store.Author.system("tests")


def put(value: Any, *, key: str = "prefs", **kwargs: Any) -> store.Written:
    kwargs.setdefault("author", SYSTEM)
    kwargs.setdefault("scope", EVERYTHING)
    return store.put_item(namespace=NS, key=key, value=value, **kwargs)


def history(key: str = "prefs") -> list[selectors.Version]:
    found = selectors.item_history(namespace=NS, key=key, scope=EVERYTHING)
    assert found is not None
    return found


def test_every_put_is_a_new_version_naming_its_writer_thread_and_checkpoint(agent: Agent) -> None:
    thread, _ = storage.create_thread(agent=agent, external_id="trip")
    checkpoint = storage.append_checkpoint(thread=thread, parent=None, state={"step": 1})
    key = agent.keys.create(prefix="qs_test1", secret_hash="0" * 64)
    first = put({"color": "red"}, author=store.Author.agent(agent.pk, key_id=key.pk))
    second = put(
        {"color": "blue"},
        author=store.Author.agent(agent.pk),
        origin=store.Origin(thread_id=thread.pk, checkpoint_id=checkpoint.pk),
    )

    assert (first.version, second.version) == (1, 2)
    assert first.created and not second.created
    newest, oldest = history()
    assert (newest.value, oldest.value) == ({"color": "blue"}, {"color": "red"})
    assert (oldest.writer, oldest.agent_id, oldest.agent_key_id) == (Writer.AGENT, agent.pk, key.pk)
    assert oldest.thread_id is None
    assert (newest.thread_id, newest.checkpoint_id) == (thread.pk, checkpoint.pk)
    assert newest.created_at > oldest.created_at
    item = selectors.get_item(namespace=NS, key="prefs", scope=EVERYTHING)
    assert item is not None and item.value == {"color": "blue"} and item.version == 2


def test_values_are_sealed_under_the_namespace_data_key() -> None:
    put({"secret": "the launch code is 1234"})

    namespace = Namespace.objects.get(path=list(NS))
    assert namespace.wrapped_key and namespace.master_key_id
    item = Item.objects.get(key="prefs")
    version = ItemVersion.objects.get(item=item, version=1)
    assert item.value is not None
    for stored in (bytes(item.value), bytes(version.payload)):
        assert stored[0] == 0x02  # crypto.SEALED
        assert b"launch code" not in stored


def test_with_encryption_off_values_are_stored_plain_and_still_verify(settings: Any) -> None:
    settings.QUICKSAVE_ENCRYPT = False
    put({"note": "plain as day"})
    put({"note": "still plain"})

    assert Namespace.objects.get(path=list(NS)).wrapped_key is None
    assert b"still plain" in bytes(Item.objects.get(key="prefs").value or b"")
    assert selectors.verify_item(namespace=NS, key="prefs", scope=EVERYTHING) == 2


def test_a_value_altered_in_the_database_fails_its_integrity_check(settings: Any) -> None:
    settings.QUICKSAVE_ENCRYPT = False
    put({"limit": 10})
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE memory_item SET value = overlay(value PLACING '99'::bytea FROM position('10'::bytea IN value)) "
            "WHERE key = 'prefs'"
        )

    with pytest.raises(IntegrityFailure, match="altered outside Quicksave"):
        selectors.get_item(namespace=NS, key="prefs", scope=EVERYTHING)


def test_an_altered_version_breaks_the_chain_after_it() -> None:
    for n in range(3):
        put({"n": n})
    with connection.cursor() as cursor:
        cursor.execute("UPDATE memory_itemversion SET rule = 'someone else' WHERE version = 2")

    with pytest.raises(IntegrityFailure, match=r"Version 2 .* fails its integrity check"):
        selectors.verify_item(namespace=NS, key="prefs", scope=EVERYTHING)


def test_a_removed_version_is_noticed() -> None:
    for n in range(3):
        put({"n": n})
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM memory_itemversion WHERE version = 2")

    with pytest.raises(IntegrityFailure, match="missing versions"):
        selectors.item_history(namespace=NS, key="prefs", scope=EVERYTHING)


def test_a_value_copied_from_another_item_does_not_open_there() -> None:
    put({"n": 1}, key="a")
    put({"n": 2}, key="b")
    with connection.cursor() as cursor:
        cursor.execute("UPDATE memory_item SET value = (SELECT value FROM memory_item WHERE key = 'b') WHERE key = 'a'")

    with pytest.raises(IntegrityFailure):
        selectors.get_item(namespace=NS, key="a", scope=EVERYTHING)


def test_large_values_are_stored_as_deltas_with_a_snapshot_every_so_often() -> None:
    notes = [hashlib.sha256(str(n).encode()).hexdigest() for n in range(100)]  # incompressible
    value: dict[str, Any] = {"notes": notes, "n": 0}
    for n in range(1, store.SNAPSHOT_EVERY + 5):
        value = {**value, "n": n}
        put(value)

    kinds = list(ItemVersion.objects.filter(item__key="prefs").order_by("version").values_list("kind", flat=True))
    assert kinds[0] == VersionKind.SNAPSHOT
    assert kinds[1 : store.SNAPSHOT_EVERY] == [VersionKind.DELTA] * (store.SNAPSHOT_EVERY - 1)
    assert kinds[store.SNAPSHOT_EVERY] == VersionKind.SNAPSHOT
    sizes = ItemVersion.objects.filter(item__key="prefs").order_by("version").values_list("payload", flat=True)
    assert max(len(bytes(p)) for p in sizes[1:5]) < len(bytes(sizes[0])) / 5
    assert [v.value["n"] for v in history()] == list(range(store.SNAPSHOT_EVERY + 4, 0, -1))


def test_a_delta_is_made_against_the_value_read_back_when_this_process_forgot_it() -> None:
    value = {"notes": "x" * 5000, "n": 1}
    put(value)
    heads.clear()
    put({**value, "n": 2})

    assert list(ItemVersion.objects.order_by("version").values_list("kind", flat=True)) == [0, 1]
    assert [v.value["n"] for v in history()] == [2, 1]


def test_an_item_reads_as_it_was_at_any_time() -> None:
    put({"v": 1})
    after_first = timezone.now()
    put({"v": 2})
    after_second = timezone.now()
    store.delete_item(namespace=NS, key="prefs", author=SYSTEM, scope=EVERYTHING)
    after_delete = timezone.now()
    put({"v": 3})

    def at(moment: Any) -> Any:
        found = selectors.item_as_of(namespace=NS, key="prefs", scope=EVERYTHING, at=moment)
        return found and found.value

    assert at(after_first - timedelta(hours=1)) is None
    assert at(after_first) == {"v": 1}
    assert at(after_second) == {"v": 2}
    assert at(after_delete) is None
    assert at(timezone.now()) == {"v": 3}


def test_a_delete_is_a_version_and_a_later_put_starts_the_item_afresh() -> None:
    first = put({"v": 1})
    deleted = store.delete_item(namespace=NS, key="prefs", author=SYSTEM, scope=EVERYTHING)
    again = put({"v": 2})

    assert deleted is not None and deleted.version == 2
    assert selectors.get_item(namespace=NS, key="prefs", scope=EVERYTHING) is not None
    assert again.created and again.created_at > first.created_at
    assert [(v.version, v.deleted) for v in history()] == [(3, False), (2, True), (1, False)]
    assert store.delete_item(namespace=NS, key="missing", author=SYSTEM, scope=EVERYTHING) is None


def test_a_write_expecting_another_version_gets_409_with_the_current_one() -> None:
    put({"v": 1}, expected_version=0)
    put({"v": 2}, expected_version=1)

    with pytest.raises(VersionConflict) as raised:
        put({"v": 3}, expected_version=1)
    assert raised.value.detail["current_version"] == 2
    with pytest.raises(VersionConflict):
        put({"v": 3}, key="new", expected_version=4)


def test_a_head_this_process_had_wrong_costs_a_retry_not_a_fork() -> None:
    put({"v": 1})
    namespace_id = Namespace.objects.get(path=list(NS)).pk
    stale = heads.get(namespace_id, "prefs")
    put({"v": 2})
    assert stale is not None
    heads.keep(namespace_id, "prefs", stale)  # what a process that missed version 2 knows

    third = put({"v": 3})

    assert third.version == 3
    assert selectors.verify_item(namespace=NS, key="prefs", scope=EVERYTHING) == 3


def test_a_put_of_a_key_this_process_does_not_know_is_one_statement(
    django_assert_num_queries: Any, django_capture_on_commit_callbacks: Any
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        put({"v": 1}, key="warm-up")  # the namespace, made and remembered once committed

    with django_assert_num_queries(1):
        put({"v": 1}, key="new")
    with django_assert_num_queries(1):
        put({"v": 2}, key="new")


def test_a_snapshot_sends_its_sealed_value_once_and_the_version_keeps_the_same_bytes() -> None:
    put({"v": 1}, key="warm-up")
    with CaptureQueriesContext(connection) as captured:
        put({"v": 2, "text": "a value long enough to be recognised in the statement"})

    item = Item.objects.get(key="prefs")
    assert item.value is not None
    sealed = bytes(item.value)
    assert bytes(ItemVersion.objects.get(item=item, version=1).payload) == sealed
    sent = "".join(query["sql"] for query in captured.captured_queries)
    assert sent.count(sealed.hex()) == 1


def test_consecutive_puts_of_one_shape_run_on_one_kept_cursor_with_the_same_statement_object(
    django_capture_on_commit_callbacks: Any,
) -> None:
    # psycopg keeps a cursor's parameter adaptation only for the very query object it ran last.
    with django_capture_on_commit_callbacks(execute=True):
        put({"v": 1}, key="warm-up")  # the namespace, made and remembered once committed
    sent: list[tuple[Any, str]] = []

    def record(execute: Any, sql: str, params: Any, many: bool, context: dict[str, Any]) -> Any:
        if "memory_itemversion" in sql:
            sent.append((context["cursor"], sql))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        put({"v": 1}, key="a")
        put({"v": 1}, key="b")
        put({"v": 2}, key="a")
        put({"v": 2}, key="b")

    (new_a, new_sql_a), (new_b, new_sql_b), (next_a, next_sql_a), (next_b, next_sql_b) = sent
    assert new_a is new_b and new_sql_a is new_sql_b
    assert next_a is next_b and next_sql_a is next_sql_b
    assert new_a is not next_a  # each shape keeps its own, so taking turns loses neither's


def test_a_put_of_an_item_another_process_wrote_continues_its_chain() -> None:
    put({"v": 1})
    put({"v": 2})
    heads.clear()  # as another process would: it never saw this item

    third = put({"v": 3})

    assert (third.version, third.created) == (3, False)
    assert [version.value for version in history()] == [{"v": 3}, {"v": 2}, {"v": 1}]
    assert selectors.verify_item(namespace=NS, key="prefs", scope=EVERYTHING) == 3


def test_a_deleted_item_another_process_wrote_is_put_again_as_its_next_version() -> None:
    put({"v": 1})
    store.delete_item(namespace=NS, key="prefs", author=SYSTEM, scope=EVERYTHING)
    heads.clear()

    again = put({"v": 2}, expected_version=0)

    assert (again.version, again.created) == (3, True)
    assert selectors.verify_item(namespace=NS, key="prefs", scope=EVERYTHING) == 3


@pytest.fixture
def namespace_deleted_since(django_capture_on_commit_callbacks: Any) -> None:
    """NS made and remembered by this process, then deleted by another (this one still remembers it)."""
    with django_capture_on_commit_callbacks(execute=True):
        put({"v": 1})
    Namespace.objects.filter(path=list(NS)).delete()


@pytest.mark.usefixtures("namespace_deleted_since")
def test_a_write_to_a_namespace_deleted_since_this_process_saw_it_makes_it_again() -> None:
    assert selectors.get_item(namespace=NS, key="prefs", scope=EVERYTHING) is None

    again = put({"v": "again"})

    assert (again.version, again.created) == (1, True)
    found = selectors.get_item(namespace=NS, key="prefs", scope=EVERYTHING)
    assert found is not None and found.value == {"v": "again"}
    assert selectors.verify_item(namespace=NS, key="prefs", scope=EVERYTHING) == 1


@pytest.mark.usefixtures("namespace_deleted_since")
def test_a_new_key_put_in_a_namespace_deleted_since_goes_to_the_namespace_made_again() -> None:
    written = put({"v": "new"}, key="never-seen")

    assert (written.version, written.created) == (1, True)
    item = Item.objects.get(key="never-seen")  # one, and in the namespace as it is now
    assert item.namespace.path == list(NS)
    assert selectors.verify_item(namespace=NS, key="never-seen", scope=EVERYTHING) == 1


def _plan_of_next_put(value: Any, *, key: str) -> str:
    """EXPLAIN ANALYZE of the statement the put of `value` sends (run, then rolled back)."""
    sent: list[tuple[str, Any]] = []

    def grab(execute: Any, sql: str, params: Any, many: bool, context: dict[str, Any]) -> Any:
        if "memory_itemversion" in sql:
            sent.append((sql, params))
            raise _Stop
        return execute(sql, params, many, context)

    with connection.execute_wrapper(grab), pytest.raises(_Stop):
        put(value, key=key)
    ((sql, params),) = sent
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) " + sql, params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
        transaction.set_rollback(True)
    return plan


class _Stop(Exception):
    pass


def _namespace_reads(plan: str) -> list[str]:
    lines = plan.splitlines()
    return [line for line in lines if "on memory_namespace" in line and "never executed" not in line]


def test_a_new_item_reads_its_namespace_once_and_an_update_does_not_read_it(
    django_capture_on_commit_callbacks: Any,
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        put({"v": 1}, key="known")  # the namespace, made and remembered once committed

    new = _plan_of_next_put({"v": 1}, key="new")
    update = _plan_of_next_put({"v": 2}, key="known")

    assert len(_namespace_reads(new)) == 1, new
    assert "memory_item" in update and _namespace_reads(update) == [], update


@pytest.mark.django_db(transaction=True)
def test_concurrent_writers_of_one_item_each_get_their_own_version() -> None:
    put({"writer": "none", "n": 0})
    errors: list[BaseException] = []

    def write(name: str) -> None:
        try:
            for n in range(15):
                heads.clear()  # as a separate process would: no head in common
                put({"writer": name, "n": n})
        except BaseException as exc:  # reported by the test
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=write, args=(name,)) for name in ("a", "b", "c")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    assert not errors
    versions = list(ItemVersion.objects.order_by("version").values_list("version", flat=True))
    assert versions == list(range(1, 47))
    assert selectors.verify_item(namespace=NS, key="prefs", scope=EVERYTHING) == 46


def test_expired_items_are_swept_as_deletions_by_quicksave() -> None:
    put({"v": 1}, ttl_minutes=5)
    put({"v": 1}, key="forever")
    Item.objects.filter(key="prefs").update(expires_at=timezone.now() - timedelta(seconds=1))

    assert store.sweep_expired() == 1

    assert selectors.get_item(namespace=NS, key="prefs", scope=EVERYTHING) is None
    assert selectors.get_item(namespace=NS, key="forever", scope=EVERYTHING) is not None
    newest = history()[0]
    assert (newest.deleted, newest.writer, newest.rule) == (True, Writer.SYSTEM, "ttl")
    assert store.sweep_expired() == 0


def test_a_read_moves_the_expiry_of_an_item_with_a_ttl() -> None:
    written = put({"v": 1}, ttl_minutes=10)
    Item.objects.filter(key="prefs").update(expires_at=timezone.now() + timedelta(minutes=1))

    assert selectors.get_item(namespace=NS, key="prefs", scope=EVERYTHING, refresh_ttl=True) is not None

    expires_at = Item.objects.get(key="prefs").expires_at
    assert written.expires_at is not None and expires_at is not None
    assert expires_at > timezone.now() + timedelta(minutes=9)


def test_an_expired_item_is_omitted_when_asked_before_any_sweep() -> None:
    put({"v": 1}, ttl_minutes=5)
    Item.objects.filter(key="prefs").update(expires_at=timezone.now() - timedelta(seconds=1))

    assert selectors.get_item(namespace=NS, key="prefs", scope=EVERYTHING) is not None
    assert selectors.get_item(namespace=NS, key="prefs", scope=EVERYTHING, omit_expired=True) is None
    assert selectors.search_items(scope=EVERYTHING, prefix=NS, omit_expired=True) == []
    assert selectors.list_namespaces(scope=EVERYTHING, omit_expired=True) == []


@pytest.mark.parametrize(
    ("value", "error", "message"),
    [
        ({"x": float("nan")}, InvalidValue, "NaN"),
        ({"x": "\ud800"}, InvalidValue, "surrogate"),
        ({"x": "y" * 5000}, ValueTooLarge, "QUICKSAVE_MEMORY_MAX_VALUE_BYTES"),
    ],
)
def test_a_value_the_store_cannot_keep_is_refused_and_nothing_is_written(
    settings: Any, value: Any, error: type[Exception], message: str
) -> None:
    settings.QUICKSAVE_MEMORY_MAX_VALUE_BYTES = 1024
    with pytest.raises(error, match=message):
        put(value)
    assert not Item.objects.exists()


@pytest.mark.parametrize("namespace", [(), ("a.b",), ("",), ("ok", 3), ("x",) * 33])
def test_a_namespace_that_is_no_path_is_refused(namespace: Any) -> None:
    with pytest.raises(InvalidNamespace):
        store.put_item(namespace=namespace, key="k", value={}, author=SYSTEM, scope=EVERYTHING)
    assert not Namespace.objects.exists()
