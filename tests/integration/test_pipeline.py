"""The append's statements in one libpq pipeline without psycopg's cursors
(interfaces/store/pipeline.py): the same adaptation and errors as `cursor.execute`, one result per
statement in order, statements prepared from their second use, nothing half-committed."""

from __future__ import annotations

from uuid import uuid4

import psycopg
import pytest

from interfaces.store import pipeline
from interfaces.store.pipeline import Pipeline, convert

pytestmark = pytest.mark.postgres

TABLE = "CREATE TABLE t (id uuid PRIMARY KEY, n bigint NOT NULL, body bytea, note text)"
INSERT = "INSERT INTO t (id, n, body, note) VALUES (%s, %s, %s, %s)"
ARRAYS = "INSERT INTO t (id, n, body) SELECT * FROM unnest(%b::uuid[], %b::bigint[], %b::bytea[]) RETURNING n"


@pytest.fixture
def conn(pg_url):
    with psycopg.connect(pg_url, autocommit=True) as connection:
        connection.execute(TABLE)
        yield connection


def test_placeholders_become_numbered_with_their_formats():
    assert convert(b"SELECT %s, %b, '100%%'") == (b"SELECT $1, $2, '100%'", (
        pipeline.PyFormat.AUTO, pipeline.PyFormat.BINARY))
    with pytest.raises(ValueError, match="%d"):
        convert(b"SELECT %d")


def test_a_transaction_runs_whole_and_answers_each_statement_in_order(conn):
    run = Pipeline(conn)
    ids = [uuid4() for _ in range(3)]
    results = run.run([
        (b"BEGIN", None, False),
        (INSERT, (ids[0], 2**40, b"\x00\xff", "caf\u00e9"), False),
        (ARRAYS, ([ids[1], ids[2]], [1, 2], [b"a", None]), False),
        ("SELECT id, n, body, note FROM t WHERE id = %s", (ids[0],), True),
        (b"COMMIT", None, False),
    ])
    assert len(results) == 5
    assert run.rows(results[2]) == [(1,), (2,)]
    assert run.rows(results[3]) == [(ids[0], 2**40, b"\x00\xff", "caf\u00e9")]  # binary rows load as psycopg's
    assert conn.execute("SELECT count(*) FROM t").fetchone() == (3,)


def test_a_statement_is_prepared_from_its_second_use_and_reused(conn):
    run = Pipeline(conn)
    for n in range(3):
        run.run([(INSERT, (uuid4(), n, None, None), False)])
    prepared = conn.execute("SELECT statement FROM pg_prepared_statements WHERE name LIKE 'sb\\_%'").fetchall()
    assert [row[0] for row in prepared] == ["INSERT INTO t (id, n, body, note) VALUES ($1, $2, $3, $4)"]
    assert conn.execute("SELECT count(*) FROM t").fetchone() == (3,)


def test_beyond_the_prepared_limit_statements_go_unnamed(conn, monkeypatch):
    monkeypatch.setattr(pipeline, "PREPARED_MAX", 1)
    run = Pipeline(conn)
    for _ in range(2):
        run.run([(INSERT, (uuid4(), 1, None, None), False), ("SELECT count(*) FROM t WHERE n = %s", (1,), False)])
    assert conn.execute("SELECT count(*) FROM pg_prepared_statements WHERE name LIKE 'sb\\_%'").fetchone() == (1,)


def test_an_error_is_psycopgs_and_nothing_of_the_transaction_commits(conn):
    run = Pipeline(conn)
    taken = uuid4()
    run.run([(INSERT, (taken, 1, None, None), False)])
    with pytest.raises(psycopg.errors.UniqueViolation):
        run.run([
            (b"BEGIN", None, False),
            (INSERT, (uuid4(), 2, None, None), False),
            (INSERT, (taken, 3, None, None), False),  # the conflict: the rest is skipped
            (INSERT, (uuid4(), 4, None, None), False),
            (b"COMMIT", None, False),
        ])
    with psycopg.connect(conn.info.dsn, autocommit=True) as other:
        assert other.execute("SELECT n FROM t ORDER BY n").fetchall() == [(1,)]


def test_a_lost_connection_is_an_operational_error(conn, pg_url):
    run = Pipeline(conn)
    run.run([(b"SELECT 1", None, False)])
    with psycopg.connect(pg_url, autocommit=True) as killer:
        killer.execute("SELECT pg_terminate_backend(%s)", (conn.info.backend_pid,))
    with pytest.raises(psycopg.OperationalError):
        run.run([(b"BEGIN", None, False), (INSERT, (uuid4(), 1, None, None), False), (b"COMMIT", None, False)])
