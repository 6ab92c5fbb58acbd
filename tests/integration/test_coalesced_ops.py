"""One writer batch's inline ops in fewer statements (interfaces/store/database.py `coalesce_ops`):
on PostgreSQL the coalesced ops leave exactly the rows the ops one by one leave, and a batch of
mixed commands leaves read models a rebuild from the log agrees with."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor

import pytest

from application.service import Caller
from interfaces.store.database import Database, DatabaseUrl, coalesce_ops, run_ops
from projections.claimable import ClaimableQueue
from projections.doorbell import Doorbells
from projections.queue_load import QueueLoad
from projections.timers import DueTimers

pytestmark = pytest.mark.postgres

INLINE = (ClaimableQueue(), DueTimers(), Doorbells(), QueueLoad())
SET = "UPDATE sb_claimable SET available_at = %s WHERE todo_id = %s"
DELETE = "DELETE FROM sb_claimable WHERE todo_id = %s"
UPSERT = ("INSERT INTO sb_timers (todo_id, kind, due_at) VALUES (%s, %s, %s)"
          " ON CONFLICT (todo_id) DO UPDATE SET kind = excluded.kind, due_at = excluded.due_at")
TIMER_DELETE = "DELETE FROM sb_timers WHERE todo_id = %s"
INSERT = "INSERT INTO sb_claimable (todo_id, endpoint_id, queue, created_at, available_at) VALUES (%s, %s, %s, %s, %s)"
IN_FLIGHT = "INSERT INTO sb_in_flight (todo_id, endpoint_id, queue, admitted) VALUES (%s, %s, %s, 1)"


def test_single_row_ops_of_distinct_rows_merge_and_nothing_moves_across_a_repeat_or_another_statement():
    ops = [
        (SET, (None, "a")), (DELETE, ("b",)), (SET, (None, "c")), (SET, (7, "d")),  # one stretch
        (SET, (None, "a")),  # `a` again: a new stretch
        (UPSERT, ("a", "lease", 1)), (TIMER_DELETE, ("b",)), (UPSERT, ("c", "lease", 2)),
        (INSERT, ("e", "ep", "q", 1, 1)), (INSERT, ("g", "ep", "q", 1, 1)),  # a plain insert is keyed by its first column
        (DELETE, ("e",)), (DELETE, ("f",)),  # `e` again: a new stretch
        (IN_FLIGHT, ("h", "ep", "q")), (IN_FLIGHT, ("i", "ep", "q")),  # an integer among the values is kept
    ]
    assert coalesce_ops(ops) == [
        ("UPDATE sb_claimable SET available_at = %s WHERE todo_id = ANY(%s)", (None, ["a", "c"])),
        (DELETE, ("b",)),
        (SET, (7, "d")),
        (SET, (None, "a")),
        ("INSERT INTO sb_timers (todo_id, kind, due_at) VALUES (%s, %s, %s), (%s, %s, %s)"
         " ON CONFLICT (todo_id) DO UPDATE SET kind = excluded.kind, due_at = excluded.due_at",
         ("a", "lease", 1, "c", "lease", 2)),
        (TIMER_DELETE, ("b",)),
        ("INSERT INTO sb_claimable (todo_id, endpoint_id, queue, created_at, available_at)"
         " VALUES (%s, %s, %s, %s, %s), (%s, %s, %s, %s, %s)", ("e", "ep", "q", 1, 1, "g", "ep", "q", 1, 1)),
        ("DELETE FROM sb_claimable WHERE todo_id = ANY(%s)", (["e", "f"],)),
        ("INSERT INTO sb_in_flight (todo_id, endpoint_id, queue, admitted) VALUES (%s, %s, %s, 1), (%s, %s, %s, 1)",
         ("h", "ep", "q", "i", "ep", "q")),
    ]


def test_statements_it_cannot_read_a_row_key_from_are_left_alone():
    kept = [
        ("UPDATE sb_tracking SET position = (SELECT max(notification_id) FROM stored_events) WHERE name = %s", ("x",)),
        ("UPDATE t SET k = %s WHERE k = %s", (1, 2)),  # assigns its own key column
        ("UPDATE t SET a = %s WHERE k = %s AND b = %s", (1, 2, 3)),
        ("INSERT INTO t (k, a) VALUES (%s, %s) ON CONFLICT (k) DO UPDATE SET a = %s", (1, 2, 3)),
        ("INSERT INTO t (k, a) VALUES (%s, %s) RETURNING k", (1, 2)),
        ("INSERT INTO t (a, k) VALUES (1, %s)", (2,)),  # its first column is no parameter
        ("INSERT INTO t (k, a) SELECT %s, a FROM u", (1,)),
        ("DELETE FROM t WHERE k = %s", (None,)),
    ]
    assert coalesce_ops(kept + kept) == [(sql, tuple(params)) for sql, params in kept + kept]


def _tables(tx) -> dict[str, list[tuple]]:
    return {table: tx.execute(f"SELECT * FROM {table} ORDER BY 1") for p in INLINE for table in p.tables}


@pytest.fixture
def db(pg_url):
    database = Database(DatabaseUrl.parse(pg_url), pool_size=2)
    database.open()
    yield database
    database.close()


def test_random_op_sequences_leave_the_same_rows_coalesced_as_one_by_one(db):
    rng = random.Random(16)
    keys = [f"todo_{i}" for i in range(12)] + ["todo_\x00nul"]
    for _ in range(40):
        ops = []
        for _ in range(rng.randint(1, 40)):
            key, at = rng.choice(keys), rng.choice([None, rng.randint(1, 5)])
            ops.append(rng.choice([
                (SET, (at, key)), (DELETE, (key,)), (INSERT, (key, "ep", "work", rng.randint(1, 9), at)),
                (UPSERT, (key, rng.choice(["lease", "retry"]), rng.randint(1, 9))), (TIMER_DELETE, (key,)),
                ("UPDATE sb_doorbell SET spell = %s, pending_since = %s WHERE todo_id = %s", (at, at, key)),
                (IN_FLIGHT, (key, "ep", "work")), ("DELETE FROM sb_in_flight WHERE todo_id = %s", (key,)),
                ("INSERT INTO sb_doorbell (todo_id, endpoint_id, queue, source, kind, title, spell, pending_since)"
                 " VALUES (%s, %s, %s, %s, %s, %s, %s, %s)", (key, "ep", "work", "operator", None, "t", at, at)),
            ]))
        results = []
        for coalesce in (False, True):
            with db.transaction() as tx:
                for p in INLINE:
                    for ddl in p.ddl:
                        tx.execute(ddl)
            outcome: str | dict = "ok"
            try:
                with db.transaction() as tx:
                    run_ops(tx._cursor, coalesce_ops(ops) if coalesce else ops, "%s")
            except Exception as error:  # noqa: BLE001 - a duplicate INSERT must fail both ways
                outcome = type(error).__name__
            with db.transaction() as tx:
                results.append((outcome, _tables(tx)))
                for p in INLINE:
                    for table in p.tables:
                        tx.execute(f"DROP TABLE {table}")
        assert results[0] == results[1], ops


def test_a_batch_of_mixed_commands_leaves_read_models_a_rebuild_agrees_with(make_container, pg_url):
    container = make_container(pg_url)
    app, cli = container.app, Caller.cli()
    app.ensure_admin()
    slug = app.vend("mixed", queues=["work", "other"], caller=cli)["slug"]
    caller = app.endpoint_caller(slug)
    for i in range(40):
        app.push(slug, f"todo {i}", caller=cli, queue="other" if i % 3 else "work")
    claimed = app.claim_next(caller=caller, max_todos=30)["todos"]

    def act(n_todo):
        n, todo = n_todo
        verb = ("complete", "fail", "release", "heartbeat", "claim_next")[n % 5]
        if verb == "claim_next":
            return app.claim_next(caller=caller)
        return getattr(app, verb)(todo["id"], caller=caller)

    with ThreadPoolExecutor(16) as pool:  # many at once: they share writer batches
        list(pool.map(act, enumerate(claimed)))
    assert container.projector.verify() == []
