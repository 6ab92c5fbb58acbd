"""The writer: one thread per process that runs every command handler, in batches (group commit).

It takes all handlers waiting at that moment (and, for a moment, those about to come), runs each
as it takes it, one after another on a shared view of the aggregates they touch
(`interfaces/store/unit.py`), and appends every resulting event in ONE transaction, with the
payloads the commands' answers show, read in it before it commits (docs/adr/0027). Optimistic
concurrency (the unique (stream, version) key) catches a race with another process: the batch
is then re-run on fresh state, then one command at a time. A commit
whose outcome was lost with the connection is resolved by the recorder (recorders.py,
docs/adr/0014); the writer only answers what it learns. See docs/adr/0004-claims-and-batching.md.
The jobs and their answers are in jobs.py; the batches an event loop commits itself, and hands
the writer what is not plain, in loop_batches.py (docs/adr/0034).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import queue
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from eventsourcing.persistence import IntegrityError, PersistenceError

from application.background import SETTLE, OutageLog
from application.errors import CommitOutcomeUnknown, RetryLimitExceeded, StoreUnavailable
from application.ports import Clock, Recorded, StoredPayload, UnitOfWork
from domain.errors import DomainError
from domain.events import DomainEvent
from domain.todo import Todo
from interfaces.store.cache import AggregateCache
from interfaces.store.candidates import CandidatePrefetch
from interfaces.store.connections import POOL_WAIT
from interfaces.store.jobs import MAX_BATCH, RUN_AGAIN, Job, Run, settle_all
from interfaces.store.loop_batches import LoopAppends, LoopBatches
from interfaces.store.queues import LoadMove, load_moves
from interfaces.store.unit import FRESH, Batch, Reads, ReadSource, Unit, WouldRead

log = logging.getLogger("switchboard.store")
T = TypeVar("T")

LINGER = 0.001  # seconds a batch may wait to fill up to the size of the recent batches
GAP = 0.00025  # seconds a filling batch waits for its next job (LINGER in all at most)
RECENT = 8  # batches whose largest size the next batch waits (LINGER at most) to reach
MAX_RETRIES = 12  # attempts of a command run alone after its batch kept losing races
BATCH_RETRIES = 3  # re-runs of a whole batch on fresh state before running it one by one

Append = Callable[[list[DomainEvent], Sequence[str]], tuple[Sequence[int] | None, Mapping[str, StoredPayload]]]
"""Writes events (with the inline read models) in one transaction and, in it before it commits,
reads the stored payloads of these digests; their log positions and the payloads read."""

_NUDGE: Any = object()
"""Put on the writer's queue to wake its idle thread (`Writer.store_down` from an event loop)."""


def _waiting_for_the_store() -> StoreUnavailable:
    return StoreUnavailable("store unavailable: the writer is waiting for the store")


class Writer:
    """Runs command handlers in batches on one thread; each caller waits for its own outcome."""

    def __init__(self, append: Append, reads: Reads, clock: Clock, loop_appends: LoopAppends | None = None) -> None:
        self._append = append
        self._loop_appends = loop_appends
        self._on_loops: dict[asyncio.AbstractEventLoop, LoopBatches] = {}
        self._reads = reads
        self._cache: AggregateCache = reads.cache
        self._prefetch: CandidatePrefetch = reads.prefetch
        self._clock = clock
        self.jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        """Jobs not yet taken into a batch (tests look at its size)."""
        self._thread: threading.Thread | None = None
        self._thread_lock = threading.Lock()
        self._listeners: list[Callable[[list[Recorded]], None]] = []
        self._recent_sizes: collections.deque[int] = collections.deque([1], maxlen=RECENT)
        self._closed = False
        self.down = False
        """The last commit failed for want of the store (cleared by the next that succeeds)."""
        self._outage = OutageLog(log, "writer", "commands are answered 503 until it is back")
        """Its log lines: one when the store goes, one once commits have gone SETTLE s without a
        failure. The thread's session and each event loop's fail and come back apart (a cluster
        short of connections lets one connect and not the other): one outage, two lines."""
        self._outage_lock = threading.Lock()
        self._learning = False
        """The writer thread is learning a lost answer's outcome (blocked up to RESOLVE_FOR)."""

    # -- callers

    def run(self, handler: Callable[[UnitOfWork], T], source: ReadSource) -> T:
        """Runs a command handler in the next batch and returns once its events are durable."""
        job = self._submit(Job(handler, source))
        started = time.monotonic()
        while True:
            try:
                return job.future.result(timeout=POOL_WAIT / 4)
            except TimeoutError:
                if self._withdrawn(job, started):
                    raise _waiting_for_the_store() from None

    async def run_async(self, handler: Callable[[UnitOfWork], T], source: ReadSource) -> T:
        """`run` for a caller on an event loop: it awaits the answer without holding a thread
        (the writer settles its future with one `call_soon_threadsafe`)."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        job = Job(handler, source, (loop, future))
        if self._loop_appends is not None and source.copies and not self.down and not self._closed:
            # decided on its caller's copies: it reads nothing, so its batch can be this loop's
            batches = self._on_loops.get(loop)
            if batches is None:
                for gone in [other for other in self._on_loops if other.is_closed()]:
                    self._on_loops.pop(gone).close()
                batches = self._on_loops[loop] = LoopBatches(self, loop, self._loop_appends)
            batches.submit(job)
        else:
            self._submit(job)
        started = time.monotonic()

        def check() -> None:  # as `run` does, every POOL_WAIT / 4
            nonlocal timer
            if future.done():
                return
            if self._withdrawn(job, started):
                future.set_exception(_waiting_for_the_store())
            else:
                timer = loop.call_later(POOL_WAIT / 4, check)

        timer = loop.call_later(POOL_WAIT / 4, check)
        try:
            outcome = await future
        finally:
            timer.cancel()
        return outcome.answer()

    def _withdrawn(self, job: Job, started: float) -> bool:
        """While the store is down, or the writer thread is busy learning a lost commit's outcome,
        a job it has not taken yet is withdrawn after POOL_WAIT (nothing of it was written: 503).
        One it has taken gets its true answer, however long that takes."""
        return (self.down or self._learning) and time.monotonic() - started >= POOL_WAIT and job.future.cancel()

    def _submit(self, job: Job) -> Job:
        if self._closed:
            raise StoreUnavailable("store is closed")
        if self._thread is None:
            with self._thread_lock:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._loop, name="switchboard-writer", daemon=True)
                    self._thread.start()
        self.jobs.put(job)
        return job

    def hand_over(self, job: Job, *, fresh: bool = False) -> None:
        """A job an event loop's batch took goes to the writer thread (it reads the store, its
        refusal is confirmed on fresh state, or its batch did not commit); `fresh`: it is run on
        the latest committed state, not on its caller's copies (one was stale)."""
        if job.future.done():
            return  # answered already (never run twice)
        if fresh:
            job.source = FRESH
        job.future.untake()
        try:
            self._submit(job)
        except StoreUnavailable as error:
            job.future.set_exception(error)

    def subscribe(self, listener: Callable[[list[Recorded]], None]) -> None:
        """Calls `listener` after each commit, on the writer thread or on the event loop whose batch
        it was (docs/adr/0034); it must be quick and safe from any thread."""
        self._listeners.append(listener)

    def stop(self) -> None:
        """Ends the thread once the jobs already queued are answered (waits up to 5 s)."""
        self._closed = True
        try:
            current = asyncio.get_running_loop()
        except RuntimeError:
            current = None
        for loop, batches in list(self._on_loops.items()):
            if loop is not current and loop.is_running() and not loop.is_closed():
                loop.call_soon_threadsafe(batches.close)  # on its loop, which watches its socket
            else:  # on this very loop, or nobody awaits its batches any more
                batches.close()
        if self._thread is not None:
            self.jobs.put(None)
            self._thread.join(timeout=5)

    def store_down(self, error: BaseException) -> None:
        """Marks the store unavailable (one log line per outage)."""
        self.down = True
        with self._outage_lock:
            began = not self._outage.down
            self._outage.failed(error)
        if began and self._thread is not None and threading.current_thread() is not self._thread:
            self.jobs.put(_NUDGE)  # an idle thread waits for jobs with no end: now with SETTLE's

    def unsure(self, error: BaseException) -> None:
        """A commit's answer was lost and its outcome is being learned (the recorder's hook). On
        the writer thread, that thread is blocked until it is known (up to RESOLVE_FOR): the jobs
        it has not taken are withdrawn after POOL_WAIT meanwhile. An event loop's batch learns it
        on another thread and blocks nobody. Not the store down: it may well answer the lookup
        (a lost session, a proxy's cut), and another session may already have said it is back."""
        if threading.current_thread() is self._thread:
            self._learning = True

    def _store_up(self) -> None:
        self.down = False
        if self._outage.down:
            with self._outage_lock:
                self._outage.succeeded()

    # -- the thread

    def _loop(self) -> None:
        while True:
            try:
                job = self.jobs.get(timeout=SETTLE) if self._outage.down else self.jobs.get()
            except queue.Empty:  # idle after an outage: back once the last commits went SETTLE s unfailed
                if not self.down:
                    self._store_up()
                continue
            if job is _NUDGE:
                continue
            if job is None:
                return
            if not job.future.take():
                continue  # withdrawn by its caller while the store was down
            # Those answered by the recent commits are about to send their next command: wait a
            # moment for as many as the largest recent batch, so the batches (and their one commit
            # each) stay full under load; a caller slow to be scheduled again (a loaded machine)
            # then does not shrink the batches after it one by one. The wait ends sooner when no
            # job has come for GAP: callers that come back one by one, each after work of its own
            # (an event loop preparing each delivery), would otherwise hold every batch for all
            # of LINGER while the first jobs in it wait (docs/adr/0032, session 16).
            target = max(self._recent_sizes)
            deadline = time.monotonic() + LINGER
            run = Run()
            try:
                # Each job's handler runs as soon as the job is taken, while the batch waits for
                # the rest: the callers come back one by one, and their gaps are the writer's.
                self._handle(run, job, 0)
                while run.size < MAX_BATCH:
                    try:
                        if run.size < target:
                            more = self.jobs.get(timeout=max(min(deadline - time.monotonic(), GAP), 0))
                        else:
                            more = self.jobs.get_nowait()
                    except queue.Empty:
                        break
                    if more is None:
                        self.jobs.put(None)
                        break
                    if more is not _NUDGE and more.future.take():
                        self._handle(run, more, 0)
                self._recent_sizes.append(run.size)
                self._finish(run, 0)
            except BaseException as error:  # never let the writer die with jobs waiting
                log.exception("writer failed a batch")
                for j in run.jobs:
                    if not j.future.done():
                        j.future.set_exception(error)

    def _process(self, jobs: list[Job], attempt: int = 0) -> None:
        """Runs jobs as one batch; after a lost race, again on fresh state, then one by one."""
        run = Run()
        for job in jobs:
            self._handle(run, job, attempt)
        self._finish(run, attempt)

    def _handle(self, run: Run, job: Job, attempt: int, *, on_loop: bool = False) -> None:
        """Runs one job's handler into the batch: a job that succeeds is answered once the batch
        commits; a refusal decided on fresh state, or an error, at once. `on_loop`: an event loop's
        batch, whose handlers may not read the store (one that would goes to the writer thread)."""
        run.jobs.append(job)
        unit = Unit(self._reads, run.batch, self._clock.now(), FRESH if attempt > 0 else job.source,
                    may_read=not on_loop)
        try:
            result = job.handler(unit)
        except WouldRead:
            unit.rollback()
            run.jobs.pop()
            self.hand_over(job)
        except DomainError as error:
            unit.rollback()
            if unit.used_cache:
                run.recheck.append(job)  # confirm the refusal against fresh state
            else:
                job.future.set_exception(error)
        except Exception as error:
            unit.rollback()
            job.future.set_exception(error)
        else:
            run.batch.payloads.want(unit.payloads_wanted)
            run.done.append((job, result))

    def _finish(self, run: Run, attempt: int) -> None:
        """Commits a batch whose handlers have run, and answers its jobs."""
        done, recheck = run.done, run.recheck
        if done:
            try:
                recorded = self._commit(run.batch)
            except RUN_AGAIN as error:
                self._unsettled(run.batch)
                self._lost_race(run.batch, error)
                again = [job for job, _ in done] + recheck
                if attempt < BATCH_RETRIES:
                    time.sleep(random.uniform(0, 0.002 * (2 ** attempt)))
                    self._process(again, attempt + 1)
                else:
                    for job in again:
                        self._run_alone(job)
                return
            except CommitOutcomeUnknown as error:
                self._unsettled(run.batch)
                self.store_down(error)
                for job, _ in done:
                    job.future.set_exception(error)
            except (PersistenceError, StoreUnavailable) as error:
                self._unsettled(run.batch)
                self.store_down(error)
                failure = StoreUnavailable(f"store unavailable: {error}")
                for job, _ in done:
                    job.future.set_exception(failure)
            except Exception:
                # events that cannot be written at all (e.g. text that is not Unicode): nothing
                # was appended; run the commands one at a time so only the culprit fails
                self._unsettled(run.batch)
                for job, _ in done:
                    self._run_alone(job)
            else:
                self._store_up()
                settle_all([(job.future, result) for job, result in done])
                # The GIL to the callers first: they answer (an HTTP 202, a tool result) and come
                # back with their next command while this thread would only announce and take the
                # next job. Without it the loop waits for the GIL behind the writer; with it ingest
                # measured ~9 % more deliveries/s (docs/adr/0032, session 15).
                time.sleep(0)
                self._announce(recorded)
        if recheck:
            self._process(recheck, attempt + 1)

    def _unsettled(self, batch: Batch) -> None:
        """A commit that failed, or whose outcome is unknown: its aggregates' copies and the
        candidates read ahead from it (which leave out its claims) are dropped."""
        self._cache.forget(batch.aggregates)
        self._prefetch.clear()

    def _lost_race(self, batch: Batch, error: BaseException) -> None:
        """Another writer appended first: where this batch read claim candidates, this writer
        reads again which writers claim there (interfaces/store/lanes.py)."""
        if isinstance(error, IntegrityError) and batch.candidates:
            self._reads.lanes.lost(batch.candidates, self._clock.now())

    def _run_alone(self, job: Job) -> None:
        for attempt in range(MAX_RETRIES):
            batch = Batch()
            unit = Unit(self._reads, batch, self._clock.now(), FRESH)
            try:
                result = job.handler(unit)
            except Exception as error:
                job.future.set_exception(error)
                return
            batch.payloads.want(unit.payloads_wanted)
            try:
                recorded = self._commit(batch)
            except RUN_AGAIN as error:
                self._unsettled(batch)
                self._lost_race(batch, error)
                time.sleep(random.uniform(0, 0.002 * (2 ** min(attempt, 6))))
                continue
            except (PersistenceError, StoreUnavailable) as error:
                self._unsettled(batch)
                self.store_down(error)
                job.future.set_exception(StoreUnavailable(f"store unavailable: {error}"))
                return
            except CommitOutcomeUnknown as error:
                self._unsettled(batch)
                self.store_down(error)
                job.future.set_exception(error)
                return
            except Exception as error:
                self._unsettled(batch)
                job.future.set_exception(error)
                return
            self._store_up()
            job.future.set_result(result)
            self._announce(recorded)
            return
        job.future.set_exception(RetryLimitExceeded("gave up after repeated concurrent updates; try again"))

    def _commit(self, batch: Batch) -> list[Recorded]:
        events, moves, wanted = self._collect(batch)
        if not events:
            if wanted:  # nothing to commit: a plain read
                batch.payloads.fill(self._reads.payloads(wanted))
            return []
        self._prefetch.read_ahead(batch.candidates, events)
        try:
            positions, payloads = self._append(events, wanted)
        finally:
            self._learning = False
        return self._committed(batch, events, moves, wanted, positions, payloads)

    def _collect(self, batch: Batch) -> tuple[list[DomainEvent], list[LoadMove], list[str]]:
        """A batch's events, what they do to the controlled queues' loads, the payloads its answers show."""
        events: list[DomainEvent] = []
        moves: list[LoadMove] = []  # what this commit does to the controlled queues' loads
        tracking = self._reads.queue_loads.tracking
        for aggregate in batch.aggregates.values():
            collected = aggregate.collect_events()
            events.extend(collected)
            if tracking and isinstance(aggregate, Todo):
                moves += load_moves(aggregate, collected)
        return events, moves, list(batch.payloads.wanted)

    def _committed(self, batch: Batch, events: list[DomainEvent], moves: list[LoadMove], wanted: list[str],
                   positions: Sequence[int] | None, payloads: Mapping[str, StoredPayload]) -> list[Recorded]:
        """What a commit leaves this process knowing: the payloads read, the queues' loads, the copies."""
        if wanted:
            batch.payloads.fill(payloads)
        if moves:
            self._reads.queue_loads.committed(moves)
        self._cache.keep(batch.aggregates)
        return [Recorded(position, event) for position, event in zip(positions or [0] * len(events), events)]

    def _announce(self, recorded: list[Recorded]) -> None:
        if not recorded:
            return
        for listener in self._listeners:
            try:
                listener(recorded)
            except Exception:  # a listener's bug must not fail committed commands
                log.exception("commit listener failed")
