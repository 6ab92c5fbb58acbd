"""Ports: what the application needs from the outside, as roles."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Protocol, TypeVar
from uuid import UUID

from domain.events import Aggregate, DomainEvent
from domain.payloads import Pruned
from domain.routing import Faulted, Matched, NoMatch
from domain.rule_set import RuleSet

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

    def queue_load(self, endpoint_id: str, queue: str, *, fresh: bool = False) -> QueueLoad: ...
    """The queue's claimed todos and its claims of the last 60 s plus this batch's claims: as this
    process last knew them (possibly behind), or as committed with `fresh`."""

    def needs_payloads(self, digests: Sequence[str]) -> PayloadSource: ...
    """The stored payloads of these digests, read in the command's own transaction after every
    command of its batch ran and before it commits: a read that fails fails the batch (nothing is
    committed). The source serves them once the command's events are durable (docs/adr/0027)."""


class StoredPayload(Protocol):
    """What the payload store holds for one digest: the bytes, or None and the prune's tombstone."""

    data: bytes | None
    pruned: Pruned | None


class PayloadSource(Protocol):
    def read_payloads(self, digests: Sequence[str]) -> dict[str, StoredPayload]: ...
    """The stored payloads of these digests; absent ones are left out."""


@dataclass(frozen=True)
class QueueLoad:
    """What admission counts (domain/queue.py): claimed todos, and the times of recent claims."""

    in_flight: int
    recent_claims: tuple[datetime, ...]


@dataclass(frozen=True)
class Recorded:
    """An event as stored: its global position and the event."""

    position: int
    event: DomainEvent


class EventStore(Protocol):
    """The write side's store: runs command handlers atomically, reads streams and the log."""

    def run(self, handler: Callable[[UnitOfWork], T], *, hints: dict[UUID, Aggregate | None] | None = None) -> T: ...

    async def run_async(self, handler: Callable[[UnitOfWork], T], *,
                        hints: dict[UUID, Aggregate | None] | None = None) -> T:
        """`run` for a caller on an event loop: the answer is awaited, no thread waits for it."""
        ...

    def load(self, cls: type[A], aggregate_id: UUID) -> A | None: ...

    def load_many(self, wanted: Sequence[tuple[type[Aggregate], UUID]]) -> dict[UUID, Aggregate | None]: ...

    def version_of(self, aggregate_id: UUID) -> int: ...

    def stream(self, aggregate_id: UUID) -> list[Recorded]: ...

    def read_log(self, after: int, limit: int, *, types: Sequence[type[DomainEvent]] = ()) -> list[Recorded]: ...

    def event_data(self, event: DomainEvent) -> dict[str, Any]: ...


class Views(Protocol):
    """The read models the application queries (see interfaces/store/views.py)."""

    def catch_up(self) -> None: ...

    def list_todos(self, *, endpoint_ids: Sequence[str] | None, state: str | None, queue: str | None,
                   limit: int, hide_queues: Sequence[str] = (), dead_letter: bool | None = None,
                   ) -> list[dict[str, Any]]: ...

    def page_todos(self, *, endpoint_ids: Sequence[str] | None, state: str | None, queue: str | None,
                   limit: int, hide_queues: Sequence[str] = (), dead_letter: bool | None = None,
                   after: tuple[int, str] | None = None) -> tuple[list[dict[str, Any]], tuple[int, str] | None]: ...

    def queue_counts(self, endpoint_ids: Sequence[str] | None = None) -> list[dict[str, Any]]: ...

    def queue_loads(self, endpoint_id: str, queues: Sequence[str], now: datetime) -> dict[str, tuple[int, int]]: ...

    def queue_load(self, endpoint_id: str, queue: str, now: datetime) -> QueueLoad: ...
    """One queue's committed load, as admission reads it on a fresh read (its claims' times too)."""

    def dead_letter_ids(self, endpoint_id: str, queue: str | None) -> list[str]: ...

    def waiting(self, endpoint_id: str, queue: str, now: datetime, limit: int) -> tuple[int, list[dict[str, Any]]]: ...
    """How many todos of the queue are claimable now, and the oldest `limit` of them ({id, title, created_at})."""

    def fault_traces(self, todo_ids: Sequence[str], endpoint_ids: Sequence[str] | None,
                     ) -> dict[str, dict[str, Any]]: ...

    def list_endpoints(self, *, owner: str | None) -> list[dict[str, Any]]: ...

    def endpoint_ids_of(self, owner: str) -> list[str]: ...

    def held_todos(self, endpoint_id: str, holder: str) -> list[str]: ...

    def due_timers(self, now: datetime, limit: int) -> list[str]: ...

    def next_due(self) -> datetime | None: ...

    def subject_of_credential(self, sha256: str) -> tuple[str, str] | None: ...

    def operator_count(self) -> int: ...

    def list_webhooks(self, *, endpoint_ids: Sequence[str] | None) -> list[dict[str, Any]]: ...

    def recent_envelopes(self, webhook_id: str, limit: int) -> list[tuple[str, str]]: ...

    def delivery_envelope(self, webhook_id: str, event_id: str) -> str | None: ...

    def list_deliveries(self, *, webhook_id: str | None, endpoint_ids: Sequence[str] | None, limit: int,
                        before: int | None) -> tuple[list[dict[str, Any]], int | None]: ...


class PasswordHasher(Protocol):
    def hash(self, password: str) -> str: ...

    def verify(self, password_hash: str, password: str) -> bool: ...


class RuleEngine(Protocol):
    def check_compiles(self, rule_set: RuleSet) -> None: ...

    def evaluate(self, rule_set: RuleSet, envelope: dict) -> Matched | NoMatch | Faulted: ...

    def evaluate_many(self, rule_set: RuleSet, envelopes_json: Sequence[str | bytes], *,
                      compare_with: RuleSet | None = None) -> list[tuple[Any, Any]]: ...


class SecretBox(Protocol):
    def encrypt(self, plaintext: str) -> str: ...

    def decrypt(self, token: str) -> str: ...
