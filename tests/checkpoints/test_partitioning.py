"""The checkpoint and event tables, hash-partitioned by thread on PostgreSQL (docs/scaling.md, "Past one
PostgreSQL").

Each test rebuilds `checkpoints_checkpoint` and `checkpoints_event` in the test database as
declaratively partitioned tables (`PARTITION BY HASH (thread_id)`, four partitions) with the
columns, constraints, indexes and triggers Django's migrations gave them, read back from the
catalogue (`pg_get_constraintdef`, `pg_indexes`, `pg_get_triggerdef`), and points the foreign keys
of other tables at the new checkpoint table. Everything happens in the test's transaction and is
rolled back with it.

As migrated, exactly the keys docs/scaling.md names stand in the way. With exactly the changes it
names (composite keys that lead with `thread_id`), both tables partition and the store's append,
reads, forks, tool results, approvals and runs work on them unchanged.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from django.db import DatabaseError, connection, transaction

from approvals.services import decide, request_approval
from checkpoints import forks, storage
from checkpoints.models import Checkpoint, Thread
from checkpoints.storage.errors import StaleParent
from quicksave_agents.models import Agent, Run
from tests.conftest import person

pytestmark = pytest.mark.django_db

PARTITIONS = 4
CHECKPOINTS = "checkpoints_checkpoint"
EVENTS = "checkpoints_event"
# PostgreSQL's refusals: a unique key without the partition column, and a foreign key to a
# partitioned table that has no unique key on the referenced columns.
UNIQUE_WITHOUT_PARTITION_KEY = "0A000"  # feature_not_supported
NO_UNIQUE_KEY_TO_REFERENCE = "42830"  # invalid_foreign_key


@dataclass(frozen=True)
class Constraint:
    table: str
    name: str
    kind: str  # p (primary key), u (unique), f (foreign key), c (check)
    columns: tuple[str, ...]
    definition: str


def _constraints(where: str, table: str) -> list[Constraint]:
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            SELECT c.conrelid::regclass::text, c.conname, c.contype, pg_get_constraintdef(c.oid),
                   array(SELECT a.attname FROM unnest(c.conkey) WITH ORDINALITY k(n, i)
                         JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.n ORDER BY k.i)
            FROM pg_constraint c WHERE {where} = %s::regclass AND c.contype IN ('p', 'u', 'f', 'c')
            ORDER BY c.contype DESC, c.conname
            """,
            [table],
        )
        return [Constraint(row[0], row[1], row[2], tuple(row[4]), row[3]) for row in cursor.fetchall()]


def constraints_of(table: str) -> list[Constraint]:
    """The table's keys and checks: unique keys and the primary key before the foreign keys, which
    may reference them."""
    return _constraints("c.conrelid", table)


def foreign_keys_to(table: str) -> list[Constraint]:
    """Foreign keys of other tables that reference `table`."""
    return [c for c in _constraints("c.confrelid", table) if c.table != table]


def _rows(sql: str, params: list[Any]) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return list(cursor.fetchall())


def refusal(sql: str) -> str | None:
    """Run `sql` in a savepoint: None when it worked, else PostgreSQL's SQLSTATE and message."""
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(sql)
    except DatabaseError as error:
        cause = error.__cause__
        assert isinstance(cause, psycopg.Error) and cause.sqlstate, error
        return f"{cause.sqlstate} {cause.diag.message_primary}"
    return None


def partition_by_thread(table: str, changes: dict[tuple[str, tuple[str, ...]], str | None]) -> dict[str, str]:
    """Rebuild `table` as `PARTITION BY HASH (thread_id)` under its own name, with its constraints,
    indexes and triggers as migrated, except `changes` ((kind, columns) -> the definition to use
    instead, or None to leave it out), and re-point other tables' foreign keys to it (through
    `changes` too). Returns what PostgreSQL refused, by (table, constraint) name.
    """
    own = constraints_of(table)
    incoming = foreign_keys_to(table)
    # Read while the definitions still name `table`: once renamed they would name the old copy.
    indexes = _rows(
        "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = current_schema() AND tablename = %s "
        "AND indexname NOT IN (SELECT conname FROM pg_constraint WHERE conrelid = %s::regclass)",
        [table, table],
    )
    triggers = _rows("SELECT pg_get_triggerdef(oid) FROM pg_trigger WHERE tgrelid = %s::regclass AND NOT tgisinternal",
                     [table])  # fmt: skip
    old = f"{table}_unpartitioned"
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE {table} RENAME TO {old}")
        for constraint in own:  # frees the names (and their indexes' names) for the new table
            cursor.execute(f'ALTER TABLE {old} RENAME CONSTRAINT "{constraint.name}" TO "{constraint.name}_old"')
        for name, _ in indexes:
            cursor.execute(f'ALTER INDEX "{name}" RENAME TO "{name}_old"')
        cursor.execute(f"CREATE TABLE {table} (LIKE {old} INCLUDING DEFAULTS INCLUDING IDENTITY INCLUDING STORAGE) "
                       "PARTITION BY HASH (thread_id)")  # fmt: skip
        for remainder in range(PARTITIONS):
            cursor.execute(f"CREATE TABLE {table}_p{remainder} PARTITION OF {table} "
                           f"FOR VALUES WITH (MODULUS {PARTITIONS}, REMAINDER {remainder})")  # fmt: skip
    refused: dict[str, str] = {}
    for constraint in own:
        definition = changes.get((constraint.kind, constraint.columns), constraint.definition)
        if definition is not None:
            problem = refusal(f'ALTER TABLE {table} ADD CONSTRAINT "{constraint.name}" {definition}')
            if problem:
                refused[f"{table}.{constraint.name}"] = problem
    for _, definition in indexes:
        assert refusal(definition) is None, definition
    for (definition,) in triggers:
        assert refusal(definition) is None, definition
    for foreign_key in incoming:
        with connection.cursor() as cursor:  # it references the old table, by its oid
            cursor.execute(f'ALTER TABLE {foreign_key.table} DROP CONSTRAINT "{foreign_key.name}"')
        definition = changes.get((foreign_key.kind, (foreign_key.table, *foreign_key.columns)), foreign_key.definition)
        if definition is not None:
            problem = refusal(f'ALTER TABLE {foreign_key.table} ADD CONSTRAINT "{foreign_key.name}" {definition}')
            if problem:
                refused[f"{foreign_key.table}.{foreign_key.name}"] = problem
    return refused


def name_of(constraints: list[Constraint], kind: str, columns: tuple[str, ...]) -> str:
    (match,) = [c for c in constraints if c.kind == kind and c.columns == columns]
    return f"{match.table}.{match.name}"


# The foreign keys into the checkpoint table, by (referencing table, column); docs/scaling.md lists each.
INCOMING = {
    ("checkpoints_branch", "fork_point_id"),
    ("checkpoints_toolresult", "checkpoint_id"),
    ("approvals_approvalrequest", "checkpoint_id"),
    ("agents_run", "checkpoint_id"),
}
DEFERRED = "DEFERRABLE INITIALLY DEFERRED"


def doc_changes() -> dict[tuple[str, tuple[str, ...]], str | None]:
    """docs/scaling.md's changes: keys that lead with the thread, foreign keys that name it."""
    changes: dict[tuple[str, tuple[str, ...]], str | None] = {
        ("p", ("id",)): "PRIMARY KEY (thread_id, id)",
        ("f", ("parent_id",)): (
            f"FOREIGN KEY (thread_id, parent_id) REFERENCES {CHECKPOINTS} (thread_id, id) {DEFERRED}"
        ),
    }
    for table, column in INCOMING:
        changes[("f", (table, column))] = (
            f"FOREIGN KEY (thread_id, {column}) REFERENCES {CHECKPOINTS} (thread_id, id) {DEFERRED}"
        )
    return changes


EVENT_CHANGES: dict[tuple[str, tuple[str, ...]], str | None] = {("p", ("id",)): "PRIMARY KEY (thread_id, seq)"}


@pytest.fixture
def cursor() -> Iterator[Any]:
    with connection.cursor() as opened:
        yield opened


def test_as_migrated_only_the_keys_scaling_md_names_keep_checkpoints_and_events_from_partitioning() -> None:
    checkpoint_constraints = constraints_of(CHECKPOINTS)
    event_constraints = constraints_of(EVENTS)
    incoming = foreign_keys_to(CHECKPOINTS)
    assert {(c.table, *c.columns) for c in incoming} == INCOMING  # and nothing else references checkpoints
    assert foreign_keys_to(EVENTS) == []

    refused = partition_by_thread(CHECKPOINTS, {}) | partition_by_thread(EVENTS, {})

    unique_refused = f"{UNIQUE_WITHOUT_PARTITION_KEY} unique constraint on partitioned table must include all "
    unique_refused += "partitioning columns"
    no_key = f'{NO_UNIQUE_KEY_TO_REFERENCE} there is no unique constraint matching given keys for referenced table "'
    no_key += f'{CHECKPOINTS}"'
    assert refused == {
        # The primary keys: unique without the thread.
        name_of(checkpoint_constraints, "p", ("id",)): unique_refused,
        name_of(event_constraints, "p", ("id",)): unique_refused,
        # Every foreign key to a checkpoint: it references `id`, now unique nowhere.
        name_of(checkpoint_constraints, "f", ("parent_id",)): no_key,
        **{f"{c.table}.{c.name}": no_key for c in incoming},
    }
    # Everything else was made as migrated: the optimistic lock (thread, branch, seq), the per-thread
    # event seq, the branch foreign key, the LangGraph index, the notifications trigger.
    assert name_of(checkpoint_constraints, "u", ("thread_id", "branch_id", "seq")) not in refused
    assert name_of(event_constraints, "u", ("thread_id", "seq")) not in refused


def test_with_the_composite_keys_scaling_md_names_the_store_works_on_tables_partitioned_by_thread(cursor: Any) -> None:
    refused = partition_by_thread(CHECKPOINTS, doc_changes()) | partition_by_thread(EVENTS, EVENT_CHANGES)
    assert refused == {}
    cursor.execute(
        "SELECT relname FROM pg_class WHERE relispartition AND relkind = 'r' AND relname LIKE 'checkpoints_%%' "
        "ORDER BY 1"
    )
    assert [row[0] for row in cursor.fetchall()] == sorted(
        [f"{CHECKPOINTS}_p{n}" for n in range(PARTITIONS)] + [f"{EVENTS}_p{n}" for n in range(PARTITIONS)]
    )

    agent = Agent.objects.create(name="partitioned")
    threads = [storage.create_thread(agent=agent, external_id=f"t{n}")[0] for n in range(8)]
    heads = {}
    for thread in threads:
        parent = storage.append_checkpoint(thread=thread, parent=None, state={"messages": [], "n": 0})
        for n in range(1, 6):
            parent = storage.append_checkpoint(thread=thread, parent=parent, patch=[
                {"op": "add", "path": "/messages/-", "value": f"m{n}"}, {"op": "replace", "path": "/n", "value": n}],
                tool_results=[{"key": f"call-{n}", "result": {"n": n}, "tool": "search"}])  # fmt: skip
        heads[thread.pk] = parent

    thread = threads[0]
    head = heads[thread.pk]
    storage.clear_caches()  # the reads below come from the partitioned rows, not this process's cache
    assert storage.latest_state(thread=thread) == (head.pk, {"messages": ["m1", "m2", "m3", "m4", "m5"], "n": 5})
    first = Checkpoint.objects.get(thread=thread, seq=1)
    assert storage.state_at(Checkpoint.objects.get(thread=thread, seq=3)) == {"messages": ["m1", "m2"], "n": 2}
    with pytest.raises(StaleParent):  # the optimistic lock holds on the partitioned table
        storage.append_checkpoint(thread=thread, parent=first, state={"messages": [], "n": -1})
    cached = storage.get_tool_result(thread=thread, key="call-3")
    assert cached is not None and cached.result == {"n": 3}
    assert [seq for seq, _, _ in storage.events_after(thread_id=thread.pk, seq=0, limit=100)] == list(range(1, 8))

    # A fork (a branch whose fork point is a checkpoint), an approval and the run its decision queues:
    # the foreign keys into the checkpoint table, now composite, all hold.
    admin, reviewer = person("ada", "admin"), person("rita", "reviewer")
    forked = forks.fork(checkpoint=Checkpoint.objects.get(thread=thread, seq=3), user=admin, reason="try again",
                        patch=[{"op": "replace", "path": "/n", "value": 20}])  # fmt: skip
    approval = request_approval(thread=thread, checkpoint=forked, action="send", args={"to": "x"})
    decide(approval=approval, user=reviewer, decision="approve")
    assert Run.objects.get(approval=approval).checkpoint_id == forked.pk
    assert storage.latest_state(thread=thread, branch=forked.branch.name)[1] == {"messages": ["m1", "m2"], "n": 20}
    with connection.cursor() as check:
        check.execute("SET CONSTRAINTS ALL IMMEDIATE")  # the deferred foreign keys, checked now

    # The rows are spread over the partitions by thread, each thread's rows in one partition.
    cursor.execute(f"SELECT tableoid::regclass::text, count(DISTINCT thread_id) FROM {CHECKPOINTS} GROUP BY 1")
    spread = dict(cursor.fetchall())
    assert len(spread) > 1 and sum(spread.values()) == len(threads)
    cursor.execute(f"SELECT count(*) FROM {EVENTS} GROUP BY thread_id HAVING count(DISTINCT tableoid) > 1")
    assert cursor.fetchall() == []
    logged = storage.events_after(thread_id=thread.pk, seq=0, limit=1000)
    assert [seq for seq, _, _ in logged] == list(range(1, Thread.objects.get(pk=thread.pk).event_seq + 1))

    # What the keys do not settle (docs/scaling.md): a read by checkpoint id alone visits every
    # partition; one that names the thread visits one.
    assert scanned_partitions(f"id = '{head.pk}'") == PARTITIONS
    assert scanned_partitions(f"thread_id = '{thread.pk}' AND id = '{head.pk}'") == 1


def scanned_partitions(condition: str) -> int:
    plan = _rows(f"EXPLAIN (COSTS OFF) SELECT payload FROM {CHECKPOINTS} WHERE {condition}", [])
    return sum(f"{CHECKPOINTS}_p" in line for (line,) in plan)
