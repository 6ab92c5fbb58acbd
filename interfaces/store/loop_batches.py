"""An event loop's own batches: the commands awaited on one loop, committed from that loop
(docs/adr/0034), on a non-blocking session of their own; what is not plain goes to the writer
thread (writer.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from eventsourcing.persistence import PersistenceError

from application.errors import CommitOutcomeUnknown, StoreUnavailable, first_line
from application.ports import Recorded, StoredPayload
from domain.events import DomainEvent
from interfaces.store.jobs import MAX_BATCH, RUN_AGAIN, Job, Run
from interfaces.store.queues import LoadMove
from interfaces.store.unit import WouldRead

if TYPE_CHECKING:
    from interfaces.store.writer import Writer

log = logging.getLogger("switchboard.store")

CHECK_EVERY = 0.25  # seconds between two reads of an event loop's batch on its way, besides its socket's reader


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
        self._next = Run()  # the next batch, its handlers run as its commands came (while one was on its way)
        self._session: Any = None
        self._opening = False
        self._busy = False  # a batch is on its way (or what became of it is being learned)
        self._learning = False  # what became of it is being learned (up to RESOLVE_FOR)
        self._scheduled = False
        self._closed = False
        self._in_flight: tuple[Run, Any] | None = None  # the batch whose answer is awaited, its append
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
        ahead, self._next = self._next, Run()
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
        run, self._next = self._next, Run()
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

    def _send(self, run: Run, jobs: list[Job]) -> None:
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

    def _guarded(self, step: Callable[..., None], run: Run, *args: Any) -> None:
        try:
            step(run, *args)
        except BaseException as error:
            self._broken(run, [], error)

    def _writable(self, run: Run, events: list[DomainEvent], moves: list[LoadMove], wanted: list[str],
                  appending: Any) -> None:
        try:
            flushed = appending.flush()
        except Exception as error:
            self._unwatch(appending)
            self._failed(run, events, moves, wanted, appending, error)
            return
        if flushed:
            self._loop.remove_writer(appending.socket)

    def _readable(self, run: Run, events: list[DomainEvent], moves: list[LoadMove], wanted: list[str],
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

    def _checked(self, run: Run, events: list[DomainEvent], moves: list[LoadMove], wanted: list[str],
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

    def _failed(self, run: Run, events: list[DomainEvent], moves: list[LoadMove], wanted: list[str],
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

    def _learnt(self, run: Run, learnt: asyncio.Future, events: list[DomainEvent], moves: list[LoadMove],
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

    def _committed(self, run: Run, events: list[DomainEvent], moves: list[LoadMove], wanted: list[str],
                   appended: tuple[Sequence[int] | None, Mapping[str, StoredPayload]]) -> None:
        writer = self._writer
        recorded = writer._committed(run.batch, events, moves, wanted, *appended)
        # what the writer thread read ahead while this batch was on its way may miss its todos
        writer._prefetch.read_ahead((), events)
        writer._store_up()
        self._answer(run, recorded)

    def _answer(self, run: Run, recorded: list[Recorded]) -> None:
        self._busy = False
        for job, result in run.done:
            waiter = job.future.resolve(result)
            if waiter is not None and not waiter[1].done():
                waiter[1].set_result(job.future)
        self._schedule()
        self._writer._announce(recorded)

    def _settle_all(self, run: Run, error: BaseException) -> None:
        self._busy = False
        for job, _ in run.done:
            if not job.future.done():
                job.future.set_exception(error)
        self._schedule()

    def _broken(self, run: Run, jobs: list[Job], error: BaseException) -> None:
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
