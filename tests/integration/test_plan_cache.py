"""Every statement is planned for its parameters and for the table as it is now (docs/adr/0013):
a plan cached while a table was small must not outlive the table's growth."""

from __future__ import annotations

import socket
import time
from uuid import uuid4

import psycopg
import pytest

from application.errors import StoreUnavailable
from application.service import Caller
from interfaces.store.database import Database, DatabaseUrl

pytestmark = pytest.mark.postgres

LOOKUP = "SELECT id, v, state FROM grown WHERE id IN (%s, %s, %s) ORDER BY id, v"


@pytest.fixture
def db(pg_url):
    database = Database(DatabaseUrl.parse(pg_url), pool_size=1)  # one connection: one session's statements
    database.open()
    yield database
    database.close()


def test_a_lookup_prepared_while_its_table_was_small_is_planned_again_as_it_grows(db):
    with db.transaction() as tx:
        tx.execute("CREATE TABLE grown (id UUID NOT NULL, v INTEGER NOT NULL, state BYTEA NOT NULL,"
                   " PRIMARY KEY (id, v))")
        tx.execute("INSERT INTO grown SELECT gen_random_uuid(), 1, '\\x00' FROM generate_series(1, 2)")
    for _ in range(30):  # psycopg prepares it on the server from the 6th run on, while the table is small
        assert db.query(LOOKUP, [uuid4(), uuid4(), uuid4()]) == []
        with db.transaction() as tx:  # as the event log grows: a few large rows per look-up
            tx.execute("INSERT INTO grown SELECT gen_random_uuid(), 1, decode(repeat(md5(i::text), 300), 'hex')"
                       " FROM generate_series(1, 3) AS i")
    with db.transaction() as tx:
        tx.execute("INSERT INTO grown SELECT gen_random_uuid(), 1, decode(repeat('ab', 200), 'hex')"
                   " FROM generate_series(1, 20000)")
    known = db.query("SELECT id FROM grown LIMIT 1")[0][0]
    for _ in range(5):
        assert [row[0] for row in db.query(LOOKUP, [known, uuid4(), uuid4()])] == [known]
    plans = db.query("SELECT generic_plans, custom_plans FROM pg_prepared_statements"
                     " WHERE statement LIKE '%%FROM grown WHERE id IN%%'")
    assert plans, "the look-up was never prepared on the server: this test checks nothing"
    generic, custom = plans[0]
    assert generic == 0 and custom >= 25  # PostgreSQL's default ("auto") chose the generic plan 25 times


def test_a_statement_without_parameters_is_not_prepared(db):
    for _ in range(10):
        assert db.query("SELECT count(*) FROM pg_class WHERE relname = 'no such table'") == [(0,)]
    assert db.query("SELECT statement FROM pg_prepared_statements WHERE statement LIKE %s",
                    ["%no such table%"]) == []


def test_every_read_connection_plans_each_run_and_the_appender_plans_once_by_its_keys(pg_url, make_container):
    store = make_container(pg_url).store
    appender = store.recorder._connection()
    with store.datastore.get_connection() as library:  # eventsourcing's reads, on the request pool
        library_mode = library.execute("SHOW plan_cache_mode").fetchone()
    assert store.db.query("SHOW plan_cache_mode") == [("force_custom_plan",)]
    assert tuple(library_mode.values()) == ("force_custom_plan",)
    assert appender.execute("SHOW plan_cache_mode").fetchone() == ("force_generic_plan",)
    assert appender.execute("SHOW enable_seqscan").fetchone() == ("off",)
    # the claim candidates' reads, by their index, on connections of their own
    assert store.db.indexed_column("SHOW plan_cache_mode", ()) == [b"force_generic_plan"]
    assert store.db.indexed_column("SHOW enable_seqscan", ()) == [b"off"]


def test_an_indexed_read_that_fails_costs_its_connection_and_the_next_read_prepares_afresh(db):
    """`indexed_column` prepares a statement on its connection from its second run; a read that
    fails there leaves that connection (pipeline.py), and the next one works on another."""
    digits = "SELECT substr(%s, 4) FROM generate_series(1, %s)"
    for _ in range(3):  # prepared on the server from the second run on
        assert db.indexed_column(digits, ("td_0a", 2)) == [b"0a", b"0a"]
    first = db.indexed_column("SELECT pg_backend_pid()", ())
    with pytest.raises(psycopg.errors.DivisionByZero):
        db.indexed_column("SELECT 1 / %s", (0,))
    assert db.indexed_column("SELECT pg_backend_pid()", ()) != first
    for _ in range(3):
        assert db.indexed_column(digits, ("td_0b", 1)) == [b"0b"]
    assert db.indexed_column("SELECT %s::text WHERE false", ("x",)) == []


def test_an_indexed_read_while_postgresql_refuses_is_store_unavailable(pg_url):
    url = DatabaseUrl.parse(pg_url)
    database = Database(DatabaseUrl.parse(f"postgresql://{url.user}@127.0.0.1:{_free_port()}/{url.dbname}"))
    try:
        with pytest.raises(StoreUnavailable):
            database.indexed_column("SELECT 1", ())
    finally:
        database.close()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


INLINE_TABLES = ("sb_claimable", "sb_in_flight", "sb_blobs", "stored_events")


def test_the_appenders_plans_made_on_small_tables_never_scan_them_once_they_have_grown(pg_url, make_container):
    """The appender, and the claim candidates' reads, cache one generic plan per statement from
    their first runs, on near-empty tables: each must still find its rows by key after the tables
    grew (docs/adr/0013)."""
    container = make_container(pg_url)
    app, store = container.app, container.store
    app.ensure_admin()
    slug = app.vend("plans", queues=["work"], caller=Caller.cli())["slug"]
    caller = app.endpoint_caller(slug)

    def cycle(count: int) -> None:
        for n in range(count):
            app.push(slug, f"todo {n}", caller=Caller.cli(), payload={"n": n, "pad": "x" * 200})
        for _ in range(count):
            claimed = app.claim_next(caller=caller)
            app.complete(claimed["todo"]["id"], caller=caller, result={"ok": True})

    cycle(12)  # the appender prepares (and plans) every statement of the cycle on small tables
    with store.db.transaction() as tx:  # the tables grow under it
        tx.execute("INSERT INTO sb_claimable (todo_id, endpoint_id, queue, created_at, available_at, source, kind,"
                   " title, spell, pending_since, due_at) SELECT 'filler-' || i, 'other', 'work', i, NULL, 'api', 'x',"
                   " 't', 0, NULL, 9e15 FROM generate_series(1, 20000) AS i")
        tx.execute("INSERT INTO sb_in_flight (todo_id, endpoint_id, queue, admitted)"
                   " SELECT 'filler-' || i, 'other', 'work', 1 FROM generate_series(1, 20000) AS i")
    before = _seq_scans(app, slug, store)
    cycle(12)
    after = _seq_scans(app, slug, store)
    assert after == before, {t: after[t] - before[t] for t in INLINE_TABLES if after[t] != before[t]}


def _seq_scans(app, slug: str, store) -> dict[str, int]:
    """Sequential scans of the inline tables so far. A backend reports its counts at the end of a
    transaction at least a second after its last report: wait, then one more append reports them."""
    time.sleep(1.2)
    app.push(slug, "flush", caller=Caller.cli())
    rows = store.db.query("SELECT relname, seq_scan FROM pg_stat_user_tables WHERE relname = ANY(%s)",
                          (list(INLINE_TABLES),))
    return dict(rows)


def test_the_operators_pgoptions_still_apply(pg_url, monkeypatch):
    monkeypatch.setenv("PGOPTIONS", "-c statement_timeout=1234")
    database = Database(DatabaseUrl.parse(pg_url), pool_size=1)
    database.open()
    try:
        assert database.query("SHOW statement_timeout") == [("1234ms",)]
        assert database.query("SHOW plan_cache_mode") == [("force_custom_plan",)]
    finally:
        database.close()
