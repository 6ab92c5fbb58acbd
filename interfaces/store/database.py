"""One seam to the SQL database (SQLite or PostgreSQL) for read models and queries.

SQL is written once with `%s` placeholders; SQLite gets them as `?`. Events themselves are
written by eventsourcing's recorders (see recorders.py), never here. The PostgreSQL request pool
and the plan settings of its connections are in connections.py; how read-model ops are run and
coalesced, in ops.py; the tables and their upgrades, in schema.py.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import psycopg
from psycopg.adapt import PyFormat

from application.errors import ConfigurationError, StoreUnavailable, first_line
from interfaces.store.connections import POOL_WAIT, Connections, plan_once, plan_per_run
from interfaces.store.ops import coalesce_ops, run_ops
from interfaces.store.pipeline import Pipeline, convert

INDEXED_POOL_SIZE = 2
"""Connections for `indexed_column`, opened as needed: the claim candidates' reads of the writer
thread and of its read-ahead thread (`application_name` switchboard-claims)."""
DEFAULT_POOL_SIZE = 10
SQLITE_BUSY_TIMEOUT_MS = 30_000
"""How long a SQLite connection waits for another's lock before it answers `database is locked`."""


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

    def conninfo(self, *, application_name: str = "switchboard") -> str:
        """libpq's shortest connect timeout (2 s); the request pool never waits that long for a
        connect (see `Connections`), the writer may."""
        return psycopg.conninfo.make_conninfo(
            host=self.host, port=self.port, user=self.user, password=self.password or None,
            dbname=self.dbname, connect_timeout=2, application_name=application_name,
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

    def apply_ops(self, ops: Sequence[tuple[str, Sequence[Any]]]) -> None:
        """Runs ops for their effect alone: on PostgreSQL coalesced (`coalesce_ops`) and sent as one
        pipeline (one round trip; an error surfaces at its end and fails the transaction), on
        SQLite one by one (`run_ops`)."""
        if self._sqlite:
            run_ops(self._cursor, ops, "?")
            return
        coalesced = coalesce_ops(ops)
        if not coalesced:
            return
        conn = self._cursor.connection
        raw = psycopg.RawCursor(conn)
        with conn.pipeline():
            for sql, params in coalesced:
                numbered = _numbered(sql)
                if numbered is not None:
                    raw.execute(numbered, params)
                else:
                    self._cursor.execute(sql, params)


def _numbered(sql: str) -> bytes | None:
    """The statement with `$n` placeholders, when each of its own is a plain `%s`; else None.

    A coalesced statement has a row's parameters per row: past 50, psycopg converts its
    placeholders afresh on every execute (a regex split, uncached), ~1/4 of the projector
    process's CPU under ingest (measured). `convert` caches the conversion, and a raw cursor
    sends the `$n` text as it is, each parameter adapted as `%s` adapts it."""
    try:
        query, formats = convert(sql.encode())
    except ValueError:  # a placeholder `convert` does not know: left to psycopg
        return None
    return query if formats.count(PyFormat.AUTO) == len(formats) else None  # one C loop: a page's VALUES has thousands


class Database:
    """Connections for read models: a pool on PostgreSQL, one connection per thread on SQLite."""

    def __init__(self, url: DatabaseUrl, *, pool_size: int = DEFAULT_POOL_SIZE,
                 application_name: str = "switchboard") -> None:
        self.url = url
        self.dialect = url.dialect
        self._local = threading.local()
        self._sqlite_conns: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        self._pool: Connections | None = None
        self._indexed: Connections | None = None
        self._readers: dict[int, Pipeline] = {}
        """`indexed_column`'s pipeline of each of its connections (its statements prepared there), by
        the connection's id; those of connections closed since are dropped as another comes."""
        if self.dialect == "postgres":
            self._pool = Connections(url.conninfo(application_name=application_name), pool_size, plan_per_run)
            self._indexed = Connections(url.conninfo(application_name=f"{application_name}-claims"), INDEXED_POOL_SIZE,
                                        plan_once)
        else:
            Path(url.path).parent.mkdir(parents=True, exist_ok=True)

    def open(self) -> None:
        if self._pool is not None:
            try:
                psycopg.connect(self.url.conninfo()).close()
            except psycopg.Error as error:
                raise StoreUnavailable(
                    f"cannot reach PostgreSQL at {self.url.host}:{self.url.port}/{self.url.dbname}: {first_line(error)}"
                ) from None

    def _sqlite_conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.url.path, timeout=30, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
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
        except psycopg.OperationalError as error:
            raise StoreUnavailable(f"store unavailable: {first_line(error)}") from None

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection]:
        """A pooled PostgreSQL connection (autocommit), for eventsourcing's reads (eventstore.py)."""
        assert self._pool is not None, "PostgreSQL only"
        with self._pool.connection() as conn:
            yield conn

    def maintain(self, sql: str, *, lock_timeout_ms: int) -> None:
        """PostgreSQL: a statement that cannot run in a transaction (VACUUM), waiting at most
        `lock_timeout_ms` for its locks (`LockBusy` after that: it did nothing)."""
        try:
            with self.connection() as conn:
                conn.execute(f"SET lock_timeout = {int(lock_timeout_ms)}")
                try:
                    conn.execute(sql)
                finally:
                    conn.execute("RESET lock_timeout")
        except psycopg.errors.LockNotAvailable as error:
            raise LockBusy(f"lock not granted in {lock_timeout_ms} ms: {first_line(error)}") from None
        except psycopg.OperationalError as error:
            raise StoreUnavailable(f"store unavailable: {first_line(error)}") from None

    def file_bytes(self) -> int:
        """SQLite: the bytes the database takes on disk — its file plus its write-ahead log (`-wal`),
        which holds every page written since the last checkpoint (a VACUUM writes the whole
        database there) and keeps its size until a checkpoint truncates it."""
        total = 0
        for suffix in ("", "-wal"):
            with contextlib.suppress(FileNotFoundError):
                total += Path(self.url.path + suffix).stat().st_size
        return total

    def checkpoint(self, *, wait_ms: int) -> bool:
        """SQLite: copies the write-ahead log into the database file, which takes the size the log
        says (smaller after a VACUUM), and truncates the log to nothing (`wal_checkpoint(TRUNCATE)`).
        It waits at most `wait_ms` (holding off writers meanwhile) for readers of older snapshots
        to finish; False when some still read one: then part of the log stays, and with it the
        space, until a later checkpoint."""
        conn = self._sqlite_conn()
        conn.execute(f"PRAGMA busy_timeout={int(wait_ms)}")
        try:
            busy = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
        except sqlite3.OperationalError as error:
            if "locked" not in str(error) and "busy" not in str(error):
                raise
            busy = 1
        finally:
            conn.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        return not busy

    def ping(self, timeout: float = POOL_WAIT) -> bool:
        """Whether the database answers (for /healthz): a connection within `timeout` seconds."""
        try:
            if self._pool is None:
                self._sqlite_conn().execute("SELECT 1").fetchall()
            else:
                with self._pool.connection(timeout=timeout) as conn:
                    conn.execute("SELECT 1")
            return True
        except (sqlite3.Error, psycopg.Error, StoreUnavailable):
            return False

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple]:
        """One statement on its own (autocommit): no BEGIN/COMMIT round trips."""
        if self._pool is None:
            cursor = self._sqlite_conn().cursor()
            return Tx(cursor, "sqlite").execute(sql, params)
        try:
            with self._pool.connection() as conn:
                return Tx(conn.cursor(), "postgres").execute(sql, params)
        except psycopg.OperationalError as error:
            raise StoreUnavailable(f"store unavailable: {first_line(error)}") from None

    def indexed_column(self, sql: str, params: Sequence[Any]) -> list[Any]:
        """The first column of the rows of one statement that finds them by an index whatever the
        tables' sizes (autocommit): the claims' reads of their candidates, and the claim lanes'
        statements (lanes.py). On PostgreSQL as the text the server sends, in bytes, on
        connections of its own that plan each statement once (ONE_PLAN) and through the `pq`
        layer (pipeline.py): for the 64 candidate ids a claim batch reads, a cursor on the request
        pool took 3× the CPU here and its planning per run ~200 µs of the server's (docs/adr/0004,
        session 22)."""
        if self._indexed is None:
            return [row[0] for row in self.query(sql, params)]
        try:
            with self._indexed.connection() as conn:
                reader = self._readers.get(id(conn))
                if reader is None or reader.connection is not conn:
                    reader = self._reader(conn)
                try:
                    [result] = reader.run([(sql, params, False)])
                except BaseException:
                    # a pipeline that failed may leave names it prepared unknown to the server:
                    # the connection goes (pipeline.py), and the pool opens another
                    conn.close()
                    raise
                return [result.get_value(row, 0) for row in range(result.ntuples)]
        except psycopg.OperationalError as error:
            raise StoreUnavailable(f"store unavailable: {first_line(error)}") from None

    def _reader(self, conn: psycopg.Connection) -> Pipeline:
        """A pipeline for a connection `indexed_column` has not used yet; the pool closes those it
        gives up (unsound, broken, failed), and their pipelines go with them here."""
        with self._lock:
            for key in [key for key, reader in self._readers.items() if reader.connection.closed]:
                del self._readers[key]
            reader = self._readers[id(conn)] = Pipeline(conn, prefix=b"sb_column_")
        return reader

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
        if self._indexed is not None:
            self._indexed.close()
        with self._lock:
            for conn in self._sqlite_conns:
                conn.close()
            self._sqlite_conns.clear()
