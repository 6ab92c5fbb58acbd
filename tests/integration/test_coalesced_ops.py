"""One writer batch's inline ops, and one catch-up page's, in fewer statements
(interfaces/store/ops.py `coalesce_ops`): on PostgreSQL the coalesced ops leave exactly the
rows the ops one by one leave, and a batch of mixed commands leaves read models a rebuild from
the log agrees with."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor

import pytest

from application.service import Caller
from interfaces.store.database import Database, DatabaseUrl
from interfaces.store.ops import array_param, coalesce_ops, run_ops
from projections.claimable import ClaimableQueue
from projections.counters import Counters
from projections.idempotency_keys import IdempotencyKeys
from projections.payload_holders import PayloadHolders
from projections.queue_load import QueueLoad

pytestmark = pytest.mark.postgres

INLINE = (ClaimableQueue(), QueueLoad())
SET = "UPDATE sb_claimable SET available_at = %s WHERE todo_id = %s"
DELETE = "DELETE FROM sb_claimable WHERE todo_id = %s"
UPSERT = ("INSERT INTO sb_in_flight (todo_id, endpoint_id, queue, admitted) VALUES (%s, %s, %s, 1)"
          " ON CONFLICT (todo_id) DO UPDATE SET queue = excluded.queue")
OUT = "DELETE FROM sb_in_flight WHERE todo_id = %s"
DUE = "UPDATE sb_claimable SET due_at = %s WHERE todo_id = %s"
STATE = "UPDATE sb_claimable SET available_at = %s, spell = %s, pending_since = %s, due_at = %s WHERE todo_id = %s"
OPEN = ("INSERT INTO sb_claimable (todo_id, endpoint_id, queue, created_at, available_at, source, kind, title, spell,"
        " pending_since, due_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)")
INSERT = "INSERT INTO sb_claimable (todo_id, endpoint_id, queue, created_at, available_at) VALUES (%s, %s, %s, %s, %s)"
IN_FLIGHT = "INSERT INTO sb_in_flight (todo_id, endpoint_id, queue, admitted) VALUES (%s, %s, %s, 1)"
CAUGHT_UP = (Counters(), PayloadHolders(), IdempotencyKeys())  # tables a catch-up page writes
COUNT = ("INSERT INTO sb_counters (metric, a, b, total) VALUES (%s, %s, %s, %s)"
         " ON CONFLICT (metric, a, b) DO UPDATE SET total = sb_counters.total + excluded.total")
COUNT_BY_QUEUE = ("INSERT INTO sb_counters (metric, a, b, total) SELECT %s, queue, %s, 1 FROM sb_counter_queues"
                  " WHERE todo_id = %s ON CONFLICT (metric, a, b) DO UPDATE SET total = sb_counters.total + excluded.total")
QUEUE_OF = "INSERT INTO sb_counter_queues (todo_id, queue) VALUES (%s, %s)"
REF = "INSERT INTO sb_payload_refs (sha256, holder) VALUES (%s, %s) ON CONFLICT (sha256, holder) DO NOTHING"
HOLDER = ("INSERT INTO sb_payload_holders (holder, finished_at) VALUES (%s, %s)"
          " ON CONFLICT (holder) DO UPDATE SET finished_at = excluded.finished_at")
KEY = ("INSERT INTO sb_idempotency_keys (endpoint_id, key, todo_id, live) VALUES (%s, %s, %s, 1)"
       " ON CONFLICT (endpoint_id, key) DO UPDATE SET todo_id = excluded.todo_id, live = 1")
KEY_LIVE = "UPDATE sb_idempotency_keys SET live = %s WHERE todo_id = %s"


def test_single_row_ops_of_distinct_rows_merge_and_nothing_moves_across_a_repeat_or_another_statement():
    ops = [
        (SET, (None, "a")), (DELETE, ("b",)), (SET, (None, "c")), (SET, (7, "d")),  # one stretch
        (SET, (None, "a")),  # `a` again: a new stretch
        (UPSERT, ("a", "ep", "q")), (OUT, ("b",)), (UPSERT, ("c", "ep", "q")),
        (INSERT, ("e", "ep", "q", 1, 1)), (INSERT, ("g", "ep", "q", 1, 1)),  # a plain insert is keyed by its first column
        (DELETE, ("e",)), (DELETE, ("f",)),  # `e` again: a new stretch
        (IN_FLIGHT, ("h", "ep", "q")), (IN_FLIGHT, ("i", "ep", "q")),  # an integer among the values is kept
    ]
    assert coalesce_ops(ops) == [
        ("UPDATE sb_claimable SET available_at = %s WHERE todo_id = ANY(%s)", (None, "{a,c}")),
        (DELETE, ("b",)),
        (SET, (7, "d")),
        (SET, (None, "a")),
        ("INSERT INTO sb_in_flight (todo_id, endpoint_id, queue, admitted) VALUES (%s, %s, %s, 1), (%s, %s, %s, 1)"
         " ON CONFLICT (todo_id) DO UPDATE SET queue = excluded.queue", ("a", "ep", "q", "c", "ep", "q")),
        (OUT, ("b",)),
        ("INSERT INTO sb_claimable (todo_id, endpoint_id, queue, created_at, available_at)"
         " VALUES (%s, %s, %s, %s, %s), (%s, %s, %s, %s, %s)", ("e", "ep", "q", 1, 1, "g", "ep", "q", 1, 1)),
        ("DELETE FROM sb_claimable WHERE todo_id = ANY(%s)", ("{e,f}",)),
        ("INSERT INTO sb_in_flight (todo_id, endpoint_id, queue, admitted) VALUES (%s, %s, %s, 1), (%s, %s, %s, 1)",
         ("h", "ep", "q", "i", "ep", "q")),
    ]


def test_a_row_counted_again_sums_and_a_repeated_do_nothing_insert_is_left_out():
    ops = [
        (COUNT, ("created", "q", "github", 1)), (REF, ("d1", "dlv_1")), (HOLDER, ("dlv_1", 5)),
        (COUNT, ("deliveries", "github", "routed", 1)), (REF, ("d1", "todo_1")),
        (COUNT, ("created", "q", "github", 1)), (REF, ("d1", "todo_1")),  # the same row again: summed, left out
        (KEY, ("ep", "k1", "todo_1")), (KEY, ("ep", "k2", "todo_2")),  # keyed by both conflict columns
        (REF, ("d2", "todo_1")),  # another row of the same statement
        (COUNT, ("created", "q", "github", 2)),
        (HOLDER, ("dlv_1", 6)),  # not additive: `dlv_1` again ends the stretch
        (COUNT, ("created", "q", "github", 1)),
    ]
    assert coalesce_ops(ops) == [
        ("INSERT INTO sb_counters (metric, a, b, total) VALUES (%s, %s, %s, %s), (%s, %s, %s, %s)"
         " ON CONFLICT (metric, a, b) DO UPDATE SET total = sb_counters.total + excluded.total",
         ("created", "q", "github", 4, "deliveries", "github", "routed", 1)),
        ("INSERT INTO sb_payload_refs (sha256, holder) VALUES (%s, %s), (%s, %s), (%s, %s)"
         " ON CONFLICT (sha256, holder) DO NOTHING", ("d1", "dlv_1", "d1", "todo_1", "d2", "todo_1")),
        (HOLDER, ("dlv_1", 5)),
        ("INSERT INTO sb_idempotency_keys (endpoint_id, key, todo_id, live) VALUES (%s, %s, %s, 1), (%s, %s, %s, 1)"
         " ON CONFLICT (endpoint_id, key) DO UPDATE SET todo_id = excluded.todo_id, live = 1",
         ("ep", "k1", "todo_1", "ep", "k2", "todo_2")),
        (HOLDER, ("dlv_1", 6)),
        (COUNT, ("created", "q", "github", 1)),
    ]


def test_keys_that_need_no_quoting_go_as_an_array_literal_and_any_other_as_the_list(db):
    assert array_param(["td_1a", "ep-2", "x.y:z"]) == "{td_1a,ep-2,x.y:z}"
    for keys in (["a", "b c"], ["a", "b,c"], ["a", 'b"c'], ["a", "{b}"], ["a", "NULL"], ["a", "null"], ["a", ""],
                 ["a", 1], ["a", "\ufffd"]):
        assert array_param(keys) == keys, keys
    with db.transaction() as tx:  # either form names the same rows
        tx.execute("DELETE FROM sb_claimable", ())
        for key in ("a", "b c", "null", 'q"x', "td_1"):
            tx.execute(INSERT, (key, "ep", "q", 1, 1))
        tx.execute("DELETE FROM sb_claimable WHERE todo_id = ANY(%s)", (array_param(["b c", "null", 'q"x']),))
        tx.execute("DELETE FROM sb_claimable WHERE todo_id = ANY(%s)", (array_param(["td_1"]),))
        assert [row[0] for row in tx.execute("SELECT todo_id FROM sb_claimable", ())] == ["a"]


def test_statements_it_cannot_read_a_row_key_from_are_left_alone():
    kept = [
        ("UPDATE sb_tracking SET position = (SELECT max(notification_id) FROM stored_events) WHERE name = %s", ("x",)),
        ("UPDATE t SET k = %s WHERE k = %s", (1, 2)),  # assigns its own key column
        ("UPDATE t SET a = %s WHERE k = %s AND b = %s", (1, 2, 3)),
        ("INSERT INTO t (k, a) VALUES (%s, %s) ON CONFLICT (k) DO UPDATE SET a = %s", (1, 2, 3)),
        ("INSERT INTO t (k, a) VALUES (%s, %s) RETURNING k", (1, 2)),
        ("INSERT INTO t (a, k) VALUES (1, %s)", (2,)),  # its first column is no parameter
        ("INSERT INTO t (k, a) SELECT %s, a FROM u", (1,)),
        ("INSERT INTO t (k, a) VALUES (%s, %s) ON CONFLICT (k, b) DO NOTHING", (1, 2)),  # b is not inserted
        ("INSERT INTO t (k, a) VALUES (%s, %s) ON CONFLICT (k) DO UPDATE SET a = t.a + excluded.a, k = 1", (1, 2)),
        ("DELETE FROM t WHERE k = %s", (None,)),
    ]
    assert coalesce_ops(kept + kept) == [(sql, tuple(params)) for sql, params in kept + kept]


def _tables(tx, projections=INLINE) -> dict[str, list[tuple]]:
    return {table: sorted(tx.execute(f"SELECT * FROM {table}"), key=repr) for p in projections for table in p.tables}


def _same_rows_both_ways(db, projections, ops) -> None:
    results = []
    for coalesce in (False, True):
        with db.transaction() as tx:
            for p in projections:
                for ddl in p.ddl:
                    tx.execute(ddl)
        outcome: str | dict = "ok"
        try:
            with db.transaction() as tx:
                run_ops(tx._cursor, coalesce_ops(ops) if coalesce else ops, "%s")
        except Exception as error:  # noqa: BLE001 - a duplicate INSERT must fail both ways
            outcome = type(error).__name__
        with db.transaction() as tx:
            results.append((outcome, _tables(tx, projections)))
            for p in projections:
                for table in p.tables:
                    tx.execute(f"DROP TABLE {table}")
    assert results[0] == results[1], ops


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
                (UPSERT, (key, "ep", rng.choice(["work", "other"]))), (DUE, (rng.randint(1, 9), key)),
                ("UPDATE sb_claimable SET spell = %s, pending_since = %s WHERE todo_id = %s", (at, at, key)),
                (STATE, (at, at, at, rng.choice([None, rng.randint(1, 9)]), key)),
                (IN_FLIGHT, (key, "ep", "work")), (OUT, (key,)),
                (OPEN, (key, "ep", "work", rng.randint(1, 9), at, "operator", None, "t", at, at, None)),
            ]))
        _same_rows_both_ways(db, INLINE, ops)


def test_random_catch_up_pages_leave_the_same_rows_coalesced_as_one_by_one(db):
    rng = random.Random(17)
    todos = [f"todo_{i}" for i in range(8)] + ["todo_\x00nul"]
    for _ in range(40):
        ops = []
        for _ in range(rng.randint(1, 60)):
            todo, digest = rng.choice(todos), rng.choice(["d1", "d2"])
            ops.append(rng.choice([
                (COUNT, (rng.choice(["created", "deliveries"]), rng.choice(["q", "r"]), "github", 1)),
                (COUNT, ("created", "q", "github", rng.randint(1, 3))),
                (COUNT_BY_QUEUE, ("claimed", "", todo)), (QUEUE_OF, (todo, rng.choice(["q", "r"]))),
                ("UPDATE sb_counter_queues SET queue = %s WHERE todo_id = %s", (rng.choice(["q", "r"]), todo)),
                (REF, (digest, todo)), (HOLDER, (todo, rng.choice([None, rng.randint(1, 9)]))),
                (KEY, ("ep", rng.choice(["k1", "k2", "k3"]), todo)), (KEY_LIVE, (rng.randint(0, 1), todo)),
            ]))
        _same_rows_both_ways(db, CAUGHT_UP, ops)


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
