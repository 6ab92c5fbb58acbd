"""Stored deliveries: what `events list/show`, rule dry runs and replays read.

Each row keeps the rule envelope as JSON text with `"payload":null` (always its last key) and
the digest and form of the body (docs/adr/0027): a replay splices the body from the payload
store into the envelope and feeds it to jq without decoding events; the body is stored once.
"""

from __future__ import annotations

import json

from domain.delivery import DELIVERY_PREFIX, DeliveryAccepted
from domain.envelopes import envelope
from domain.events import DomainEvent
from domain.bodies import parse_payload_form
from domain.names import format_id
from domain.trust import NO_POLICY, Actor
from domain.todo import TODO_EVENTS
from projections.base import Op, as_json, micros

COLUMNS = (
    "event_id", "webhook_id", "endpoint_id", "source", "kind", "trust_mode", "verified", "disposition",
    "size", "todo_count", "remote_addr", "received_at", "position", "routing", "todos", "envelope",
    "body_sha256", "payload_form",
)


RETIRED = ("deliveries",)  # tracking rows of projections replaced by this one


def _actor(event: DeliveryAccepted) -> Actor:
    """The actor the rules saw; a delivery stored before trusted senders existed (its body carried
    by the upcaster) was trusted if verified."""
    if event.sender_actor is not None:
        return Actor(event.sender_actor.get("sender"), event.sender_actor.get("association"),
                     bool(event.sender_actor.get("trusted")))
    payload = parse_payload_form(event.body_bytes, event.content_type)[0] if event.body_bytes is not None else None
    return NO_POLICY.actor(event.source, payload, verified=event.verified)


class Deliveries:
    name = "stored_deliveries"
    inline = False
    tables = ("sb_stored_deliveries",)
    ignores = TODO_EVENTS
    ddl = (
        "CREATE TABLE IF NOT EXISTS sb_stored_deliveries (event_id TEXT PRIMARY KEY, webhook_id TEXT NOT NULL,"
        " endpoint_id TEXT NOT NULL, source TEXT NOT NULL, kind TEXT, trust_mode TEXT NOT NULL,"
        " verified INTEGER NOT NULL, disposition TEXT NOT NULL, size BIGINT NOT NULL,"
        " todo_count INTEGER NOT NULL, remote_addr TEXT, received_at BIGINT NOT NULL,"
        " position BIGINT NOT NULL, routing TEXT NOT NULL, todos TEXT NOT NULL, envelope TEXT NOT NULL,"
        " body_sha256 TEXT, payload_form TEXT)",
        # The table before payloads were stored once (`sb_deliveries`, each envelope with its
        # payload) goes; this one, a projection of its own, is built from the log on upgrade.
        "DROP TABLE IF EXISTS sb_deliveries",
        "CREATE INDEX IF NOT EXISTS sb_stored_deliveries_webhook ON sb_stored_deliveries (webhook_id, position)",
        "CREATE INDEX IF NOT EXISTS sb_stored_deliveries_endpoint ON sb_stored_deliveries (endpoint_id, position)",
    )

    def ops(self, event: DomainEvent, position: int | None) -> list[Op]:
        match event:
            case DeliveryAccepted():
                env = envelope(
                    source=event.source, kind=event.kind, webhook_id=event.webhook_id,
                    trust_mode=event.trust_mode, verified=event.verified, content_type=event.content_type,
                    size=event.size, headers=event.headers, payload=None, actor=_actor(event),
                )
                return [(
                    f"INSERT INTO sb_stored_deliveries ({', '.join(COLUMNS)}) VALUES ({', '.join(['%s'] * len(COLUMNS))})",
                    (format_id(DELIVERY_PREFIX, event.originator_id), event.webhook_id, event.endpoint_id,
                     event.source, event.kind, event.trust_mode, int(event.verified), event.disposition,
                     event.size, sum(1 for t in event.todos if t.get("created")), event.remote_addr,
                     micros(event.timestamp), position or 0, as_json(event.routing), as_json(event.todos),
                     json.dumps(env, separators=(",", ":")), event.body_ref["sha256"], _form_of(event)),
                )]
        return []


def _form_of(event: DeliveryAccepted) -> str | None:
    """How the payload is read from the body; an event from before payloads were stored once
    carries its body (upcast), so its form is found as ingest found it."""
    if event.payload_form is None and event.body_bytes is not None:
        return parse_payload_form(event.body_bytes, event.content_type)[1]
    return event.payload_form
