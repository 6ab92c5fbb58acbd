"""eventsourcing's application recorders, extended to write the inline read models.

The claimable queue and the due timers are written in the same transaction as the events
(docs/adr/0001-event-store-and-ordering.md): when a command returns, `claim_next` and the
reaper already see its effect. Only SQL runs inside the hook; every op was computed (and
validated) before the transaction began, because on PostgreSQL a Python exception raised
after the INSERT would not roll the transaction back. `append` also reads, in that transaction
before it commits, the stored payloads the batch's answers show (docs/adr/0027): a read that
fails commits nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import contextlib
from contextlib import contextmanager
import logging
import threading
import time
from uuid import uuid4

import psycopg
from eventsourcing.persistence import IntegrityError, OperationalError, PersistenceError, StoredEvent
from psycopg.rows import dict_row, tuple_row
from psycopg.sql import SQL, Identifier, Literal
from eventsourcing.postgres import PostgresApplicationRecorder, PostgresDatastore
from eventsourcing.sqlite import SQLiteApplicationRecorder

from application.errors import CommitOutcomeUnknown, StoreUnavailable, first_line
from domain.doorbell import FREED, RING
from interfaces.store import blobs
from interfaces.store.connections import idle_and_sound, plan_once
from interfaces.store.database import Database, DatabaseUrl
from interfaces.store.ops import array_param, coalesce_ops, run_ops
from interfaces.store.pipeline import Pipeline, Sent, Statement
from projections.base import Op

log = logging.getLogger("switchboard.store")


class NotCommitted(OperationalError):
    """An append's session was lost with its answer, and the lookup on another connection found
    that it had not committed (docs/adr/0014): nothing was stored, and the store answered just
    now. A lost session, not a lost store: the writer runs the batch again rather than answer 503
    and say the store is down (the store is up, and one of its other sessions may already have
    said it is back)."""


RESOLVE_FOR = 8.0
"""How long the writer keeps trying to learn whether a commit whose answer was lost committed
(the database may be restarting): then the caller is told the outcome is unknown, never 503.
Under GitHub's 10 s, so a sender hears that rather than timing out."""
RESOLVE_PAUSE = 0.2
FENCE_WAIT_MS = 1000
"""How long PostgreSQL waits for the lost session to end once told to (pg_terminate_backend)."""
# Errors that come from the server refusing a statement leave the outcome known (nothing was
# committed); these classes (connection, operator intervention, system, internal) do not.
_UNSURE_CLASSES = ("08", "57", "58", "XX")


class PooledPostgresDatastore(PostgresDatastore):
    """eventsourcing's reads (streams, the log, table creation) on the process's one request pool
    (`Database`), so `SWITCHBOARD_PG_POOL_SIZE` bounds them too and they share its outage rules
    (docs/adr/0014); the library's own psycopg_pool is never opened."""

    db: Database

    @contextmanager
    def get_connection(self) -> Iterator[Any]:
        try:
            with self.db.connection() as conn:
                conn.row_factory = dict_row
                try:
                    yield conn
                finally:
                    conn.row_factory = tuple_row
        except StoreUnavailable as error:
            raise OperationalError(str(error)) from None
        except psycopg.IntegrityError as error:
            raise IntegrityError(str(error)) from error
        except (psycopg.OperationalError, psycopg.InterfaceError) as error:
            raise OperationalError(str(error)) from error
        except psycopg.Error as error:
            raise PersistenceError(str(error)) from error


Appended = tuple["Sequence[int] | None", "dict[str, blobs.Stored]"]
"""The appended events' log positions and the stored payloads read in their transaction."""


class SqliteEventRecorder(SQLiteApplicationRecorder):
    """Appends events, then runs the inline projection ops and moves their tracking rows."""

    def append(self, stored_events: Sequence[StoredEvent], *, read: Sequence[str] = (), **kwargs: Any) -> Appended:
        """`insert_events`, then the stored payloads of `read`, in the same transaction."""
        with self.datastore.transaction(commit=True) as c:
            ids = self._insert_events(c, stored_events, **kwargs)
            return ids, (blobs.read(lambda sql, params: _fetch(c, sql, params), read) if read else {})

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


def _fetch(cursor: Any, sql: str, params: Sequence[Any]) -> list[Any]:
    cursor.execute(sql.replace("%s", "?"), tuple(params))
    return cursor.fetchall()


class PostgresEventRecorder(PostgresApplicationRecorder):
    """eventsourcing's PostgreSQL recorder with the append done in ONE round trip.

    The library's insert takes two (a pipeline sync to surface a conflict, then COMMIT). Here
    the writer thread's own connection sends BEGIN, the library's table lock, the doorbell's
    NOTIFY (only when the commit can make a ring due), the INSERT, the inline ops, the tracking update and COMMIT as one pipeline; a conflict aborts
    the transaction and surfaces at the single sync. The table, its lock (id order = commit
    order, docs/adr/0001) and everything the library reads are unchanged. The statements go
    through `pipeline.Pipeline`, psycopg's `pq` layer without its cursors (~3 µs of Python per
    statement instead of ~14). After any error the connection is discarded, so the statements it
    believes prepared never disagree with the server's (an aborted pipeline skips their Parse).
    """

    def __init__(self, datastore: Any, *, url: DatabaseUrl, **kwargs: Any) -> None:
        super().__init__(datastore, **kwargs)
        self._url = url
        self._local = threading.local()
        self.on_unsure: Any = None
        """Called with the error when a commit's answer was lost and its outcome is looked for."""
        self.connections: Any = None
        """A pooled connection for the look-up (`Database.connection`): the pool may hold the last
        free slots of a cluster out of connections; else a fresh connection is opened."""
        # Each append's statements, rendered to bytes once: psycopg renders a composed statement
        # again on every execute (~8 µs each, four per append).
        table, channel = Identifier(self.events_table_name), Identifier(self.channel_name)
        self._insert_arrays = SQL(
            "INSERT INTO {table} (originator_id, originator_version, topic, state)"
            " SELECT * FROM unnest(%b::uuid[], %b::bigint[], %b::text[], %b::bytea[])"
            " RETURNING notification_id"
        ).format(table=table).as_bytes(None)
        self._lock = SQL("LOCK TABLE {table} IN EXCLUSIVE MODE").format(table=table).as_bytes(None)
        self._notify = {news: SQL("NOTIFY {channel}, {news}").format(channel=channel, news=Literal(news)).as_bytes(None)
                        for news in (RING, FREED)}
        """The doorbell's wake-up, sent only by commits that can make a ring due (docs/adr/0011)."""
        self._track = SQL(
            "UPDATE sb_tracking SET position = (SELECT max(notification_id) FROM {table}) WHERE name = ANY(%s)"
        ).format(table=table).as_bytes(None)

    def _connection(self) -> psycopg.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is not None and not idle_and_sound(conn):  # e.g. the server restarted since
            self._discard()
            conn = None
        if conn is None:
            session = self._open("switchboard-writer")
            self._local.conn, self._local.name, self._local.pipeline = session.conn, session.name, session.pipeline
            conn = session.conn
        return conn

    def _open(self, kind: str, *, nonblocking: bool = False) -> Session:
        """A writer session: a name of its own (`kind-<hex>`), so that after a lost answer this very
        session can be found and ended, each statement planned once (`plan_once`, docs/adr/0013)."""
        name = f"{kind}-{uuid4().hex[:16]}"
        conn = psycopg.connect(self._url.conninfo(application_name=name), autocommit=True)
        try:
            plan_once(conn)
            if nonblocking:
                conn.pgconn.nonblocking = 1
        except BaseException:
            conn.close()
            raise
        return Session(conn, name, Pipeline(conn))

    def _discard(self) -> None:
        conn = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def insert_events(self, stored_events: Sequence[StoredEvent], **kwargs: Any) -> Sequence[int] | None:
        return self.append(stored_events, **kwargs)[0]

    def append(self, stored_events: Sequence[StoredEvent], *, read: Sequence[str] = (), **kwargs: Any) -> Appended:
        """The append in one round trip; the stored payloads of `read` are selected in it after the
        inline ops and before COMMIT (an error there aborts the transaction: nothing commits)."""
        if not stored_events:
            return [], {}
        plan = self._plan(stored_events, read, kwargs)  # before BEGIN: nothing may raise once sent
        conn = None
        try:
            conn = self._connection()
            pipeline = self._local.pipeline
            return plan.appended(pipeline, pipeline.run(plan.statements))
        except psycopg.Error as error:
            return self._failed(error, conn, getattr(self._local, "name", ""), self._discard, plan)

    def _plan(self, stored_events: Sequence[StoredEvent], read: Sequence[str], kwargs: dict[str, Any]) -> _Plan:
        ops = coalesce_ops(kwargs.get("inline_ops", ()))
        tracked: Sequence[str] = kwargs.get("inline_tracking", ())
        notify = self._notify.get(kwargs.get("notify"))
        wanted = list(dict.fromkeys(read))
        columns = (
            [e.originator_id for e in stored_events], [e.originator_version for e in stored_events],
            [e.topic for e in stored_events], [e.state for e in stored_events],
        )
        statements: list[Statement] = [(b"BEGIN", None, False), (self._lock, None, False)]
        if notify is not None:
            statements.append((notify, None, False))
        # %b: binary arrays; psycopg dumps a text array of bytea item by item in Python (hex + regex
        # escaping), ~1 ms per batch more than the binary one (measured)
        inserted = len(statements)
        statements.append((self._insert_arrays, columns, False))
        statements += [(sql, params, False) for sql, params in ops]  # coalesce_ops made them storable
        if tracked:
            statements.append((self._track, (array_param(list(tracked)),), False))
        payloads_read = len(statements)
        if wanted:  # as this commit leaves them (after its own upserts and prunes)
            statements.append((blobs.READ_ANY, (array_param(wanted),), True))
        statements.append((b"COMMIT", None, False))
        return _Plan(statements, columns, wanted, inserted, payloads_read)

    def _failed(self, error: psycopg.Error, conn: psycopg.Connection | None, name: str,
                discard: Callable[[], None], plan: _Plan) -> Appended:
        """After an append's error: the connection discarded; a conflict raised as such; an
        outcome the error leaves unsure looked for (blocking, up to RESOLVE_FOR)."""
        sqlstate = getattr(error, "sqlstate", None)
        unsure = conn is not None and not isinstance(error, psycopg.errors.IntegrityError) and (
            isinstance(error, psycopg.OperationalError) or conn.broken or conn.closed
            or sqlstate is None or sqlstate[:2] in _UNSURE_CLASSES
        )
        discard()
        if isinstance(error, psycopg.errors.IntegrityError):
            raise IntegrityError(error) from error
        if unsure:
            appended = self._outcome(name, plan.columns, error, plan.wanted)
            if appended is not None:
                return appended
            raise NotCommitted(error) from error
        raise OperationalError(error) from error

    # -- an append whose answer an event loop awaits (docs/adr/0034)

    def open_session(self) -> Session:
        """A connection of its own for a caller on an event loop (blocking: open it on a thread),
        named apart from the writer thread's in pg_stat_activity, and non-blocking: its appends are
        sent from the loop, which never waits."""
        return self._open("switchboard-writer-loop", nonblocking=True)

    def send(self, session: Session, stored_events: Sequence[StoredEvent], *, read: Sequence[str] = (),
             **kwargs: Any) -> SentAppend:
        """Sends the append on `session` and returns at once; its answer is read as it comes
        (`SentAppend.poll`). If sending failed, the append's `error` says why (its outcome may be
        unsure all the same: `SentAppend.failed`)."""
        plan = self._plan(stored_events, read, kwargs)
        appending = SentAppend(self, session, plan)
        try:
            appending.started(session.pipeline.start(plan.statements))
        except psycopg.Error as error:
            appending.error = error
        except BaseException:
            # a parameter that cannot be sent (COMMIT, which has none, was not queued yet):
            # nothing was committed, and the session is mid-pipeline
            session.close()
            raise
        return appending

    def _lookup_connection(self) -> Any:
        if self.connections is not None:
            return self.connections()
        return psycopg.connect(self._url.conninfo(application_name="switchboard-resolver"), autocommit=True)

    def _outcome(self, session: str, columns: tuple[list, ...], error: psycopg.Error,
                 read: Sequence[str]) -> Appended | None:
        """Whether the append whose answer was lost committed: its notification ids and the stored
        payloads of `read` (read again: the answer that held them was lost), or None.

        On a fresh connection: end the lost session if it still lives (pg_terminate_backend, and
        wait for it to go), so its transaction is over — committed or rolled back, never still
        able to commit — then read back what it wrote. The append is one transaction, so all its
        events are there, with these exact bytes, or none of ours is (docs/adr/0014).
        """
        if self.on_unsure is not None:
            self.on_unsure(error)
        deadline = time.monotonic() + RESOLVE_FOR
        while True:
            try:
                with self._lookup_connection() as conn:
                    if session:
                        ended = conn.execute(
                            "SELECT pg_terminate_backend(pid, %s) FROM pg_stat_activity"
                            " WHERE application_name = %s AND pid <> pg_backend_pid()",
                            (FENCE_WAIT_MS, session),
                        ).fetchall()
                        if not all(row[0] for row in ended):
                            raise psycopg.OperationalError("the lost session has not ended yet")
                    rows = conn.execute(
                        SQL("SELECT k.n, e.notification_id, e.topic = k.topic AND e.state = k.state"
                            " FROM unnest(%b::uuid[], %b::bigint[], %b::text[], %b::bytea[])"
                            " WITH ORDINALITY AS k(id, version, topic, state, n)"
                            " JOIN {table} e ON e.originator_id = k.id AND e.originator_version = k.version"
                            " ORDER BY k.n").format(table=Identifier(self.events_table_name)),
                        columns,
                    ).fetchall()
                    ours = len(rows) == len(columns[0]) and all(same for _, _, same in rows)
                    payloads = blobs.stored_rows(
                        conn.execute(blobs.READ_ANY, (list(read),), binary=True).fetchall()) if ours and read else {}
                break
            except (psycopg.Error, StoreUnavailable) as retry:
                if time.monotonic() >= deadline:
                    log.debug("writer: could not learn whether a commit committed: %s", first_line(retry))
                    raise CommitOutcomeUnknown(
                        "store down: whether this was stored is unknown (retrying it is safe)"
                    ) from None
                time.sleep(RESOLVE_PAUSE)
        log.debug("writer: a commit whose answer was lost %s", "had committed" if ours else "had not committed")
        return ([position for _, position, _ in rows], payloads) if ours else None


class _Plan:
    """One append's statements, and where its answers are among their results."""

    __slots__ = ("statements", "columns", "wanted", "inserted", "payloads_read")

    def __init__(self, statements: list[Statement], columns: tuple[list, ...], wanted: list[str], inserted: int,
                 payloads_read: int) -> None:
        self.statements, self.columns, self.wanted = statements, columns, wanted
        self.inserted, self.payloads_read = inserted, payloads_read

    def appended(self, pipeline: Pipeline, results: list[Any]) -> Appended:
        ids = [value for value, in pipeline.rows(results[self.inserted])]
        return ids, (blobs.stored_rows(pipeline.rows(results[self.payloads_read])) if self.wanted else {})


class Session:
    """A writer connection used by one event loop's batches (`PostgresEventRecorder.open_session`)."""

    def __init__(self, conn: psycopg.Connection, name: str, pipeline: Pipeline) -> None:
        self.conn, self.name, self.pipeline = conn, name, pipeline

    def sound(self) -> bool:
        return idle_and_sound(self.conn)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.conn.close()


class SentAppend:
    """An append on its way (`PostgresEventRecorder.send`)."""

    def __init__(self, recorder: PostgresEventRecorder, session: Session, plan: _Plan) -> None:
        self._recorder, self._session, self._plan = recorder, session, plan
        self._sent: Sent | None = None
        self.socket = -1
        self.error: psycopg.Error | None = None
        """Why sending failed, if it did."""

    def started(self, sent: Sent) -> None:
        self._sent, self.socket = sent, sent.socket

    def flush(self) -> bool:
        """Hands what it can of the append to the socket; True once all of it has gone."""
        assert self._sent is not None
        return self._sent.flush()

    def poll(self) -> Appended | None:
        """The append's answer once it has come, else None; raises `psycopg.Error` on failure."""
        assert self._sent is not None
        results = self._sent.poll()
        return None if results is None else self._plan.appended(self._session.pipeline, results)

    def close(self) -> None:
        self._session.close()

    def failed(self, error: BaseException) -> Appended:
        """As `append` does after an error: closes the session, raises the conflict or the store's
        error, or returns the append if its answer was lost but it committed. Any error that is
        not the server's (e.g. reading an answer that had come) leaves the outcome unsure.
        Blocking (a lost answer is looked for up to RESOLVE_FOR): call it on a thread."""
        if not isinstance(error, psycopg.Error):
            error = psycopg.OperationalError(f"{type(error).__name__}: {error}")
        session = self._session
        return self._recorder._failed(error, session.conn, session.name, session.close, self._plan)
