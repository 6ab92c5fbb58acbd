"""Event serialization: msgspec JSON, typed on decode, with stable short topics.

See docs/adr/0003-event-serialization.md. Topics are the event class names, registered here,
not `module:QualName`, so moving a class never breaks the stored log.
"""

from __future__ import annotations

import dataclasses
from typing import Any
from uuid import UUID

import msgspec
from eventsourcing.persistence import StoredEvent

from domain.delivery import DELIVERY_EVENTS
from domain.endpoint import ENDPOINT_EVENTS
from domain.events import DomainEvent
from domain.idempotency import KEY_EVENTS
from domain.installation import INSTALLATION_EVENTS
from domain.once import ONCE_EVENTS
from domain.operator import OPERATOR_EVENTS
from domain.payloads import PAYLOAD_FIELDS, is_carried, upcast
from domain.retention import RETENTION_EVENTS
from domain.todo import TODO_EVENTS
from domain.webhook import WEBHOOK_EVENTS

EVENT_TYPES: dict[str, type[DomainEvent]] = {
    cls.__name__: cls
    for cls in (*TODO_EVENTS, *ENDPOINT_EVENTS, *OPERATOR_EVENTS, *KEY_EVENTS, *WEBHOOK_EVENTS, *DELIVERY_EVENTS,
                *ONCE_EVENTS)
}
EVENT_TYPES.update((cls.__name__, cls) for cls in (*INSTALLATION_EVENTS, *RETENTION_EVENTS))
_ENVELOPE = ("originator_id", "originator_version")


def stored_fields(cls: type[DomainEvent]) -> tuple[str, ...]:
    """The fields serialized: not the stream's columns, not the bytes an event carries to the
    store (domain/payloads.py `carried`)."""
    return tuple(f.name for f in dataclasses.fields(cls) if f.name not in _ENVELOPE and not is_carried(f))


class EventCodec:
    """Maps domain events to eventsourcing's StoredEvent and back."""

    def __init__(self, types: dict[str, type[DomainEvent]] = EVENT_TYPES) -> None:
        self._types = dict(types)
        self._fields = {cls: stored_fields(cls) for cls in self._types.values()}
        self._encoder = msgspec.json.Encoder()
        self._decoder = msgspec.json.Decoder(dict)

    def register(self, cls: type[DomainEvent]) -> None:
        self._types[cls.__name__] = cls
        self._fields[cls] = stored_fields(cls)

    def encode_state(self, event: DomainEvent) -> bytes:
        return self._encoder.encode({name: getattr(event, name) for name in self._fields[type(event)]})

    def to_stored_event(self, event: DomainEvent) -> StoredEvent:
        return StoredEvent(
            originator_id=event.originator_id,
            originator_version=event.originator_version,
            topic=type(event).__name__,
            state=self.encode_state(event),
        )

    def decode(self, topic: str, originator_id: UUID | str, version: int, state: bytes) -> DomainEvent:
        cls = self._types[topic]
        data: dict[str, Any] = self._decoder.decode(state)
        if topic in PAYLOAD_FIELDS:
            data = upcast(topic, data)  # an event from before payloads were stored once
        data["originator_id"] = originator_id if isinstance(originator_id, UUID) else UUID(str(originator_id))
        data["originator_version"] = version
        return msgspec.convert(data, cls, strict=False)

    def to_domain_event(self, stored: StoredEvent) -> DomainEvent:
        return self.decode(stored.topic, stored.originator_id, stored.originator_version, bytes(stored.state))

    def event_data(self, event: DomainEvent) -> dict[str, Any]:
        """The event's own fields as JSON-ready builtins (for history and audit)."""
        return msgspec.json.decode(self.encode_state(event))
