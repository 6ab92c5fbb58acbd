"""Due timers: when a lease lapses or a retry falls due. Written inline; the reaper reads it.

One row per todo with a running clock: `lease` while claimed, `retry` while failed awaiting
its retry, `delay` while pending with a `not_before` or a snooze still to come. The background
scheduler sleeps until the earliest `due_at`.
"""

from __future__ import annotations

from domain.events import DomainEvent
from domain.names import TODO_PREFIX, format_id
from domain.todo import (
    DelayElapsed, LeaseExpired, LeaseRenewed, TodoClaimed, TodoCompleted, TodoDiscarded, TodoFailed, TodoMoved, TodoOpened,
    TodoReleased, TodoRequeued,
)
from projections.base import Op, micros

_DELETE = "DELETE FROM sb_timers WHERE todo_id = %s"
_UPSERT = (
    "INSERT INTO sb_timers (todo_id, kind, due_at) VALUES (%s, %s, %s)"
    " ON CONFLICT (todo_id) DO UPDATE SET kind = excluded.kind, due_at = excluded.due_at"
)


class DueTimers:
    name = "timers"
    inline = True
    tables = ("sb_timers",)
    ignores = (TodoMoved,)  # a todo released from quarantine has no clock running
    ddl = (
        "CREATE TABLE IF NOT EXISTS sb_timers (todo_id TEXT PRIMARY KEY, kind TEXT NOT NULL,"
        " due_at BIGINT NOT NULL)",
        "CREATE INDEX IF NOT EXISTS sb_timers_due ON sb_timers (due_at)",
    )

    def ops(self, event: DomainEvent, position: int | None) -> list[Op]:
        todo_id = format_id(TODO_PREFIX, event.originator_id)
        match event:
            case TodoClaimed() | LeaseRenewed():
                return [(_UPSERT, (todo_id, "lease", micros(event.lease_expires_at)))]
            case TodoFailed() if not event.dead_letter:
                return [(_UPSERT, (todo_id, "retry", micros(event.next_retry_at)))]
            case TodoOpened() if event.not_before is not None:
                return [(_UPSERT, (todo_id, "delay", micros(event.not_before)))]
            case TodoReleased() if event.available_at is not None:
                return [(_UPSERT, (todo_id, "delay", micros(event.available_at)))]
            case (TodoCompleted() | TodoFailed() | LeaseExpired() | TodoReleased() | TodoRequeued() | TodoDiscarded()
                  | DelayElapsed()):
                return [(_DELETE, (todo_id,))]
        return []
