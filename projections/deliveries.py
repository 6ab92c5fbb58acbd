"""Stored deliveries: what `events list/show`, rule dry runs and replays read.

Each row keeps the rule envelope as JSON text, so a replay feeds stored deliveries to jq
without decoding events or re-parsing bodies in Python.
"""

from __future__ import annotations

import json

from domain.delivery import DELIVERY_PREFIX, DeliveryAccepted, decode_body
from domain.events import DomainEvent
from domain.ingest import parse_payload
from domain.names import format_id
from domain.routing import envelope
from domain.trust import NO_POLICY, Actor
from domain.todo import TODO_EVENTS
from projections.base import Op, as_json, micros

COLUMNS = (
    "event_id", "webhook_id", "endpoint_id", "source", "kind", "trust_mode", "verified", "disposition",
    "size", "todo_count", "remote_addr", "received_at", "position", "routing", "todos", "envelope",
)


def _actor(event: DeliveryAccepted, payload: object) -> Actor:
    """The actor the rules saw; a delivery stored before trusted senders existed was trusted if verified."""
    if event.sender_actor is not None:
        return Actor(event.sender_actor.get("sender"), event.sender_actor.get("association"),
                     bool(event.sender_actor.get("trusted")))
    return NO_POLICY.actor(event.source, payload, verified=event.verified)


class Deliveries:
    name = "deliveries"
    inline = False
    tables = ("sb_deliveries",)
    ignores = TODO_EVENTS
    ddl = (
        "CREATE TABLE IF NOT EXISTS sb_deliveries (event_id TEXT PRIMARY KEY, webhook_id TEXT NOT NULL,"
        " endpoint_id TEXT NOT NULL, source TEXT NOT NULL, kind TEXT, trust_mode TEXT NOT NULL,"
        " verified INTEGER NOT NULL, disposition TEXT NOT NULL, size BIGINT NOT NULL,"
        " todo_count INTEGER NOT NULL, remote_addr TEXT, received_at BIGINT NOT NULL,"
        " position BIGINT NOT NULL, routing TEXT NOT NULL, todos TEXT NOT NULL, envelope TEXT NOT NULL)",
        "CREATE INDEX IF NOT EXISTS sb_deliveries_webhook ON sb_deliveries (webhook_id, position)",
        "CREATE INDEX IF NOT EXISTS sb_deliveries_endpoint ON sb_deliveries (endpoint_id, position)",
    )

    def ops(self, event: DomainEvent, position: int | None) -> list[Op]:
        match event:
            case DeliveryAccepted():
                payload = parse_payload(decode_body(event.body, event.body_encoding), event.content_type)
                env = envelope(
                    source=event.source, kind=event.kind, webhook_id=event.webhook_id,
                    trust_mode=event.trust_mode, verified=event.verified, content_type=event.content_type,
                    size=event.size, headers=event.headers, payload=payload, actor=_actor(event, payload),
                )
                return [(
                    f"INSERT INTO sb_deliveries ({', '.join(COLUMNS)}) VALUES ({', '.join(['%s'] * len(COLUMNS))})",
                    (format_id(DELIVERY_PREFIX, event.originator_id), event.webhook_id, event.endpoint_id,
                     event.source, event.kind, event.trust_mode, int(event.verified), event.disposition,
                     event.size, sum(1 for t in event.todos if t.get("created")), event.remote_addr,
                     micros(event.timestamp), position or 0, as_json(event.routing), as_json(event.todos),
                     json.dumps(env, separators=(",", ":"))),
                )]
        return []
