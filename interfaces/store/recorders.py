"""eventsourcing's application recorders, extended to write the inline read models.

The claimable queue and the due timers are written in the same transaction as the events
(docs/adr/0002-event-store-and-ordering.md): when a command returns, `claim_next` and the
reaper already see its effect. Only SQL runs inside the hook; every op was computed (and
validated) before the transaction began, because on PostgreSQL a Python exception raised
after the INSERT would not roll the transaction back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from eventsourcing.persistence import StoredEvent
from eventsourcing.postgres import PostgresApplicationRecorder
from eventsourcing.sqlite import SQLiteApplicationRecorder

from projections.base import Op


def _run(cursor: Any, ops: Sequence[Op], placeholder: str) -> None:
    i = 0
    while i < len(ops):
        sql = ops[i][0]
        j = i
        while j < len(ops) and ops[j][0] == sql:
            j += 1
        statement = sql.replace("%s", placeholder) if placeholder != "%s" else sql
        if j - i == 1:
            cursor.execute(statement, ops[i][1])
        else:
            cursor.executemany(statement, [op[1] for op in ops[i:j]])
        i = j


class SqliteEventRecorder(SQLiteApplicationRecorder):
    """Appends events, then runs the inline projection ops and moves their tracking rows."""

    def _insert_events(self, c: Any, stored_events: Sequence[StoredEvent], **kwargs: Any):
        ids = super()._insert_events(c, stored_events, **kwargs)
        ops: Sequence[Op] = kwargs.get("inline_ops", ())
        tracked: Sequence[str] = kwargs.get("inline_tracking", ())
        if ops:
            _run(c, ops, "?")
        if tracked and ids:
            c.execute(
                f"UPDATE sb_tracking SET position = ? WHERE name IN ({', '.join('?' * len(tracked))})",
                (max(ids), *tracked),
            )
        return ids


class PostgresEventRecorder(PostgresApplicationRecorder):
    """Same as the SQLite one, inside eventsourcing's locked, pipelined insert transaction."""

    def _insert_stored_events(self, curs: Any, stored_events: Sequence[StoredEvent], **kwargs: Any) -> None:
        super()._insert_stored_events(curs, stored_events, **kwargs)
        ops: Sequence[Op] = kwargs.get("inline_ops", ())
        tracked: Sequence[str] = kwargs.get("inline_tracking", ())
        with curs.connection.cursor() as extra:
            if ops:
                _run(extra, ops, "%s")
            if tracked:
                extra.execute(
                    f"UPDATE sb_tracking SET position = (SELECT max(notification_id) FROM {self.events_table_name})"
                    " WHERE name = ANY(%s)",
                    (list(tracked),),
                )
