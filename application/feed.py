"""The transition feed: every todo transition in log order, for the board's live view and `/stream`.

One tailer per process reads the event log after the last position it has seen — woken at once
by a local commit, and at least every `poll` seconds for what other processes commit — and keeps
the newest transitions in a ring. A follower resumes from any position: from the ring when it is
recent enough, else straight from the log. Positions are the log's: a follower that passes the
last position it received (SSE `Last-Event-ID`) gets every later transition exactly once.

That needs the log to become visible in position order. Both recorders make it so: SQLite has
one writer at a time, and the PostgreSQL append takes the events table's EXCLUSIVE lock before
its INSERT draws positions from the sequence, so a lower position never commits after a higher
one is visible (docs/adr/0012-operator-board.md). The tailer also reads only up to the maximum
position it saw committed before the read, never past it.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from application.errors import first_line
from application.presenters import iso
from domain.endpoint import Endpoint, EndpointVended, endpoint_uuid_of
from domain.names import ENDPOINT_PREFIX, TODO_PREFIX, format_id
from domain.todo import TODO_EVENTS, Todo, TodoMoved, TodoOpened, state_after

log = logging.getLogger("switchboard.feed")

PAGE = 500
PAGES_PER_READ = 4  # a tick or a resume reads at most this many pages, then comes back for more
RING = 20_000
KNOWN_TODOS = 200_000
JOIN_TIMEOUT = 10.0  # seconds close() waits for a tick in flight (a read of a stalled store)


@dataclass(frozen=True)
class Transition:
    position: int
    owner: str
    data: dict[str, Any]


class TransitionFeed:
    """Tails the log for todo transitions; thread-safe; the tailer runs only while followed."""

    def __init__(self, store: Any, *, poll: float = 0.25, ring: int = RING) -> None:
        self.store = store
        self.poll = poll
        self._ring: deque[Transition] = deque(maxlen=ring)
        self._floor = -1  # the ring holds every transition after this position (-1: not started)
        self._head = 0
        self._owners: dict[str, str] = {}  # endpoint id -> owner: never changes once vended
        self._todos: OrderedDict[UUID, tuple[str, str]] = OrderedDict()  # todo -> (endpoint id, queue)
        self._lock = threading.Condition()
        self._cache_lock = threading.Lock()
        self._wake = threading.Event()
        self._followers = 0
        self._listeners: list[Callable[[], None]] = []
        self._thread: threading.Thread | None = None
        self._behind = False
        self._closed = False

    # -- the tailer

    def wake(self) -> None:
        """A local commit: read the log now rather than at the next poll."""
        self._wake.set()

    def head(self) -> int:
        with self._lock:
            if self._floor < 0:
                self._start_locked()
            return self._head

    def _start_locked(self) -> None:
        self._head = self._floor = self.store.max_position()

    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="switchboard-feed", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        failing = False
        while not self._closed:
            with self._lock:
                if self._followers == 0:
                    self._thread = None  # the next follower starts afresh at the log's head
                    return
            try:
                self.tick()
                if failing:
                    log.warning("transition feed: reading the log again")
                failing = False
            except Exception as error:  # noqa: BLE001 - a store hiccup must not end the feed
                if not failing:
                    log.warning("transition feed: reading the log failed (%s); retrying", first_line(error))
                failing = True
            if not self._behind:
                self._wake.wait(self.poll)
                self._wake.clear()

    def tick(self) -> int:
        """Reads what was committed since the head into the ring (a few pages at most; `_behind`
        says more is waiting); returns how many transitions."""
        with self._lock:
            if self._floor < 0:
                self._start_locked()
            head = self._head
        found, new_head, self._behind = self._read(head)
        with self._lock:
            if self._head != head:  # another tick ran meanwhile (only `tick` moves the head)
                return 0
            self._ring.extend(found)
            if len(self._ring) == self._ring.maxlen and self._ring:
                self._floor = max(self._floor, self._ring[0].position - 1)
            self._head = new_head
            listeners = list(self._listeners) if found else []
            self._lock.notify_all()
        for listener in listeners:
            listener()
        return len(found)

    def _read(self, after: int, stop: int | None = None) -> tuple[list[Transition], int, bool]:
        """Transitions after `after`, up to what was committed when the read began, at most
        PAGES_PER_READ pages: also the position reached and whether more remains."""
        ceiling = self.store.max_position()
        if stop is not None:
            ceiling = min(ceiling, stop)
        found: list[Transition] = []
        position = after
        for _ in range(PAGES_PER_READ):
            if position >= ceiling or self._closed:  # closing: end a tick in flight at the next page
                break
            page = self.store.read_log(position, PAGE, types=(*TODO_EVENTS, EndpointVended), stop=ceiling)
            if len(page) < PAGE:  # nothing more of these types up to the ceiling
                found.extend(self._transitions(page))
                position = ceiling
                break
            found.extend(self._transitions(page))
            position = page[-1].position
        reached = max(position, after)
        return found, reached, reached < ceiling

    def _transitions(self, recorded: Iterable[Any]) -> list[Transition]:
        with self._cache_lock:  # the tailer and a follower reading old history may both be here
            return self._transitions_locked(list(recorded))

    def _transitions_locked(self, records: list[Any]) -> list[Transition]:
        out: list[Transition] = []
        self._learn_missing(records)
        for r in records:
            event = r.event
            if isinstance(event, EndpointVended):
                self._owners[format_id(ENDPOINT_PREFIX, event.originator_id)] = event.owner
                continue
            if isinstance(event, TodoOpened | TodoMoved):
                self._remember(event.originator_id, event.endpoint_id, event.queue)
            known = self._todos.get(event.originator_id)
            if known is None:
                continue  # a todo whose endpoint is gone from the store: nobody can see it
            endpoint_id, queue = known
            owner = self._owner_of(endpoint_id)
            if owner is None:
                continue
            state, dead = state_after(event)
            out.append(Transition(r.position, owner, {
                "position": r.position, "todo_id": format_id(TODO_PREFIX, event.originator_id),
                "type": type(event).__name__, "state": state, "dead_letter": dead, "queue": queue,
                "endpoint_id": endpoint_id, "time": iso(event.timestamp), "actor": event.actor,
            }))
        return out

    def _remember(self, todo: UUID, endpoint_id: str, queue: str) -> None:
        self._todos[todo] = (endpoint_id, queue)
        self._todos.move_to_end(todo)
        while len(self._todos) > KNOWN_TODOS:
            self._todos.popitem(last=False)

    def _learn_missing(self, records: list[Any]) -> None:
        """Todos opened before this process saw them: their endpoint and queue, in one read per page."""
        opened = {r.event.originator_id for r in records if isinstance(r.event, TodoOpened)}
        missing = {
            r.event.originator_id for r in records
            if not isinstance(r.event, EndpointVended) and r.event.originator_id not in opened
            and r.event.originator_id not in self._todos
        }
        for todo_uuid, todo in self.store.load_many([(Todo, m) for m in missing]).items():
            if todo is not None:
                self._remember(todo_uuid, todo.endpoint_id, todo.queue)

    def _owner_of(self, endpoint_id: str) -> str | None:
        owner = self._owners.get(endpoint_id)
        if owner is None:
            endpoint = self.store.load(Endpoint, endpoint_uuid_of(endpoint_id))
            if endpoint is None:
                return None
            owner = self._owners[endpoint_id] = endpoint.owner
        return owner

    # -- followers

    def present(self) -> int:
        """The log position now: a stream without Last-Event-ID sends every transition after it.
        Taken before the stream's answer goes out, so what the client does once it has that
        answer is always sent."""
        with self._lock:
            head = self._head
        return max(head, self.store.max_position())  # the tailer may be a poll behind

    def follow(self, start: int | None = None) -> Follower:
        """A new reader from `start`, a position already read with `present` (None: the present now)."""
        with self._lock:
            if self._floor < 0 or self._thread is None or not self._thread.is_alive():
                # nobody followed for a while: the ring and head are stale, start at the log's head
                self._start_locked()
                self._ring.clear()
            present = self.present() if start is None else start
            self._followers += 1  # only once nothing can fail: a store error leaves no follower behind
            self._ensure_thread()
            return Follower(self, present)

    def _unfollow(self) -> None:
        with self._lock:
            self._followers -= 1

    def since(self, after: int, owner: str | None) -> tuple[list[dict[str, Any]], int, bool]:
        """This owner's transitions after a position (None: everyone's), the position reached, and
        whether more is already there to read (call again at once)."""
        with self._lock:
            if self._floor < 0:
                self._start_locked()
            head, floor = self._head, self._floor
            if after >= floor:
                found: list[Transition] = []
                for t in reversed(self._ring):  # followers are near the head: walk back from it
                    if t.position <= after:
                        break
                    found.append(t)
                found.reverse()
                return [t.data for t in found if owner is None or t.owner == owner], max(head, after), False
        # older than the ring holds: read that stretch from the log itself, a few pages at a time
        older, reached, _ = self._read(after, stop=floor)
        return [t.data for t in older if owner is None or t.owner == owner], reached, True

    def add_listener(self, listener: Callable[[], None]) -> None:
        with self._lock:
            self._listeners.append(listener)

    def remove_listener(self, listener: Callable[[], None]) -> None:
        with self._lock:
            if listener in self._listeners:
                self._listeners.remove(listener)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def tailing(self) -> bool:
        """Whether the tailer thread is running (it reads the store)."""
        thread = self._thread
        return thread is not None and thread.is_alive()

    def close(self, *, wait: bool = True) -> None:
        """The server is stopping: followers end their streams, and (`wait`) the tailer has ended
        when this returns, so the store can be closed under it. A store's close ends the
        connections that are in use, and SQLite's C library crashes the process when one is
        closed while another thread runs a statement on it (CI saw that segfault).
        `wait=False` only signals: safe from a signal handler."""
        self._closed = True
        self._wake.set()
        with self._lock:
            listeners = list(self._listeners)
            thread = self._thread
        try:
            for listener in listeners:
                try:
                    listener()
                except Exception:  # noqa: BLE001 - e.g. a stream's loop already closed: nothing to wake
                    log.debug("transition feed: a listener failed at close", exc_info=True)
        finally:
            if wait and thread is not None and thread is not threading.current_thread():
                thread.join(JOIN_TIMEOUT)
                if thread.is_alive():
                    log.warning("transition feed: the tailer did not end within %s s", JOIN_TIMEOUT)


class Follower:
    """One reader of the feed (an SSE connection); `close` when it leaves."""

    def __init__(self, feed: TransitionFeed, start: int) -> None:
        self.feed = feed
        self.start = start
        self._closed = False

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.feed._unfollow()
