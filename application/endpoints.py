"""Endpoints: vend, authenticate, revoke, set the default lease, list. Commands return the
Endpoint they changed (with what they generated); application/presenters.py shapes answers."""

from __future__ import annotations

import secrets
from datetime import timedelta
from typing import Any

from application.access import Caller, holder_of, scope_of, touchable_endpoint, vend_owner, visible_owner
from application.operators import new_secret
from application.ports import Clock, EventStore, UnitOfWork, Views
from application.todos import Todos
from domain.endpoint import Endpoint, credential_hash, endpoint_uuid, endpoint_uuid_of
from domain.errors import Conflict, Forbidden, InvalidArgument, NotFound
from domain.names import slugify
from domain.operator import Operator, check_operator_name, operator_uuid

CREDENTIAL_CACHE_SIZE = 10_000  # endpoints whose credential → endpoint resolution is kept (then forgotten at once)
MAX_TTL_SECONDS = 100 * 365 * 86400  # an endpoint lifetime beyond a century is `never`
_SLUG_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789"


def _check_ttl(ttl_seconds: object) -> timedelta | None:
    if ttl_seconds is None:
        return None
    if isinstance(ttl_seconds, bool) or not isinstance(ttl_seconds, int) or not 1 <= ttl_seconds <= MAX_TTL_SECONDS:
        raise InvalidArgument(f"ttl_seconds must be within 1..{MAX_TTL_SECONDS} (or none: never expires)")
    return timedelta(seconds=ttl_seconds)


class Endpoints:
    def __init__(self, store: EventStore, views: Views, clock: Clock, todos: Todos) -> None:
        self.store = store
        self.views = views
        self.clock = clock
        self.todos = todos
        self._credentials: dict[str, Endpoint] = {}
        """credential hash → its endpoint as last loaded; trusted only while the endpoint's
        stream is still at that version (checked on every use, so a change by any process counts)."""

    def vend(
        self, agent: str, *, queues: list[str], caller: Caller, verbs: list[str] | None = None,
        webhook_max: int | None = None, source_types: list[str] | None = None,
        webhook_queues: list[str] | None = None, ttl_seconds: int | None = None,
        default_lease_seconds: int | None = None, owner: str | None = None,
    ) -> tuple[Endpoint, str]:
        """Vends an endpoint; returns it with its credential (which no later answer shows)."""
        owner = vend_owner(caller, owner)
        credential = new_secret("sbk_")
        ttl = _check_ttl(ttl_seconds)
        base = slugify(agent)

        def handler(uow: UnitOfWork) -> Endpoint:
            if uow.get(Operator, operator_uuid(check_operator_name(owner))) is None:
                raise NotFound(f"operator {owner} not found")
            for _ in range(20):
                slug = f"{base}-{''.join(secrets.choice(_SLUG_ALPHABET) for _ in range(4))}"
                if uow.get(Endpoint, endpoint_uuid(slug)) is None:
                    break
            else:  # pragma: no cover - 1.6 million suffixes per agent name
                raise Conflict("could not find a free slug")
            endpoint = Endpoint.vend(
                id=endpoint_uuid(slug), now=uow.now, actor=caller.label, slug=slug, agent=agent,
                owner=owner, credential_sha256=credential_hash(credential), queues=queues, verbs=verbs,
                webhook_max=5 if webhook_max is None else webhook_max, source_types=source_types,
                webhook_queues=webhook_queues, ttl=ttl, default_lease_seconds=default_lease_seconds,
            )
            uow.add(endpoint)
            return endpoint

        return self.store.run(handler), credential

    def authenticate(self, credential: str) -> Endpoint | None:
        """The active endpoint holding this credential, or None. A credential seen before costs one
        look-up of its endpoint's version: any event on the endpoint (a revocation, by any
        process) makes the next call resolve it afresh."""
        digest = credential_hash(credential)
        known = self._credentials.get(digest)
        if known is not None and self.store.version_of(known.id) == known.version:
            return known if known.is_active(self.clock.now()) else None
        self._credentials.pop(digest, None)
        holder = holder_of(self.views, digest, "endpoint")
        if holder is None:
            return None
        endpoint = self.store.load(Endpoint, endpoint_uuid_of(holder))
        if endpoint is None:
            return None
        if len(self._credentials) >= CREDENTIAL_CACHE_SIZE:
            self._credentials.clear()
        self._credentials[digest] = endpoint
        return endpoint if endpoint.is_active(self.clock.now()) else None

    def caller_of(self, endpoint: Endpoint | str) -> Caller:
        """The caller an authenticated endpoint acts as (active now, else Forbidden)."""
        if isinstance(endpoint, str):
            loaded = self.store.load(Endpoint, endpoint_uuid_of(endpoint))
            if loaded is None:
                raise NotFound(f"endpoint {endpoint} not found")
            endpoint = loaded
        if not endpoint.is_active(self.clock.now()):
            raise Forbidden(f"endpoint {endpoint.slug} is revoked or expired")
        return Caller("endpoint", endpoint.slug, scope=scope_of(endpoint))

    def revoke(self, ref: str, *, caller: Caller) -> tuple[Endpoint, int]:
        """Revokes at once: the credential stops working and held leases are released (how many)."""
        endpoint_id = endpoint_uuid_of(ref)

        def handler(uow: UnitOfWork) -> Endpoint:
            endpoint = touchable_endpoint(uow, endpoint_id, ref, caller)
            endpoint.revoke(now=uow.now, actor=caller.label)
            return endpoint

        endpoint = self.store.run(handler)
        self.views.catch_up()
        released = sum(
            1 for todo_id in self.views.held_todos(endpoint.endpoint_id, endpoint.principal)
            if self.todos.revoke_lease(todo_id, endpoint.principal, caller=caller)
        )
        return endpoint, released

    def set_default_lease(self, ref: str, seconds: int | None, *, caller: Caller) -> Endpoint:
        endpoint_id = endpoint_uuid_of(ref)

        def handler(uow: UnitOfWork) -> Endpoint:
            endpoint = touchable_endpoint(uow, endpoint_id, ref, caller)
            endpoint.set_default_lease(now=uow.now, actor=caller.label, seconds=seconds)
            return endpoint

        return self.store.run(handler)

    def list(self, *, caller: Caller) -> list[dict[str, Any]]:
        self.views.catch_up()
        return self.views.list_endpoints(owner=visible_owner(caller))
