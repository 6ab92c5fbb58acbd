"""The live todos: one row per todo that is not done, holding what the write side's hot paths read
about it now. Written inline.

- **Claimable** (`claim_next` reads it): `available_at` is when the todo can be claimed (null while
  claimed or dead-lettered; in the future while delayed, snoozed or awaiting a retry), oldest
  `created_at` first; the write side still decides the claim. The todo rows read `available_at` too.
- **The doorbell** (docs/adr/0011-doorbell.md): while the todo is pending and claimable,
  `pending_since` is when it became so and `spell` the version of the event that made it so (for
  a delayed or snoozed todo, `DelayElapsed`: it is rung when due), with what a ring says (`source`,
  `kind`, `title`); both are null while it is claimed, failed, dead-lettered or held in quarantine
  (never rung). One pending spell is one ring schedule.
- **The due timer** (the reaper sleeps until the earliest): `due_at` is when its lease lapses
  while claimed, when its retry falls due while failed, when its delay or snooze ends while
  pending with one still to come; null otherwise.

These were three tables keyed by the same todo until docs/adr/0036: a claim updated three rows and a
completion deleted three. Being inline, a row is visible to every process the moment its event
commits, which is how a process learns of todos another process opened.
"""

from __future__ import annotations

from domain.events import DomainEvent
from domain.names import QUARANTINE, TODO_PREFIX, format_id
from domain.todo import (
    DelayElapsed, LeaseExpired, LeaseRenewed, TodoClaimed, TodoCompleted, TodoDiscarded, TodoFailed, TodoMoved, TodoOpened, TodoReleased,
    TodoRequeued,
)
from projections.base import Op, micros

RETIRED = ("doorbell", "timers")
"""Tracking rows of the projections this one took in (their tables: interfaces/store/schema.py)."""

_STATE = "UPDATE sb_claimable SET available_at = %s, spell = %s, pending_since = %s, due_at = %s WHERE todo_id = %s"
_DELETE = "DELETE FROM sb_claimable WHERE todo_id = %s"


class ClaimableQueue:
    name = "claimable"
    inline = True
    tables = ("sb_claimable",)
    ignores = ()
    ddl = (
        "CREATE TABLE IF NOT EXISTS sb_claimable (todo_id TEXT PRIMARY KEY, endpoint_id TEXT NOT NULL,"
        " queue TEXT NOT NULL, created_at BIGINT NOT NULL, available_at BIGINT, source TEXT, kind TEXT,"
        " title TEXT, spell BIGINT, pending_since BIGINT, due_at BIGINT)",
        "CREATE INDEX IF NOT EXISTS sb_claimable_order ON sb_claimable"
        " (endpoint_id, queue, created_at, todo_id) WHERE available_at IS NOT NULL",
        "CREATE INDEX IF NOT EXISTS sb_claimable_pending ON sb_claimable (endpoint_id, pending_since)"
        " WHERE pending_since IS NOT NULL",
        "CREATE INDEX IF NOT EXISTS sb_claimable_due ON sb_claimable (due_at) WHERE due_at IS NOT NULL",
    )

    def ops(self, event: DomainEvent, position: int | None) -> list[Op]:
        todo_id = format_id(TODO_PREFIX, event.originator_id)
        at = micros(event.timestamp)
        pending = (event.originator_version, at)  # a new pending spell, from this event on
        match event:
            case TodoOpened():
                delayed = event.not_before is not None
                rung = event.queue != QUARANTINE and not delayed  # a delayed one is rung when due
                return [(
                    "INSERT INTO sb_claimable (todo_id, endpoint_id, queue, created_at, available_at, source, kind,"
                    " title, spell, pending_since, due_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                    (todo_id, event.endpoint_id, event.queue, at, micros(event.not_before) or at, event.source,
                     event.kind, event.title, *(pending if rung else (None, None)), micros(event.not_before)),
                )]
            case TodoClaimed():
                return [(_STATE, (None, None, None, micros(event.lease_expires_at), todo_id))]
            case LeaseRenewed():
                return [("UPDATE sb_claimable SET due_at = %s WHERE todo_id = %s",
                         (micros(event.lease_expires_at), todo_id))]
            case TodoCompleted() | TodoDiscarded():
                return [(_DELETE, (todo_id,))]
            case TodoFailed():
                retry = None if event.dead_letter else micros(event.next_retry_at)
                return [(_STATE, (retry, None, None, retry, todo_id))]
            case TodoReleased():
                # a snooze keeps it from claims (and rings) until its available_at, when it is due
                available = None if event.dead_letter else micros(event.available_at) or at
                rung = event.available_at is None and not event.dead_letter
                return [(_STATE, (available, *(pending if rung else (None, None)), micros(event.available_at),
                                  todo_id))]
            case LeaseExpired():
                return [(_STATE, (None, None, None, None, todo_id) if event.dead_letter else (at, *pending, None, todo_id))]
            case TodoRequeued():
                return [(_STATE, (at, *pending, None, todo_id))]
            case TodoMoved():  # only a pending todo moves: claimable at once in its new queue, rung like a new todo
                return [(
                    "UPDATE sb_claimable SET queue = %s, available_at = %s, source = %s, kind = %s, title = %s,"
                    " spell = %s, pending_since = %s WHERE todo_id = %s",
                    (event.queue, at, event.source, event.kind, event.title, *pending, todo_id),
                )]
            case DelayElapsed():  # its available_at was the delay's end: rung from now
                return [("UPDATE sb_claimable SET spell = %s, pending_since = %s, due_at = %s WHERE todo_id = %s",
                         (*pending, None, todo_id))]
        return []
