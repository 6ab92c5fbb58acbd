"""The event store adapter: eventsourcing recorders + a batching writer + an aggregate cache.

Every command handler runs on one writer thread per process. The writer takes all handlers
waiting at that moment, runs them one after another against a shared in-memory view of the
aggregates they touch, and appends every resulting event in ONE transaction (group commit),
together with the inline read models. Optimistic concurrency (the unique (stream, version)
key) catches a race with another process; the batch is then re-run one command at a time on
fresh state. See docs/adr/0004-claims-and-batching.md.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import contextmanager
from datetime import datetime
from typing import Any, TypeVar
from uuid import UUID

import eventsourcing.persistence as es_persistence
import psycopg
from eventsourcing.persistence import IntegrityError, PersistenceError
from psycopg.rows import dict_row, tuple_row
from eventsourcing.postgres import PostgresDatastore
from eventsourcing.sqlite import SQLiteDatastore

from application.errors import CommitOutcomeUnknown, RetryLimitExceeded, StoreUnavailable
from application.ports import Clock, Recorded, UnitOfWork
from domain.errors import DomainError
from domain.events import Aggregate, DomainEvent
from domain.idempotency import IdempotencyKey
from domain.names import TODO_PREFIX, format_id
from domain.todo import MAY_BECOME_CLAIMABLE, Todo, TodoClaimed
from interfaces.store import blobs
from interfaces.store.codec import EventCodec
from interfaces.store.database import (
    DEFAULT_POOL_SIZE, POOL_WAIT, Database, DatabaseUrl, LockBusy, Tx, first_line,
)
from interfaces.store.recorders import PostgresEventRecorder, SqliteEventRecorder
from interfaces.store.rings import RINGS_DDL
from projections.base import Projection, Tracking, micros
from projections.deliveries import RETIRED

log = logging.getLogger("switchboard.store")
T = TypeVar("T")
A = TypeVar("A", bound=Aggregate)

MAX_BATCH = 64
LZ4_COLUMNS = (("sb_stored_deliveries", "envelope"), (blobs.TABLE, "data"))
COMPRESSION_LOCK_TIMEOUT_MS = 1000
LINGER = 0.001  # seconds a batch may wait to fill up to the previous batch's size
MAX_RETRIES = 12
BATCH_RETRIES = 3
CANDIDATES_PER_BATCH = 64
SPREAD_ON_RETRY = 32
CACHE_SIZE = 50_000
# Aggregates whose every change goes through a version check; others are always read fresh
# because a command may rely on them without writing them (an endpoint's revocation).
CACHEABLE = (Todo, IdempotencyKey)


def _without_bytes(aggregate: Aggregate) -> Aggregate:
    """What the cache keeps: the payload bytes an aggregate got from its own commands are left
    out, so a later read asks the payload store (which knows when retention removed them, in
    this process or any other) and the cache holds references, not megabytes."""
    if getattr(aggregate, "payload_bytes", None) is None and getattr(aggregate, "result_bytes", None) is None:
        return aggregate
    slim = aggregate.clone()
    slim.payload_bytes = slim.result_bytes = None
    return slim


class _Job:
    __slots__ = ("handler", "future", "hints")

    def __init__(self, handler: Callable[[UnitOfWork], Any], hints: dict[UUID, Aggregate | None] | None) -> None:
        self.handler = handler
        self.future: Future = Future()
        self.hints = hints or {}


class _Batch:
    """The aggregates touched by the commands of one batch, in the order first touched."""

    def __init__(self) -> None:
        self.aggregates: dict[UUID, Aggregate] = {}
        self.cached: set[UUID] = set()
        self.candidates: dict[tuple[str, tuple[str, ...]], tuple[list[UUID], bool]] = {}


class _Unit:
    """One command's view of the batch; undoes its own changes if the command is refused."""

    def __init__(self, store: SqlEventStore, batch: _Batch, now: datetime, fresh: bool,
                 hints: dict[UUID, Aggregate | None] | None = None) -> None:
        self._store = store
        self._batch = batch
        self._fresh = fresh
        self._hints = {} if fresh or hints is None else hints
        self._savepoints: dict[UUID, Aggregate | None] = {}
        self.now = now
        self.used_cache = False

    def get(self, cls: type[A], aggregate_id: UUID, *, fresh: bool = False) -> A | None:
        aggregates = self._batch.aggregates
        if aggregate_id in aggregates:
            aggregate = aggregates[aggregate_id]
            if aggregate_id not in self._savepoints:
                # This command changes its own copy: an earlier command of the batch may have
                # returned `aggregate` as its answer, which must not show this command's effects.
                self._savepoints[aggregate_id] = aggregate
                aggregate = aggregates[aggregate_id] = aggregate.clone()
            stale_suspect = aggregate_id in self._batch.cached and not aggregate.pending_events
            if not (fresh and stale_suspect):
                return aggregate  # type: ignore[return-value]
            # "fresh": the latest committed state, unless this batch already changed it
            self._batch.cached.discard(aggregate_id)
            reloaded = self._store.load(cls, aggregate_id)
            if reloaded is None:
                return None
            aggregates[aggregate_id] = reloaded
            return reloaded
        if not fresh and aggregate_id in self._hints:
            # read by the caller just before: treated like the cache, checked at commit
            hinted = self._hints[aggregate_id]
            if hinted is None or not isinstance(hinted, cls):
                return None
            aggregate, cached = hinted.clone(), True
        else:
            aggregate, cached = self._store._load_for_write(cls, aggregate_id, fresh=fresh or self._fresh)
        if aggregate is None:
            return None
        if cached:
            self.used_cache = True
            self._batch.cached.add(aggregate_id)
        aggregates[aggregate_id] = aggregate
        self._savepoints[aggregate_id] = None
        return aggregate

    def add(self, aggregate: Aggregate) -> None:
        if aggregate.id not in self._batch.aggregates:
            self._batch.aggregates[aggregate.id] = aggregate
            self._savepoints[aggregate.id] = None

    def claimable(self, endpoint_id: str, queues: Sequence[str], limit: int) -> list[UUID]:
        """Candidates read once per batch (commands of one batch see each other's claims)."""
        key = (endpoint_id, tuple(queues))
        want = limit + len(self._batch.aggregates)
        cached = self._batch.candidates.get(key)
        if cached is None and not self._fresh:
            cached = self._store._prefetched(key, want)
            if cached is not None:
                self._batch.candidates[key] = cached
        if cached is None or (len(cached[0]) < want and not cached[1]):
            fetch = max(want, CANDIDATES_PER_BATCH)
            ids = self._store.claimable(endpoint_id, queues, self.now, fetch)
            if self._fresh:
                # A re-run after a lost race: another process is taking the oldest todos as
                # we speak, so spread over the head of the queue instead of racing it again.
                head = ids[:SPREAD_ON_RETRY]
                random.shuffle(head)
                ids = head + ids[SPREAD_ON_RETRY:]
            cached = self._batch.candidates[key] = (ids, len(ids) < fetch)
        return cached[0]

    def rollback(self) -> None:
        for aggregate_id, saved in self._savepoints.items():
            if saved is None:
                self._batch.aggregates.pop(aggregate_id, None)
            else:
                self._batch.aggregates[aggregate_id] = saved


class _Datastore(PostgresDatastore):
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
            raise es_persistence.OperationalError(str(error)) from None
        except psycopg.IntegrityError as error:
            raise IntegrityError(str(error)) from error
        except (psycopg.OperationalError, psycopg.InterfaceError) as error:
            raise es_persistence.OperationalError(str(error)) from error
        except psycopg.Error as error:
            raise PersistenceError(str(error)) from error


def _create(tx: Tx, statement: Any) -> None:
    """One of the library's DDL statements; a type that exists is kept (CREATE TYPE has no IF NOT
    EXISTS: the library runs it in a transaction of its own, here a savepoint)."""
    if "CREATE TYPE" not in statement.as_string():
        tx.execute(statement)
        return
    tx.execute("SAVEPOINT sb_create_type")
    try:
        tx.execute(statement)
    except psycopg.errors.DuplicateObject:
        tx.execute("ROLLBACK TO SAVEPOINT sb_create_type")
    else:
        tx.execute("RELEASE SAVEPOINT sb_create_type")


def _use_lz4(tx: Tx, table: str, column: str) -> None:
    """Compresses the column with lz4 from now on, when this server has lz4 and it is not yet set
    (the ALTER takes the table's strongest lock: never taken when there is nothing to change)."""
    if tx.execute(
        "SELECT 1 FROM pg_settings WHERE name = 'default_toast_compression' AND 'lz4' = ANY(enumvals)"
    ) and not tx.execute(
        "SELECT 1 FROM pg_attribute WHERE attrelid = %s::regclass AND attname = %s AND attcompression = 'l'",
        (table, column),
    ):
        tx.execute(f"ALTER TABLE {table} ALTER COLUMN {column} SET COMPRESSION lz4")


class SqlEventStore:
    """The EventStore port on SQLite or PostgreSQL."""

    def __init__(self, url: DatabaseUrl, clock: Clock, projections: Sequence[Projection], *,
                 pool_size: int = DEFAULT_POOL_SIZE, application_name: str = "switchboard") -> None:
        self.url = url
        self.clock = clock
        self.codec = EventCodec()
        self.db = Database(url, pool_size=pool_size, application_name=application_name)
        self.projections = tuple(projections)
        self.inline = tuple(p for p in self.projections if p.inline)
        self.datastore: Any = None
        self.recorder: Any = None
        self._cache: OrderedDict[UUID, Aggregate] = OrderedDict()
        self._cache_lock = threading.Lock()
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._writer: threading.Thread | None = None
        self._writer_lock = threading.Lock()
        self._listeners: list[Callable[[list[Recorded]], None]] = []
        self._last_batch_size = 1
        self._prefetch: dict[tuple[str, tuple[str, ...]], tuple[Future, frozenset[UUID]]] = {}
        self._prefetcher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="switchboard-prefetch")
        self._closed = False
        self.down = False
        """The writer's last commit failed for want of the store (cleared by the next that succeeds)."""

    # -- lifecycle

    def open(self) -> SqlEventStore:
        """Connects and creates the tables (idempotent, safe with several processes)."""
        self.db.open()
        url = self.url
        try:
            if url.dialect == "sqlite":
                self.datastore = SQLiteDatastore(url.path, lock_timeout=30, pool_size=4, max_overflow=8)
                self.recorder = SqliteEventRecorder(self.datastore)
            else:
                # eventsourcing's datastore serves reads (streams, the log) on our pool (never its
                # own); appends go through the recorder's own one-round-trip connection (recorders.py)
                self.datastore = _Datastore(
                    url.dbname, url.host, url.port, url.user, url.password, pool_size=1, max_overflow=0,
                )
                self.datastore.db = self.db
                self.recorder = PostgresEventRecorder(self.datastore, url=url)
                self.recorder.on_unsure = self._store_down
                self.recorder.connections = self.db.connection
            if self.url.dialect == "postgres":
                with self.db.transaction() as tx:
                    tx.execute("SELECT pg_advisory_xact_lock(715517)")
                    # the library's create_table() on this transaction's connection, not a second one
                    # from the pool (a pool of one would wait for itself)
                    for statement in self.recorder.sql_create_statements:
                        _create(tx, statement)
                    # lz4 compresses event bodies several times faster than the default pglz. Only
                    # when not yet set, and before any projection DDL: ALTER takes the events table's
                    # strongest lock, and taking it while holding a projection table's lock would
                    # deadlock with a running server's append (events table first, then projections).
                    _use_lz4(tx, "stored_events", "state")
                    self._migrate(tx)
                    blobs.upgrade(tx, self.codec.decode, sqlite=False)
                self._compress_read_models()
            else:
                self.recorder.create_table()
                with self.db.transaction() as tx:
                    self._migrate(tx)
                    blobs.upgrade(tx, self.codec.decode, sqlite=True)
        except PersistenceError as error:
            raise StoreUnavailable(f"store unavailable: {error}") from None
        return self

    def _compress_read_models(self) -> None:
        """lz4 for the large read-model columns too (the deliveries' rule envelopes): PostgreSQL's
        default pglz took ~190 µs per 11 KB envelope, lz4 ~60 (measured). Once per database: each
        in a transaction of its own, holding no other lock, so it can only wait for a running
        catch-up, never deadlock with it. While it waits, it queues ahead of the table's other
        users, so it waits at most a second; then this open leaves it to the next one."""
        for table, column in LZ4_COLUMNS:
            try:
                with self.db.transaction(lock_timeout_ms=COMPRESSION_LOCK_TIMEOUT_MS) as tx:
                    _use_lz4(tx, table, column)
            except LockBusy:
                log.warning("%s.%s keeps its compression until the next start (table busy)", table, column)

    def _migrate(self, tx: Any) -> None:
        for statement in (*Tracking.DDL, *RINGS_DDL, *blobs.DDL[self.url.dialect]):
            tx.execute(statement)
        tx.execute(f"DELETE FROM sb_tracking WHERE name IN ({', '.join(['%s'] * len(RETIRED))})", RETIRED)
        for projection in self.projections:
            for statement in projection.ddl:
                tx.execute(statement)
            tx.execute(
                "INSERT INTO sb_tracking (name, position) VALUES (%s, 0) ON CONFLICT (name) DO NOTHING",
                (projection.name,),
            )

    def close(self) -> None:
        self._closed = True
        if self._writer is not None:
            self._jobs.put(None)
            self._writer.join(timeout=5)
        self._prefetcher.shutdown(wait=False)
        self.db.close()
        if self.datastore is not None:
            self.datastore.close()

    def subscribe(self, listener: Callable[[list[Recorded]], None]) -> None:
        """Calls `listener` on the writer thread after each commit; it must be quick."""
        self._listeners.append(listener)

    # -- the write side

    def run(self, handler: Callable[[UnitOfWork], T], *, hints: dict[UUID, Aggregate | None] | None = None) -> T:
        """Runs a command handler in the next batch and returns once its events are durable.

        `hints` are aggregates (None: known absent) the caller has just read; the handler gets
        them instead of reading the store on the writer thread. Like cached aggregates, a stale
        hint only costs a re-run on fresh state.
        """
        if self._closed:
            raise StoreUnavailable("store is closed")
        if self._writer is None:
            with self._writer_lock:
                if self._writer is None:
                    self._writer = threading.Thread(target=self._write_loop, name="switchboard-writer", daemon=True)
                    self._writer.start()
        job = _Job(handler, hints)
        self._jobs.put(job)
        started = time.monotonic()
        while True:
            try:
                return job.future.result(timeout=POOL_WAIT / 4)
            except FutureTimeout:
                # While the store is down the writer may be busy learning a lost commit's outcome:
                # a job it has not taken yet is withdrawn after POOL_WAIT (nothing of it was
                # written: 503). One it has taken gets its true answer, however long that takes.
                if self.down and time.monotonic() - started >= POOL_WAIT and job.future.cancel():
                    raise StoreUnavailable("store unavailable: the writer is waiting for the store") from None

    def _store_down(self, error: BaseException | None = None) -> None:
        if not self.down:
            self.down = True
            log.warning("writer: store unavailable (%s); commands are answered 503 until it is back",
                        first_line(error) if error is not None else "unknown")

    def _store_up(self) -> None:
        if self.down:
            self.down = False
            log.warning("writer: store is back")

    def _write_loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            if not job.future.set_running_or_notify_cancel():
                continue  # withdrawn by its caller while the store was down
            batch = [job]
            # Those answered by the last commit are about to send their next command: wait a
            # moment for as many, so the batch (and its one commit) stays full under load.
            deadline = time.monotonic() + LINGER
            while len(batch) < MAX_BATCH:
                try:
                    if len(batch) < self._last_batch_size:
                        more = self._jobs.get(timeout=max(deadline - time.monotonic(), 0))
                    else:
                        more = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    self._jobs.put(None)
                    break
                if more.future.set_running_or_notify_cancel():
                    batch.append(more)
            self._last_batch_size = len(batch)
            try:
                self._process(batch)
            except BaseException as error:  # never let the writer die with jobs waiting
                log.exception("writer failed a batch")
                for j in batch:
                    if not j.future.done():
                        j.future.set_exception(error)

    def _process(self, jobs: list[_Job], attempt: int = 0) -> None:
        """Runs jobs as one batch; after a lost race, again on fresh state, then one by one."""
        batch = _Batch()
        done: list[tuple[_Job, Any]] = []
        recheck: list[_Job] = []
        for job in jobs:
            unit = _Unit(self, batch, self.clock.now(), fresh=attempt > 0, hints=job.hints)
            try:
                result = job.handler(unit)
            except DomainError as error:
                unit.rollback()
                if unit.used_cache:
                    recheck.append(job)  # confirm the refusal against fresh state
                else:
                    job.future.set_exception(error)
            except Exception as error:
                unit.rollback()
                job.future.set_exception(error)
            else:
                done.append((job, result))
        if done:
            try:
                recorded = self._commit(batch)
            except IntegrityError:
                self._evict(batch.aggregates)
                self._prefetch.clear()
                again = [job for job, _ in done] + recheck
                if attempt < BATCH_RETRIES:
                    time.sleep(random.uniform(0, 0.002 * (2 ** attempt)))
                    self._process(again, attempt + 1)
                else:
                    for job in again:
                        self._run_alone(job)
                return
            except CommitOutcomeUnknown as error:
                self._evict(batch.aggregates)
                self._prefetch.clear()
                for job, _ in done:
                    job.future.set_exception(error)
            except (PersistenceError, StoreUnavailable) as error:
                self._evict(batch.aggregates)
                self._store_down(error)
                failure = StoreUnavailable(f"store unavailable: {error}")
                for job, _ in done:
                    job.future.set_exception(failure)
            except Exception:
                # events that cannot be written at all (e.g. text that is not Unicode): nothing
                # was appended; run the commands one at a time so only the culprit fails
                self._evict(batch.aggregates)
                self._prefetch.clear()
                for job, _ in done:
                    self._run_alone(job)
            else:
                self._store_up()
                for job, result in done:
                    job.future.set_result(result)
                self._announce(recorded)
        if recheck:
            self._process(recheck, attempt + 1)

    def _run_alone(self, job: _Job) -> None:
        for attempt in range(MAX_RETRIES):
            batch = _Batch()
            unit = _Unit(self, batch, self.clock.now(), fresh=True)
            try:
                result = job.handler(unit)
            except Exception as error:
                job.future.set_exception(error)
                return
            try:
                recorded = self._commit(batch)
            except IntegrityError:
                self._evict(batch.aggregates)
                time.sleep(random.uniform(0, 0.002 * (2 ** min(attempt, 6))))
                continue
            except (PersistenceError, StoreUnavailable) as error:
                self._evict(batch.aggregates)
                self._store_down(error)
                job.future.set_exception(StoreUnavailable(f"store unavailable: {error}"))
                return
            except Exception as error:
                self._evict(batch.aggregates)
                job.future.set_exception(error)
                return
            self._store_up()
            job.future.set_result(result)
            self._announce(recorded)
            return
        job.future.set_exception(RetryLimitExceeded("gave up after repeated concurrent updates; try again"))

    def _prefetch_candidates(self, batch: _Batch, events: list[DomainEvent]) -> None:
        """Reads the next batch's candidates while this batch commits (the query overlaps the I/O).

        Todos this batch claims are left out; a batch after which any todo may become claimable
        (`MAY_BECOME_CLAIMABLE`) prefetches nothing, so no candidate is ever missed.
        """
        self._prefetch.clear()
        if not batch.candidates or any(isinstance(e, MAY_BECOME_CLAIMABLE) for e in events):
            return
        claimed = frozenset(e.originator_id for e in events if isinstance(e, TodoClaimed))
        now = self.clock.now()
        for (endpoint_id, queues) in batch.candidates:
            future = self._prefetcher.submit(self.claimable, endpoint_id, queues, now, CANDIDATES_PER_BATCH)
            self._prefetch[(endpoint_id, queues)] = (future, claimed)

    def _prefetched(self, key: tuple[str, tuple[str, ...]], want: int) -> tuple[list[UUID], bool] | None:
        entry = self._prefetch.pop(key, None)
        if entry is None:
            return None
        future, claimed = entry
        try:
            ids = future.result(timeout=0.05)
        except Exception:  # a failed or slow prefetch only means reading now
            return None
        if len(ids) < CANDIDATES_PER_BATCH:
            return None  # the queue's tail was visible: read it fresh, nothing may be missed
        remaining = [i for i in ids if i not in claimed]
        return (remaining, False) if len(remaining) >= want else None

    def _commit(self, batch: _Batch) -> list[Recorded]:
        events: list[DomainEvent] = []
        for aggregate in batch.aggregates.values():
            events.extend(aggregate.collect_events())
        if not events:
            return []
        self._prefetch_candidates(batch, events)
        stored = [self.codec.to_stored_event(e) for e in events]
        # the payloads the events name, in their transaction (docs/adr/0019)
        ops = blobs.ops_for(blobs.carried_blobs(events), events[0].timestamp,
                            compress=self.url.dialect == "sqlite")
        pruning, rewritten = blobs.retention_ops(events, self.db.query, sqlite=self.url.dialect == "sqlite")
        ops += pruning
        ops += [op for p in self.inline for e in events for op in p.ops(e, None)]
        ids = self.recorder.insert_events(
            stored, inline_ops=ops, inline_tracking=tuple(p.name for p in self.inline)
        )
        with self._cache_lock:
            for aggregate_id in rewritten:  # their payloads were pruned: read them again
                self._cache.pop(aggregate_id, None)
            for aggregate_id, aggregate in batch.aggregates.items():
                if isinstance(aggregate, CACHEABLE):
                    self._cache[aggregate_id] = _without_bytes(aggregate)
                    self._cache.move_to_end(aggregate_id)
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        return [Recorded(position, event) for position, event in zip(ids or [0] * len(events), events)]

    def _announce(self, recorded: list[Recorded]) -> None:
        if not recorded:
            return
        for listener in self._listeners:
            try:
                listener(recorded)
            except Exception:  # a listener's bug must not fail committed commands
                log.exception("commit listener failed")

    def _evict(self, aggregates: dict[UUID, Aggregate]) -> None:
        with self._cache_lock:
            for aggregate_id in aggregates:
                self._cache.pop(aggregate_id, None)

    def _load_for_write(self, cls: type[A], aggregate_id: UUID, *, fresh: bool) -> tuple[A | None, bool]:
        if not fresh and cls in CACHEABLE:
            with self._cache_lock:
                cached = self._cache.get(aggregate_id)
            if cached is not None and isinstance(cached, cls):
                return cached.clone(), True  # type: ignore[return-value]
        return self.load(cls, aggregate_id), False

    # -- reads

    def load(self, cls: type[A], aggregate_id: UUID) -> A | None:
        """Rebuilds an aggregate from its stream (no cache)."""
        try:
            stored = self.recorder.select_events(aggregate_id)
        except PersistenceError as error:
            raise StoreUnavailable(f"store unavailable: {error}") from None
        events = [self.codec.to_domain_event(s) for s in stored]
        aggregate = cls.replay(events)
        return aggregate if aggregate is None or isinstance(aggregate, cls) else None

    def load_many(self, wanted: Sequence[tuple[type[Aggregate], UUID]]) -> dict[UUID, Aggregate | None]:
        """Several aggregates in one round trip (absent ones map to None)."""
        if not wanted:
            return {}
        ids = list(dict.fromkeys(aggregate_id for _, aggregate_id in wanted))
        marks = ", ".join(["%s"] * len(ids))
        sqlite = self.url.dialect == "sqlite"
        rows = self.db.query(
            "SELECT originator_id, originator_version, topic, state FROM stored_events"
            f" WHERE originator_id IN ({marks}) ORDER BY originator_id, originator_version",
            [i.hex if sqlite else i for i in ids],
        )
        streams: dict[UUID, list[DomainEvent]] = {}
        for originator, version, topic, state in rows:
            key = originator if isinstance(originator, UUID) else UUID(hex=originator)
            streams.setdefault(key, []).append(self.codec.decode(topic, key, version, bytes(state)))
        loaded: dict[UUID, Aggregate | None] = {}
        for cls, aggregate_id in wanted:
            aggregate = cls.replay(streams.get(aggregate_id, []))
            loaded[aggregate_id] = aggregate if isinstance(aggregate, cls) else None
        return loaded

    def version_of(self, aggregate_id: UUID) -> int:
        """The aggregate's current version (0 when it has no events): one primary-key lookup."""
        key: Any = aggregate_id.hex if self.url.dialect == "sqlite" else aggregate_id
        rows = self.db.query("SELECT max(originator_version) FROM stored_events WHERE originator_id = %s", (key,))
        return int(rows[0][0] or 0) if rows else 0

    def stream(self, aggregate_id: UUID) -> list[Recorded]:
        """Every event of one aggregate with its position in the global log."""
        if self.url.dialect == "sqlite":
            sql = ("SELECT rowid, originator_version, topic, state FROM stored_events"
                   " WHERE originator_id = %s ORDER BY originator_version")
            key: Any = aggregate_id.hex
        else:
            sql = ("SELECT notification_id, originator_version, topic, state FROM stored_events"
                   " WHERE originator_id = %s ORDER BY originator_version")
            key = aggregate_id
        rows = self.db.query(sql, (key,))
        return [
            Recorded(position, self.codec.decode(topic, aggregate_id, version, bytes(state)))
            for position, version, topic, state in rows
        ]

    def read_log(self, after: int, limit: int, *, types: Sequence[type[DomainEvent]] = (),
                 stop: int | None = None) -> list[Recorded]:
        """Events after a position (up to `stop`, of these types if given), in log order."""
        try:
            notes = self.recorder.select_notifications(
                start=after, limit=limit, stop=stop, topics=[t.__name__ for t in types], inclusive_of_start=False,
            )
        except PersistenceError as error:
            raise StoreUnavailable(f"store unavailable: {error}") from None
        return [
            Recorded(n.id, self.codec.decode(n.topic, n.originator_id, n.originator_version, bytes(n.state)))
            for n in notes
        ]

    def read_log_in(self, tx: Tx, after: int, limit: int) -> list[Recorded]:
        """`read_log` inside a transaction of the read-model database (a catch-up reads and applies
        on one connection, in one round trip fewer)."""
        sqlite = self.url.dialect == "sqlite"
        position = "rowid" if sqlite else "notification_id"
        rows = tx.execute(
            f"SELECT {position}, originator_id, originator_version, topic, state FROM stored_events"
            f" WHERE {position} > %s ORDER BY {position} LIMIT %s",
            (after, limit), binary=True,  # the states as bytes, not hex text
        )
        return [
            Recorded(at, self.codec.decode(topic, originator, version, bytes(state)))
            for at, originator, version, topic, state in rows
        ]

    def max_position(self) -> int:
        try:
            return self.recorder.max_notification_id() or 0
        except PersistenceError as error:
            raise StoreUnavailable(f"store unavailable: {error}") from None

    def event_data(self, event: DomainEvent) -> dict[str, Any]:
        return self.codec.event_data(event)

    def read_payloads(self, digests: Sequence[str]) -> dict[str, blobs.Stored]:
        """The stored bytes (or prune tombstones) of these payload digests; absent ones left out."""
        if not digests:
            return {}
        return blobs.read(self.db.query, digests)

    def claimable(self, endpoint_id: str, queues: Sequence[str], now: datetime, limit: int) -> list[UUID]:
        """Todo ids of the endpoint claimable now in the given queues, oldest first."""
        if not queues:
            return []
        # One index range per queue (endpoint, queue, created_at, todo_id), merged: the index
        # order serves each queue without sorting the pending rows.
        one = ("SELECT created_at, todo_id FROM (SELECT created_at, todo_id FROM sb_claimable"
               " WHERE endpoint_id = %s AND queue = %s AND available_at IS NOT NULL AND available_at <= %s"
               " ORDER BY created_at, todo_id LIMIT %s) AS q{n}")
        sql = " UNION ALL ".join(one.format(n=n) for n in range(len(queues)))
        params: list[Any] = []
        for queue in queues:
            params += [endpoint_id, queue, micros(now), limit]
        rows = self.db.query(f"SELECT todo_id FROM ({sql}) AS c ORDER BY created_at, todo_id LIMIT %s", (*params, limit))
        return [UUID(hex=row[0][len(TODO_PREFIX):]) for row in rows]

    @staticmethod
    def todo_ref(todo_id: UUID) -> str:
        return format_id(TODO_PREFIX, todo_id)
