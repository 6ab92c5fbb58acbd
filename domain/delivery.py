"""The Delivery aggregate: one accepted POST to a webhook, with its routing decision.

`DeliveryAccepted` is appended in the same transaction as every todo it mints (fan-out), so a
delivery and its todos exist together or not at all.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from domain.events import Aggregate, DomainEvent
from domain.names import format_id

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
    body: str
    body_encoding: str
    delivery_key: str
    disposition: str
    routing: dict[str, Any]
    todos: list[dict[str, Any]]
    # the rule envelope's `actor` ({sender, association, trusted}); None in deliveries stored
    # before trusted senders existed (every one of them trusted)
    sender_actor: dict[str, Any] | None = None


DELIVERY_EVENTS = (DeliveryAccepted,)


def delivery_id_of(delivery_key: str) -> str:
    """The sender's delivery id inside an idempotency key `<webhook_id>:<delivery id>`."""
    return delivery_key.partition(":")[2] or delivery_key


def encode_body(raw: bytes) -> tuple[str, str]:
    """A body is kept as text when it is UTF-8 (nearly every webhook), else as base64."""
    try:
        return raw.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        return base64.b64encode(raw).decode("ascii"), "base64"


def decode_body(text: str, encoding: str) -> bytes:
    """The exact bytes received."""
    return base64.b64decode(text) if encoding == "base64" else text.encode("utf-8")


class Delivery(Aggregate):
    """Immutable once accepted."""

    @classmethod
    def accept(cls, *, id: UUID, now: datetime, actor: str, body: bytes, **fields: Any) -> Delivery:
        """Records an accepted delivery (its exact body) with its decision and the todos it names."""
        delivery = cls()
        delivery.id = id
        text, encoding = encode_body(body)
        delivery._record(DeliveryAccepted, timestamp=now, actor=actor, cause="ingest", body=text,
                         body_encoding=encoding, **fields)
        return delivery

    @property
    def event_id(self) -> str:
        return format_id(DELIVERY_PREFIX, self.id)

    def _mutate(self, event: DomainEvent) -> None:
        match event:
            case DeliveryAccepted():
                self.__dict__.update({k: v for k, v in vars(event).items()
                                      if k not in ("originator_id", "originator_version")})
                self.body = decode_body(event.body, event.body_encoding)
                self.received_at = event.timestamp
            case _:  # pragma: no cover
                raise TypeError(f"Delivery cannot apply {type(event).__name__}")
