"""Every statement is planned for its own parameters (docs/adr/0013): a plan cached while a table
was empty must not outlive the table's growth (the stream look-up stayed a sequential scan)."""

from __future__ import annotations

from uuid import uuid4

import pytest

from interfaces.store.database import Database, DatabaseUrl

pytestmark = pytest.mark.postgres

LOOKUP = "SELECT id, v, state FROM grown WHERE id IN (%s, %s, %s) ORDER BY id, v"


@pytest.fixture
def db(pg_url):
    database = Database(DatabaseUrl.parse(pg_url), pool_size=1)  # one connection: one session's plans
    database.open()
    yield database
    database.close()


def test_a_lookup_prepared_on_an_empty_table_is_planned_again_once_it_has_grown(db):
    with db.transaction() as tx:
        tx.execute("CREATE TABLE grown (id UUID NOT NULL, v INTEGER NOT NULL, state BYTEA NOT NULL,"
                   " PRIMARY KEY (id, v))")
        tx.execute("INSERT INTO grown SELECT gen_random_uuid(), 1, '\\x00' FROM generate_series(1, 2)")
    for _ in range(30):  # psycopg prepares it on the server after 5 runs, while the table is small
        assert db.query(LOOKUP, [uuid4(), uuid4(), uuid4()]) == []
        with db.transaction() as tx:  # as the log grows: a few large rows per look-up
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
    assert generic == 0 and custom >= 30
    assert db.query("SHOW plan_cache_mode") == [("force_custom_plan",)]
