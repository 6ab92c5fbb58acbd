"""eventsourcing's application recorders, extended to write the inline read models.

The claimable queue and the due timers are written in the same transaction as the events
(docs/adr/0001-event-store-and-ordering.md): when a command returns, `claim_next` and the
reaper already see its effect. Only SQL runs inside the hook; every op was computed (and
validated) before the transaction began, because on PostgreSQL a Python exception raised
after the INSERT would not roll the transaction back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import contextlib
import threading

import psycopg
from eventsourcing.persistence import IntegrityError, OperationalError, StoredEvent
from psycopg.sql import SQL, Identifier
from eventsourcing.postgres import PostgresApplicationRecorder
from eventsourcing.sqlite import SQLiteApplicationRecorder

from interfaces.store.database import plan_per_run, run_ops
from projections.base import Op


class SqliteEventRecorder(SQLiteApplicationRecorder):
    """Appends events, then runs the inline projection ops and moves their tracking rows."""

    def _insert_events(self, c: Any, stored_events: Sequence[StoredEvent], **kwargs: Any):
        ids = super()._insert_events(c, stored_events, **kwargs)
        ops: Sequence[Op] = kwargs.get("inline_ops", ())
        tracked: Sequence[str] = kwargs.get("inline_tracking", ())
        if ops:
            run_ops(c, ops, "?")
        if tracked and ids:
            c.execute(
                f"UPDATE sb_tracking SET position = ? WHERE name IN ({', '.join('?' * len(tracked))})",
                (max(ids), *tracked),
            )
        return ids


class PostgresEventRecorder(PostgresApplicationRecorder):
    """eventsourcing's PostgreSQL recorder with the append done in ONE round trip.

    The library's insert takes two (a pipeline sync to surface a conflict, then COMMIT). Here
    the writer thread's own connection sends BEGIN, the library's table lock and NOTIFY, the
    INSERT, the inline ops, the tracking update and COMMIT as one pipeline; a conflict aborts
    the transaction and surfaces at the single sync. The table, its lock (id order = commit
    order, docs/adr/0001) and everything the library reads are unchanged. After any error the
    connection is discarded, so psycopg's prepared-statement cache never disagrees with the
    server's (an aborted pipeline skips the Parse of a statement psycopg believes prepared).
    """

    def __init__(self, datastore: Any, *, conninfo: str, **kwargs: Any) -> None:
        super().__init__(datastore, **kwargs)
        self._conninfo = conninfo
        self._local = threading.local()
        self._insert_arrays = SQL(
            "INSERT INTO {table} (originator_id, originator_version, topic, state)"
            " SELECT * FROM unnest(%b::uuid[], %b::bigint[], %b::text[], %b::bytea[])"
            " RETURNING notification_id"
        ).format(table=Identifier(self.events_table_name))
        self._lock = SQL("LOCK TABLE {table} IN EXCLUSIVE MODE").format(table=Identifier(self.events_table_name))
        self._notify = SQL("NOTIFY {channel}").format(channel=Identifier(self.channel_name))
        self._track = SQL(
            "UPDATE sb_tracking SET position = (SELECT max(notification_id) FROM {table}) WHERE name = ANY(%s)"
        ).format(table=Identifier(self.events_table_name))

    def _connection(self) -> psycopg.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None or conn.closed:
            conn = psycopg.connect(self._conninfo, autocommit=True)
            plan_per_run(conn)
            self._local.conn = conn
        return conn

    def _discard(self) -> None:
        conn = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def insert_events(self, stored_events: Sequence[StoredEvent], **kwargs: Any) -> Sequence[int] | None:
        if not stored_events:
            return []
        ops: Sequence[Op] = kwargs.get("inline_ops", ())
        tracked: Sequence[str] = kwargs.get("inline_tracking", ())
        columns = (
            [e.originator_id for e in stored_events], [e.originator_version for e in stored_events],
            [e.topic for e in stored_events], [e.state for e in stored_events],
        )
        try:
            conn = self._connection()
            with conn.cursor() as head, conn.cursor() as inserted, conn.cursor() as extra:
                with conn.pipeline():
                    head.execute("BEGIN")
                    head.execute(self._lock)
                    head.execute(self._notify)
                    # %b: binary arrays; psycopg dumps a text array of bytea item by item in Python (hex + regex
                    # escaping), ~1 ms per batch more than the binary one (measured)
                    inserted.execute(self._insert_arrays, columns)
                    run_ops(extra, ops, "%s")
                    if tracked:
                        extra.execute(self._track, (list(tracked),))
                    head.execute("COMMIT")
                return [row[0] for row in inserted.fetchall()]
        except psycopg.errors.IntegrityError as error:
            self._discard()
            raise IntegrityError(error) from error
        except psycopg.Error as error:
            self._discard()
            raise OperationalError(error) from error
