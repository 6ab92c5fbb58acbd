"""Ports: what the application needs from the outside, as roles."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Protocol, TypeVar
from uuid import UUID

from domain.events import Aggregate, DomainEvent

A = TypeVar("A", bound=Aggregate)
T = TypeVar("T")


class Clock(Protocol):
    def now(self) -> datetime: ...


class SystemClock:
    """Wall-clock UTC time."""

    def now(self) -> datetime:
        return datetime.now(timezone.utc)


class UnitOfWork(Protocol):
    """What a command handler sees: aggregates to load and change, all saved atomically."""

    now: datetime

    def get(self, cls: type[A], aggregate_id: UUID, *, fresh: bool = False) -> A | None: ...

    def add(self, aggregate: Aggregate) -> None: ...

    def claimable(self, endpoint_id: str, queues: Sequence[str], limit: int) -> list[UUID]: ...


@dataclass(frozen=True)
class Recorded:
    """An event as stored: its global position and the event."""

    position: int
    event: DomainEvent


class EventStore(Protocol):
    """The write side's store: runs command handlers atomically, reads streams and the log."""

    def run(self, handler: Callable[[UnitOfWork], T], *, hints: dict[UUID, Aggregate | None] | None = None) -> T: ...

    def load(self, cls: type[A], aggregate_id: UUID) -> A | None: ...

    def load_many(self, wanted: Sequence[tuple[type[Aggregate], UUID]]) -> dict[UUID, Aggregate | None]: ...

    def version_of(self, aggregate_id: UUID) -> int: ...

    def stream(self, aggregate_id: UUID) -> list[Recorded]: ...

    def read_log(self, after: int, limit: int, *, types: Sequence[type[DomainEvent]] = ()) -> list[Recorded]: ...

    def event_data(self, event: DomainEvent) -> dict[str, Any]: ...

    def max_position(self) -> int: ...

    def read_payloads(self, digests: Sequence[str]) -> dict[str, Any]:
        """The stored bytes (or prune tombstones) of these payload digests (docs/adr/0019)."""
        ...
