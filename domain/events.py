"""The shape every domain event shares."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

SYSTEM = "system"


@dataclass(frozen=True, kw_only=True)
class DomainEvent:
    """A fact that happened to one aggregate: who did it, when, and why.

    `originator_id`/`originator_version` place it in its stream; `timestamp` is the
    domain time passed in by the caller (never read from a clock here).
    """

    originator_id: UUID
    originator_version: int
    timestamp: datetime
    actor: str
    cause: str


class Aggregate:
    """Base of the event-sourced aggregates: commands record events, `apply` evolves state."""

    id: UUID
    version: int

    def __init__(self) -> None:
        self.version = 0
        self._pending: list[DomainEvent] = []

    def _record(self, event_class: type[DomainEvent], **fields: object) -> None:
        event = event_class(
            originator_id=self.id, originator_version=self.version + 1, **fields
        )
        self.apply(event)
        self._pending.append(event)

    def apply(self, event: DomainEvent) -> None:
        self._mutate(event)
        self.version = event.originator_version

    def _mutate(self, event: DomainEvent) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def collect_events(self) -> list[DomainEvent]:
        """Hands over the events recorded since the last collection."""
        events, self._pending = self._pending, []
        return events

    @property
    def pending_events(self) -> tuple[DomainEvent, ...]:
        return tuple(self._pending)

    @classmethod
    def replay(cls, events: list[DomainEvent] | tuple[DomainEvent, ...]):
        """Rebuilds the aggregate from its stream; None for an empty stream."""
        if not events:
            return None
        aggregate = cls.__new__(cls)
        Aggregate.__init__(aggregate)
        aggregate.id = events[0].originator_id
        for event in events:
            aggregate.apply(event)
        return aggregate

    def clone(self):
        """A copy safe to mutate: state is replaced, never mutated in place, by `_mutate`."""
        twin = self.__class__.__new__(self.__class__)
        twin.__dict__.update(self.__dict__)
        twin._pending = list(self._pending)
        return twin
