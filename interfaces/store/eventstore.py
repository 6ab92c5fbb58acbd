"""The event store adapter: eventsourcing recorders, the batching writer and the reads.

Its parts, each in a module of its own:
- `writer.py`: the one writer thread, batching (group commit), retries after a lost race; its
  jobs and their answers in `jobs.py`, the batches an event loop commits itself in `loop_batches.py`;
- `unit.py`: the unit of work a handler sees (savepoints) and its explicit `ReadSource`;
- `cache.py`: the aggregate cache; `candidates.py`: claim candidates read ahead;
- `recorders.py`: the appends with the inline read models, lost-commit resolution;
- `schema.py`: creating the tables. This module wires them and serves the reads.
See docs/adr/0004-claims-and-batching.md.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, TypeVar
from uuid import UUID

from eventsourcing.persistence import PersistenceError
from eventsourcing.sqlite import SQLiteDatastore

from application.errors import StoreUnavailable
from application.ports import Clock, Recorded, UnitOfWork
from domain.doorbell import doorbell_news
from domain.events import Aggregate, DomainEvent
from domain.names import TODO_PREFIX, format_id, uuid_of_hex
from interfaces.store import blobs, read_checks, schema
from interfaces.store.cache import AggregateCache
from interfaces.store.candidates import CandidatePrefetch
from interfaces.store.codec import EventCodec
from interfaces.store.database import DEFAULT_POOL_SIZE, Database, DatabaseUrl, Tx
from interfaces.store.lanes import ClaimLanes, SqlClaimers
from interfaces.store.loop_batches import LoopAppends
from interfaces.store.queues import LoadEstimates, SqlQueueLoad
from interfaces.store.recorders import (
    PooledPostgresDatastore, PostgresEventRecorder, SentAppend, Session, SqliteEventRecorder,
)
from interfaces.store.unit import Reads, ReadSource, WouldRead
from interfaces.store.writer import Writer
from projections.base import Projection, micros

T = TypeVar("T")
A = TypeVar("A", bound=Aggregate)


def _would_read(*_: Any) -> Any:
    raise WouldRead("a prune reads the store before its append")


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
        self._prefetch = CandidatePrefetch(self.claimable, clock)
        self.cache = AggregateCache()
        self.queue_reads = SqlQueueLoad(self.db)
        self.load_estimates = LoadEstimates(self.queue_reads)
        self.lanes = ClaimLanes(SqlClaimers(self.db) if url.dialect == "postgres" else None)
        reads = Reads(load=self.load, claimable=self.claimable, payloads=self.read_payloads, cache=self.cache,
                      prefetch=self._prefetch, queue_loads=self.load_estimates, lanes=self.lanes)
        loop_appends = LoopAppends(self._open_session, self._send) if url.dialect == "postgres" else None
        self.writer = Writer(self._append, reads, clock, loop_appends)

    # -- lifecycle

    def open(self) -> SqlEventStore:
        """Connects and creates the tables (idempotent, safe with several processes)."""
        self.db.open()
        url = self.url
        try:
            if url.dialect == "sqlite":
                self.datastore = SQLiteDatastore(url.path, lock_timeout=30, pool_size=4, max_overflow=8)
                self.recorder = SqliteEventRecorder(self.datastore)
                self.recorder.create_table()
                with self.db.transaction() as tx:
                    schema.migrate(tx, self.projections, dialect="sqlite", decode=self.codec.decode)
                    blobs.upgrade(tx, self.codec.decode, sqlite=True)
            else:
                # eventsourcing's datastore serves reads (streams, the log) on our pool (never its
                # own); appends go through the recorder's own one-round-trip connection (recorders.py)
                self.datastore = PooledPostgresDatastore(
                    url.dbname, url.host, url.port, url.user, url.password, pool_size=1, max_overflow=0,
                )
                self.datastore.db = self.db
                self.recorder = PostgresEventRecorder(self.datastore, url=url)
                self.recorder.on_unsure = self.writer.unsure
                self.recorder.connections = self.db.connection
                with self.db.transaction() as tx:
                    schema.create_postgres(tx, self.recorder, self.projections, self.codec.decode)
                    blobs.upgrade(tx, self.codec.decode, sqlite=False)
                schema.compress_read_models(self.db)
        except PersistenceError as error:
            raise StoreUnavailable(f"store unavailable: {error}") from None
        return self

    def close(self) -> None:
        self.writer.stop()
        self._prefetch.close()
        self.lanes.leave()
        self.db.close()
        if self.datastore is not None:
            self.datastore.close()

    def subscribe(self, listener: Callable[[list[Recorded]], None]) -> None:
        """Calls `listener` after each commit (on the writer thread, or on the event loop whose
        batch it was: docs/adr/0034); it must be quick and safe from any thread."""
        self.writer.subscribe(listener)

    # -- the write side

    def run(self, handler: Callable[[UnitOfWork], T], *, hints: dict[UUID, Aggregate | None] | None = None) -> T:
        """Runs a command handler in the next batch and returns once its events are durable.

        `hints` are aggregates (None: known absent) the caller has just read; the handler reads
        them (`ReadSource.just_read`) instead of the store on the writer thread. Like cached
        aggregates, a stale one only costs a re-run on fresh state.
        """
        return self.writer.run(handler, ReadSource.just_read(hints))

    async def run_async(self, handler: Callable[[UnitOfWork], T], *,
                        hints: dict[UUID, Aggregate | None] | None = None) -> T:
        """`run` for a caller on an event loop: awaits the commit without holding a thread."""
        return await self.writer.run_async(handler, ReadSource.just_read(hints))

    def _append(self, events: list[DomainEvent], read: Sequence[str] = ()) -> tuple[Sequence[int] | None, dict[str, blobs.Stored]]:
        """The writer's one transaction: the check of the streams the events were decided on
        (read_checks.py), the events, the payloads they name (docs/adr/0027), what a prune among
        them removes, and the inline read models' rows; then, before it commits, the
        stored payloads of `read` (what the batch's answers show), as of this very commit."""
        stored, extra, rewritten = self._prepared(events, self.db.query)
        positions, payloads = self.recorder.append(stored, read=read, **extra)
        self.cache.forget(rewritten)  # their payloads were pruned: read them again
        return positions, payloads

    def _prepared(self, events: list[DomainEvent],
                  query: Callable[..., Any]) -> tuple[list[Any], dict[str, Any], set[Any]]:
        """The events as stored, what the recorder writes with them (the ops, the tracked inline
        models, the doorbell's news), the aggregates a prune among them rewrites."""
        stored = [self.codec.to_stored_event(e) for e in events]
        sqlite = self.url.dialect == "sqlite"
        ops = read_checks.check_ops(events, sqlite=sqlite)  # first: a moved stream fails the append (ADR 31)
        ops += blobs.ops_for(blobs.carried_blobs(events), events[0].timestamp, compress=sqlite)
        pruning, rewritten = blobs.retention_ops(events, query, sqlite=sqlite)
        ops += pruning
        ops += [op for p in self.inline for e in events for op in p.ops(e, None)]
        extra = {"inline_ops": ops, "inline_tracking": tuple(p.name for p in self.inline),
                 "notify": doorbell_news(events)}
        return stored, extra, rewritten

    def _open_session(self) -> Session:
        return self.recorder.open_session()

    def _send(self, session: Session, events: list[DomainEvent], read: Sequence[str]) -> SentAppend:
        """`_append` sent from an event loop (docs/adr/0034): the same transaction, its answer read
        when it comes. A prune among the events reads the store first, so it raises `WouldRead`:
        such a batch is the writer thread's (then nothing is rewritten here, nothing to forget)."""
        stored, extra, _ = self._prepared(events, _would_read)
        return self.recorder.send(session, stored, read=read, **extra)

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
        digits = self.db.indexed_column(f"SELECT substr(todo_id, {len(TODO_PREFIX) + 1}) FROM ({sql}) AS c"
                                        " ORDER BY created_at, todo_id LIMIT %s", (*params, limit))
        return [uuid_of_hex(value) for value in digits]

    @staticmethod
    def todo_ref(todo_id: UUID) -> str:
        return format_id(TODO_PREFIX, todo_id)