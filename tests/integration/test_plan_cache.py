"""Every statement is planned for its parameters and for the table as it is now (docs/adr/0013):
a plan cached while a table was small must not outlive the table's growth."""

from __future__ import annotations

from uuid import uuid4

import pytest

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


def test_every_connection_of_the_store_plans_each_run(pg_url, make_container):
    store = make_container(pg_url).store
    appender = store.recorder._connection()
    with store.datastore.get_connection() as library:  # eventsourcing's reads, on the request pool
        library_mode = library.execute("SHOW plan_cache_mode").fetchone()
    assert store.db.query("SHOW plan_cache_mode") == [("force_custom_plan",)]
    assert appender.execute("SHOW plan_cache_mode").fetchone() == ("force_custom_plan",)
    assert tuple(library_mode.values()) == ("force_custom_plan",)


def test_the_operators_pgoptions_still_apply(pg_url, monkeypatch):
    monkeypatch.setenv("PGOPTIONS", "-c statement_timeout=1234")
    database = Database(DatabaseUrl.parse(pg_url), pool_size=1)
    database.open()
    try:
        assert database.query("SHOW statement_timeout") == [("1234ms",)]
        assert database.query("SHOW plan_cache_mode") == [("force_custom_plan",)]
    finally:
        database.close()
