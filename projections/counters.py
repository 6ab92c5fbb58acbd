"""Monotonic counters behind `/metrics` (CONTRACT §10), counted from the domain events alone.

One row of `sb_counters` per (metric, a, b): `a` and `b` are the metric's labels in this order,
`''` for a metric with one label.

| metric | a, b | counted on |
|---|---|---|
| `todos_created` | queue, source | `TodoOpened` |
| `todos_claimed` | queue | `TodoClaimed` |
| `todos_completed` | queue, outcome | `TodoCompleted` → `complete`; `TodoFailed` → `fail` (a dead-lettering fail too) |
| `leases_expired` | queue | `LeaseExpired` (a dead-lettering expiry too) |
| `webhook_deliveries` | source, verdict | `DeliveryAccepted` |

The verdict of a delivery is its disposition (`routed`, `dropped`, `faulted`, `held`), except
that a routed delivery that named todos but minted none is `repeat` when `once` found its
subject's todo live (its trace says `once: "repeat"`), else `duplicate` (every target's todo for
its key was still live). Releases, revocations, requeues and quarantine discards count nowhere.

Only `TodoOpened` and `TodoMoved` carry a todo's queue, so `sb_counter_queues` keeps
todo → queue itself: a projection never reads another one's tables, whose progress may differ.
Every count is an UPSERT that adds one, the same SQL on SQLite and PostgreSQL, so counting the
same events from zero (rebuild, verify) gives the same totals.
"""

from __future__ import annotations

from domain.delivery import DeliveryAccepted
from domain.events import DomainEvent
from domain.names import TODO_PREFIX, format_id
from domain.todo import (
    DelayElapsed, LeaseExpired, LeaseRenewed, TodoClaimed, TodoCompleted, TodoDiscarded, TodoFailed, TodoMoved, TodoOpened,
    TodoReleased, TodoRequeued,
)
from projections.base import Op

CREATED, CLAIMED, COMPLETED, EXPIRED, DELIVERIES = (
    "todos_created", "todos_claimed", "todos_completed", "leases_expired", "webhook_deliveries",
)

# adds the row's own total (1): ops of one row add up, so a catch-up can sum them (`coalesce_ops`)
_ADD = " ON CONFLICT (metric, a, b) DO UPDATE SET total = sb_counters.total + excluded.total"
_COUNT = "INSERT INTO sb_counters (metric, a, b, total) VALUES (%s, %s, %s, %s)" + _ADD
_COUNT_BY_QUEUE = (  # the todo's queue from this projection's own table
    "INSERT INTO sb_counters (metric, a, b, total) SELECT %s, queue, %s, 1 FROM sb_counter_queues"
    " WHERE todo_id = %s"
) + _ADD


def verdict(event: DeliveryAccepted) -> str:
    """A delivery's verdict: its disposition, or `repeat`/`duplicate` for a routed one that minted no todo."""
    if event.disposition == "routed" and event.todos and not any(t.get("created") for t in event.todos):
        return "repeat" if event.routing.get("once") == "repeat" else "duplicate"
    return event.disposition


class Counters:
    """Counters per metric and labels, plus the queue of every todo seen opened."""

    name = "counters"
    inline = False
    tables = ("sb_counters", "sb_counter_queues")
    # counted: todos created and moved, claims, outcomes; a renewal, release, requeue or discard is none
    ignores = (LeaseRenewed, TodoReleased, TodoRequeued, TodoDiscarded, DelayElapsed)
    ddl = (
        "CREATE TABLE IF NOT EXISTS sb_counters (metric TEXT NOT NULL, a TEXT NOT NULL, b TEXT NOT NULL,"
        " total BIGINT NOT NULL, PRIMARY KEY (metric, a, b))",
        "CREATE TABLE IF NOT EXISTS sb_counter_queues (todo_id TEXT PRIMARY KEY, queue TEXT NOT NULL)",
    )

    def ops(self, event: DomainEvent, position: int | None) -> list[Op]:
        todo_id = format_id(TODO_PREFIX, event.originator_id)
        match event:
            case TodoOpened():
                return [
                    ("INSERT INTO sb_counter_queues (todo_id, queue) VALUES (%s, %s)", (todo_id, event.queue)),
                    (_COUNT, (CREATED, event.queue, event.source, 1)),
                ]
            case TodoMoved():
                return [("UPDATE sb_counter_queues SET queue = %s WHERE todo_id = %s", (event.queue, todo_id))]
            case TodoClaimed():
                return [(_COUNT_BY_QUEUE, (CLAIMED, "", todo_id))]
            case TodoCompleted():
                return [(_COUNT_BY_QUEUE, (COMPLETED, "complete", todo_id))]
            case TodoFailed():
                return [(_COUNT_BY_QUEUE, (COMPLETED, "fail", todo_id))]
            case LeaseExpired():
                return [(_COUNT_BY_QUEUE, (EXPIRED, "", todo_id))]
            case DeliveryAccepted():
                return [(_COUNT, (DELIVERIES, event.source, verdict(event), 1))]
        return []
