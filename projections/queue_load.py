"""Queue load: each queue's controls, its claimed todos and its recent claims. Written inline.

`sb_queue_controls` holds the controls operators set (`QueueControlsSet`). `sb_in_flight` has one
row per claimed todo of every queue (so a limit set on a busy queue counts what is already
claimed; claims recorded before this projection existed carry no queue and are not counted).
`sb_queue_claims` has one row per claim admitted under a rate in the last two minutes (the rate
counts the last one).

Being written in the transaction that appends the claim, after the store's write lock, the rows
of a claim admitted under controls check the queue's controls **as committed at that moment**:
an `admitted` column that must be 1 is computed from the current counts, so a claim that would
take a paused queue, a queue at `max_in_flight` or at its rate fails its whole commit (a CHECK
violation, which the writer treats like a lost race: it re-runs the command on fresh state, where
admission refuses it with its reason). That is what holds every process to the limits
(docs/adr/0025-queue-admission.md). Rebuilt from zero, the same claims in the same order pass the
same checks.
"""

from __future__ import annotations

from domain.endpoint import QueueControlsSet
from domain.events import DomainEvent
from domain.names import ENDPOINT_PREFIX, TODO_PREFIX, format_id
from domain.queue import RATE_WINDOW
from domain.todo import (
    ENDS_A_CLAIM, DelayElapsed, LeaseRenewed, TodoClaimed, TodoDiscarded, TodoMoved, TodoOpened, TodoRequeued,
)
from projections.base import Op, micros

_CONTROLS = "FROM sb_queue_controls c WHERE c.endpoint_id = %s AND c.queue = %s"
_ADMIT_IN_FLIGHT = (
    "INSERT INTO sb_in_flight (todo_id, endpoint_id, queue, admitted) VALUES (%s, %s, %s, COALESCE(("
    "SELECT CASE WHEN c.paused = 0 AND (c.max_in_flight IS NULL OR (SELECT count(*) FROM sb_in_flight f"
    " WHERE f.endpoint_id = %s AND f.queue = %s) < c.max_in_flight) THEN 1 ELSE 0 END " + _CONTROLS + "), 1))"
)
_ADMIT_RATE = (
    "INSERT INTO sb_queue_claims (endpoint_id, queue, claimed_at, todo_id, admitted) VALUES (%s, %s, %s, %s,"
    " COALESCE((SELECT CASE WHEN c.max_claims_per_minute IS NULL OR (SELECT count(*) FROM sb_queue_claims q"
    " WHERE q.endpoint_id = %s AND q.queue = %s AND q.claimed_at > %s) < c.max_claims_per_minute THEN 1 ELSE 0 END "
    + _CONTROLS + "), 1))"
)
_FORGET_CLAIMS = "DELETE FROM sb_queue_claims WHERE endpoint_id = %s AND queue = %s AND claimed_at <= %s"
_IN_FLIGHT = "INSERT INTO sb_in_flight (todo_id, endpoint_id, queue, admitted) VALUES (%s, %s, %s, 1)"


class QueueLoad:
    name = "queue_load"
    inline = True
    tables = ("sb_queue_controls", "sb_in_flight", "sb_queue_claims")
    ignores = (TodoOpened, LeaseRenewed, TodoRequeued, TodoMoved, TodoDiscarded, DelayElapsed)  # none is claimed
    ddl = (
        "CREATE TABLE IF NOT EXISTS sb_queue_controls (endpoint_id TEXT NOT NULL, queue TEXT NOT NULL,"
        " paused INTEGER NOT NULL, max_in_flight INTEGER, max_claims_per_minute INTEGER,"
        " PRIMARY KEY (endpoint_id, queue))",
        "CREATE TABLE IF NOT EXISTS sb_in_flight (todo_id TEXT PRIMARY KEY, endpoint_id TEXT NOT NULL,"
        " queue TEXT NOT NULL, admitted INTEGER NOT NULL CHECK (admitted = 1))",
        "CREATE INDEX IF NOT EXISTS sb_in_flight_queue ON sb_in_flight (endpoint_id, queue)",
        "CREATE TABLE IF NOT EXISTS sb_queue_claims (endpoint_id TEXT NOT NULL, queue TEXT NOT NULL,"
        " claimed_at BIGINT NOT NULL, todo_id TEXT NOT NULL, admitted INTEGER NOT NULL CHECK (admitted = 1),"
        " PRIMARY KEY (endpoint_id, queue, claimed_at, todo_id))",
    )

    def ops(self, event: DomainEvent, position: int | None) -> list[Op]:
        match event:
            case QueueControlsSet():
                endpoint_id = format_id(ENDPOINT_PREFIX, event.originator_id)
                return [(
                    "INSERT INTO sb_queue_controls (endpoint_id, queue, paused, max_in_flight, max_claims_per_minute)"
                    " VALUES (%s, %s, %s, %s, %s) ON CONFLICT (endpoint_id, queue) DO UPDATE SET"
                    " paused = excluded.paused, max_in_flight = excluded.max_in_flight,"
                    " max_claims_per_minute = excluded.max_claims_per_minute",
                    (endpoint_id, event.queue, int(event.paused), event.max_in_flight, event.max_claims_per_minute),
                )]
            case TodoClaimed():
                if event.queue is None:  # claimed before queues had controls: not counted
                    return []
                todo_id = format_id(TODO_PREFIX, event.originator_id)
                key = (event.endpoint_id, event.queue)
                if event.admitted_under is None:
                    return [(_IN_FLIGHT, (todo_id, *key))]
                admit = [(_ADMIT_IN_FLIGHT, (todo_id, *key, *key, *key))]
                if event.admitted_under.get("max_claims_per_minute") is None:
                    return admit
                at = micros(event.timestamp)
                since = at - int(RATE_WINDOW.total_seconds() * 1_000_000)
                return [
                    *admit,
                    # forgotten a window later than needed: a claim stamped by a process whose clock
                    # is behind (by less than a minute) still counts the claims it must
                    (_FORGET_CLAIMS, (*key, since - int(RATE_WINDOW.total_seconds() * 1_000_000))),
                    (_ADMIT_RATE, (*key, at, todo_id, *key, since, *key)),
                ]
        if isinstance(event, ENDS_A_CLAIM):
            return [("DELETE FROM sb_in_flight WHERE todo_id = %s", (format_id(TODO_PREFIX, event.originator_id),))]
        return []
