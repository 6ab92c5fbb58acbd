"""The IdempotencyKey aggregate: which todo a key on an endpoint currently names.

Its stream id is derived from (endpoint, key), so two concurrent first uses of a key both
try to write version 1 of the same stream and the event store lets exactly one win.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from uuid import UUID, uuid5

from domain.events import Aggregate, DomainEvent

_KEY_NAMESPACE = UUID("0c7c3f7e-2a55-4b8e-8f3a-6a1d2b9e4c21")
KEY_MAX_BYTES = 512


def key_uuid(endpoint_id: str, key: str) -> UUID:
    return uuid5(_KEY_NAMESPACE, f"{endpoint_id}\x00{key}")


@dataclass(frozen=True, kw_only=True)
class KeyBound(DomainEvent):
    endpoint_id: str
    key: str
    todo_id: str


KEY_EVENTS = (KeyBound,)


class IdempotencyKey(Aggregate):
    """Binds a key to a todo; rebinding happens only once the previous todo is no longer live."""

    @classmethod
    def new(cls, *, endpoint_id: str, key: str) -> IdempotencyKey:
        aggregate = cls()
        aggregate.id = key_uuid(endpoint_id, key)
        aggregate.endpoint_id = endpoint_id
        aggregate.key = key
        aggregate.todo_id = None
        return aggregate

    def bind(self, *, todo_id: str, now: datetime, actor: str) -> None:
        """Points the key at a newly opened todo."""
        self._record(
            KeyBound, timestamp=now, actor=actor, cause="dedup",
            endpoint_id=self.endpoint_id, key=self.key, todo_id=todo_id,
        )

    def _mutate(self, event: DomainEvent) -> None:
        match event:
            case KeyBound():
                self.endpoint_id = event.endpoint_id
                self.key = event.key
                self.todo_id = event.todo_id
            case _:  # pragma: no cover
                raise TypeError(f"IdempotencyKey cannot apply {type(event).__name__}")
