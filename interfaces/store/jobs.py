"""A command waiting for its batch, the batch it is taken into, and how their answers are given.

A `Job` is a command handler with the `Outcome` its caller waits on; a `Run` is one batch on its
way, as the writer thread (writer.py) and an event loop (loop_batches.py) both build it. An
`Outcome` is set once, on whichever of them commits the batch, and `settle_all` wakes each event
loop once per batch for the callers awaiting there (docs/adr/0023, docs/adr/0034).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from typing import Any

from eventsourcing.persistence import IntegrityError

from application.ports import UnitOfWork
from interfaces.store.recorders import NotCommitted
from interfaces.store.unit import Batch, ReadSource

MAX_BATCH = 64  # commands per batch (one transaction)

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


class Run:
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

