"""One seam to the SQL database (SQLite or PostgreSQL) for read models and queries.

SQL is written once with `%s` placeholders; SQLite gets them as `?`. Events themselves are
written by eventsourcing's recorders (see recorders.py), never here.
"""

from __future__ import annotations

import contextlib
import functools
import re
import select
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import psycopg
from psycopg.adapt import PyFormat
from psycopg.pq import TransactionStatus

from application.errors import ConfigurationError, StoreUnavailable, first_line
from interfaces.store.pipeline import Pipeline, convert

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
INDEXED_POOL_SIZE = 2
"""Connections for `indexed_column`, opened as needed: the claim candidates' reads of the writer
thread and of its read-ahead thread (`application_name` switchboard-claims)."""

POOL_WAIT = 1.0
"""Longest a request waits for a PostgreSQL connection (a free one, or a new one connecting):
then it is answered 503 `store down` (CONTRACT §12, docs/adr/0014)."""
DEFAULT_POOL_SIZE = 10
SQLITE_BUSY_TIMEOUT_MS = 30_000
"""How long a SQLite connection waits for another's lock before it answers `database is locked`."""


def plan_per_run(conn: psycopg.Connection) -> None:
    """Set-up of an autocommit connection: custom plans only (a pool's `configure`, or right after
    connecting)."""
    conn.execute(PLAN_PER_RUN)


def plan_once(conn: psycopg.Connection) -> None:
    """Set-up of an autocommit connection whose statements all read or write by an index (ONE_PLAN)."""
    for setting in ONE_PLAN:
        conn.execute(setting)


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


def storable(params: Sequence[Any]) -> tuple[Any, ...]:
    """PostgreSQL text cannot hold NUL; replaced the same way on every store (rebuild equals live)."""
    for p in params:  # the usual case, no NUL anywhere: the parameters as they are (a writer batch has hundreds)
        if isinstance(p, str) and "\x00" in p:
            return tuple(p.replace("\x00", "\ufffd") if isinstance(p, str) else p for p in params)
    return params if type(params) is tuple else tuple(params)


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
            cursor.execute(statement, storable(ops[i][1]))
        else:
            cursor.executemany(statement, [storable(op[1]) for op in ops[i:j]])
        i = j


_KEYED_WHERE = re.compile(r"(?:UPDATE (\w+) SET (.*)|DELETE FROM (\w+)) WHERE (\w+) = %s")
_KEYED_UPSERT = re.compile(
    r"INSERT INTO (\w+) \(([\w, ]+)\) VALUES (\((?:%s|\d+)(?:, (?:%s|\d+))*\))"
    r" ON CONFLICT \(([\w, ]+)\) DO (?:UPDATE SET (.*)|NOTHING)")
_KEYED_INSERT = re.compile(r"INSERT INTO (\w+) \(([\w, ]+)\) VALUES (\((?:%s|\d+)(?:, (?:%s|\d+))*\))")
_ADDITIVE = re.compile(r"(\w+) = (\w+)\.\1 \+ excluded\.\1")

RowShape = tuple[str, str, str, "int | tuple[int, ...]", "int | None"]
"""(kind, table, key column(s), index or indexes of the key parameter(s), index of the increment)."""


def _row_key_shape(sql: str) -> RowShape | None:
    """How a single-row op names its row: (kind, table, key column(s), index or indexes of the key
    parameter(s), index of the increment of an additive upsert), or None when it cannot be told from
    the statement (then the op is never moved or merged).

    Recognised: `UPDATE t SET ... WHERE col = %s`, `DELETE FROM t WHERE col = %s` (the key the
    last parameter), `INSERT INTO t (cols) VALUES (%s, 1, ...) ON CONFLICT (col, ...) DO UPDATE SET ...`
    (the key the parameters of the conflict columns) or `... DO NOTHING` (`nothing`), and a plain
    `INSERT INTO t (col, ...) VALUES (%s, ...)` whose values are parameters or integers (the key its
    first column, the one our inline tables are keyed by); none with a sub-select, none that
    assigns its key column. An upsert whose only assignment is `c = t.c + excluded.c` is `add`:
    its ops on one row add up (`coalesce_ops` sums their increments).
    """
    if "SELECT" in sql:
        return None
    count = sql.count("%s")
    where = _KEYED_WHERE.fullmatch(sql)
    if where is not None:
        table, assigned, deleted, column = where.groups()
        if assigned is not None and re.search(rf"\b{column}\b", assigned):
            return None
        return ("update" if deleted is None else "delete"), table or deleted, column, count - 1, None
    upsert = _KEYED_UPSERT.fullmatch(sql)
    if upsert is not None:
        table, columns, values, conflict, assigned = upsert.groups()
        names = [c.strip() for c in columns.split(",")]
        keys = [c.strip() for c in conflict.split(",")]
        given = [v.strip() == "%s" for v in values[1:-1].split(",")]
        if len(names) != len(given) or count != sum(given):
            return None
        param = {name: given[:i].count(True) for i, name in enumerate(names) if given[i]}  # column -> its parameter
        if not all(k in param for k in keys):
            return None
        at = param[keys[0]] if len(keys) == 1 else tuple(param[k] for k in keys)
        if assigned is None:
            return "nothing", table, conflict, at, None
        if any(re.search(rf"\b{k}\s*=", assigned) for k in keys):
            return None
        additive = _ADDITIVE.fullmatch(assigned)
        if additive is not None and additive.group(2) == table and additive.group(1) in param \
                and additive.group(1) not in keys:
            return "add", table, conflict, at, param[additive.group(1)]
        return "upsert", table, conflict, at, None
    insert = _KEYED_INSERT.fullmatch(sql)
    if insert is not None:
        table, columns, values = insert.groups()
        names = [c.strip() for c in columns.split(",")]
        if len(names) == len(values.split(",")) and values.startswith("(%s"):
            return "insert", table, names[0], 0, None
    return None


@functools.lru_cache(maxsize=1024)
def _shape_of(sql: str) -> tuple[RowShape, int] | None:
    """A statement's `_row_key_shape` and its placeholder count, once (a batch names a few
    statements hundreds of times)."""
    shape = _row_key_shape(sql)
    return None if shape is None else (shape, sql.count("%s"))


def _keyed(sql: str, params: Sequence[Any]) -> tuple[RowShape, Any] | None:
    """The shape of a single-row op (`_row_key_shape`) and the key value of its row, or None."""
    found = _shape_of(sql)
    if found is None or found[1] != len(params):
        return None
    shape = found[0]
    at = shape[3]
    return shape, (params[at] if isinstance(at, int) else tuple(params[i] for i in at))


_PLAIN_ITEMS = re.compile(r"[A-Za-z0-9_.:-]+(?:,[A-Za-z0-9_.:-]+)*")


def array_param(values: list[Any]) -> Any:
    """An `= ANY(%s)` parameter: text items that need no quoting (ids, as the keys of our inline
    tables are) as the array's literal `{a,b}`, which psycopg sends as it is (it dumps a list
    item by item in Python, a regular expression each: ~4x the time); anything else, the list.
    Either is a parameter of unknown type, which the server reads as an array of the column's type."""
    if all(type(v) is str for v in values):
        joined = ",".join(values)
        if joined.count(",") == len(values) - 1 and _PLAIN_ITEMS.fullmatch(joined) and "null" not in joined.lower():
            return "{" + joined + "}"
    return values


_UNKEYED = object()
_WHOLE_ROW = frozenset({"upsert", "add", "nothing", "insert"})
"""Kinds whose ops of one statement merge into one multi-row VALUES whatever their parameters."""


def coalesce_ops(ops: Sequence[tuple[str, Sequence[Any]]]) -> list[tuple[str, tuple[Any, ...]]]:
    """PostgreSQL: the same ops in fewer statements (a writer batch's inline ops are ~3 per event,
    a catch-up page's ~4).

    Within a stretch of single-row ops (`_keyed`) that name distinct rows — per table one key
    (column or columns), each key value once — the ops touch disjoint rows, so their order does
    not matter: the UPDATEs or DELETEs of one statement with the same other parameters become one
    `col = ANY(%s)`, and the inserts or upserts of one statement one multi-row VALUES. A row may be
    named again in its stretch only by the very statement that named it first when that statement
    is an additive upsert (`add`: the increments are summed into one row, as adding commutes) or
    `ON CONFLICT ... DO NOTHING` with the same parameters (the repeat does nothing, and is left
    out). Any other op, and any other second naming of a row, ends the stretch; nothing moves
    across it. NUL in text is replaced first (`storable`), as `run_ops` does.
    """
    out: list[tuple[str, tuple[Any, ...]]] = []
    groups: dict[tuple[Any, ...], list[tuple[Any, ...]]] = {}
    sqls: dict[tuple[Any, ...], tuple[str, RowShape]] = {}
    columns: dict[str, str] = {}
    rows: dict[tuple[str, Any], tuple[str, tuple[Any, ...], int]] = {}
    """Each row named in the stretch: the statement and parameters that named it, and where its
    member sits in that statement's group."""

    def flush() -> None:
        for group, members in groups.items():
            sql, (kind, _, column, _, _) = sqls[group]
            if len(members) == 1:
                out.append((sql, members[0]))
            elif kind in ("upsert", "add", "nothing"):
                head, values, tail = sql.partition(" VALUES ")[0], _KEYED_UPSERT.fullmatch(sql).group(3), \
                    sql.partition(" ON CONFLICT ")[2]
                out.append((f"{head} VALUES {', '.join([values] * len(members))} ON CONFLICT {tail}",
                            tuple(p for m in members for p in m)))
            elif kind == "insert":
                head, values = sql.partition(" VALUES ")[0], _KEYED_INSERT.fullmatch(sql).group(3)
                out.append((f"{head} VALUES {', '.join([values] * len(members))}", tuple(p for m in members for p in m)))
            else:
                prefix = sql[: -len(f"{column} = %s")]
                out.append((f"{prefix}{column} = ANY(%s)", (*members[0][:-1], array_param([m[-1] for m in members]))))
        groups.clear()
        sqls.clear()
        columns.clear()
        rows.clear()

    for sql, raw in ops:
        params = storable(raw)
        keyed = _keyed(sql, params)
        if keyed is None:
            flush()
            out.append((sql, params))
            continue
        shape, key = keyed
        kind, table, column, _, increment = shape
        try:
            named = rows.get((table, key)) if key is not None else _UNKEYED
        except TypeError:  # an unhashable key: no row we can tell apart
            named = _UNKEYED
        if named is _UNKEYED:  # no row named, or none we can tell apart
            flush()
            out.append((sql, params))
            continue
        if named is not None and named[0] == sql:
            first_sql, first_params, at = named
            if kind == "nothing" and first_params == params:
                continue  # it does nothing: the row is there since the first
            if kind == "add" and isinstance(params[increment], int) and isinstance(first_params[increment], int) \
                    and first_params[:increment] + first_params[increment + 1:] == params[:increment] + params[increment + 1:]:
                members = groups[(sql,)]
                summed = list(members[at])
                summed[increment] += params[increment]
                members[at] = tuple(summed)
                rows[(table, key)] = (first_sql, members[at], at)
                continue
        if columns.get(table, column) != column or named is not None:
            flush()
        columns[table] = column
        group = (sql,) if kind in _WHOLE_ROW else (sql, *params[:-1])
        try:
            members = groups.get(group)
        except TypeError:  # an unhashable parameter (a JSON value): this op stays as it is
            group = (sql, id(params))
            members = None
        if members is None:
            members = groups[group] = []
            sqls[group] = (sql, shape)
        rows[(table, key)] = (sql, params, len(members))
        members.append(params)
    flush()
    return out


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
