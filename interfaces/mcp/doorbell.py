"""The doorbell: rings one live session of an endpoint when one of its todos becomes claimable.

Every process runs one `Doorbell` on the event loop that serves MCP (the session registry is
confined to it). It never learns of todos by message: the inline `sb_claimable` projection holds
every pending todo and since when, written in the transaction of the event that made it pending,
whichever process (a server, the CLI) wrote it. The doorbell scans it for rings due on the
endpoints it holds sessions of — when a local commit or a PostgreSQL NOTIFY says a ring may be due
(a todo became claimable, a queue's controls changed, or a claim ended while a queue was held), at
once again while a scan finds a full page of due rings, and at least every POLL seconds — takes each ring once across processes (`sb_rings`, the primary key decides),
and rings one target, rotating between the endpoint's targets: a handshake session gets
`notifications/claude/channel`, a stateless-era listen stream `notifications/resources/updated`
for the queue's resource (interfaces/mcp/listeners.py, docs/adr/0041). A process holding no
deliverable target of an endpoint takes none of its rings, so the process that does rings it.
See docs/adr/0011-doorbell.md.

Queue controls (docs/adr/0025-queue-admission.md): a ring of a queue that cannot admit a claim
now (paused, at max_in_flight, at its rate) is not taken; when such a queue can admit again, its
oldest waiting todo is rung (once across processes, like any ring). A session that opens its GET
stream, or a listen stream that opens, is rung at once for the oldest claimable todo of its queues
that can admit (ring on attach).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import anyio
import anyio.to_thread

from application.background import OutageLog
from application.errors import StoreUnavailable, first_line
from application.ports import Clock
from domain.doorbell import FREED, RING, RING_GRACE
from interfaces.mcp.sessions import CHANNEL, RingTarget, SessionRegistry
from interfaces.store.queues import QueueKey, SqlQueueLoad
from interfaces.store.rings import DUE_PER_SCAN, DueRing, SqlRings

log = logging.getLogger("switchboard.doorbell")

__all__ = ["CHANNEL", "Doorbell"]
POLL = 0.5
"""Longest wait between two scans: bounds how late a todo written by a process that cannot wake
this one (SQLite) is rung."""
MIN_GAP = 0.01
"""Shortest time between two scans, so a burst of commits costs a few scans, not one each."""
PUSH_TIMEOUT = 2.0
"""How long one session may hold up a ring (its stream buffer holds 16) before the next is tried."""
PRUNE_EVERY = 600.0
FORGET_EVERY = timedelta(seconds=1)
"""How often the scan drops the rings it decided more than 2 x RING_GRACE ago (not every scan)."""
LISTEN_RETRY = 5.0
LISTEN_TICK = 0.5
"""How often the listener thread looks up from its connection to see whether it should stop."""
ATTACH_WAIT = 5.0
"""How long a newly attached session waits for its connection's handle before its ring on attach
is given up (the handle comes with the session's next message, normally at once)."""
ADMIT_RING = 1000
"""Ring numbers from here on are rings of a queue that can admit again (1000 + the minute of the
spell in which it could), outside the schedule's 0..4, so each is taken once across processes."""


class Doorbell:
    """Scans for due rings of the endpoints this process holds sessions of, and rings them."""

    def __init__(self, registry: SessionRegistry, rings: SqlRings, clock: Clock, *,
                 listen: tuple[str, str] | None = None, poll: float = POLL,
                 push_timeout: float = PUSH_TIMEOUT, queues: SqlQueueLoad | None = None) -> None:
        self.registry = registry
        self.rings = rings
        self.queues = queues
        """Reads which queues cannot admit a claim (None: queue controls are not looked at)."""
        self._blocked: set[QueueKey] = set()
        """Queues of this process's endpoints that could not admit at the last scan."""
        self._attached: list[tuple[RingTarget, float]] = []
        """Sessions whose GET stream opened and that are not rung yet (ring on attach), each with
        the monotonic time after which it is no longer tried (its handle may come a moment later)."""
        self.clock = clock
        self.listen = listen
        """(conninfo, channel) of the PostgreSQL NOTIFY sent with every append, or None."""
        self.poll = poll
        self.push_timeout = push_timeout
        self._loop: asyncio.AbstractEventLoop | None = None
        self._event: asyncio.Event | None = None
        self._decided: dict[tuple[str, int, int], datetime] = {}
        self._turns: dict[str, int] = {}
        self._pruned = 0.0
        self._forgot_at: datetime | None = None
        self._failing = False
        self._outage = OutageLog(log, "doorbell", f"scanning again every {poll:.1f} s")

    def attached(self, session_id: str) -> None:
        """A session opened its GET stream (called on the loop): ring it at the next scan for the
        oldest claimable todo of its queues that can admit."""
        session = self.registry.get(session_id)
        if session is not None:
            self.attach(session)

    def attach(self, target: RingTarget) -> None:
        """A target can be rung from now on (a session's GET stream or a listen stream opened; on
        the loop): ring it at the next scan for the oldest claimable todo of its queues that can admit."""
        self._attached.append((target, time.monotonic() + ATTACH_WAIT))
        if self._event is not None:
            self._event.set()

    def heard(self, news: str | None) -> None:
        """A commit (here or, by NOTIFY, in any process) told the doorbell `news` (domain/doorbell.py
        `doorbell_news`): scan now if it can find something because of it — a ring due, or a
        queue that could not admit and may now (safe from any thread)."""
        if news == RING or (news == FREED and self._blocked):
            self.wake()

    def wake(self) -> None:
        """Scan now (safe from any thread, e.g. the store's writer after a commit)."""
        loop, event = self._loop, self._event
        if loop is not None and event is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(event.set)
            except RuntimeError:  # the loop closed meanwhile
                pass

    async def run(self) -> None:
        """Rings until cancelled (entered once, in the MCP gateway's lifespan)."""
        self._loop, self._event = asyncio.get_running_loop(), asyncio.Event()
        stop = threading.Event()
        try:
            if self.listen is not None:
                threading.Thread(target=self._listen, args=(*self.listen, stop), name="switchboard-doorbell-listen",
                                 daemon=True).start()
            async with anyio.create_task_group() as tasks:
                while True:
                    with anyio.move_on_after(self.poll):
                        await self._event.wait()
                    self._event.clear()
                    try:
                        await self.tick(tasks)
                        self._outage.succeeded()
                        if self._failing:
                            log.warning("doorbell recovered")
                        self._failing = False
                    except StoreUnavailable as error:  # an outage: one line now, one when it is back
                        self._outage.failed(error)
                    except Exception:  # keep ringing once it is mended
                        if not self._failing:
                            log.exception("doorbell scan failed (will retry)")
                        self._failing = True
                    await anyio.sleep(MIN_GAP)
        finally:
            stop.set()
            self._loop = self._event = None

    @staticmethod
    def deliverable(session: RingTarget, queue: str) -> bool:
        """A target can take a ring: it covers the queue (a session its endpoint's scope, a listen
        stream the queues it listens for) and can be written to now (a session needs an open GET
        stream: without one the SDK drops every server notification)."""
        return session.ready and queue in session.queues

    async def tick(self, tasks: Any) -> None:
        """One scan: takes every ring due now on this process's endpoints and starts its push."""
        endpoints = [eid for eid in self.registry.endpoints() if any(s.ready for s in self.registry.of_endpoint(eid))]
        now = self.clock.now()
        self._forget(now)
        if not endpoints:  # attached sessions without a handle yet wait for the next scan
            self._attached = [(s, until) for s, until in self._attached if time.monotonic() < until]
            return
        refused = await anyio.to_thread.run_sync(self.queues.refusals, endpoints, now) if self.queues else {}
        ours: list[tuple[DueRing, list[RingTarget]]] = []
        due = await anyio.to_thread.run_sync(self.rings.due, endpoints, now)
        if len(due) >= DUE_PER_SCAN and self._event is not None:
            self._event.set()  # a backlog: scan again at once, not at the next commit or poll
        for ring in due:
            if ring.key in self._decided or (ring.endpoint_id, ring.queue) in refused:
                continue  # a queue that cannot admit is not rung (its waiting todo is, once it can)
            sessions = [s for s in self.registry.of_endpoint(ring.endpoint_id) if self.deliverable(s, ring.queue)]
            if sessions:  # else none of ours can take it: leave it to another process
                ours.append((ring, sessions))
        ringing = {ring.todo_id for ring, _ in ours}
        ours += [(r, s) for r, s in await self._admitting_again(set(refused), now) if r.todo_id not in ringing]
        await self._ring_attached(tasks, set(refused), {ring.todo_id for ring, _ in ours}, now)
        if ours:
            taken = await anyio.to_thread.run_sync(self.rings.take_all, [ring for ring, _ in ours], now)
            for ring, sessions in ours:
                self._decided[ring.key] = now + 2 * RING_GRACE
                if ring.key in taken:
                    tasks.start_soon(self._push, self._rotate(ring.endpoint_id, sessions), ring)
        if time.monotonic() - self._pruned > PRUNE_EVERY:
            self._pruned = time.monotonic()
            await anyio.to_thread.run_sync(self.rings.prune, now)

    async def _admitting_again(self, refused: set[QueueKey], now: datetime) -> list[tuple[DueRing, list[RingTarget]]]:
        """The rings of the oldest waiting todo of each queue that could not admit at the last scan
        and can now."""
        again, self._blocked = self._blocked - refused, refused
        rings: list[tuple[DueRing, list[RingTarget]]] = []
        for endpoint_id, queue in sorted(again):
            sessions = [s for s in self.registry.of_endpoint(endpoint_id) if self.deliverable(s, queue)]
            if not sessions or self.queues is None:
                continue
            ring_no = ADMIT_RING + int(now.timestamp() // 60) % 1_000_000
            waiting = await anyio.to_thread.run_sync(self.queues.oldest_waiting, endpoint_id, [queue], now, ring_no)
            if waiting is not None:
                rings.append((waiting, sessions))
        return rings

    async def _ring_attached(self, tasks: Any, refused: set[QueueKey], ringing: set[str], now: datetime) -> None:
        """Rings each session that has just opened its stream for the oldest claimable todo of its
        queues that can admit (that session only: no other session is rung for it), unless that
        todo is being rung by this scan anyway; its ring 0 is then not sent by this process."""
        attached, self._attached = self._attached, []
        for session, until in attached:
            if not self.registry.holds(session) or not session.has_stream:
                continue
            if not session.ready:  # no handle on its connection yet: look again at the next scan
                if time.monotonic() < until:
                    self._attached.append((session, until))
                continue
            queues = [q for q in session.queues if (session.endpoint_id, q) not in refused]
            if self.queues is None or not queues:
                continue
            waiting = await anyio.to_thread.run_sync(self.queues.oldest_waiting, session.endpoint_id, queues, now, 0)
            if waiting is not None and waiting.todo_id not in ringing:
                # Its ring 0 is decided here: a todo that became claimable after this scan read
                # its due rings would otherwise be rung again by the next scan.
                self._decided[waiting.key] = now + 2 * RING_GRACE
                tasks.start_soon(self._push, [session], waiting)

    def _rotate(self, endpoint_id: str, sessions: Sequence[RingTarget]) -> list[RingTarget]:
        """The endpoint's targets starting with the next one in turn (round robin per endpoint,
        handshake sessions and listen streams alike)."""
        turn = self._turns.get(endpoint_id, 0)
        self._turns[endpoint_id] = turn + 1
        first = turn % len(sessions)
        return [*sessions[first:], *sessions[:first]]

    def _forget(self, now: datetime) -> None:
        if self._forgot_at is not None and now - self._forgot_at < FORGET_EVERY:
            return
        self._forgot_at = now
        for key in [k for k, until in self._decided.items() if until <= now]:
            del self._decided[key]

    async def _push(self, sessions: Sequence[RingTarget], ring: DueRing) -> None:
        """Pushes one ring to the first session that takes it within the timeout. It runs in the
        doorbell's task group: nothing it raises may end the doorbell (and the gateway with it)."""
        try:
            await self._push_to_one(sessions, ring)
        except Exception:
            log.exception("ring %d of todo %s failed", ring.ring_no, ring.todo_id)

    async def _push_to_one(self, sessions: Sequence[RingTarget], ring: DueRing) -> None:
        for session in sessions:
            with anyio.move_on_after(self.push_timeout):
                try:
                    if await session.ring(ring):
                        return
                except Exception as error:  # the session ended meanwhile: try the next one
                    log.debug("ring of %s to session %s failed: %s", ring.todo_id, session.session_id[:8], error)
        log.info("ring %d of todo %s reached no session", ring.ring_no, ring.todo_id)

    def _listen(self, conninfo: str, channel: str, stop: threading.Event) -> None:
        """Wakes the scan on a PostgreSQL append (by any process) that can make a ring due — the
        writer NOTIFYs only then, saying which news (`heard`); polling covers any gap. Runs in its
        own thread on a blocking connection: every commit that frees a claim NOTIFYs, and most
        wake nothing, so they are read and passed over off the event loop (ADR 18)."""
        import psycopg

        lost = False
        while not stop.is_set():
            try:
                with psycopg.connect(conninfo, autocommit=True) as conn:
                    conn.execute(f'LISTEN "{channel}"')
                    if lost:
                        log.warning("doorbell listener: store is back")
                        lost = False
                    self.wake()  # what was committed while it listened to nothing
                    while not stop.is_set():
                        for notice in conn.notifies(timeout=LISTEN_TICK):
                            if (notice.payload == RING or (notice.payload == FREED and self._blocked)
                                    or notice.payload not in (RING, FREED)):  # an older version's
                                self.wake()
            except Exception as error:  # the database restarted: poll until it is back
                if not lost:
                    log.warning("doorbell listener: store unavailable (%s); polling every %.1f s, listening"
                                " again every %.0f s", first_line(error), self.poll, LISTEN_RETRY)
                    lost = True
            stop.wait(LISTEN_RETRY)
