"""The claimable queue: which todos `claim_next` may take, oldest first. Written inline.

One row per todo that is not done; `available_at` is when it can be claimed (null while
claimed or dead-lettered; in the future while delayed, snoozed or awaiting a retry). `claim_next`
reads it, and so do the todo rows (`available_at`); the write side still decides the claim.
"""

from __future__ import annotations

from domain.events import DomainEvent
from domain.names import TODO_PREFIX, format_id
from domain.todo import (
    DelayElapsed, LeaseExpired, LeaseRenewed, TodoClaimed, TodoCompleted, TodoDiscarded, TodoFailed, TodoMoved, TodoOpened, TodoReleased,
    TodoRequeued,
)
from projections.base import Op, micros

_SET = "UPDATE sb_claimable SET available_at = %s WHERE todo_id = %s"


class ClaimableQueue:
    name = "claimable"
    inline = True
    tables = ("sb_claimable",)
    ignores = (LeaseRenewed, DelayElapsed)  # a renewal keeps the todo claimed; a delay's end was its available_at
    ddl = (
        "CREATE TABLE IF NOT EXISTS sb_claimable (todo_id TEXT PRIMARY KEY, endpoint_id TEXT NOT NULL,"
        " queue TEXT NOT NULL, created_at BIGINT NOT NULL, available_at BIGINT)",
        "CREATE INDEX IF NOT EXISTS sb_claimable_order ON sb_claimable"
        " (endpoint_id, queue, created_at, todo_id) WHERE available_at IS NOT NULL",
    )

    def ops(self, event: DomainEvent, position: int | None) -> list[Op]:
        todo_id = format_id(TODO_PREFIX, event.originator_id)
        at = micros(event.timestamp)
        match event:
            case TodoOpened():
                return [(
                    "INSERT INTO sb_claimable (todo_id, endpoint_id, queue, created_at, available_at)"
                    " VALUES (%s, %s, %s, %s, %s)",
                    (todo_id, event.endpoint_id, event.queue, at, micros(event.not_before) or at),
                )]
            case TodoClaimed():
                return [(_SET, (None, todo_id))]
            case TodoCompleted():
                return [("DELETE FROM sb_claimable WHERE todo_id = %s", (todo_id,))]
            case TodoFailed():
                return [(_SET, (None if event.dead_letter else micros(event.next_retry_at), todo_id))]
            case TodoReleased():  # a snooze keeps it from claims until its available_at
                return [(_SET, (None if event.dead_letter else micros(event.available_at) or at, todo_id))]
            case LeaseExpired():
                return [(_SET, (None if event.dead_letter else at, todo_id))]
            case TodoRequeued():
                return [(_SET, (at, todo_id))]
            case TodoMoved():  # only a pending todo moves: claimable at once in its new queue
                return [("UPDATE sb_claimable SET queue = %s, available_at = %s WHERE todo_id = %s",
                         (event.queue, at, todo_id))]
            case TodoDiscarded():
                return [("DELETE FROM sb_claimable WHERE todo_id = %s", (todo_id,))]
        return []
