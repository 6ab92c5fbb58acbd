"""The Endpoint aggregate: an agent's door, with a fixed scope and a hashed credential."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from uuid import UUID, uuid5

from domain.errors import CeilingExceeded, Conflict, Forbidden, ForbiddenSourceType, InvalidArgument, NotFound
from domain.events import Aggregate, DomainEvent
from domain.names import DEFAULT_SOURCE_TYPES, ENDPOINT_PREFIX, SOURCE_TYPES, check_queue_name, format_id, parse_id
from domain.queue import NO_CONTROLS, UNSET, QueueControls
from domain.leases import DEFAULT_LEASE, MAX_LEASE, MIN_DEFAULT_LEASE

TODO_VERBS = (
    "list_todos", "get_todo", "claim", "claim_next", "heartbeat", "complete", "fail", "release",
)
WEBHOOK_VERBS = (
    "create_webhook", "list_webhooks", "rotate_webhook", "delete_webhook",
    "add_webhook_route", "remove_webhook_route", "list_webhook_routes",
    "list_webhook_rules", "set_webhook_rules", "test_webhook_rules",
    "list_webhook_events", "get_webhook_event",
)
LEASE_VERBS = ("get_default_lease", "set_default_lease")
ALL_VERBS = TODO_VERBS + WEBHOOK_VERBS + LEASE_VERBS
DEFAULT_WEBHOOK_MAX = 5


_LIFETIME = re.compile(r"(\d{1,9})\s*([smhd])")
_LIFETIME_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_lifetime(text: str) -> int | None:
    """An endpoint lifetime `<n>s|m|h|d` in seconds, or None for `never` (CONTRACT §11)."""
    text = text.strip()
    if text == "never":
        return None
    match = _LIFETIME.fullmatch(text)
    if not match or int(match.group(1)) == 0:
        raise InvalidArgument(f"lifetime {text!r} must be <n>s, <n>m, <n>h, <n>d or never")
    return int(match.group(1)) * _LIFETIME_UNITS[match.group(2)]


def credential_hash(credential: str) -> str:
    """Only the SHA-256 of a credential is ever stored."""
    return hashlib.sha256(credential.encode()).hexdigest()


def check_default_lease(seconds: int | None, *, name: str = "default lease") -> int | None:
    """A default lease is 60..86400 seconds, or None for the 300 s default. A refusal names the field
    `name` (the board's vend form calls it by its label)."""
    if seconds is None:
        return None
    if isinstance(seconds, bool) or not isinstance(seconds, int):
        raise InvalidArgument(f"{name} must be a whole number of seconds")
    low, high = int(MIN_DEFAULT_LEASE.total_seconds()), int(MAX_LEASE.total_seconds())
    if not low <= seconds <= high:
        raise InvalidArgument(f"{name} must be within {low}..{high} seconds")
    return seconds


@dataclass(frozen=True, kw_only=True)
class EndpointVended(DomainEvent):
    slug: str
    agent: str
    owner: str
    credential_sha256: str
    queues: tuple[str, ...]
    verbs: tuple[str, ...]
    webhook_max: int
    source_types: tuple[str, ...]
    webhook_queues: tuple[str, ...]
    expires_at: datetime | None
    default_lease_seconds: int | None


@dataclass(frozen=True, kw_only=True)
class DefaultLeaseSet(DomainEvent):
    default_lease_seconds: int | None


@dataclass(frozen=True, kw_only=True)
class EndpointRevoked(DomainEvent):
    pass


@dataclass(frozen=True, kw_only=True)
class QueueControlsSet(DomainEvent):
    """An operator set the controls of one of the endpoint's queues (all three, as they now are)."""

    queue: str
    paused: bool
    max_in_flight: int | None
    max_claims_per_minute: int | None


@dataclass(frozen=True, kw_only=True)
class WebhookAttached(DomainEvent):
    webhook_id: str


@dataclass(frozen=True, kw_only=True)
class WebhookDetached(DomainEvent):
    webhook_id: str


ENDPOINT_EVENTS = (
    EndpointVended, DefaultLeaseSet, EndpointRevoked, WebhookAttached, WebhookDetached, QueueControlsSet,
)


def _unique(values) -> tuple[str, ...]:
    return tuple(dict.fromkeys(values))


class Endpoint(Aggregate):
    """An endpoint's scope is fixed at vend; its default lease and its queues' controls change
    until it is revoked."""

    @classmethod
    def vend(
        cls,
        *,
        id: UUID,
        now: datetime,
        actor: str,
        slug: str,
        agent: str,
        owner: str,
        credential_sha256: str,
        queues: list[str],
        verbs: list[str] | None = None,
        webhook_max: int = DEFAULT_WEBHOOK_MAX,
        source_types: list[str] | None = None,
        webhook_queues: list[str] | None = None,
        ttl: timedelta | None = None,
        default_lease_seconds: int | None = None,
    ) -> Endpoint:
        """Vends an endpoint: at least one queue, known verbs and source types."""
        if not agent or not agent.strip():
            raise InvalidArgument("agent name is required")
        if not queues:
            raise InvalidArgument("at least one queue is required")
        queues_t = _unique(check_queue_name(q) for q in queues)
        verbs_t = _unique(verbs) if verbs is not None else ALL_VERBS
        unknown = [v for v in verbs_t if v not in ALL_VERBS]
        if unknown:
            raise InvalidArgument(f"unknown verbs: {', '.join(unknown)}")
        types_t = _unique(source_types) if source_types is not None else DEFAULT_SOURCE_TYPES
        unknown = [t for t in types_t if t not in SOURCE_TYPES]
        if unknown:
            raise InvalidArgument(f"unknown source types: {', '.join(unknown)}")
        hook_queues = _unique(check_queue_name(q) for q in webhook_queues) if webhook_queues else queues_t
        if isinstance(webhook_max, bool) or not isinstance(webhook_max, int) or not 0 <= webhook_max <= 1000:
            raise InvalidArgument("webhook ceiling must be within 0..1000")
        if ttl is not None and ttl <= timedelta(0):
            raise InvalidArgument("lifetime must be positive")
        endpoint = cls()
        endpoint.id = id
        endpoint._record(
            EndpointVended, timestamp=now, actor=actor, cause="vend", slug=slug,
            agent=agent.strip(), owner=owner, credential_sha256=credential_sha256,
            queues=queues_t, verbs=verbs_t, webhook_max=webhook_max, source_types=types_t,
            webhook_queues=hook_queues, expires_at=now + ttl if ttl is not None else None,
            default_lease_seconds=check_default_lease(default_lease_seconds),
        )
        return endpoint

    @property
    def endpoint_id(self) -> str:
        return format_id(ENDPOINT_PREFIX, self.id)

    @property
    def principal(self) -> str:
        """How the endpoint reads as an actor and a lease holder."""
        return f"endpoint:{self.slug}"

    def is_active(self, now: datetime) -> bool:
        """Not revoked and not expired: an expired endpoint is treated as revoked."""
        return not self.revoked and (self.expires_at is None or now < self.expires_at)

    @property
    def default_lease(self) -> timedelta:
        if self.default_lease_seconds is None:
            return DEFAULT_LEASE
        return timedelta(seconds=self.default_lease_seconds)

    def set_default_lease(self, *, now: datetime, actor: str, seconds: int | None) -> None:
        """Sets the lease used when a claim names none (60..86400 s, or None for 300 s)."""
        self._check_not_revoked()
        self._record(
            DefaultLeaseSet, timestamp=now, actor=actor, cause="set_default_lease",
            default_lease_seconds=check_default_lease(seconds),
        )

    def controls_of(self, queue: str) -> QueueControls:
        """The controls of one of its queues (none set: admits every claim)."""
        return self.queue_controls.get(queue, NO_CONTROLS)

    def set_queue_controls(
        self, *, now: datetime, actor: str, queue: str, paused: object = UNSET,
        max_in_flight: object = UNSET, max_claims_per_minute: object = UNSET, cause: str = "set_queue_controls",
    ) -> QueueControls:
        """An operator pauses or resumes one of the endpoint's queues or sets its limits; settings
        not given stay as they are. A change that changes nothing records nothing."""
        self._check_not_revoked()
        if queue not in self.queues:
            raise InvalidArgument(f"queue {queue!r} is not one of endpoint {self.slug}'s queues")
        before = self.controls_of(queue)
        after = before.changed(paused=paused, max_in_flight=max_in_flight, max_claims_per_minute=max_claims_per_minute)
        if after != before:
            self._record(
                QueueControlsSet, timestamp=now, actor=actor, cause=cause, queue=queue, paused=after.paused,
                max_in_flight=after.max_in_flight, max_claims_per_minute=after.max_claims_per_minute,
            )
        return after

    def revoke(self, *, now: datetime, actor: str) -> None:
        """Revocation is final; revoking twice is a conflict."""
        self._check_not_revoked()
        self._record(EndpointRevoked, timestamp=now, actor=actor, cause="revoke")

    def attach_webhook(
        self, *, now: datetime, actor: str, webhook_id: str, source_type: str, target_queue: str,
    ) -> None:
        """A new webhook counts against the ceiling; its source type and queue must be granted."""
        self._check_not_revoked()
        if source_type not in self.source_types:
            raise ForbiddenSourceType(f"source type {source_type!r} is not allowed for endpoint {self.slug}")
        if target_queue not in self.webhook_queues:
            raise Forbidden(f"queue {target_queue} is not among endpoint {self.slug}'s webhook queues")
        if len(self.webhook_ids) >= self.webhook_max:
            raise CeilingExceeded(f"endpoint {self.slug} already has {self.webhook_max} webhook(s)")
        self._record(WebhookAttached, timestamp=now, actor=actor, cause="create_webhook", webhook_id=webhook_id)

    def detach_webhook(self, *, now: datetime, actor: str, webhook_id: str) -> None:
        """A deleted webhook frees its place under the ceiling."""
        if webhook_id in self.webhook_ids:
            self._record(WebhookDetached, timestamp=now, actor=actor, cause="delete_webhook", webhook_id=webhook_id)

    def _check_not_revoked(self) -> None:
        if self.revoked:
            raise Conflict(f"endpoint {self.slug} is revoked")

    def _mutate(self, event: DomainEvent) -> None:
        match event:
            case EndpointVended():
                self.slug = event.slug
                self.agent = event.agent
                self.owner = event.owner
                self.credential_sha256 = event.credential_sha256
                self.queues = tuple(event.queues)
                self.verbs = tuple(event.verbs)
                self.webhook_max = event.webhook_max
                self.source_types = tuple(event.source_types)
                self.webhook_queues = tuple(event.webhook_queues)
                self.expires_at = event.expires_at
                self.default_lease_seconds = event.default_lease_seconds
                self.created_at = event.timestamp
                self.revoked = False
                self.revoked_at = None
                self.webhook_ids: tuple[str, ...] = ()
                self.queue_controls: dict[str, QueueControls] = {}
            case DefaultLeaseSet():
                self.default_lease_seconds = event.default_lease_seconds
            case EndpointRevoked():
                self.revoked = True
                self.revoked_at = event.timestamp
            case WebhookAttached():
                self.webhook_ids = (*self.webhook_ids, event.webhook_id)
            case WebhookDetached():
                self.webhook_ids = tuple(w for w in self.webhook_ids if w != event.webhook_id)
            case QueueControlsSet():
                controls = QueueControls(event.paused, event.max_in_flight, event.max_claims_per_minute)
                # replaced, never mutated: a clone shares the dict until it changes
                self.queue_controls = {**self.queue_controls, event.queue: controls}
            case _:  # pragma: no cover
                raise TypeError(f"Endpoint cannot apply {type(event).__name__}")


_ENDPOINT_NAMESPACE = UUID("3d8f6a0e-9b1c-4f7e-a2d4-5c6b7e8f9a01")


def endpoint_uuid(slug: str) -> UUID:
    """An endpoint's id is derived from its slug, so slugs are unique by construction."""
    return uuid5(_ENDPOINT_NAMESPACE, slug)


def endpoint_uuid_of(ref: object) -> UUID:
    """An endpoint is named by its `ep_` id or by its slug, everywhere."""
    if not isinstance(ref, str) or not ref:
        raise NotFound(f"endpoint {ref} not found")
    return parse_id(ENDPOINT_PREFIX, ref) or endpoint_uuid(ref)
