"""A catch-up's coalesced statement goes to PostgreSQL with `$n` placeholders converted once
(`interfaces/store/database.py`, `_numbered`), or, when a placeholder is not a plain `%s`, through
psycopg's own conversion."""

from __future__ import annotations

from interfaces.store.database import _numbered


def test_plain_placeholders_are_numbered_in_order_across_rows():
    assert _numbered("INSERT INTO t (a, b) VALUES (%s, %s), (%s, %s) ON CONFLICT (a) DO NOTHING") == (
        b"INSERT INTO t (a, b) VALUES ($1, $2), ($3, $4) ON CONFLICT (a) DO NOTHING")


def test_a_literal_percent_stays_one_percent():
    assert _numbered("UPDATE t SET n = n %% 7 WHERE a = %s") == b"UPDATE t SET n = n % 7 WHERE a = $1"


def test_any_other_placeholder_is_left_to_psycopg():
    assert _numbered("INSERT INTO t (a) VALUES (%b)") is None
    assert _numbered("INSERT INTO t (a) VALUES (%t)") is None
    assert _numbered("INSERT INTO t (a) VALUES (%(a)s)") is None
