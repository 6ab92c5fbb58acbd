"""Todo rows: what lists, the board and the per-queue counts read (never the payload)."""

from __future__ import annotations

from domain.events import DomainEvent
from domain.names import TODO_PREFIX, format_id
from domain.todo import (
    DelayElapsed, LeaseExpired, LeaseRenewed, TodoClaimed, TodoCompleted, TodoDiscarded, TodoFailed, TodoMoved, TodoOpened,
    PENDING, TodoReleased, TodoRequeued, state_after,
)
from projections.base import Op, micros

COLUMNS = (
    "todo_id", "endpoint_id", "queue", "source", "kind", "title", "state", "trust_mode", "owner",
    "attempt", "lease_expires_at", "next_retry_at", "dead_letter", "created_at", "updated_at",
    "payload_size", "position",
)
_STAMP = "updated_at = %s, position = %s"


class TodoRows:
    name = "todo_rows"
    inline = False
    tables = ("sb_todo_rows",)
    ignores = ()
    ddl = (
        "CREATE TABLE IF NOT EXISTS sb_todo_rows (todo_id TEXT PRIMARY KEY, endpoint_id TEXT NOT NULL,"
        " queue TEXT NOT NULL, source TEXT NOT NULL, kind TEXT, title TEXT NOT NULL,"
        " state TEXT NOT NULL, trust_mode TEXT NOT NULL, owner TEXT, attempt INTEGER NOT NULL,"
        " lease_expires_at BIGINT, next_retry_at BIGINT, dead_letter INTEGER NOT NULL,"
        " created_at BIGINT NOT NULL, updated_at BIGINT NOT NULL, payload_size BIGINT NOT NULL,"
        " position BIGINT NOT NULL)",
        "CREATE INDEX IF NOT EXISTS sb_todo_rows_endpoint ON sb_todo_rows (endpoint_id, created_at)",
        "CREATE INDEX IF NOT EXISTS sb_todo_rows_queue ON sb_todo_rows (queue, state)",
    )

    def ops(self, event: DomainEvent, position: int | None) -> list[Op]:
        todo_id = format_id(TODO_PREFIX, event.originator_id)
        at = micros(event.timestamp)
        stamp = (at, position or 0, todo_id)
        match event:
            case TodoOpened():
                return [(
                    f"INSERT INTO sb_todo_rows ({', '.join(COLUMNS)}) VALUES ({', '.join(['%s'] * len(COLUMNS))})",
                    (todo_id, event.endpoint_id, event.queue, event.source, event.kind, event.title,
                     PENDING, event.trust_mode, None, 0, None, None, 0, at, at, event.payload_size,
                     position or 0),
                )]
            case TodoClaimed():
                return [(
                    "UPDATE sb_todo_rows SET state = 'claimed', owner = %s, attempt = %s,"
                    f" lease_expires_at = %s, next_retry_at = NULL, {_STAMP} WHERE todo_id = %s",
                    (event.holder, event.attempt, micros(event.lease_expires_at), *stamp),
                )]
            case LeaseRenewed():
                return [(
                    f"UPDATE sb_todo_rows SET lease_expires_at = %s, {_STAMP} WHERE todo_id = %s",
                    (micros(event.lease_expires_at), *stamp),
                )]
            case TodoCompleted():
                return [(
                    "UPDATE sb_todo_rows SET state = 'done', owner = NULL, lease_expires_at = NULL,"
                    f" {_STAMP} WHERE todo_id = %s",
                    stamp,
                )]
            case TodoFailed():
                return [(
                    "UPDATE sb_todo_rows SET state = 'failed', owner = NULL, lease_expires_at = NULL,"
                    f" next_retry_at = %s, dead_letter = %s, {_STAMP} WHERE todo_id = %s",
                    (micros(event.next_retry_at), int(event.dead_letter), *stamp),
                )]
            case LeaseExpired() | TodoReleased():
                return [(
                    "UPDATE sb_todo_rows SET state = %s, owner = NULL, lease_expires_at = NULL,"
                    f" dead_letter = %s, {_STAMP} WHERE todo_id = %s",
                    (*_after(event), *stamp),
                )]
            case TodoMoved():
                return [(f"UPDATE sb_todo_rows SET queue = %s, {_STAMP} WHERE todo_id = %s", (event.queue, *stamp))]
            case DelayElapsed():  # still pending; the row's available_at comes from the claimable queue
                return [(f"UPDATE sb_todo_rows SET {_STAMP} WHERE todo_id = %s", stamp)]
            case TodoDiscarded():
                return [(
                    "UPDATE sb_todo_rows SET state = 'done', owner = NULL, lease_expires_at = NULL,"
                    f" next_retry_at = NULL, dead_letter = 0, {_STAMP} WHERE todo_id = %s",
                    stamp,
                )]
            case TodoRequeued():
                return [(
                    "UPDATE sb_todo_rows SET state = 'pending', next_retry_at = NULL, dead_letter = 0,"
                    f" attempt = CASE WHEN %s = 1 THEN 0 ELSE attempt END, {_STAMP} WHERE todo_id = %s",
                    (int(event.fresh_budget), *stamp),
                )]
        return []


def _after(event: DomainEvent) -> tuple[str, int]:
    """The state and dead-letter flag (as the row stores it) the lifecycle gives after `event`."""
    state, dead_letter = state_after(event)
    return state, int(dead_letter)
