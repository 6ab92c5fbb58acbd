"""Live idempotency keys: which todo a (endpoint, key) names while that todo is live."""

from __future__ import annotations

from domain.events import DomainEvent
from domain.idempotency import KeyBound
from domain.names import TODO_PREFIX, format_id
from domain.todo import (
    DelayElapsed, LeaseExpired, LeaseRenewed, TodoClaimed, TodoCompleted, TodoDiscarded, TodoFailed, TodoMoved, TodoOpened,
    TodoReleased, TodoRequeued,
)
from projections.base import Op

_LIVE = "UPDATE sb_idempotency_keys SET live = %s WHERE todo_id = %s"


class IdempotencyKeys:
    name = "idempotency_keys"
    inline = False
    tables = ("sb_idempotency_keys",)
    ignores = (TodoOpened, TodoClaimed, LeaseRenewed, TodoMoved, DelayElapsed)  # keys are bound by KeyBound; these keep them live
    ddl = (
        "CREATE TABLE IF NOT EXISTS sb_idempotency_keys (endpoint_id TEXT NOT NULL, key TEXT NOT NULL,"
        " todo_id TEXT NOT NULL, live INTEGER NOT NULL, PRIMARY KEY (endpoint_id, key))",
        "CREATE INDEX IF NOT EXISTS sb_idempotency_keys_todo ON sb_idempotency_keys (todo_id)",
    )

    def ops(self, event: DomainEvent, position: int | None) -> list[Op]:
        match event:
            case KeyBound():
                return [(
                    "INSERT INTO sb_idempotency_keys (endpoint_id, key, todo_id, live) VALUES (%s, %s, %s, 1)"
                    " ON CONFLICT (endpoint_id, key) DO UPDATE SET todo_id = excluded.todo_id, live = 1",
                    (event.endpoint_id, event.key, event.todo_id),
                )]
        todo_id = format_id(TODO_PREFIX, event.originator_id)
        match event:
            case TodoCompleted() | TodoDiscarded():
                return [(_LIVE, (0, todo_id))]
            case TodoFailed() | LeaseExpired() | TodoReleased() if event.dead_letter:
                return [(_LIVE, (0, todo_id))]
            case TodoRequeued():
                return [(_LIVE, (1, todo_id))]
        return []
