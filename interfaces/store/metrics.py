"""What `/metrics` reads: todos per queue and state, the counters, and each projection's lag."""

from __future__ import annotations

from dataclasses import dataclass, field

from domain.todo import PENDING, STATES
from interfaces.store.database import Database
from interfaces.store.projector import Projector
from interfaces.store.views import queue_counts_sql

# The todo states of CONTRACT §6: a dead letter is `failed` (with no retry left), counted apart too.
QUEUE_STATES = STATES


@dataclass(frozen=True)
class MetricsSnapshot:
    """One consistent read of the read models (after catching them up)."""

    todos: dict[tuple[str, str], int] = field(default_factory=dict)  # (queue, state) -> todos
    dead_letters: dict[str, int] = field(default_factory=dict)  # queue -> dead letters (among `failed`)
    oldest_pending: dict[str, int] = field(default_factory=dict)  # queue -> created_at (µs) of the oldest pending
    counters: dict[str, dict[tuple[str, str], int]] = field(default_factory=dict)  # metric -> (a, b) -> total
    lag: dict[str, int] = field(default_factory=dict)  # projection -> events it had not applied yet
    in_flight: dict[str, int] = field(default_factory=dict)  # queue -> claimed todos (sb_in_flight)
    refused: dict[tuple[str, str], int] = field(default_factory=dict)  # (queue, reason) -> claims refused

    @property
    def queues(self) -> list[str]:
        return sorted({queue for queue, _ in self.todos})


class SqlMetrics:
    """Reads the projections for a scrape; sees what every process wrote."""

    def __init__(self, db: Database, projector: Projector) -> None:
        self.db = db
        self.projector = projector

    def read(self) -> MetricsSnapshot:
        """Lag as found (how far behind readers were), then the read models caught up to the log."""
        lag = self.projector.lag()
        self.projector.catch_up()
        with self.db.transaction(write=False, snapshot=True) as tx:
            grouped = tx.execute(queue_counts_sql())
            counted = tx.execute("SELECT metric, a, b, total FROM sb_counters")
            in_flight = dict(tx.execute("SELECT queue, count(*) FROM sb_in_flight GROUP BY queue"))
            refused = {(q, r): n for q, r, n in tx.execute("SELECT queue, reason, total FROM sb_claim_refusals")}
        todos: dict[tuple[str, str], int] = {}
        dead: dict[str, int] = {}
        oldest: dict[str, int] = {}
        for queue, state, dead_letter, count, created_at in grouped:
            todos[(queue, state)] = todos.get((queue, state), 0) + count
            if dead_letter:
                dead[queue] = dead.get(queue, 0) + count
            if state == PENDING:
                oldest[queue] = min(created_at, oldest.get(queue, created_at))
        counters: dict[str, dict[tuple[str, str], int]] = {}
        for metric, a, b, total in counted:
            counters.setdefault(metric, {})[(a, b)] = total
        return MetricsSnapshot(todos, dead, oldest, counters, lag, in_flight, refused)
