"""Doorbell candidates: which todos are pending, since when, and what a ring says. Written inline.

One row per todo that is not done (quarantined todos have none: they are never rung). While the
todo is pending and claimable, `pending_since` is when it became so and `spell` the version of the
event that made it so (for a delayed or snoozed todo, `DelayElapsed`: it is rung when due) (one pending spell = one ring schedule, docs/adr/0011-doorbell.md); both are null while
it is claimed, failed or dead-lettered. Being inline, a row is visible to every process the moment
its event commits, which is how a process learns of todos another process opened.
"""

from __future__ import annotations

from domain.events import DomainEvent
from domain.names import QUARANTINE, TODO_PREFIX, format_id
from domain.todo import (
    DelayElapsed, LeaseExpired, LeaseRenewed, TodoClaimed, TodoCompleted, TodoDiscarded, TodoFailed, TodoMoved, TodoOpened, TodoReleased,
    TodoRequeued,
)
from projections.base import Op, micros

_SET = "UPDATE sb_doorbell SET spell = %s, pending_since = %s WHERE todo_id = %s"


def _insert(todo_id: str, event: TodoOpened | TodoMoved, delayed: bool = False) -> Op:
    """A row for a todo that is pending from this event on (both events carry what a ring says);
    a delayed one has no spell until its delay elapses."""
    return (
        "INSERT INTO sb_doorbell (todo_id, endpoint_id, queue, source, kind, title, spell, pending_since)"
        " VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
        (todo_id, event.endpoint_id, event.queue, event.source, event.kind, event.title,
         None if delayed else event.originator_version, None if delayed else micros(event.timestamp)),
    )


class Doorbells:
    name = "doorbell"
    inline = True
    tables = ("sb_doorbell",)
    ignores = (LeaseRenewed,)  # a renewal keeps the todo claimed: nothing to ring
    ddl = (
        "CREATE TABLE IF NOT EXISTS sb_doorbell (todo_id TEXT PRIMARY KEY, endpoint_id TEXT NOT NULL,"
        " queue TEXT NOT NULL, source TEXT, kind TEXT, title TEXT NOT NULL, spell BIGINT,"
        " pending_since BIGINT)",
        "CREATE INDEX IF NOT EXISTS sb_doorbell_pending ON sb_doorbell (endpoint_id, pending_since)"
        " WHERE pending_since IS NOT NULL",
    )

    def ops(self, event: DomainEvent, position: int | None) -> list[Op]:
        todo_id = format_id(TODO_PREFIX, event.originator_id)
        pending = (event.originator_version, micros(event.timestamp), todo_id)
        match event:
            case TodoOpened() if event.queue != QUARANTINE:
                return [_insert(todo_id, event, delayed=event.not_before is not None)]
            case TodoClaimed() | TodoFailed():
                return [(_SET, (None, None, todo_id))]
            case TodoReleased() if event.available_at is not None:  # snoozed: rung when the delay elapses
                return [(_SET, (None, None, todo_id))]
            case LeaseExpired() | TodoReleased():
                return [(_SET, (None, None, todo_id) if event.dead_letter else pending)]
            case TodoRequeued() | DelayElapsed():
                return [(_SET, pending)]
            case TodoMoved():  # out of quarantine, pending: a new spell, rung like a new todo
                return [_insert(todo_id, event)]
            case TodoCompleted() | TodoDiscarded():
                return [("DELETE FROM sb_doorbell WHERE todo_id = %s", (todo_id,))]
        return []
