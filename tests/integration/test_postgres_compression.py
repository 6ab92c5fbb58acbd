"""Large values are compressed with lz4 on PostgreSQL: the events' states and the deliveries'
rule envelopes (docs/adr/0013). A database made before that is converted at the next start."""

from __future__ import annotations

import psycopg
import pytest

pytestmark = pytest.mark.postgres

COLUMNS = {("stored_events", "state"), ("sb_stored_deliveries", "envelope")}


def compressions(url: str) -> dict[tuple[str, str], str]:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT c.relname, a.attname, a.attcompression FROM pg_attribute a"
            " JOIN pg_class c ON c.oid = a.attrelid"
            " WHERE (c.relname, a.attname) IN (('stored_events', 'state'), ('sb_stored_deliveries', 'envelope'))"
        ).fetchall()
    return {(table, column): compression for table, column, compression in rows}


def test_a_start_sets_lz4_on_the_large_columns_of_an_older_database(pg_url, make_container):
    make_container(pg_url).close()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("ALTER TABLE sb_stored_deliveries ALTER COLUMN envelope SET COMPRESSION pglz")
    assert compressions(pg_url)[("sb_stored_deliveries", "envelope")] == "p"

    make_container(pg_url)

    assert compressions(pg_url) == {column: "l" for column in COLUMNS}


def test_a_start_waits_at_most_a_second_for_a_busy_table_and_still_serves(pg_url, make_container):
    make_container(pg_url).close()
    with psycopg.connect(pg_url) as holder:
        holder.execute("ALTER TABLE sb_stored_deliveries ALTER COLUMN envelope SET COMPRESSION pglz")
        holder.commit()
        holder.execute("LOCK TABLE sb_stored_deliveries IN ACCESS SHARE MODE")  # a reader that will not let go

        container = make_container(pg_url)  # waits 1 s for the lock, then starts without it

        assert container.app.ensure_admin() is not None
        assert compressions(pg_url)[("sb_stored_deliveries", "envelope")] == "p"
        holder.rollback()
    make_container(pg_url)
    assert compressions(pg_url)[("sb_stored_deliveries", "envelope")] == "l"
