"""One seam to the SQL database (SQLite or PostgreSQL) for read models and queries.

SQL is written once with `%s` placeholders; SQLite gets them as `?`. Events themselves are
written by eventsourcing's recorders (see recorders.py), never here.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import psycopg
import psycopg_pool

from application.errors import ConfigurationError, StoreUnavailable

# Every statement is planned for its parameters and for the table as it is now (docs/adr/0013).
# psycopg prepares a statement on the server after 5 runs, and PostgreSQL may then keep a generic
# plan costed on the table as it was: the event log starts with a handful of rows, so the stream
# look-up was cached as a sequential scan and stayed one (measured: 3,287 scans reading 21.7 M
# rows in one 10 s ingest run, ~0.7 ms of PostgreSQL CPU per delivery) until an ANALYZE, which
# nothing guarantees. Set after connecting, not as a startup option: that would replace the
# operator's PGOPTIONS, and poolers such as PgBouncer refuse startup options they do not track.
PLAN_PER_RUN = "SET plan_cache_mode = force_custom_plan"


def plan_per_run(conn: psycopg.Connection) -> None:
    """Set-up of an autocommit connection: custom plans only (a pool's `configure`, or right after
    connecting)."""
    conn.execute(PLAN_PER_RUN)


@dataclass(frozen=True)
class DatabaseUrl:
    """A parsed `sqlite:///PATH` or `postgresql://user[:pw]@host[:port]/db`."""

    dialect: str
    path: str = ""
    host: str = ""
    port: int = 5432
    user: str = ""
    password: str = ""
    dbname: str = ""

    @classmethod
    def parse(cls, url: str) -> DatabaseUrl:
        if url.startswith("sqlite:///"):
            path = url[len("sqlite:///"):]
            if not path:
                raise ConfigurationError(f"bad database URL {url!r}: sqlite:///PATH needs a path")
            return cls("sqlite", path=path)
        parsed = urlparse(url)
        if parsed.scheme in ("postgresql", "postgres"):
            dbname = parsed.path.lstrip("/")
            if not parsed.hostname or not dbname:
                raise ConfigurationError(f"bad database URL {url!r}: postgresql://user[:pw]@host[:port]/db")
            try:
                port = parsed.port or 5432
            except ValueError:
                raise ConfigurationError(f"bad database URL {url!r}: bad port") from None
            return cls(
                "postgres", host=parsed.hostname, port=port, user=unquote(parsed.username or "postgres"),
                password=unquote(parsed.password or ""), dbname=dbname,
            )
        raise ConfigurationError(
            f"bad database URL {url!r}: expected sqlite:///PATH or postgresql://user[:pw]@host[:port]/db"
        )

    def conninfo(self) -> str:
        return psycopg.conninfo.make_conninfo(
            host=self.host, port=self.port, user=self.user, password=self.password or None,
            dbname=self.dbname, connect_timeout=5,
        )


class LockBusy(StoreUnavailable):
    """A lock was not granted within the `lock_timeout_ms` its transaction asked for."""


class Tx:
    """A transaction: run statements, get tuples back."""

    def __init__(self, cursor: Any, dialect: str) -> None:
        self._cursor = cursor
        self._sqlite = dialect == "sqlite"

    def _sql(self, sql: str) -> str:
        return sql.replace("%s", "?") if self._sqlite else sql

    def execute(self, sql: str, params: Sequence[Any] = (), *, binary: bool = False) -> list[tuple]:
        """`binary`: PostgreSQL sends the results in binary format (bytea as bytes, not hex)."""
        if self._sqlite:
            self._cursor.execute(self._sql(sql), tuple(params))
        else:  # without parameters a prepared plan is generic by definition: planned each run instead
            self._cursor.execute(sql, tuple(params), binary=binary, prepare=False if not params else None)
        if self._cursor.description is None:
            return []
        return [tuple(row) for row in self._cursor.fetchall()]

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        if rows:
            self._cursor.executemany(self._sql(sql), [tuple(r) for r in rows])

    @property
    def rowcount(self) -> int:
        return self._cursor.rowcount

    def run_ops(self, ops: Sequence[tuple[str, Sequence[Any]]]) -> None:
        """Runs ops in order, batching runs of the same statement into one executemany."""
        run_ops(self._cursor, ops, "?" if self._sqlite else "%s")


def _storable(params: Sequence[Any]) -> tuple[Any, ...]:
    """PostgreSQL text cannot hold NUL; replaced the same way on every store (rebuild equals live)."""
    return tuple(p.replace("\x00", "\ufffd") if isinstance(p, str) and "\x00" in p else p for p in params)


def run_ops(cursor: Any, ops: Sequence[tuple[str, Sequence[Any]]], placeholder: str) -> None:
    """Runs projection ops on any DB-API cursor; consecutive identical statements go as one executemany.

    Read models are derived data: a value no store can hold must never stop a projection.
    """
    i = 0
    while i < len(ops):
        sql = ops[i][0]
        j = i
        while j < len(ops) and ops[j][0] == sql:
            j += 1
        statement = sql if placeholder == "%s" else sql.replace("%s", placeholder)
        if j - i == 1:
            cursor.execute(statement, _storable(ops[i][1]))
        else:
            cursor.executemany(statement, [_storable(op[1]) for op in ops[i:j]])
        i = j


class Database:
    """Connections for read models: a pool on PostgreSQL, one connection per thread on SQLite."""

    def __init__(self, url: DatabaseUrl, *, pool_size: int = 8) -> None:
        self.url = url
        self.dialect = url.dialect
        self._local = threading.local()
        self._sqlite_conns: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        self._pool: psycopg_pool.ConnectionPool | None = None
        if self.dialect == "postgres":
            self._pool = psycopg_pool.ConnectionPool(
                url.conninfo(), min_size=1, max_size=pool_size, open=False,
                kwargs={"autocommit": True}, configure=plan_per_run, timeout=10,
            )
        else:
            Path(url.path).parent.mkdir(parents=True, exist_ok=True)

    def open(self) -> None:
        if self._pool is not None:
            try:
                psycopg.connect(self.url.conninfo()).close()  # fails fast, unlike a pool
            except psycopg.Error as error:
                first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
                raise StoreUnavailable(
                    f"cannot reach PostgreSQL at {self.url.host}:{self.url.port}/{self.url.dbname}: {first}"
                ) from None
            try:
                self._pool.open(wait=True, timeout=5)
            except psycopg_pool.PoolTimeout:
                raise StoreUnavailable(
                    f"cannot reach PostgreSQL at {self.url.host}:{self.url.port}/{self.url.dbname}"
                ) from None

    def _sqlite_conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.url.path, timeout=30, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA busy_timeout=30000")
            self._local.conn = conn
            with self._lock:
                self._sqlite_conns.append(conn)
        return conn

    @contextmanager
    def transaction(self, *, write: bool = True, snapshot: bool = False, derived: bool = False,
                    lock_timeout_ms: int | None = None) -> Iterator[Tx]:
        """A write transaction (serialised on SQLite), or a read snapshot.

        `lock_timeout_ms` (PostgreSQL): waiting longer than that for a lock raises `LockBusy`.

        `derived`: it writes only what the log can rebuild (read models and their tracking rows,
        together), so on PostgreSQL it commits without waiting for its WAL flush. A crash may
        lose the last such commits whole, never half of one: the rows and the position that
        says they are applied go together, and the next catch-up applies those events again.
        """
        if self._pool is None:
            conn = self._sqlite_conn()
            cursor = conn.cursor()
            cursor.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            try:
                yield Tx(cursor, "sqlite")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            else:
                conn.execute("COMMIT")
            return
        try:
            with self._pool.connection() as conn:
                if snapshot:
                    conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
                    try:
                        yield Tx(conn.cursor(), "postgres")
                    finally:
                        conn.execute("ROLLBACK")
                    return
                with conn.transaction():
                    if derived:
                        conn.execute("SET LOCAL synchronous_commit TO off")
                    if lock_timeout_ms is not None:
                        conn.execute(f"SET LOCAL lock_timeout = {int(lock_timeout_ms)}")
                    yield Tx(conn.cursor(), "postgres")
        except psycopg.errors.LockNotAvailable as error:
            if lock_timeout_ms is not None:  # the store is there; the lock was not, in the time asked
                raise LockBusy(f"lock not granted in {lock_timeout_ms} ms: {error}") from None
            raise StoreUnavailable(f"store unavailable: {error}") from None
        except (psycopg.OperationalError, psycopg_pool.PoolTimeout) as error:
            raise StoreUnavailable(f"store unavailable: {error}") from None

    def ping(self, timeout: float = 2.0) -> bool:
        """Whether the database answers within `timeout` seconds (for /healthz)."""
        try:
            if self._pool is None:
                self._sqlite_conn().execute("SELECT 1").fetchall()
            else:
                with self._pool.connection(timeout=timeout) as conn:
                    conn.execute("SELECT 1")
            return True
        except (sqlite3.Error, psycopg.Error, psycopg_pool.PoolTimeout):
            return False

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple]:
        """One statement on its own (autocommit): no BEGIN/COMMIT round trips."""
        if self._pool is None:
            cursor = self._sqlite_conn().cursor()
            return Tx(cursor, "sqlite").execute(sql, params)
        try:
            with self._pool.connection() as conn:
                return Tx(conn.cursor(), "postgres").execute(sql, params)
        except (psycopg.OperationalError, psycopg_pool.PoolTimeout) as error:
            raise StoreUnavailable(f"store unavailable: {error}") from None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
        with self._lock:
            for conn in self._sqlite_conns:
                conn.close()
            self._sqlite_conns.clear()
