"""PostgreSQL connections: the request pool (`Connections`), the check that an idle connection is
still sound, and the plan settings a connection is set up with (docs/adr/0013, docs/adr/0014).
"""

from __future__ import annotations

import contextlib
import select
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import contextmanager

import psycopg
from psycopg.pq import TransactionStatus

from application.errors import ConfigurationError, StoreUnavailable, first_line

# Every statement is planned for its parameters and for the table as it is now (docs/adr/0013),
# but on the appender's sessions and the claim reads' (`ONE_PLAN`: each of theirs finds its rows by
# an index, planned once).
# psycopg prepares a statement on the server after 5 runs, and PostgreSQL may then keep a generic
# plan costed on the table as it was: the event log starts with a handful of rows, so the stream
# look-up was cached as a sequential scan and stayed one (measured: 3,287 scans reading 21.7 M
# rows in one 10 s ingest run, ~0.7 ms of PostgreSQL CPU per delivery) until an ANALYZE, which
# nothing guarantees. Set after connecting, not as a startup option: that would replace the
# operator's PGOPTIONS, and poolers such as PgBouncer refuse startup options they do not track.
PLAN_PER_RUN = "SET plan_cache_mode = force_custom_plan"
ONE_PLAN = ("SET plan_cache_mode = force_generic_plan", "SET enable_seqscan = off")
"""For a session whose every statement names its rows by an index (the appender's, the candidate
reads'): each is planned once, for any table size, since with sequential scans priced out the
generic plan is that index's however small the table was when it was made (docs/adr/0013)."""

POOL_WAIT = 1.0
"""Longest a request waits for a PostgreSQL connection (a free one, or a new one connecting):
then it is answered 503 `store down` (CONTRACT §12, docs/adr/0014)."""


def plan_per_run(conn: psycopg.Connection) -> None:
    """Set-up of an autocommit connection: custom plans only (a pool's `configure`, or right after
    connecting)."""
    conn.execute(PLAN_PER_RUN)


def plan_once(conn: psycopg.Connection) -> None:
    """Set-up of an autocommit connection whose statements all read or write by an index (ONE_PLAN)."""
    for setting in ONE_PLAN:
        conn.execute(setting)


def idle_and_sound(conn: psycopg.Connection) -> bool:
    """A pooled connection is reusable: open, idle, and nothing waiting on its socket. An idle
    session is sent nothing unasked, so anything readable is the server's goodbye (a FATAL before
    it closed: a restart, pg_terminate_backend) or the end of the stream: one poll, no round trip."""
    if conn.closed or conn.broken or conn.info.transaction_status != TransactionStatus.IDLE:
        return False
    try:
        readable, _, _ = select.select([conn.fileno()], [], [], 0)
    except (OSError, ValueError, psycopg.Error):
        return False
    return not readable


class Connections:
    """One process's PostgreSQL connections for requests and reads: at most `size` open at once.

    psycopg_pool waited up to its timeout for a connection during an outage, and after one it
    reconnected with exponential back-off, so it came back seconds to minutes after the database
    did. Here a request takes a free slot (waiting `POOL_WAIT` at most), then an idle connection
    that is still sound, else connects itself: while PostgreSQL refuses, that fails at once
    (503); the first request after it is back connects again (no back-off, no restart). The
    connect runs on a helper thread, so even one that hangs (a dropped network) costs the request
    no more than what is left of `POOL_WAIT`; it finishes in the background and is then closed.
    """

    def __init__(self, conninfo: str, size: int, configure: Callable[[psycopg.Connection], None] | None = None,
                 *, wait: float = POOL_WAIT) -> None:
        if size < 1:
            raise ConfigurationError(f"a pool needs at least one connection, not {size}")
        self.size = size
        self.wait = wait
        self._conninfo = conninfo
        self._configure = configure
        self._slots = threading.BoundedSemaphore(size)
        self._idle: list[psycopg.Connection] = []
        self._lock = threading.Lock()
        self._connector = ThreadPoolExecutor(max_workers=size, thread_name_prefix="switchboard-connect")
        self._closed = False

    def _connect(self) -> psycopg.Connection:
        conn = psycopg.connect(self._conninfo, autocommit=True)
        try:
            if self._configure is not None:
                self._configure(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    def _take(self, deadline: float) -> psycopg.Connection:
        while True:
            with self._lock:
                conn = self._idle.pop() if self._idle else None
            if conn is None:
                break
            if idle_and_sound(conn):
                return conn
            with contextlib.suppress(Exception):
                conn.close()
        future = self._connector.submit(self._connect)
        try:
            return future.result(timeout=max(deadline - time.monotonic(), 0.0))
        except FutureTimeout:
            future.add_done_callback(_close_late)
            raise StoreUnavailable(f"store unavailable: no connection to PostgreSQL within {self.wait:g} s") from None
        except psycopg.Error as error:
            raise StoreUnavailable(f"store unavailable: {first_line(error)}") from None

    def _put(self, conn: psycopg.Connection) -> None:
        if self._closed or conn.closed or conn.broken or conn.info.transaction_status != TransactionStatus.IDLE:
            with contextlib.suppress(Exception):
                conn.close()
            if conn.broken:  # the server went away: the idle ones are likely gone too
                self.flush()
            return
        with self._lock:
            self._idle.append(conn)

    @contextmanager
    def connection(self, timeout: float | None = None) -> Iterator[psycopg.Connection]:
        """A connection for the block; `StoreUnavailable` when none is free within the wait."""
        wait = self.wait if timeout is None else min(timeout, self.wait)
        deadline = time.monotonic() + wait
        if self._closed:
            raise StoreUnavailable("store is closed")
        if not self._slots.acquire(timeout=wait):
            raise StoreUnavailable(f"store unavailable: no free PostgreSQL connection within {wait:g} s "
                                   f"(SWITCHBOARD_PG_POOL_SIZE={self.size})")
        try:
            conn = self._take(deadline)
            try:
                yield conn
            finally:
                self._put(conn)
        finally:
            self._slots.release()

    def flush(self) -> None:
        """Closes every idle connection (a new one is made when next needed)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            with contextlib.suppress(Exception):
                conn.close()

    def close(self) -> None:
        self._closed = True
        self._connector.shutdown(wait=False, cancel_futures=True)
        self.flush()


def _close_late(future) -> None:
    """A connect that finished after its request gave up on it."""
    if not future.cancelled() and future.exception() is None:
        with contextlib.suppress(Exception):
            future.result().close()

