"""What `/metrics` reads: todos per queue and state, the counters, and each projection's lag."""

from __future__ import annotations

from dataclasses import dataclass, field

from interfaces.store.database import Database
from interfaces.store.projector import Projector

DEAD = "dead"
# `failed` is a failed todo awaiting its retry; a dead letter (failed, no retry left) is `dead`.
QUEUE_STATES = ("pending", "claimed", "done", "failed", DEAD)


@dataclass(frozen=True)
class MetricsSnapshot:
    """One consistent read of the read models (after catching them up)."""

    todos: dict[tuple[str, str], int] = field(default_factory=dict)  # (queue, state) -> todos
    oldest_pending: dict[str, int] = field(default_factory=dict)  # queue -> created_at (µs) of the oldest pending
    counters: dict[str, dict[tuple[str, str], int]] = field(default_factory=dict)  # metric -> (a, b) -> total
    lag: dict[str, int] = field(default_factory=dict)  # projection -> events it had not applied yet

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
            grouped = tx.execute(
                "SELECT queue, state, dead_letter, count(*) FROM sb_todo_rows GROUP BY queue, state, dead_letter"
            )
            oldest = tx.execute("SELECT queue, min(created_at) FROM sb_todo_rows WHERE state = 'pending' GROUP BY queue")
            counted = tx.execute("SELECT metric, a, b, total FROM sb_counters")
        todos: dict[tuple[str, str], int] = {}
        for queue, state, dead_letter, count in grouped:
            key = (queue, DEAD if state == "failed" and dead_letter else state)
            todos[key] = todos.get(key, 0) + count
        counters: dict[str, dict[tuple[str, str], int]] = {}
        for metric, a, b, total in counted:
            counters.setdefault(metric, {})[(a, b)] = total
        return MetricsSnapshot(todos, {queue: at for queue, at in oldest}, counters, lag)
