"""The Delivery aggregate: one accepted POST to a webhook, with its routing decision.

`DeliveryAccepted` is appended in the same transaction as every todo it mints (fan-out), so a
delivery and its todos exist together or not at all.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any
from uuid import UUID

from domain.events import Aggregate, DomainEvent
from domain.names import format_id
from domain.payloads import carried, ref_of

DELIVERY_PREFIX = "ev_"
DISPOSITIONS = ("routed", "dropped", "faulted", "held")


@dataclass(frozen=True, kw_only=True)
class DeliveryAccepted(DomainEvent):
    webhook_id: str
    endpoint_id: str
    source: str
    kind: str | None
    trust_mode: str
    verified: bool
    remote_addr: str | None
    content_type: str | None
    size: int
    headers: dict[str, str]
    delivery_key: str
    disposition: str
    routing: dict[str, Any]
    todos: list[dict[str, Any]]
    # the rule envelope's `actor` ({sender, association, trusted}); None in deliveries stored
    # before trusted senders existed (every one of them trusted)
    sender_actor: dict[str, Any] | None = None
    # Before payloads were stored once (docs/adr/0027) the body was inline: `body` (text) and
    # `body_encoding` ("utf-8" or "base64"). Now `body_ref` names its bytes and `payload_form`
    # says how its payload is read from them (domain/payloads.py).
    body: str | None = None
    body_encoding: str | None = None
    body_ref: dict[str, Any] | None = None
    payload_form: str | None = None
    body_bytes: bytes | None = carried()
    # The streams (aggregate id, version) ingest decided on from copies it kept rather than read
    # just before (never stored): the append commits the delivery only while each stream is
    # still at that version, else the command runs again on fresh state (docs/adr/0031).
    decided_on: tuple[tuple[UUID, int], ...] = carried(())


DELIVERY_EVENTS = (DeliveryAccepted,)


def delivery_id_of(delivery_key: str) -> str:
    """The sender's delivery id inside an idempotency key `<webhook_id>:<delivery id>`."""
    return delivery_key.partition(":")[2] or delivery_key


_ACCEPTED_FIELDS = tuple(f.name for f in fields(DeliveryAccepted)
                         if f.name not in ("originator_id", "originator_version"))
"""The fields a delivery takes from its one event (named once: `fields()` costs more than the copy)."""


class Delivery(Aggregate):
    """Immutable once accepted."""

    @classmethod
    def accept(cls, *, id: UUID, now: datetime, actor: str, body: bytes, payload_form: str,
               body_ref: dict[str, Any] | None = None, **fields: Any) -> Delivery:
        """Records an accepted delivery (its exact body, by reference) with its decision and the todos it names."""
        delivery = cls()
        delivery.id = id
        delivery._record(DeliveryAccepted, timestamp=now, actor=actor, cause="ingest",
                         body_ref=body_ref or ref_of(body), payload_form=payload_form, body_bytes=body,
                         **fields)
        return delivery

    @property
    def event_id(self) -> str:
        return format_id(DELIVERY_PREFIX, self.id)

    def _mutate(self, event: DomainEvent) -> None:
        match event:
            case DeliveryAccepted():
                self.__dict__.update({name: getattr(event, name) for name in _ACCEPTED_FIELDS})
                self.received_at = event.timestamp
            case _:  # pragma: no cover
                raise TypeError(f"Delivery cannot apply {type(event).__name__}")
