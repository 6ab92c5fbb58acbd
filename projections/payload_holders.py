"""Who still needs each stored payload: what retention asks before it removes one.

`sb_payload_refs` has a row per (digest, holder) — a todo names its payload and results, a
delivery its body, and the body again for every todo the delivery names (so a delivery's body
stays while any of its todos is live). `sb_payload_holders` says when each holder finished:
a delivery when it was received (a delivery is never live itself), a todo when it became done
or a dead letter (NULL while it is live; an operator's retry makes it live again).
`sb_inline_payloads` lists the events from before payloads were stored once that still hold
their payload inline (docs/adr/0027), which a prune must rewrite to give the space back.
"""

from __future__ import annotations

from domain.delivery import DELIVERY_PREFIX, DeliveryAccepted
from domain.events import DomainEvent
from domain.names import TODO_PREFIX, format_id
from domain.payloads import PAYLOAD_FIELDS
from domain.todo import (
    DelayElapsed, LeaseExpired, LeaseRenewed, TodoClaimed, TodoCompleted, TodoDiscarded, TodoFailed,
    TodoMoved, TodoOpened, TodoReleased, TodoRequeued, is_live_state, state_after,
)
from projections.base import Op, micros

_REF = "INSERT INTO sb_payload_refs (sha256, holder) VALUES (%s, %s) ON CONFLICT (sha256, holder) DO NOTHING"
_HOLDER = ("INSERT INTO sb_payload_holders (holder, finished_at) VALUES (%s, %s)"
           " ON CONFLICT (holder) DO UPDATE SET finished_at = excluded.finished_at")
_INLINE = ("INSERT INTO sb_inline_payloads (event_key, sha256) VALUES (%s, %s)"
           " ON CONFLICT (event_key, sha256) DO NOTHING")


def event_key(event: DomainEvent) -> str:
    """How retention finds a stored event again: `<originator hex>:<version>`."""
    return f"{event.originator_id.hex}:{event.originator_version}"


class PayloadHolders:
    name = "payload_holders"
    inline = False
    tables = ("sb_payload_refs", "sb_payload_holders", "sb_inline_payloads")
    # a claim, a renewal or a move never finishes a todo nor revives one
    ignores = (TodoClaimed, LeaseRenewed, TodoMoved, DelayElapsed)
    ddl = (
        "CREATE TABLE IF NOT EXISTS sb_payload_refs (sha256 TEXT NOT NULL, holder TEXT NOT NULL,"
        " PRIMARY KEY (sha256, holder))",
        "CREATE INDEX IF NOT EXISTS sb_payload_refs_holder ON sb_payload_refs (holder)",
        "CREATE TABLE IF NOT EXISTS sb_payload_holders (holder TEXT PRIMARY KEY, finished_at BIGINT)",
        "CREATE TABLE IF NOT EXISTS sb_inline_payloads (event_key TEXT NOT NULL, sha256 TEXT NOT NULL,"
        " PRIMARY KEY (event_key, sha256))",
    )

    def ops(self, event: DomainEvent, position: int | None) -> list[Op]:
        ops = self._inline(event)
        match event:
            case DeliveryAccepted():
                delivery = format_id(DELIVERY_PREFIX, event.originator_id)
                digest = event.body_ref["sha256"]
                ops += [(_HOLDER, (delivery, micros(event.timestamp))), (_REF, (digest, delivery))]
                ops += [(_REF, (digest, todo["id"])) for todo in event.todos]
            case TodoOpened():
                todo = format_id(TODO_PREFIX, event.originator_id)
                ops.append((_HOLDER, (todo, None)))
                if event.payload_ref is not None:
                    ops.append((_REF, (event.payload_ref["sha256"], todo)))
            case TodoCompleted() | TodoFailed() | TodoDiscarded() | LeaseExpired() | TodoReleased() | TodoRequeued():
                todo = format_id(TODO_PREFIX, event.originator_id)
                state, dead_letter = state_after(event)
                finished = not is_live_state(state, dead_letter)
                ops.append((_HOLDER, (todo, micros(event.timestamp) if finished else None)))
                ref = getattr(event, "result_ref", None)
                if ref is not None:
                    ops.append((_REF, (ref["sha256"], todo)))
        return ops

    @staticmethod
    def _inline(event: DomainEvent) -> list[Op]:
        """An event read from the log with its payload's bytes at hand was written inline (upcast)."""
        ops: list[Op] = []
        for _, reference, carried in PAYLOAD_FIELDS.get(type(event).__name__, ()):
            ref = getattr(event, reference, None)
            if ref is not None and getattr(event, carried, None) is not None:
                ops.append((_INLINE, (event_key(event), ref["sha256"])))
        return ops
