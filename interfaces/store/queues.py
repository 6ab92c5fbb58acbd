"""The queue-load reads: what admission needs to decide a claim, and what the doorbell needs to
know which queues cannot admit. Reads `sb_queue_controls`, `sb_in_flight`, `sb_queue_claims`
(projections/queue_load.py) and `sb_claimable` for the oldest waiting todo.

Only queues with controls are ever asked about, so a queue without them costs nothing here.

`sb_claim_refusals` is not a read model (a refusal is no event): it counts the claims refused per
queue and reason, for `switchboard_claims_refused_total`, shared by every process like `sb_rings`.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from datetime import datetime

from application.ports import QueueLoad
from domain.events import DomainEvent
from domain.queue import RATE_WINDOW, QueueControls, Refusal, admission
from domain.todo import ENDS_A_CLAIM, Todo, TodoClaimed
from interfaces.store.database import Database
from interfaces.store.rings import DueRing
from projections.base import from_micros, micros

QueueKey = tuple[str, str]  # (endpoint_id, queue)
MAX_KEPT = 100_000  # claim times an estimate keeps at most (the highest rate)
LoadMove = tuple[QueueKey, int, "datetime | None"]
"""What one event does to its queue's load: +1 a claim (with its time when it counts against a
rate), -1 a claim's end."""
REFUSALS_DDL = (
    "CREATE TABLE IF NOT EXISTS sb_claim_refusals (queue TEXT NOT NULL, reason TEXT NOT NULL,"
    " total BIGINT NOT NULL, PRIMARY KEY (queue, reason))",
)


class SqlQueueLoad:
    """Reads the queue-load read models."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def load(self, endpoint_id: str, queue: str, now: datetime) -> QueueLoad:
        """The queue's committed load: in-flight count and the claims of the window before `now`."""
        rows = self.db.query(
            "SELECT count(*), NULL FROM sb_in_flight WHERE endpoint_id = %s AND queue = %s"
            " UNION ALL SELECT NULL, claimed_at FROM sb_queue_claims"
            " WHERE endpoint_id = %s AND queue = %s AND claimed_at > %s",
            (endpoint_id, queue, endpoint_id, queue, micros(now - RATE_WINDOW)),
        )
        in_flight = next((int(n) for n, _ in rows if n is not None), 0)
        return QueueLoad(in_flight, tuple(from_micros(at) for n, at in rows if n is None and at is not None))

    def controls(self, endpoint_ids: Sequence[str]) -> dict[QueueKey, QueueControls]:
        """The queues of these endpoints that have controls set."""
        if not endpoint_ids:
            return {}
        marks = ", ".join(["%s"] * len(endpoint_ids))
        rows = self.db.query(
            "SELECT endpoint_id, queue, paused, max_in_flight, max_claims_per_minute FROM sb_queue_controls"
            f" WHERE endpoint_id IN ({marks})", tuple(endpoint_ids),
        )
        found = {(e, q): QueueControls(bool(p), m, r) for e, q, p, m, r in rows}
        return {key: controls for key, controls in found.items() if controls.controlled}

    def refusals(self, endpoint_ids: Sequence[str], now: datetime) -> dict[QueueKey, Refusal]:
        """The queues of these endpoints that cannot admit a claim now, and why."""
        refused: dict[QueueKey, Refusal] = {}
        for key, controls in self.controls(endpoint_ids).items():
            load = self.load(*key, now) if not controls.paused else QueueLoad(0, ())
            refusal = admission(controls, in_flight=load.in_flight, recent_claims=load.recent_claims, now=now)
            if refusal is not None:
                refused[key] = refusal
        return refused

    def count_refusal(self, queue: str, reason: str) -> None:
        """One more claim refused in this queue for this reason (in its own short transaction)."""
        self.db.query(
            "INSERT INTO sb_claim_refusals (queue, reason, total) VALUES (%s, %s, 1)"
            " ON CONFLICT (queue, reason) DO UPDATE SET total = sb_claim_refusals.total + 1", (queue, reason),
        )

    def oldest_waiting(self, endpoint_id: str, queues: Sequence[str], now: datetime, ring_no: int) -> DueRing | None:
        """Ring `ring_no` of the oldest todo claimable now in these queues of the endpoint
        (quarantine never is one)."""
        if not queues:
            return None
        marks = ", ".join(["%s"] * len(queues))
        rows = self.db.query(
            "SELECT c.todo_id, c.endpoint_id, c.queue, c.source, c.kind, c.title, c.spell FROM sb_claimable c"
            f" WHERE c.endpoint_id = %s AND c.queue IN ({marks}) AND c.queue <> 'quarantine'"
            " AND c.available_at IS NOT NULL AND c.available_at <= %s"
            " ORDER BY c.created_at, c.todo_id LIMIT 1",
            (endpoint_id, *queues, micros(now)),
        )
        if not rows:
            return None
        todo_id, eid, queue, source, kind, title, spell = rows[0]
        return DueRing(todo_id, eid, queue, source, kind, title, int(spell or 0), ring_no)


class LoadEstimates:
    """This process's last known load of each controlled queue, moved by its own commits.

    Admission reads it instead of the database, so a claim in a queue whose limit is far from
    binding costs no read: a load that is too low (another process claimed meanwhile) only lets a
    claim through that its commit's CHECK then refuses, and the writer re-runs the command on
    fresh state, which reads the database; a load that is too high is never believed for a
    refusal (the application confirms a refusal on a fresh read). Every fresh read replaces the
    estimate.
    """

    def __init__(self, reads: SqlQueueLoad) -> None:
        self.reads = reads
        self._known: dict[QueueKey, QueueLoad] = {}
        self._lock = threading.Lock()

    @property
    def tracking(self) -> bool:
        """Some controlled queue has an estimate (else commits need not say what they move)."""
        return bool(self._known)

    def get(self, key: QueueKey, now: datetime, *, fresh: bool) -> QueueLoad:
        if not fresh:
            known = self.known(key, now)
            if known is not None:
                return known
        load = self.reads.load(*key, now)
        with self._lock:
            self._known[key] = load
        return load

    def known(self, key: QueueKey, now: datetime) -> QueueLoad | None:
        """The estimate, if there is one (None: `get` would read the store)."""
        with self._lock:
            known = self._known.get(key)
        if known is None:
            return None
        since = now - RATE_WINDOW
        return QueueLoad(known.in_flight, tuple(t for t in known.recent_claims if t > since))

    def committed(self, moves: Sequence[LoadMove]) -> None:
        """After a commit: each (queue, +1 for a claim / -1 for a claim's end, the claim's time if
        it counts against a rate) moves the estimate of a queue that has one."""
        with self._lock:
            for key, delta, claimed_at in moves:  # only queues with an estimate are moved
                known = self._known.get(key)
                if known is None:
                    continue
                claims = (*known.recent_claims, claimed_at) if claimed_at is not None else known.recent_claims
                self._known[key] = QueueLoad(max(known.in_flight + delta, 0), claims[-MAX_KEPT:])


def load_moves(todo: Todo, events: Sequence[DomainEvent]) -> list[LoadMove]:
    """What these events of one todo do to its queue's load."""
    moves: list[LoadMove] = []
    for event in events:
        if isinstance(event, TodoClaimed) and event.queue is not None:
            rated = bool(event.admitted_under and event.admitted_under.get("max_claims_per_minute"))
            moves.append(((event.endpoint_id, event.queue), 1, event.timestamp if rated else None))
        elif isinstance(event, ENDS_A_CLAIM):
            moves.append(((todo.endpoint_id, todo.queue), -1, None))
    return moves
