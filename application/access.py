"""Who may see and touch what: the one access policy every command and query asks.

- The CLI (a superuser) sees every endpoint and everything on it.
- An operator sees the endpoints it owns, and their todos, webhooks and deliveries.
- An operator vends endpoints for itself only; the CLI for any operator.
- An endpoint (an agent) sees itself, its webhooks and deliveries, and of its todos only those in
  its own queues (never quarantine).

Whatever a caller may not see is answered as not found, never as forbidden: a name it may not
see is not confirmed to exist.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from uuid import UUID

from application.ports import EventStore, UnitOfWork, Views
from domain.delivery import DELIVERY_PREFIX, Delivery
from domain.endpoint import Endpoint, endpoint_uuid_of
from domain.errors import Forbidden, NotFound
from domain.names import TODO_PREFIX, parse_id
from domain.queue import QueueControls
from domain.todo import Todo
from domain.webhook import WEBHOOK_PREFIX, Webhook


@dataclass(frozen=True)
class EndpointScope:
    """What an authenticated endpoint may touch, fixed at authentication time."""

    endpoint_id: str
    queues: tuple[str, ...]
    default_lease: timedelta
    controls: Mapping[str, QueueControls] = field(default_factory=dict)
    """The controls of those of its queues that have any (none: every claim is admitted)."""


@dataclass(frozen=True)
class Caller:
    """Who acts: an endpoint (agent), an operator, or the CLI with every operator's rights.

    An endpoint caller built by `Switchboard.endpoint_caller` carries its scope, checked active
    once per request; without it, each command reads the endpoint.
    """

    kind: str
    name: str
    superuser: bool = False
    scope: EndpointScope | None = None

    @property
    def label(self) -> str:
        return f"{self.kind}:{self.name}"

    @classmethod
    def cli(cls) -> Caller:
        return cls("operator", "cli", superuser=True)

    @classmethod
    def operator(cls, name: str) -> Caller:
        return cls("operator", name)


def scope_of(endpoint: Endpoint) -> EndpointScope:
    controls = {q: c for q, c in endpoint.queue_controls.items() if c.controlled and q in endpoint.queues}
    return EndpointScope(endpoint.endpoint_id, tuple(endpoint.queues), endpoint.default_lease, controls)


def may_touch(caller: Caller, endpoint: Endpoint, todo: Todo | None = None) -> bool:
    """The policy: may this caller see (and act on) this endpoint, or this todo of it?"""
    if caller.superuser:
        return True
    if caller.kind == "operator":
        return endpoint.owner == caller.name
    if caller.kind != "endpoint" or endpoint.slug != caller.name:
        return False
    return todo is None or todo.queue in endpoint.queues


def visible_owner(caller: Caller) -> str | None:
    """Whose endpoints (by owning operator) a caller's listings and live feed show; None: everyone's."""
    return None if caller.superuser else caller.name


def vend_owner(caller: Caller, owner: str | None) -> str:
    """The operator a new endpoint belongs to: the caller itself (the CLI may name any; `admin` by default)."""
    owner = owner or (caller.name if not caller.superuser else "admin")
    if not caller.superuser and owner != caller.name:
        raise Forbidden("an operator vends endpoints for itself only")
    return owner


def in_scope(scope: EndpointScope, todo: Todo) -> bool:
    """The policy for an authenticated endpoint, from its scope alone: its own todos, own queues."""
    return todo.endpoint_id == scope.endpoint_id and todo.queue in scope.queues


def todo_uuid(todo_id: object) -> UUID:
    parsed = parse_id(TODO_PREFIX, todo_id)
    if parsed is None:
        raise NotFound(f"todo {todo_id} not found")
    return parsed


def webhook_uuid(webhook_id: object) -> UUID:
    parsed = parse_id(WEBHOOK_PREFIX, webhook_id)
    if parsed is None:
        raise NotFound(f"webhook {webhook_id} not found")
    return parsed


def active_endpoint(uow: UnitOfWork, endpoint_id: UUID) -> Endpoint:
    endpoint = uow.get(Endpoint, endpoint_id)
    if endpoint is None or not endpoint.is_active(uow.now):
        raise Forbidden("endpoint is revoked or expired")
    return endpoint


def touchable_endpoint(uow: UnitOfWork, endpoint_id: UUID, ref: str, caller: Caller) -> Endpoint:
    """The endpoint `ref` (parsed: `endpoint_id`) names, loaded in a command, if the caller may touch it."""
    endpoint = uow.get(Endpoint, endpoint_id)
    if endpoint is None or not may_touch(caller, endpoint):
        raise NotFound(f"endpoint {ref} not found")
    return endpoint


def touchable_todo(uow: UnitOfWork, todo_uuid_: UUID, todo_id: str, caller: Caller) -> tuple[Todo, EndpointScope]:
    """The todo a command acts on and the scope it acts in, if the caller may touch it.

    An authenticated endpoint is judged by its scope alone (no read of the endpoint); any other
    caller by the todo's endpoint, which an endpoint caller without a scope must also have active.
    """
    todo = uow.get(Todo, todo_uuid_)
    if todo is None:
        raise NotFound(f"todo {todo_id} not found")
    scope = caller.scope
    if scope is not None:
        if not in_scope(scope, todo):
            raise NotFound(f"todo {todo_id} not found")
        return todo, scope
    endpoint = uow.get(Endpoint, endpoint_uuid_of(todo.endpoint_id))
    if endpoint is None or not may_touch(caller, endpoint, todo):
        raise NotFound(f"todo {todo_id} not found")
    if caller.kind == "endpoint" and not endpoint.is_active(uow.now):
        raise Forbidden(f"endpoint {endpoint.slug} is revoked or expired")
    return todo, scope_of(endpoint)


def holder_of(views: Views, sha256: str, kind: str) -> str | None:
    """The id of the `kind` (endpoint, operator, webhook) whose credential has this hash, if any:
    the index is read again after a catch-up before a credential is called unknown."""
    subject = views.subject_of_credential(sha256)
    if subject is None:
        views.catch_up()
        subject = views.subject_of_credential(sha256)
    return subject[1] if subject is not None and subject[0] == kind else None


class Access:
    """The policy applied to reads outside a command: what a caller sees, loaded from the store."""

    def __init__(self, store: EventStore, views: Views) -> None:
        self.store = store
        self.views = views

    def endpoint(self, ref: str, caller: Caller) -> Endpoint:
        """The endpoint named by slug or id, if the caller may see it."""
        endpoint = self.store.load(Endpoint, endpoint_uuid_of(ref))
        if endpoint is None or not may_touch(caller, endpoint):
            raise NotFound(f"endpoint {ref} not found")
        return endpoint

    def visible_endpoint_ids(self, caller: Caller, endpoint: str | None = None) -> list[str] | None:
        """The endpoints whose things a listing shows (None: every one): an agent's own, else the
        one named (if the caller may see it), else all the operator owns (all, for the CLI)."""
        if caller.kind == "endpoint":
            return [self.endpoint(caller.name, caller).endpoint_id]
        if endpoint is not None:
            return [self.endpoint(endpoint, caller).endpoint_id]
        return None if caller.superuser else self.views.endpoint_ids_of(caller.name)

    def todo(self, todo_id: str, caller: Caller) -> Todo:
        todo = self.store.load(Todo, todo_uuid(todo_id))
        if todo is None:
            raise NotFound(f"todo {todo_id} not found")
        endpoint = self.store.load(Endpoint, endpoint_uuid_of(todo.endpoint_id))
        if endpoint is None or not may_touch(caller, endpoint, todo):
            raise NotFound(f"todo {todo_id} not found")
        return todo

    def webhook(self, webhook_id: str, caller: Caller, *, live: bool = True) -> tuple[Webhook, Endpoint]:
        """A webhook (a deleted one too, unless `live`) and its owner endpoint, if the caller may see them."""
        webhook = self.store.load(Webhook, webhook_uuid(webhook_id))
        if webhook is None or (live and webhook.deleted):
            raise NotFound(f"webhook {webhook_id} not found")
        owner = self.store.load(Endpoint, endpoint_uuid_of(webhook.endpoint_id))
        if owner is None or not may_touch(caller, owner):
            raise NotFound(f"webhook {webhook_id} not found")
        return webhook, owner

    def delivery(self, event_id: str, caller: Caller) -> Delivery:
        parsed = parse_id(DELIVERY_PREFIX, event_id)
        delivery = self.store.load(Delivery, parsed) if parsed else None
        if delivery is None:
            raise NotFound(f"event {event_id} not found")
        owner = self.store.load(Endpoint, endpoint_uuid_of(delivery.endpoint_id))
        if owner is None or not may_touch(caller, owner):
            raise NotFound(f"event {event_id} not found")
        return delivery
