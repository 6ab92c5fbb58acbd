"""Background work of `serve`: the lease reaper and retry scheduler, and projection catch-up.

Neither sweeps on a fixed period. The scheduler sleeps until the earliest due timer (read
from the inline `timers` projection) and is woken by any local commit that moves a timer (a
burst of them gathers into one tick); the cap of
MAX_SLEEP bounds how late it notices a timer set by another process. Several processes may
run it on one database: the write side decides, so a lease is expired once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from application.errors import StoreUnavailable, first_line
from application.ports import Clock

log = logging.getLogger("switchboard.background")

MAX_SLEEP = 1.0
SETTLE = 2.0
"""Seconds a loop must succeed, and every loop of its process go without a failure, before it
says the store is back."""
DUE_PAGE = 200
FIRE_CHUNK = 50


class TimerScheduler:
    """Fires lapsed leases and due retries within a second of their time.

    After a wake it lets commits gather for GATHER seconds, as the projection worker does: every
    claim and every finished claim moves a timer and wakes it, so a drain of claim + complete
    costs a tick (two queries) per GATHER, not one per commit; a timer fires GATHER late.
    """

    GATHER = 0.02

    def __init__(self, app, views, clock: Clock) -> None:
        self.app = app
        self.views = views
        self.clock = clock
        self.wake = threading.Event()

    def tick(self) -> float:
        """Fires everything due now; returns how long to sleep before the next timer."""
        while True:
            due = self.views.due_timers(self.clock.now(), DUE_PAGE)
            moved = sum(self.app.fire_timers(due[i:i + FIRE_CHUNK]) for i in range(0, len(due), FIRE_CHUNK))
            if len(due) < DUE_PAGE or moved == 0:
                break
        upcoming = self.views.next_due()
        if upcoming is None:
            return MAX_SLEEP
        return min(max((upcoming - self.clock.now()).total_seconds(), 0.0), MAX_SLEEP)

    def run(self, stop: threading.Event) -> None:
        def tick() -> float:
            stop.wait(self.GATHER)
            return self.tick()

        _loop(tick, self.wake, stop, "scheduler")


class ProjectionWorker:
    """Keeps the asynchronous projections caught up with the log.

    After a wake it lets commits gather for GATHER seconds, so a burst of commits costs one
    catch-up, not one each; readers that need their own writes catch up themselves.
    """

    GATHER = 0.02

    def __init__(self, catch_up: Callable[[], object]) -> None:
        self._catch_up = catch_up
        self.wake = threading.Event()

    def tick(self) -> float:
        self._catch_up()
        return MAX_SLEEP

    def run(self, stop: threading.Event) -> None:
        def tick() -> float:
            # Always, not only while `wake` is set: the loop clears it before each tick, so that
            # test let every commit of a burst start a catch-up of its own. A periodic tick (no
            # wake for MAX_SLEEP) is late by GATHER, which no reader notices.
            stop.wait(self.GATHER)
            return self.tick()

        _loop(tick, self.wake, stop, "projections")


class OutageLog:
    """A loop's one line when the store goes and one when it is back (CONTRACT §12), however the
    store flaps in between: a cluster short of connections lets some ticks through, so "back" is
    said only once the loop has succeeded for SETTLE seconds without a failure, its own or any
    other loop's of this process. (A loop that holds a pooled connection keeps succeeding while
    the others cannot connect; said on its own ticks alone, its "back" came while the shortage
    went on, and its next connection failed: a second outage in the log of one.)"""

    last_failure = float("-inf")
    """When a loop of this process last failed for want of the store (time.monotonic)."""

    def __init__(self, logger: logging.Logger, name: str, retrying: str,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self._log = logger
        self.name = name
        self.retrying = retrying
        self.down = False
        self._ok_since: float | None = None
        self._monotonic = monotonic

    def failed(self, error: BaseException) -> None:
        self._ok_since = None
        OutageLog.last_failure = self._monotonic()
        if not self.down:
            self.down = True
            self._log.warning("%s: store unavailable (%s); %s", self.name, first_line(error), self.retrying)

    def succeeded(self) -> None:
        if not self.down:
            return
        now = self._monotonic()
        if self._ok_since is None:
            self._ok_since = now
        elif now - max(self._ok_since, OutageLog.last_failure) >= SETTLE:
            self.down, self._ok_since = False, None
            self._log.warning("%s: store is back", self.name)


def _loop(tick: Callable[[], float], wake: threading.Event, stop: threading.Event, name: str) -> None:
    """Runs `tick` until stopped. An outage of the store is one line when it starts and one when it
    ends, however many retries lie between (`OutageLog`); any other failure is logged once with
    its traceback, then retried quietly."""
    outage = OutageLog(log, name, f"retrying every {MAX_SLEEP:.0f} s")
    failing = False
    while not stop.is_set():
        try:
            delay = tick()
            outage.succeeded()
            if failing:
                log.warning("%s recovered", name)
            failing = False
        except StoreUnavailable as error:
            outage.failed(error)
            delay = MAX_SLEEP
        except Exception as error:
            if not failing:
                log.exception("%s tick failed (will retry every %.0f s)", name, MAX_SLEEP)
            else:
                log.debug("%s still failing: %s", name, error)
            failing = True
            delay = MAX_SLEEP
        if delay > 0:
            wake.wait(delay)
        wake.clear()
