"""The writer: one thread per process that runs every command handler, in batches (group commit).

It takes all handlers waiting at that moment (and, for a moment, those about to come), runs each
as it takes it, one after another on a shared view of the aggregates they touch
(`interfaces/store/unit.py`), and appends every resulting event in ONE transaction, with the
payloads the commands' answers show, read in it before it commits (docs/adr/0027). Optimistic
concurrency (the unique (stream, version) key) catches a race with another process: the batch
is then re-run on fresh state, then one command at a time. A commit
whose outcome was lost with the connection is resolved by the recorder (recorders.py,
docs/adr/0014); the writer only answers what it learns. See docs/adr/0004-claims-and-batching.md.
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
from dataclasses import dataclass
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
from interfaces.store.database import POOL_WAIT, first_line
from interfaces.store.queues import LoadMove, load_moves
from interfaces.store.recorders import NotCommitted
from interfaces.store.unit import FRESH, Batch, Reads, ReadSource, Unit, WouldRead

log = logging.getLogger("switchboard.store")
T = TypeVar("T")

MAX_BATCH = 64  # commands per batch (one transaction)
LINGER = 0.001  # seconds a batch may wait to fill up to the size of the recent batches
GAP = 0.00025  # seconds a filling batch waits for its next job (LINGER in all at most)
RECENT = 8  # batches whose largest size the next batch waits (LINGER at most) to reach
MAX_RETRIES = 12  # attempts of a command run alone after its batch kept losing races
BATCH_RETRIES = 3  # re-runs of a whole batch on fresh state before running it one by one
CHECK_EVERY = 0.25  # seconds between two reads of an event loop's batch on its way, besides its socket's reader

Append = Callable[[list[DomainEvent], Sequence[str]], tuple[Sequence[int] | None, Mapping[str, StoredPayload]]]
"""Writes events (with the inline read models) in one transaction and, in it before it commits,
reads the stored payloads of these digests; their log positions and the payloads read."""


_PENDING, _TAKEN, _CANCELLED, _DONE = range(4)
_TRANSITIONS = threading.Lock()  # taking a job into a batch against its caller withdrawing it


class Outcome:
    """A command's answer, set once on the writer thread and waited for by its caller: a lock held
    until then. (A `concurrent.futures.Future` wakes its waiter through a condition, with Python of
    its own per answer: ~1/6 of the writer thread in a claim+complete profile.)"""

    __slots__ = ("_ready", "_state", "_value", "_error", "_waiter")

    def __init__(self, waiter: tuple[asyncio.AbstractEventLoop, asyncio.Future] | None = None) -> None:
        self._ready = threading.Lock()
        self._ready.acquire()
        self._state = _PENDING
        self._value: Any = None
        self._error: BaseException | None = None
        self._waiter = waiter
        """An event loop's future to settle too, for a caller that awaits (`Writer.run_async`)."""

    def take(self) -> bool:
        """The writer takes the job into a batch, unless its caller has withdrawn it."""
        with _TRANSITIONS:
            if self._state == _CANCELLED:
                return False
            self._state = _TAKEN
            return True

    def taken(self) -> bool:
        return self._state == _TAKEN

    def untake(self) -> None:
        """A job taken into an event loop's batch goes back to waiting (for the writer thread)."""
        with _TRANSITIONS:
            if self._state == _TAKEN:
                self._state = _PENDING

    def cancel(self) -> bool:
        """The caller withdraws a job the writer has not taken."""
        with _TRANSITIONS:
            if self._state != _PENDING:
                return False
            self._state = _CANCELLED
            return True

    def done(self) -> bool:
        return self._state == _DONE

    def set_result(self, value: Any) -> None:
        if self.resolve(value) is not None:
            self._wake()

    def resolve(self, value: Any) -> tuple[asyncio.AbstractEventLoop, asyncio.Future] | None:
        """`set_result` whose awaiting caller, if any, is left to be woken by the one returned
        here (the writer wakes each loop once per batch: `settle_all`)."""
        self._value, self._state = value, _DONE
        self._ready.release()
        return self._waiter

    def set_exception(self, error: BaseException) -> None:
        self._error, self._state = error, _DONE
        self._ready.release()
        if self._waiter is not None:
            self._wake()

    def _wake(self) -> None:
        loop, future = self._waiter
        try:
            loop.call_soon_threadsafe(_settle_all, [(future, self)])
        except RuntimeError:  # the loop has closed: nobody awaits the answer any more
            pass

    def answer(self) -> Any:
        """The answer of an outcome that is done (or its error raised)."""
        if self._error is not None:
            raise self._error
        return self._value

    def result(self, timeout: float) -> Any:
        """The answer (or its error raised); `TimeoutError` if it is not set within `timeout`."""
        if not self._ready.acquire(timeout=timeout):
            raise TimeoutError
        self._ready.release()
        return self.answer()


RUN_AGAIN = (IntegrityError, NotCommitted)
"""An append that failed with these stored nothing and the store is up (a lost race, a lost
session whose lookup found nothing of it): its batch runs again on fresh state, on the writer
thread (its own batches, and those an event loop hands it)."""

_NUDGE: Any = object()
"""Put on the writer's queue to wake its idle thread (`Writer.store_down` from an event loop)."""


def _waiting_for_the_store() -> StoreUnavailable:
    return StoreUnavailable("store unavailable: the writer is waiting for the store")


def _settle_all(settled: list[tuple[asyncio.Future, Outcome]]) -> None:
    """On the awaiting callers' loop: each future takes its outcome (which holds the answer)."""
    for future, outcome in settled:
        if not future.done():
            future.set_result(outcome)


def settle_all(answered: Sequence[tuple[Outcome, Any]]) -> None:
    """Answers a batch's outcomes; the callers awaiting on one event loop are woken together, by
    one `call_soon_threadsafe` (one wake-up of that loop, not one per command)."""
    woken: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future, Outcome]]] = {}
    for outcome, value in answered:
        waiter = outcome.resolve(value)
        if waiter is not None:
            woken.setdefault(waiter[0], []).append((waiter[1], outcome))
    for loop, settled in woken.items():
        try:
            loop.call_soon_threadsafe(_settle_all, settled)
        except RuntimeError:  # the loop has closed: nobody awaits these answers any more
            pass


class Job:
    """A command handler waiting for its batch, the outcome its caller waits on, its read source."""

    __slots__ = ("handler", "future", "source")

    def __init__(self, handler: Callable[[UnitOfWork], Any], source: ReadSource,
                 waiter: tuple[asyncio.AbstractEventLoop, asyncio.Future] | None = None) -> None:
        self.handler = handler
        self.future = Outcome(waiter)
        self.source = source


class _Run:
    """One batch on its way: the jobs taken, their shared view, those whose handler succeeded (with
    its result) and those whose refusal must be confirmed on fresh state."""

    __slots__ = ("jobs", "batch", "done", "recheck")

    def __init__(self) -> None:
        self.jobs: list[Job] = []
        self.batch = Batch()
        self.done: list[tuple[Job, Any]] = []
        self.recheck: list[Job] = []

    @property
    def size(self) -> int:
        return len(self.jobs)


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
            run = _Run()
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
        run = _Run()
        for job in jobs:
            self._handle(run, job, attempt)
        self._finish(run, attempt)

    def _handle(self, run: _Run, job: Job, attempt: int, *, on_loop: bool = False) -> None:
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

    def _finish(self, run: _Run, attempt: int) -> None:
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


@dataclass(frozen=True)
class LoopAppends:
    """How an event loop's batches reach the store (PostgreSQL only): a session of their own,
    opened on a thread, and an append sent on it whose answer is read when it comes."""

    open_session: Callable[[], Any]
    send: Callable[[Any, list[DomainEvent], Sequence[str]], Any]


class LoopBatches:
    """The batches of the commands awaited on one event loop, committed from that loop
    (docs/adr/0034).

    A command decided on its caller's copies (an ingest delivery, ADR 31) reads nothing: its
    handler, its batch's append and the answers all run on the loop that awaits it, and the
    append's round trip is awaited as the loop awaits a socket (the session is non-blocking:
    nothing here waits). No thread takes the command or hands its answer back, and nothing
    competes with the loop for the GIL to do so. The commands that come while a batch commits
    form the next one, sent as soon as its answer has come.

    What is not plain goes to the writer thread (`Writer.hand_over`), which has every rule for
    it: a handler that would read the store (`WouldRead`), a refusal to confirm on fresh state or
    a batch that lost a race (both run again there on fresh state), events that cannot be written,
    and every command while this loop has no session (the first ones, and after a failure, while
    one is opened on a thread). A batch whose append failed because the store did is answered 503
    as the thread's would be; one whose answer was lost is looked for on a thread, as the thread's
    is (ADR 14): its commands get their true answer, run again on the writer thread if it had not
    committed, or are told the outcome is unknown (its new commands go to the thread meanwhile). The
    thread's batches and the loop's commit on two sessions; the table lock orders their events as
    it orders several processes'.
    """

    def __init__(self, writer: Writer, loop: asyncio.AbstractEventLoop, appends: LoopAppends) -> None:
        self._writer = writer
        self._loop = loop
        self._appends = appends
        self._pending: list[Job] = []
        self._next = _Run()  # the next batch, its handlers run as its commands came (while one was on its way)
        self._session: Any = None
        self._opening = False
        self._busy = False  # a batch is on its way (or what became of it is being learned)
        self._learning = False  # what became of it is being learned (up to RESOLVE_FOR)
        self._scheduled = False
        self._closed = False
        self._in_flight: tuple[_Run, Any] | None = None  # the batch whose answer is awaited, its append
        self._check: asyncio.TimerHandle | None = None  # its next check (`_checked`)

    def submit(self, job: Job) -> None:
        if self._learning:  # nobody waits behind a lookup: the writer thread has sessions of its own
            self._writer.hand_over(job)
            return
        if self._busy and self._next.size < MAX_BATCH:
            # A batch is on its way: this command's handler runs now, in the time the loop would
            # wait for its answer, and the next batch is ready to go the moment that answer comes.
            # (Decided before that batch is known to have committed, on the copies and the kept
            # aggregates as of the last commit: one that overlaps it loses the race at its append,
            # and runs again on fresh state, as any stale copy does.)
            if job.future.take():
                self._writer._handle(self._next, job, 0, on_loop=True)
            return
        self._pending.append(job)
        self._schedule()

    def _waiting(self) -> list[Job]:
        """The commands not sent yet, taken from this loop: those whose handler ran (unless it
        answered them already), and those not taken."""
        ahead, self._next = self._next, _Run()
        jobs, self._pending = [job for job in ahead.jobs if job.future.taken()] + self._pending, []
        return jobs

    def close(self) -> None:
        """On the loop: the session closes; a batch on its way is answered as unknown, and the
        commands not sent go to the writer thread (which answers them, or says the store closed)."""
        self._closed = True
        in_flight, self._in_flight = self._in_flight, None
        if in_flight is not None:
            run, appending = in_flight
            self._unwatch(appending)
            self._settle_all(run, CommitOutcomeUnknown("store closed: whether this was stored is unknown"))
        session, self._session = self._session, None
        if session is not None:
            session.close()
        self._schedule()

    def _schedule(self) -> None:
        # call_soon, not at once: the commands submitted in this turn of the loop join the batch,
        # and the answers just settled go out before the next batch is built
        if not self._busy and not self._scheduled and (self._pending or self._next.jobs):
            self._scheduled = True
            self._loop.call_soon(self._start)

    def _start(self) -> None:
        self._scheduled = False
        if self._busy or not (self._pending or self._next.jobs):
            return
        writer = self._writer
        if self._closed or self._session is None or not self._session.sound():
            if self._session is not None:
                self._session.close()
                self._session = None
            self._open()
            for job in self._waiting():
                writer.hand_over(job)
            return
        run, self._next = self._next, _Run()
        room = MAX_BATCH - run.size
        jobs, self._pending = self._pending[:room], self._pending[room:]
        try:
            self._send(run, jobs)
        except BaseException as error:  # never leave a command unanswered (the thread's `_loop` does the same)
            self._broken(run, jobs, error)  # `jobs`: those not reached yet
        self._schedule()

    def _open(self) -> None:
        if self._opening or self._closed:
            return
        self._opening = True
        self._loop.run_in_executor(None, self._appends.open_session).add_done_callback(self._opened)

    def _opened(self, opening: asyncio.Future) -> None:
        self._opening = False
        if opening.cancelled():
            return
        error = opening.exception()
        if error is not None:  # the writer thread's batches meanwhile; tried again at the next command
            log.debug("writer: the event loop's session did not open: %s", first_line(error))
        elif self._closed:
            opening.result().close()
        else:
            self._session = opening.result()

    def _send(self, run: _Run, jobs: list[Job]) -> None:
        writer = self._writer
        while jobs:
            job = jobs.pop(0)
            if job.future.take():
                writer._handle(run, job, 0, on_loop=True)
        for job in run.recheck:  # a refusal read from a copy: confirmed on fresh state
            writer.hand_over(job, fresh=True)
        if not run.done:
            return
        appending = None
        try:
            events, moves, wanted = writer._collect(run.batch)
            if not events and wanted:  # a plain read of payloads
                raise WouldRead("the answers show stored payloads")
            if events:
                writer._prefetch.read_ahead(run.batch.candidates, events)
                appending = self._appends.send(self._session, events, wanted)
        except Exception:  # a prune that reads first, a value that cannot be sent: nothing committed
            if self._session is not None and self._session.conn.closed:
                self._session = None
            writer._unsettled(run.batch)
            for job, _ in run.done:
                writer.hand_over(job)
            return
        if appending is None:  # nothing to commit
            self._answer(run, [])
            return
        self._busy = True
        if appending.error is not None:
            self._failed(run, events, moves, wanted, appending, appending.error)
            return
        self._in_flight = (run, appending)
        self._check = self._loop.call_later(CHECK_EVERY, self._checked, run, events, moves, wanted, appending)
        self._loop.add_reader(appending.socket, self._guarded, self._readable, run, events, moves, wanted, appending)
        if not appending.flush():  # the rest goes as the socket takes it
            self._loop.add_writer(appending.socket, self._guarded, self._writable, run, events, moves, wanted,
                                  appending)

    def _guarded(self, step: Callable[..., None], run: _Run, *args: Any) -> None:
        try:
            step(run, *args)
        except BaseException as error:
            self._broken(run, [], error)

    def _writable(self, run: _Run, events: list[DomainEvent], moves: list[LoadMove], wanted: list[str],
                  appending: Any) -> None:
        try:
            flushed = appending.flush()
        except Exception as error:
            self._unwatch(appending)
            self._failed(run, events, moves, wanted, appending, error)
            return
        if flushed:
            self._loop.remove_writer(appending.socket)

    def _readable(self, run: _Run, events: list[DomainEvent], moves: list[LoadMove], wanted: list[str],
                  appending: Any) -> None:
        try:
            appended = appending.poll()
        except Exception as error:  # the server's refusal, a lost connection, an answer not read
            self._unwatch(appending)
            self._failed(run, events, moves, wanted, appending, error)
            return
        if appended is not None:
            self._unwatch(appending)
            self._committed(run, events, moves, wanted, appended)

    def _checked(self, run: _Run, events: list[DomainEvent], moves: list[LoadMove], wanted: list[str],
                 appending: Any) -> None:
        """Every CHECK_EVERY while a batch is on its way, its session is read as its reader would
        read it. In the fault suite's `backends_killed` (1 run in ~3) a batch's reader was seen
        never to fire: its session's server process was gone, the socket open, libpq's connection
        still OK, and the batch (with every command after it) waited for ever. The socket was then
        readable but gone from the interest list of uvloop's epoll (seen in /proc in 5 hangs);
        asyncio's own loop never hung (0 in 16 runs against 5 in 24 on uvloop, the check off).
        Likely, not proven: uvloop's or libuv's removal of an earlier socket with the same number,
        which sessions reuse as they are lost and reopened on threads (docs/adr/0034, session 19). The check finds the
        session's end, and the batch's outcome is learned as any lost answer's is; 2 batches in 5
        runs were ended by it, and none hung (8 of 8 runs, against 3 hangs in 8 before)."""
        if self._in_flight is None or self._in_flight[1] is not appending:
            return
        self._guarded(self._readable, run, events, moves, wanted, appending)
        if self._in_flight is not None and self._in_flight[1] is appending:
            self._check = self._loop.call_later(CHECK_EVERY, self._checked, run, events, moves, wanted, appending)

    def _unwatch(self, appending: Any) -> None:
        self._in_flight = None
        if self._check is not None:
            self._check.cancel()
            self._check = None
        self._loop.remove_reader(appending.socket)
        self._loop.remove_writer(appending.socket)

    def _failed(self, run: _Run, events: list[DomainEvent], moves: list[LoadMove], wanted: list[str],
                appending: Any, error: BaseException) -> None:
        """The session is done with; what became of the batch is learned on a thread (a lost
        answer is looked for up to RESOLVE_FOR, as the writer thread would)."""
        self._session = None
        if self._closed:  # the store is closing: its threads are going
            appending.close()
            self._settle_all(run, CommitOutcomeUnknown("store closed: whether this was stored is unknown"))
            return
        self._learning = True
        for job in self._waiting():
            self._writer.hand_over(job)
        learning = self._loop.run_in_executor(None, appending.failed, error)
        learning.add_done_callback(lambda learnt: self._guarded(self._learnt, run, learnt, events, moves, wanted))

    def _learnt(self, run: _Run, learnt: asyncio.Future, events: list[DomainEvent], moves: list[LoadMove],
                wanted: list[str]) -> None:
        self._learning = False
        error = learnt.exception()
        if error is None:  # its answer was lost, and it had committed
            self._committed(run, events, moves, wanted, learnt.result())
            return
        # nothing was stored (or whether it was is unknown): answered as the writer thread's
        # `_finish` answers its own batch
        writer = self._writer
        writer._unsettled(run.batch)
        again = isinstance(error, RUN_AGAIN)
        if isinstance(error, CommitOutcomeUnknown):
            writer.store_down(error)
            self._settle_all(run, error)
        elif isinstance(error, (PersistenceError, StoreUnavailable)) and not again:
            writer.store_down(error)
            self._settle_all(run, StoreUnavailable(f"store unavailable: {error}"))
        else:  # run again on fresh state; events that cannot be written: one by one
            self._busy = False
            for job, _ in run.done:
                writer.hand_over(job, fresh=again)
            self._schedule()

    def _committed(self, run: _Run, events: list[DomainEvent], moves: list[LoadMove], wanted: list[str],
                   appended: tuple[Sequence[int] | None, Mapping[str, StoredPayload]]) -> None:
        writer = self._writer
        recorded = writer._committed(run.batch, events, moves, wanted, *appended)
        # what the writer thread read ahead while this batch was on its way may miss its todos
        writer._prefetch.read_ahead((), events)
        writer._store_up()
        self._answer(run, recorded)

    def _answer(self, run: _Run, recorded: list[Recorded]) -> None:
        self._busy = False
        for job, result in run.done:
            waiter = job.future.resolve(result)
            if waiter is not None and not waiter[1].done():
                waiter[1].set_result(job.future)
        self._schedule()
        self._writer._announce(recorded)

    def _settle_all(self, run: _Run, error: BaseException) -> None:
        self._busy = False
        for job, _ in run.done:
            if not job.future.done():
                job.future.set_exception(error)
        self._schedule()

    def _broken(self, run: _Run, jobs: list[Job], error: BaseException) -> None:
        """A bug of ours in a step: the commands taken are answered with it, as the writer thread's
        `_loop` answers them, and the next batch starts on a new session."""
        log.error("writer: an event loop's batch failed", exc_info=error)
        in_flight, self._in_flight = self._in_flight, None
        if in_flight is not None:
            self._unwatch(in_flight[1])
        session, self._session = self._session, None
        if session is not None:
            session.close()
        self._writer._unsettled(run.batch)
        self._busy = self._learning = False
        for job in run.jobs:
            if job.future.taken():  # not answered, nor handed to the thread
                job.future.set_exception(error)
        for job in jobs:  # not taken yet
            self._writer.hand_over(job)
        self._schedule()
