"""The unit of work a command handler sees: one command's view of its writer batch.

Commands of one batch share the aggregates they touch (`Batch`), so a later command sees an
earlier one's effects; each takes a savepoint of what it changes and a refused command rolls
back to it. An aggregate the batch has not touched yet is read from the unit's `ReadSource`.
The unit reads through `Reads`, a narrow collaborator, never the store itself.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TypeVar
from uuid import UUID

from application.ports import QueueLoad, StoredPayload
from domain.events import Aggregate
from domain.todo import TodoClaimed
from interfaces.store.cache import AggregateCache
from interfaces.store.candidates import CANDIDATES_PER_BATCH, CandidatePrefetch, Candidates, QueueKey, ReadClaimable
from interfaces.store.lanes import ClaimLanes
from interfaces.store.queues import LoadEstimates

A = TypeVar("A", bound=Aggregate)

SPREAD_ON_RETRY = 32  # oldest candidates shuffled on a fresh re-run, to stop racing another process


@dataclass(frozen=True)
class ReadSource:
    """Where a unit of work reads an aggregate its batch has not touched yet.

    - `CACHED`: the process's aggregate cache, else the store.
    - `ReadSource.just_read(copies)`: copies the caller has just read (None: known absent),
      else as `CACHED`; the handler then needs no read on the writer thread.
    - `FRESH`: the latest committed state only (a re-run after a lost race or on a refusal
      read from copies); its claim candidates are spread over the head of the queue.

    Cached and just-read copies may be stale: the commit's version check catches a stale copy
    that was written, and a refusal that read one is confirmed on fresh state.
    """

    fresh: bool = False
    copies: Mapping[UUID, Aggregate | None] = field(default_factory=dict)

    @staticmethod
    def just_read(copies: Mapping[UUID, Aggregate | None] | None) -> ReadSource:
        return ReadSource(copies=copies) if copies else CACHED


CACHED = ReadSource()
FRESH = ReadSource(fresh=True)


@dataclass(frozen=True)
class Reads:
    """What a unit reads through: committed state (`load`, `claimable`), the cache, and the
    claim candidates read ahead."""

    load: Callable[[type[Aggregate], UUID], Aggregate | None]
    claimable: ReadClaimable
    payloads: Callable[[Sequence[str]], Mapping[str, StoredPayload]]
    cache: AggregateCache
    prefetch: CandidatePrefetch
    queue_loads: LoadEstimates
    lanes: ClaimLanes


class PayloadsRead:
    """The payloads the answers of one batch show, read by the writer in the batch's transaction
    after its commands ran and before it committed (docs/adr/0027): the `PayloadSource` those
    answers are shown from, so a committed change never reads the store again to be answered."""

    def __init__(self) -> None:
        self.wanted: dict[str, None] = {}
        """The digests asked for (each once, in order) by the commands that were not refused."""
        self._rows: Mapping[str, StoredPayload] = {}
        self.read = False

    def want(self, digests: Iterable[str]) -> None:
        self.wanted.update(dict.fromkeys(digests))

    def fill(self, rows: Mapping[str, StoredPayload]) -> None:
        """What the batch's transaction read for `wanted` (a digest the store lacks is absent)."""
        self._rows, self.read = rows, True

    def read_payloads(self, digests: Sequence[str]) -> dict[str, StoredPayload]:
        unasked = [d for d in digests if d not in self.wanted]
        if unasked or not self.read:
            raise LookupError(f"payloads not read in the batch's transaction: {unasked or list(digests)}")
        return {d: self._rows[d] for d in digests if d in self._rows}


class Batch:
    """The aggregates touched by the commands of one batch, in the order first touched."""

    def __init__(self) -> None:
        self.payloads = PayloadsRead()
        self.aggregates: dict[UUID, Aggregate] = {}
        self.cached: set[UUID] = set()
        """Ids read from a copy (cache or caller) rather than the store: possibly stale."""
        self.candidates: dict[QueueKey, Candidates] = {}
        self.loads: dict[tuple[str, str], tuple[QueueLoad, bool]] = {}
        """Each controlled queue's load as this batch took it (once per queue), and whether read fresh."""


class WouldRead(Exception):
    """A unit that may not read the store was about to: its command is for the writer thread."""


class Unit:
    """One command's view of the batch; undoes its own changes if the command is refused.

    A unit made with `may_read=False` (a batch committed from an event loop, docs/adr/0034) reads
    only its caller's copies, the cache and the batch: where it would read the store (or wait for
    a read ahead), it raises `WouldRead` instead."""

    def __init__(self, reads: Reads, batch: Batch, now: datetime, source: ReadSource, *,
                 may_read: bool = True) -> None:
        self._may_read = may_read
        self._reads = reads
        self._batch = batch
        self._source = source
        self._savepoints: dict[UUID, Aggregate | None] = {}
        self.now = now
        self.used_cache = False
        """A copy (cache or caller's) was read: a refusal must be confirmed on fresh state."""
        self.payloads_wanted: list[str] = []
        """Digests this command's answer shows (`needs_payloads`); the writer adds them to the
        batch's `PayloadsRead` once the command is not refused."""

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
            self._check_may_read()
            self._batch.cached.discard(aggregate_id)
            reloaded = self._reads.load(cls, aggregate_id)
            if reloaded is None:
                return None
            aggregates[aggregate_id] = reloaded
            return reloaded  # type: ignore[return-value]
        aggregate, copied = self._read(cls, aggregate_id, fresh=fresh or self._source.fresh)
        if aggregate is None:
            return None
        if copied:
            self.used_cache = True
            self._batch.cached.add(aggregate_id)
        aggregates[aggregate_id] = aggregate
        self._savepoints[aggregate_id] = None
        return aggregate

    def _read(self, cls: type[A], aggregate_id: UUID, *, fresh: bool) -> tuple[A | None, bool]:
        """The aggregate from the read source, and whether it is a copy (possibly stale)."""
        if not fresh:
            copies = self._source.copies
            if aggregate_id in copies:
                copy = copies[aggregate_id]
                if copy is None or not isinstance(copy, cls):
                    return None, False
                return copy.clone(), True  # type: ignore[return-value]
            cached = self._reads.cache.get(cls, aggregate_id)
            if cached is not None:
                return cached, True
        self._check_may_read()
        return self._reads.load(cls, aggregate_id), False  # type: ignore[return-value]

    def _check_may_read(self) -> None:
        if not self._may_read:
            raise WouldRead("this command reads the store")

    def add(self, aggregate: Aggregate) -> None:
        if aggregate.id not in self._batch.aggregates:
            self._batch.aggregates[aggregate.id] = aggregate
            self._savepoints[aggregate.id] = None

    def claimable(self, endpoint_id: str, queues: Sequence[str], limit: int) -> list[UUID]:
        """Candidates read once per batch (commands of one batch see each other's claims), less
        those a command of the batch has changed into a todo not claimable now."""
        self._check_may_read()  # candidates are read, or waited for
        key = (endpoint_id, tuple(queues))
        lane = self._reads.lanes.current(key, self.now)  # other writers claim here too (lanes.py)
        window = lane.window(limit) if lane is not None else limit
        want = limit + len(self._batch.aggregates)
        fresh = self._source.fresh
        cached = self._batch.candidates.get(key)
        if cached is None and not fresh:
            cached = self._reads.prefetch.take(key, want)
            if cached is not None:
                self._batch.candidates[key] = cached
        if cached is None or (len(cached[0]) < want and not cached[1]):
            fetch = max(want, CANDIDATES_PER_BATCH)
            ids = self._reads.claimable(endpoint_id, queues, self.now, fetch)
            if fresh:
                # A re-run after a lost race: another process is taking the oldest todos as
                # we speak, so spread over the head of the queue instead of racing it again
                # (its lane's todos first, if any: one that just began claiming here may not be
                # counted yet).
                head = ids[:SPREAD_ON_RETRY]
                random.shuffle(head)
                ids = head + ids[SPREAD_ON_RETRY:]
            cached = self._batch.candidates[key] = (ids, len(ids) < fetch)
        # Leave out what an earlier command of the batch has already taken: eight claims of ten in
        # one batch walked 0, 10, … 70 such candidates each, two reads and a copy apiece. At most
        # `limit` are given: a claim reads its first few, and the whole list (64 and more) cost
        # each claim a hash per candidate. With a lane, its todos of the oldest `window` first.
        aggregates, now = self._batch.aggregates, self.now
        ids: list[UUID] = []
        for c in cached[0]:
            if not ((taken := aggregates.get(c)) is not None and taken.pending_events and not taken.is_claimable(now)):
                ids.append(c)
                if len(ids) == window:
                    break
        return lane.order(ids, limit)[:limit] if lane is not None else ids

    def queue_load(self, endpoint_id: str, queue: str, *, fresh: bool = False) -> QueueLoad:
        """The queue's load — this process's estimate, or with `fresh` (and on a re-run) as committed —
        plus the claims this batch has made in it."""
        key = (endpoint_id, queue)
        fresh = fresh or self._source.fresh
        taken = self._batch.loads.get(key)
        if taken is None or (fresh and not taken[1]):
            if not self._may_read and (fresh or self._reads.queue_loads.known(key, self.now) is None):
                raise WouldRead("this command reads a queue's load")
            taken = self._batch.loads[key] = (self._reads.queue_loads.get(key, self.now, fresh=fresh), fresh)
        committed = taken[0]
        ours = [e.timestamp for a in self._batch.aggregates.values() for e in a.pending_events
                if isinstance(e, TodoClaimed) and e.queue == queue and e.endpoint_id == endpoint_id]
        if not ours:
            return committed
        return QueueLoad(committed.in_flight + len(ours), committed.recent_claims + tuple(ours))

    def needs_payloads(self, digests: Sequence[str]) -> PayloadsRead:
        self.payloads_wanted += digests
        return self._batch.payloads

    def rollback(self) -> None:
        for aggregate_id, saved in self._savepoints.items():
            if saved is None:
                self._batch.aggregates.pop(aggregate_id, None)
            else:
                self._batch.aggregates[aggregate_id] = saved
