"""The Delivery aggregate: one accepted POST to a webhook, with its routing decision.

`DeliveryAccepted` is appended in the same transaction as every todo it mints (fan-out), so a
delivery and its todos exist together or not at all.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from domain.events import Aggregate, DomainEvent
from domain.names import format_id

DELIVERY_PREFIX = "ev_"
DISPOSITIONS = ("routed", "dropped", "faulted")


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
    body: bytes
    delivery_key: str
    disposition: str
    routing: dict[str, Any]
    todos: list[dict[str, Any]]


DELIVERY_EVENTS = (DeliveryAccepted,)


class Delivery(Aggregate):
    """Immutable once accepted."""

    @classmethod
    def accept(cls, *, id: UUID, now: datetime, actor: str, **fields: Any) -> Delivery:
        """Records an accepted delivery with its decision and the todos it names."""
        delivery = cls()
        delivery.id = id
        delivery._record(DeliveryAccepted, timestamp=now, actor=actor, cause="ingest", **fields)
        return delivery

    @property
    def event_id(self) -> str:
        return format_id(DELIVERY_PREFIX, self.id)

    def _mutate(self, event: DomainEvent) -> None:
        match event:
            case DeliveryAccepted():
                self.__dict__.update({k: v for k, v in vars(event).items()
                                      if k not in ("originator_id", "originator_version")})
                self.received_at = event.timestamp
            case _:  # pragma: no cover
                raise TypeError(f"Delivery cannot apply {type(event).__name__}")
