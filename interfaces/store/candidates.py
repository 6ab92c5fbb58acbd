"""Claim candidates read ahead: the next batch's claimable todos, queried while this one commits.

A batch that claimed reads the todo ids claimable for each (endpoint, queues) it asked about
again, on a thread of its own, while its events are written (the query overlaps the commit's
I/O). A later batch that claims takes them instead of querying on the writer thread: the next
one, or one after batches that claimed nothing there (completions, heartbeats: with
`claim_next(max=10)` nine batches in ten), for up to `MAX_AGE`. Nothing is ever missed: todos
claimed since the read are left out, a batch after which any todo may become claimable
(`MAY_BECOME_CLAIMABLE`) drops every read ahead, and a read that reached the queue's tail is
thrown away (read fresh instead).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from datetime import datetime, timedelta
from uuid import UUID

from application.ports import Clock
from domain.events import DomainEvent
from domain.todo import MAY_BECOME_CLAIMABLE, TodoClaimed

CANDIDATES_PER_BATCH = 64  # todo ids read per (endpoint, queues) at a time
PREFETCH_WAIT = 0.05  # seconds the next batch waits for a read ahead before querying itself
MAX_AGE = timedelta(milliseconds=250)
"""How long a read ahead stays good (by the store's clock) while batches that claim nothing there
pass. What became claimable meanwhile without an event of this writer (a delay or backoff that
ended; a release, expiry or requeue in another process) is not in it, so for that long a claim
may be served by younger todos (never an empty answer: a read that reached the tail is not
kept); a todo another process claimed meanwhile is read afresh before it is given, or loses the
commit's version check."""
CLOSE_WAIT = 5.0  # seconds close() waits for a read ahead still running (before its connection closes)

QueueKey = tuple[str, tuple[str, ...]]
"""(endpoint id, queues) as a claim names them."""
Candidates = tuple[list[UUID], bool]
"""Claimable todo ids, oldest first, and whether they are the whole of what is claimable."""
ReadClaimable = Callable[[str, Sequence[str], datetime, int], list[UUID]]


def _fresh(read_at: datetime, now: datetime) -> bool:
    """Read at most MAX_AGE ago (a clock that went back since makes it stale too)."""
    return timedelta(0) <= now - read_at <= MAX_AGE


class CandidatePrefetch:
    """The read-ahead of one writer: started after a batch that claimed, taken (once) by a later one."""

    def __init__(self, read: ReadClaimable, clock: Clock) -> None:
        self._read = read
        self._clock = clock
        self._ahead: dict[QueueKey, tuple[Future, frozenset[UUID], datetime]] = {}
        """Per key: the read, the todos claimed since it was started, and when it was."""
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="switchboard-prefetch")
        self._running: set[Future] = set()  # reads ahead not finished (done ones remove themselves)
        self._running_lock = threading.Lock()

    def read_ahead(self, keys: Iterable[QueueKey], events: Sequence[DomainEvent]) -> None:
        """Starts reading the candidates of these queues for a batch after the one that recorded
        `events`; what was read ahead for other queues stays, less what `events` claim (all of
        it goes if any of them may make a todo claimable)."""
        if any(isinstance(e, MAY_BECOME_CLAIMABLE) for e in events):
            self._ahead.clear()
            return
        keys = list(keys)
        claimed = frozenset(e.originator_id for e in events if isinstance(e, TodoClaimed))
        now = self._clock.now()
        for key, (future, taken, read_at) in list(self._ahead.items()):
            if key in keys or not _fresh(read_at, now):
                self._ahead.pop(key, None)  # an event loop's batches read ahead too (docs/adr/0034)
            elif claimed:
                self._ahead[key] = (future, taken | claimed, read_at)
        for endpoint_id, queues in keys:
            future = self._pool.submit(self._read, endpoint_id, queues, now, CANDIDATES_PER_BATCH)
            with self._running_lock:
                self._running.add(future)
            future.add_done_callback(self._finished)
            self._ahead[(endpoint_id, queues)] = (future, claimed, now)

    def take(self, key: QueueKey, want: int) -> Candidates | None:
        """The candidates read ahead for `key`, if there are at least `want` of them; else None
        (then the caller reads them itself)."""
        entry = self._ahead.pop(key, None)
        if entry is None:
            return None
        future, claimed, read_at = entry
        if not _fresh(read_at, self._clock.now()):
            return None
        try:
            ids = future.result(timeout=PREFETCH_WAIT)
        except Exception:  # a failed or slow read ahead only means reading now
            return None
        if len(ids) < CANDIDATES_PER_BATCH:
            return None  # the queue's tail was visible: read it fresh, nothing may be missed
        remaining = [i for i in ids if i not in claimed]
        return (remaining, False) if len(remaining) >= want else None

    def _finished(self, future: Future) -> None:
        with self._running_lock:
            self._running.discard(future)

    def clear(self) -> None:
        """Forgets what was read ahead (the batch it followed did not commit as expected)."""
        self._ahead.clear()

    def close(self) -> None:
        """Stops reading ahead, and waits (a bounded time) for a read still running: the store
        closes its connections next, and a SQLite connection closed under a running query can
        crash the process."""
        with self._running_lock:
            running = list(self._running)
        self._ahead.clear()
        self._pool.shutdown(wait=False, cancel_futures=True)
        wait(running, timeout=CLOSE_WAIT)
