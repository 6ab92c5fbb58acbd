"""The todo's domain events: what each transition of a todo records (their shapes only).

What they mean for the lifecycle — the state after each, which make a todo claimable, which end
a claim, which move a timer — is said once, in domain/todo.py beside the aggregate; import those
facts from there. Stored events are named by their class name alone (interfaces/store/codec.py),
and the audit export names their aggregate "todo" by this module (application/audit.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from domain.events import DomainEvent
from domain.payloads import carried


@dataclass(frozen=True, kw_only=True)
class TodoOpened(DomainEvent):
    endpoint_id: str
    queue: str
    source: str
    kind: str | None
    title: str
    trust_mode: str
    payload_size: int
    idempotency_key: str | None = None
    routing: dict[str, Any] | None = None
    delivery_id: str | None = None
    not_before: datetime | None = None
    """Not claimable before this time (None: at once)."""
    # `payload` inline before payloads were stored once (docs/adr/0027); now `payload_ref` names
    # the bytes (for a delivery's todo: its delivery's body) and `payload_form` how to read them.
    payload: Any = None
    payload_ref: dict[str, Any] | None = None
    payload_form: str | None = None
    payload_bytes: bytes | None = carried()
    trace_id: str | None = None
    """The todo's W3C trace id (docs/adr/0040); None only in todos opened before traces, whose trace
    id is their own id's hex."""
    trace_parent: str | None = None
    """The delivery's own valid `traceparent` header, the parent of the todo's trace (None: none sent)."""


@dataclass(frozen=True, kw_only=True)
class TodoClaimed(DomainEvent):
    attempt: int
    attempt_seq: int
    holder: str
    claimant: str | None
    lease_expires_at: datetime
    fence_hash: str | None = None
    endpoint_id: str | None = None
    queue: str | None = None
    """Where the claimed todo is (None only in claims recorded before queue controls existed)."""
    admitted_under: dict[str, Any] | None = None
    """The queue controls this claim was admitted under (`max_in_flight`, `max_claims_per_minute`),
    or None for a queue without controls: the store holds every process to them at commit."""
    span_id: str | None = None
    """This attempt's span of the todo's trace (None only in claims recorded before traces: then
    derived the same way, domain/traces.py)."""


@dataclass(frozen=True, kw_only=True)
class LeaseRenewed(DomainEvent):
    lease_expires_at: datetime
    checkpoint: Any = None
    """What the holder saved with this heartbeat (any JSON, at most 64 KiB; None: none): the next
    claim resumes from the todo's latest one."""


@dataclass(frozen=True, kw_only=True)
class TodoCompleted(DomainEvent):
    result: Any = None  # inline before docs/adr/0027; now by reference
    summary: str | None = None
    result_ref: dict[str, Any] | None = None
    result_bytes: bytes | None = carried()


@dataclass(frozen=True, kw_only=True)
class TodoFailed(DomainEvent):
    result: Any = None  # inline before docs/adr/0027; now by reference
    summary: str | None = None
    next_retry_at: datetime | None = None
    dead_letter: bool = False
    result_ref: dict[str, Any] | None = None
    result_bytes: bytes | None = carried()


@dataclass(frozen=True, kw_only=True)
class LeaseExpired(DomainEvent):
    dead_letter: bool = False


@dataclass(frozen=True, kw_only=True)
class TodoReleased(DomainEvent):
    summary: str | None = None
    outcome: str = "released"
    dead_letter: bool = False
    available_at: datetime | None = None
    """A snooze: pending but not claimable before this time (None: at once)."""


@dataclass(frozen=True, kw_only=True)
class DelayElapsed(DomainEvent):
    """A delayed (pushed with `not_before`) or snoozed todo became claimable."""


@dataclass(frozen=True, kw_only=True)
class TodoRequeued(DomainEvent):
    fresh_budget: bool = False


@dataclass(frozen=True, kw_only=True)
class TodoMoved(DomainEvent):
    """A pending quarantined todo released to one of its endpoint's queues. It repeats what the
    doorbell projection needs to ring for it, as TodoOpened does."""

    queue: str
    from_queue: str
    endpoint_id: str
    source: str
    kind: str | None
    title: str


@dataclass(frozen=True, kw_only=True)
class TodoDiscarded(DomainEvent):
    """An operator ends a quarantined todo without work: it is done, with no result."""

    summary: str | None = None
