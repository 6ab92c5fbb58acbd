"""Command handlers and queries: the one application layer behind the CLI, HTTP and MCP.

Each handler loads what it needs through the unit of work, calls one domain method, and
returns what the caller needs; the event store appends the events atomically.
"""

from __future__ import annotations

import base64
import json
import re
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, Protocol
from uuid import UUID

from application.explain import explain
from application.ports import Clock, EventStore, UnitOfWork
from application.presenters import endpoint_view, iso, todo_full, todo_row
from domain.endpoint import Endpoint, credential_hash, endpoint_uuid, endpoint_uuid_of
from domain.errors import Conflict, Forbidden, InvalidArgument, NotFound
from domain.idempotency import KEY_MAX_BYTES, IdempotencyKey, key_uuid
from domain.delivery import DELIVERY_PREFIX
from domain.names import (
    ENDPOINT_PREFIX, OPERATOR_PREFIX, QUARANTINE, REDACTED, TODO_PREFIX, check_queue_name, parse_id, slugify,
)
from domain.installation import INSTALLATION_ID, Installation
from domain.operator import Operator, check_operator_name, operator_uuid
from domain.todo import STATES, Todo, effective_lease
from domain.webhook import WEBHOOK_PREFIX

CLAIM_CANDIDATES = 8
MAX_CLAIM_BATCH = 100  # todos one claim_next may take at once (`max`)
CREDENTIAL_CACHE_SIZE = 10_000  # endpoints whose credential → endpoint resolution is kept (then forgotten at once)
MAX_TTL_SECONDS = 100 * 365 * 86400  # an endpoint lifetime beyond a century is `never`
# Event fields never shown by history or audit export (they stay in the log).
REDACTED_FIELDS = ("password_hash",)


# The public name of each aggregate type, by the module its events live in, and its id prefix:
# the export names aggregates as every other surface does (`td_…`), not by bare hex.
AGGREGATE_NAMES = {
    "domain.todo": ("todo", TODO_PREFIX), "domain.endpoint": ("endpoint", ENDPOINT_PREFIX),
    "domain.webhook": ("webhook", WEBHOOK_PREFIX), "domain.delivery": ("delivery", DELIVERY_PREFIX),
    "domain.operator": ("operator", OPERATOR_PREFIX),
    "domain.idempotency": ("idempotency_key", "ik_"),
    "domain.installation": ("installation", "in_"),
}


def public_aggregate(event: Any) -> tuple[str, str]:
    """(aggregate_type, public id) of an event's aggregate; an unknown type keeps its module's name."""
    module = type(event).__module__
    kind, prefix = AGGREGATE_NAMES.get(module, (module.rpartition(".")[2], ""))
    return kind, f"{prefix}{event.originator_id.hex}" if prefix else event.originator_id.hex


def _shown(data: dict[str, Any]) -> dict[str, Any]:
    for name in REDACTED_FIELDS:
        if name in data:
            data[name] = REDACTED
    return data


@dataclass(frozen=True)
class EndpointScope:
    """What an authenticated endpoint may touch, fixed at authentication time."""

    endpoint_id: str
    queues: tuple[str, ...]
    default_lease: timedelta


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

    def fault_traces(self, todo_ids: Sequence[str], endpoint_ids: Sequence[str] | None,
                     ) -> dict[str, dict[str, Any]]: ...

    def list_endpoints(self, *, owner: str | None) -> list[dict[str, Any]]: ...

    def endpoint_ids_of(self, owner: str) -> list[str]: ...

    def held_todos(self, endpoint_id: str, holder: str) -> list[str]: ...

    def due_timers(self, now: datetime, limit: int) -> list[str]: ...

    def next_due(self) -> datetime | None: ...

    def subject_of_credential(self, sha256: str) -> tuple[str, str] | None: ...

    def operator_count(self) -> int: ...


class PasswordHasher(Protocol):
    def hash(self, password: str) -> str: ...

    def verify(self, password_hash: str, password: str) -> bool: ...


def new_secret(prefix: str) -> str:
    """`prefix` + 43 base64url characters (32 random bytes)."""
    return prefix + base64.urlsafe_b64encode(secrets.token_bytes(32)).rstrip(b"=").decode()


def _todo_uuid(todo_id: object) -> UUID:
    parsed = parse_id(TODO_PREFIX, todo_id)
    if parsed is None:
        raise NotFound(f"todo {todo_id} not found")
    return parsed


_TODO_CURSOR = re.compile(r"(\d{1,19})\.(td_[0-9a-f]{32})")


def _todo_cursor(cursor: object) -> tuple[int, str]:
    """The (created_at, todo_id) a `next_cursor` of `page_todos` names."""
    match = _TODO_CURSOR.fullmatch(cursor) if isinstance(cursor, str) else None
    if match is None or int(match.group(1)) >= 2**63:
        raise InvalidArgument("bad cursor: give the next_cursor of the previous page")
    return int(match.group(1)), match.group(2)


def _check_limit(limit: int | None, default: int, maximum: int) -> int:
    if limit is None:
        return default
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= maximum:
        raise InvalidArgument(f"limit must be within 1..{maximum}")
    return limit


class Switchboard:
    """The application: every command and query of the contract's todo lifecycle."""

    def __init__(
        self, store: EventStore, views: Views, clock: Clock, hasher: PasswordHasher, base_url: str,
    ) -> None:
        self.store = store
        self.views = views
        self.clock = clock
        self.hasher = hasher
        self.base_url = base_url.rstrip("/")
        self._credentials: dict[str, Endpoint] = {}
        """credential hash → its endpoint as last loaded; trusted only while the endpoint's
        stream is still at that version (checked on every use, so a change by any process counts)."""

    # -- access: operators and endpoints -------------------------------------------------

    def create_operator(self, name: str, password: str | None = None, *, caller: Caller) -> dict[str, Any]:
        """Creates an operator; returns the generated password when none was given."""
        check_operator_name(name)
        generated = password is None
        password, password_hash = self._new_password(password)

        def handler(uow: UnitOfWork) -> None:
            if uow.get(Operator, operator_uuid(name)) is not None:
                raise Conflict(f"operator {name} already exists")
            uow.add(Operator.create(name=name, password_hash=password_hash, now=uow.now, actor=caller.label))

        self.store.run(handler)
        return {"name": name, "password": password if generated else None}

    def _new_password(self, password: str | None) -> tuple[str, str]:
        """The given password (at least 8 characters) or a generated one, with its hash."""
        password = password if password is not None else secrets.token_urlsafe(18)
        if len(password) < 8:
            raise InvalidArgument("password must be at least 8 characters")
        return password, self.hasher.hash(password)

    def ensure_admin(self) -> str | None:
        """On an empty store, creates operator `admin`; returns its password, else None."""
        if self.store.load(Operator, operator_uuid("admin")) is not None:
            return None
        try:
            return self.create_operator("admin", caller=Caller("system", "bootstrap"))["password"]
        except Conflict:
            return None

    def reset_password(self, name: str, password: str | None = None, *, caller: Caller) -> dict[str, Any]:
        """Sets a new password (an event); returns the generated one when none was given."""
        check_operator_name(name)
        generated = password is None
        password, password_hash = self._new_password(password)

        def handler(uow: UnitOfWork) -> None:
            operator = uow.get(Operator, operator_uuid(name))
            if operator is None:
                raise NotFound(f"operator {name} not found")
            operator.reset_password(password_hash=password_hash, now=uow.now, actor=caller.label)

        self.store.run(handler)
        return {"name": name, "password": password if generated else None}

    def record_base_url(self, base_url: str, *, caller: Caller) -> bool:
        """Records the base URL this server mints links with; an event only when it changed."""

        def handler(uow: UnitOfWork) -> bool:
            installation = uow.get(Installation, INSTALLATION_ID)
            if installation is None:
                installation = Installation.new()
                changed = installation.record_base_url(base_url=base_url, now=uow.now, actor=caller.label)
                uow.add(installation)
                return changed
            return installation.record_base_url(base_url=base_url, now=uow.now, actor=caller.label)

        return self.store.run(handler)

    def recorded_base_url(self) -> str | None:
        """The base URL `serve` recorded last, if any."""
        installation = self.store.load(Installation, INSTALLATION_ID)
        return installation.base_url if installation is not None else None

    def mint_operator_token(self, name: str, *, caller: Caller) -> dict[str, Any]:
        """Mints an `sbo_` API token; only its hash is kept."""
        token = new_secret("sbo_")

        def handler(uow: UnitOfWork) -> None:
            operator = uow.get(Operator, operator_uuid(check_operator_name(name)))
            if operator is None:
                raise NotFound(f"operator {name} not found")
            operator.mint_token(token_sha256=credential_hash(token), now=uow.now, actor=caller.label)

        self.store.run(handler)
        return {"name": name, "token": token}

    def verify_password(self, name: str, password: str) -> bool:
        try:
            operator = self.store.load(Operator, operator_uuid(check_operator_name(name)))
        except InvalidArgument:
            operator = None
        if operator is None:
            self.hasher.hash(password)  # as slow as a wrong password: no timing oracle for names
            return False
        return self.hasher.verify(operator.password_hash, password)

    def authenticate_operator_token(self, token: str) -> Caller | None:
        """The operator holding this `sbo_` API token, or None (an `sbk_` credential never is one)."""
        if not token.startswith("sbo_"):
            return None
        sha256 = credential_hash(token)
        subject = self.views.subject_of_credential(sha256)
        if subject is None:
            self.views.catch_up()
            subject = self.views.subject_of_credential(sha256)
        if subject is None or subject[0] != "operator":
            return None
        operator = self.store.load(Operator, parse_id(OPERATOR_PREFIX, subject[1]))
        if operator is None or sha256 not in operator.token_hashes:
            return None
        return Caller.operator(operator.name)

    def operator_exists(self, name: str) -> bool:
        try:
            return self.store.load(Operator, operator_uuid(check_operator_name(name))) is not None
        except InvalidArgument:
            return False

    def vend(
        self,
        agent: str,
        *,
        queues: list[str],
        caller: Caller,
        verbs: list[str] | None = None,
        webhook_max: int | None = None,
        source_types: list[str] | None = None,
        webhook_queues: list[str] | None = None,
        ttl_seconds: int | None = None,
        default_lease_seconds: int | None = None,
        owner: str | None = None,
    ) -> dict[str, Any]:
        """Vends an endpoint; the credential appears in this answer and never again."""
        owner = owner or (caller.name if not caller.superuser else "admin")
        if not caller.superuser and owner != caller.name:
            raise Forbidden("an operator vends endpoints for itself only")
        credential = new_secret("sbk_")
        if ttl_seconds is not None and (
            isinstance(ttl_seconds, bool) or not isinstance(ttl_seconds, int) or not 1 <= ttl_seconds <= MAX_TTL_SECONDS
        ):
            raise InvalidArgument(f"ttl_seconds must be within 1..{MAX_TTL_SECONDS} (or none: never expires)")
        ttl = timedelta(seconds=ttl_seconds) if ttl_seconds is not None else None
        base = slugify(agent)

        def handler(uow: UnitOfWork) -> Endpoint:
            if uow.get(Operator, operator_uuid(check_operator_name(owner))) is None:
                raise NotFound(f"operator {owner} not found")
            for _ in range(20):
                slug = f"{base}-{''.join(secrets.choice('abcdefghijklmnopqrstuvwxyz0123456789') for _ in range(4))}"
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

        endpoint = self.store.run(handler)
        mcp_url = f"{self.base_url}/mcp/{endpoint.slug}"
        return {
            "endpoint_id": endpoint.endpoint_id,
            "slug": endpoint.slug,
            "mcp_url": mcp_url,
            "credential": credential,
            "queues": list(endpoint.queues),
            "verbs": list(endpoint.verbs),
            "expires_at": iso(endpoint.expires_at),
            "mcp_json": {"mcpServers": {"switchboard": {
                "type": "http", "url": mcp_url, "headers": {"Authorization": f"Bearer {credential}"},
            }}},
        }

    def endpoint(self, ref: str, *, caller: Caller) -> Endpoint:
        """The endpoint named by slug or id, if the caller may see it."""
        endpoint = self.store.load(Endpoint, endpoint_uuid_of(ref))
        if endpoint is None or not self.owns(caller, endpoint):
            raise NotFound(f"endpoint {ref} not found")
        return endpoint

    def authenticate_endpoint(self, credential: str) -> Endpoint | None:
        """The active endpoint holding this credential, or None. A credential seen before costs one
        look-up of its endpoint's version: any event on the endpoint (a revocation, by any
        process) makes the next call resolve it afresh."""
        digest = credential_hash(credential)
        known = self._credentials.get(digest)
        if known is not None and self.store.version_of(known.id) == known.version:
            return known if known.is_active(self.clock.now()) else None
        self._credentials.pop(digest, None)
        subject = self.views.subject_of_credential(digest)
        if subject is None:
            self.views.catch_up()
            subject = self.views.subject_of_credential(digest)
        if subject is None or subject[0] != "endpoint":
            return None
        endpoint = self.store.load(Endpoint, endpoint_uuid_of(subject[1]))
        if endpoint is None:
            return None
        if len(self._credentials) >= CREDENTIAL_CACHE_SIZE:
            self._credentials.clear()
        self._credentials[digest] = endpoint
        return endpoint if endpoint.is_active(self.clock.now()) else None

    def endpoint_caller(self, endpoint: Endpoint | str) -> Caller:
        """The caller an authenticated endpoint acts as (active now, else Forbidden)."""
        if isinstance(endpoint, str):
            loaded = self.store.load(Endpoint, endpoint_uuid_of(endpoint))
            if loaded is None:
                raise NotFound(f"endpoint {endpoint} not found")
            endpoint = loaded
        if not endpoint.is_active(self.clock.now()):
            raise Forbidden(f"endpoint {endpoint.slug} is revoked or expired")
        return Caller("endpoint", endpoint.slug, scope=EndpointScope(
            endpoint.endpoint_id, tuple(endpoint.queues), endpoint.default_lease))

    def revoke(self, ref: str, *, caller: Caller) -> dict[str, Any]:
        """Revokes at once: the credential stops working and held leases are released."""
        endpoint_id = endpoint_uuid_of(ref)

        def handler(uow: UnitOfWork) -> Endpoint:
            endpoint = uow.get(Endpoint, endpoint_id)
            if endpoint is None or not self.owns(caller, endpoint):
                raise NotFound(f"endpoint {ref} not found")
            endpoint.revoke(now=uow.now, actor=caller.label)
            return endpoint

        endpoint = self.store.run(handler)
        self.views.catch_up()
        released = 0
        for todo_id in self.views.held_todos(endpoint.endpoint_id, endpoint.principal):
            if self._release_revoked(_todo_uuid(todo_id), endpoint.principal, caller):
                released += 1
        return endpoint_view(endpoint) | {"released_leases": released}

    def _release_revoked(self, todo_uuid: UUID, holder: str, caller: Caller) -> bool:
        def handler(uow: UnitOfWork) -> bool:
            todo = uow.get(Todo, todo_uuid, fresh=True)
            if todo is None or todo.state != "claimed" or todo.holder != holder:
                return False
            todo.revoke_lease(now=uow.now, actor=caller.label)
            return True

        return self.store.run(handler)

    def set_default_lease(self, ref: str, seconds: int | None, *, caller: Caller) -> dict[str, Any]:
        endpoint_id = endpoint_uuid_of(ref)

        def handler(uow: UnitOfWork) -> Endpoint:
            endpoint = uow.get(Endpoint, endpoint_id)
            if endpoint is None or not self.owns(caller, endpoint):
                raise NotFound(f"endpoint {ref} not found")
            endpoint.set_default_lease(now=uow.now, actor=caller.label, seconds=seconds)
            return endpoint

        return self.default_lease_view(self.store.run(handler))

    @staticmethod
    def default_lease_view(endpoint: Endpoint) -> dict[str, Any]:
        return {
            "default_lease_ttl_seconds": endpoint.default_lease_seconds,
            "effective_lease_ttl_seconds": int(endpoint.default_lease.total_seconds()),
        }

    def list_endpoints(self, *, caller: Caller) -> list[dict[str, Any]]:
        self.views.catch_up()
        return self.views.list_endpoints(owner=None if caller.superuser else caller.name)

    # -- todos: operator side ------------------------------------------------------------

    def push(
        self, ref: str, title: str, *, caller: Caller, queue: str | None = None, payload: Any = None,
        key: str | None = None,
    ) -> dict[str, Any]:
        """An operator-authored todo; with a key, a repeat while the first is live returns it."""
        if not isinstance(title, str) or not title.strip():
            raise InvalidArgument("title is required")
        if key is not None and (not isinstance(key, str) or not key or len(key.encode()) > KEY_MAX_BYTES):
            raise InvalidArgument(f"key must be 1..{KEY_MAX_BYTES} bytes")
        try:  # UTF-8 encodable too: a lone surrogate is not text any store can keep
            payload_size = len(json.dumps(payload, separators=(",", ":")).encode())
            json.dumps([title, payload], ensure_ascii=False).encode()
        except (TypeError, ValueError):
            raise InvalidArgument("payload must be JSON and title and payload valid Unicode text") from None
        endpoint_id = endpoint_uuid_of(ref)
        todo_id = UUID(bytes=secrets.token_bytes(16), version=4)

        def handler(uow: UnitOfWork) -> tuple[Todo, bool]:
            endpoint = uow.get(Endpoint, endpoint_id)
            if endpoint is None or not self.owns(caller, endpoint):
                raise NotFound(f"endpoint {ref} not found")
            if not endpoint.is_active(uow.now):
                raise Conflict(f"endpoint {endpoint.slug} is revoked or expired")
            target = check_queue_name(queue) if queue is not None else endpoint.queues[0]
            if target not in endpoint.queues:
                raise Forbidden(f"queue {target} is not in endpoint {endpoint.slug}'s scope")
            binding = None
            if key is not None:
                binding = uow.get(IdempotencyKey, key_uuid(endpoint.endpoint_id, key))
                if binding is not None:
                    existing = uow.get(Todo, _todo_uuid(binding.todo_id), fresh=True)
                    if existing is not None and existing.is_live:
                        return existing, False
                else:
                    binding = IdempotencyKey.new(endpoint_id=endpoint.endpoint_id, key=key)
            todo = Todo.open(
                id=todo_id, now=uow.now, actor=caller.label, endpoint_id=endpoint.endpoint_id,
                queue=target, source="operator", title=title, trust_mode="operator", payload=payload,
                payload_size=payload_size, idempotency_key=key,
            )
            uow.add(todo)
            if binding is not None:
                binding.bind(todo_id=todo.todo_id, now=uow.now, actor=caller.label)
                uow.add(binding)
            return todo, True

        todo, created = self.store.run(handler)
        return {"todo": todo_row(todo), "created": created}

    def retry(self, todo_id: str, *, caller: Caller) -> dict[str, Any]:
        """Retry now: a failed todo is pending at once with a fresh budget."""
        return self._todo_command(todo_id, caller, lambda todo, uow, _: todo.retry_now(now=uow.now, actor=caller.label))

    def release_quarantined(self, todo_id: str, queue: str, *, caller: Caller) -> dict[str, Any]:
        """An operator releases a pending quarantined todo to one of its endpoint's queues."""
        if caller.kind != "operator":
            raise Forbidden("only an operator can release a quarantined todo")
        target = check_queue_name(queue)

        def command(todo: Todo, uow: UnitOfWork, scope: EndpointScope) -> None:
            if target not in scope.queues:
                raise Forbidden(f"queue {target} is not in the endpoint's scope")
            todo.move_from_quarantine(now=uow.now, actor=caller.label, queue=target)

        return self._todo_command(todo_id, caller, command)

    def discard_quarantined(self, todo_id: str, *, caller: Caller, summary: str | None = None) -> dict[str, Any]:
        """An operator ends a quarantined todo without work."""
        if caller.kind != "operator":
            raise Forbidden("only an operator can discard a quarantined todo")
        return self._todo_command(todo_id, caller, lambda todo, uow, _: todo.discard(
            now=uow.now, actor=caller.label, summary=summary))

    # -- todos: the lease holder's side (agents, or an operator on the board) -------------

    def claim(
        self, todo_id: str, *, caller: Caller, lease_ttl_seconds: float | None = None,
        claimant: str | None = None, require_fence: bool = False,
    ) -> dict[str, Any]:
        """Claims one claimable todo under a lease; each claim is one attempt."""
        fence = secrets.token_urlsafe(24) if require_fence else None

        def command(todo: Todo, uow: UnitOfWork, scope: EndpointScope) -> None:
            todo.claim(
                now=uow.now, holder=caller.label, claimant=claimant, fence_token=fence,
                lease=effective_lease(lease_ttl_seconds, scope.default_lease),
            )

        todo = self._todo_command(todo_id, caller, command, full=False)
        return todo_full(todo, lease_token=fence)

    def claim_next(
        self, *, caller: Caller, queue: str | None = None, lease_ttl_seconds: float | None = None,
        claimant: str | None = None, require_fence: bool = False, max_todos: int | None = None,
    ) -> dict[str, Any]:
        """Claims the oldest claimable todo across the endpoint's queues (or the one given); with
        `max_todos`, up to that many at once (oldest first, one lease and one attempt each)."""
        if caller.kind != "endpoint":
            raise Forbidden("claim_next is for endpoints")
        if max_todos is not None and (isinstance(max_todos, bool) or not 1 <= max_todos <= MAX_CLAIM_BATCH):
            raise InvalidArgument(f"max must be 1..{MAX_CLAIM_BATCH}")
        want = 1 if max_todos is None else max_todos
        endpoint_id = endpoint_uuid(caller.name)
        fences: dict[UUID, str | None] = {}

        def handler(uow: UnitOfWork) -> list[Todo]:
            scope = caller.scope or self._scope_of(self._active_endpoint(uow, endpoint_id))
            if queue is not None and queue not in scope.queues:
                raise Forbidden(f"queue {queue} is not in this endpoint's scope")
            queues = [queue] if queue is not None else list(scope.queues)
            lease = effective_lease(lease_ttl_seconds, scope.default_lease)
            fences.clear()  # a re-run after a lost race starts over
            taken: list[Todo] = []
            seen: set[UUID] = set()
            while True:  # candidates taken meanwhile by another process are skipped, not fatal
                candidates = [
                    c for c in uow.claimable(scope.endpoint_id, queues, max(CLAIM_CANDIDATES, want) + len(seen))
                    if c not in seen
                ]
                if not candidates:
                    return taken
                for candidate in candidates:
                    seen.add(candidate)
                    todo = uow.get(Todo, candidate)
                    if todo is not None and not todo.is_claimable(uow.now):
                        todo = uow.get(Todo, candidate, fresh=True)
                    if todo is None or not todo.is_claimable(uow.now):
                        continue
                    fence = secrets.token_urlsafe(24) if require_fence else None
                    todo.claim(now=uow.now, holder=caller.label, lease=lease, claimant=claimant, fence_token=fence)
                    fences[todo.id] = fence
                    taken.append(todo)
                    if len(taken) == want:
                        return taken

        taken = self.store.run(handler)
        if max_todos is not None:
            return {"empty": not taken, "todos": [todo_full(t, lease_token=fences[t.id]) for t in taken]}
        if not taken:
            return {"empty": True}
        return {"empty": False, "todo": todo_full(taken[0], lease_token=fences[taken[0].id])}

    def heartbeat(
        self, todo_id: str, *, caller: Caller, lease_ttl_seconds: float | None = None,
        lease_token: str | None = None,
    ) -> dict[str, Any]:
        """The holder extends its lease to now + ttl."""
        return self._todo_command(todo_id, caller, lambda todo, uow, scope: todo.heartbeat(
            now=uow.now, holder=caller.label, fence_token=lease_token,
            lease=effective_lease(lease_ttl_seconds, scope.default_lease),
        ))

    def complete(self, todo_id: str, *, caller: Caller, result: Any = None, summary: str | None = None,
                 lease_token: str | None = None) -> dict[str, Any]:
        return self._todo_command(todo_id, caller, lambda todo, uow, _: todo.complete(
            now=uow.now, holder=caller.label, result=result, summary=summary, fence_token=lease_token,
        ))

    def fail(self, todo_id: str, *, caller: Caller, result: Any = None, summary: str | None = None,
             lease_token: str | None = None) -> dict[str, Any]:
        return self._todo_command(todo_id, caller, lambda todo, uow, _: todo.fail(
            now=uow.now, holder=caller.label, result=result, summary=summary, fence_token=lease_token,
        ))

    def release(self, todo_id: str, *, caller: Caller, summary: str | None = None,
                lease_token: str | None = None) -> dict[str, Any]:
        return self._todo_command(todo_id, caller, lambda todo, uow, _: todo.release(
            now=uow.now, holder=caller.label, summary=summary, fence_token=lease_token,
        ))

    def _todo_command(
        self, todo_id: str, caller: Caller, command: Callable[[Todo, UnitOfWork, EndpointScope], None],
        *, full: bool | None = None,
    ):
        todo_uuid = _todo_uuid(todo_id)

        def handler(uow: UnitOfWork) -> Todo:
            todo = uow.get(Todo, todo_uuid)
            if todo is None:
                raise NotFound(f"todo {todo_id} not found")
            scope = caller.scope
            if scope is not None:  # an authenticated endpoint: its own todos, in its own queues
                if todo.endpoint_id != scope.endpoint_id or todo.queue not in scope.queues:
                    raise NotFound(f"todo {todo_id} not found")
            else:
                endpoint = uow.get(Endpoint, endpoint_uuid_of(todo.endpoint_id))
                if endpoint is None or not self._may_touch(caller, endpoint, todo):
                    raise NotFound(f"todo {todo_id} not found")
                if caller.kind == "endpoint" and not endpoint.is_active(uow.now):
                    raise Forbidden(f"endpoint {endpoint.slug} is revoked or expired")
                scope = self._scope_of(endpoint)
            command(todo, uow, scope)
            return todo

        todo = self.store.run(handler)
        return todo if full is False else todo_row(todo)

    @staticmethod
    def _scope_of(endpoint: Endpoint) -> EndpointScope:
        return EndpointScope(endpoint.endpoint_id, tuple(endpoint.queues), endpoint.default_lease)

    def _active_endpoint(self, uow: UnitOfWork, endpoint_id: UUID) -> Endpoint:
        endpoint = uow.get(Endpoint, endpoint_id)
        if endpoint is None or not endpoint.is_active(uow.now):
            raise Forbidden("endpoint is revoked or expired")
        return endpoint

    @staticmethod
    def owns(caller: Caller, endpoint: Endpoint) -> bool:
        if caller.superuser:
            return True
        if caller.kind == "operator":
            return endpoint.owner == caller.name
        return caller.kind == "endpoint" and endpoint.slug == caller.name

    def _may_touch(self, caller: Caller, endpoint: Endpoint, todo: Todo) -> bool:
        """Agents see only their own todos in their own queues (never quarantine)."""
        if caller.kind == "endpoint":
            return endpoint.slug == caller.name and todo.queue in endpoint.queues
        return self.owns(caller, endpoint)

    # -- the scheduler's commands --------------------------------------------------------

    def fire_timers(self, todo_ids: Sequence[str]) -> int:
        """Expires lapsed leases and requeues due retries among these todos; returns how many moved."""
        uuids = [_todo_uuid(t) for t in todo_ids]

        def handler(uow: UnitOfWork) -> int:
            moved = 0
            for todo_uuid in uuids:
                todo = uow.get(Todo, todo_uuid)
                if todo is None:
                    continue
                if not (todo.lease_lapsed(uow.now) or todo.retry_due(uow.now)):
                    todo = uow.get(Todo, todo_uuid, fresh=True)
                if todo.lease_lapsed(uow.now):
                    todo.expire_lease(now=uow.now)
                elif todo.retry_due(uow.now):
                    todo.requeue_due(now=uow.now)
                else:
                    continue
                moved += 1
            return moved

        return self.store.run(handler)

    # -- queries -------------------------------------------------------------------------

    def get_todo(self, todo_id: str, *, caller: Caller) -> dict[str, Any]:
        return todo_full(self._visible_todo(todo_id, caller))

    # -- what the clock decides, by this application's clock (the board shows it) --------

    def todo_now(self, todo_id: str, *, caller: Caller) -> dict[str, Any]:
        """`get_todo` plus `claimable`: whether a claim would be taken now (`Todo.is_claimable`)."""
        todo = self._visible_todo(todo_id, caller)
        return todo_full(todo) | {"claimable": todo.is_claimable(self.clock.now())}

    def endpoints_now(self, *, caller: Caller) -> list[dict[str, Any]]:
        """`list_endpoints`, each row with its `status` now: `revoked`, `expired` (past `expires_at`,
        which `Endpoint.is_active` treats as revoked) or `active`."""
        now = self.clock.now()
        return [row | {"status": "revoked" if row["revoked"] else "expired" if row["expires_at"] and (
            datetime.fromisoformat(row["expires_at"]) <= now) else "active"}
            for row in self.list_endpoints(caller=caller)]

    def _visible_todo(self, todo_id: str, caller: Caller) -> Todo:
        todo = self.store.load(Todo, _todo_uuid(todo_id))
        if todo is None:
            raise NotFound(f"todo {todo_id} not found")
        endpoint = self.store.load(Endpoint, endpoint_uuid_of(todo.endpoint_id))
        if endpoint is None or not self._may_touch(caller, endpoint, todo):
            raise NotFound(f"todo {todo_id} not found")
        return todo

    def history(self, todo_id: str, *, caller: Caller, payloads: bool = True) -> dict[str, Any]:
        """Every event of a todo in order, with position, version, time, type, actor, cause and data.

        With `payloads=False` an event's `payload` is left out of its data (named in `omitted`), and
        never converted: a reader that shows the payload elsewhere does not pay for it twice."""
        todo = self._visible_todo(todo_id, caller)
        events = []
        for recorded in self.store.stream(todo.id):
            event, omitted = recorded.event, []
            if not payloads and getattr(event, "payload", None) is not None:
                event, omitted = replace(event, payload=None), ["payload"]
            data = self.store.event_data(event)
            time, actor, cause = data.pop("timestamp"), data.pop("actor"), data.pop("cause")
            for name in omitted:
                data.pop(name, None)
            events.append({
                "position": recorded.position, "version": recorded.event.originator_version,
                "time": time, "type": type(recorded.event).__name__, "actor": actor, "cause": cause,
                "data": _shown(data), **({"omitted": omitted} if omitted else {}),
            })
        return {"todo_id": todo.todo_id, "events": events}

    def explain(self, todo_id: str, *, caller: Caller) -> dict[str, Any]:
        """`{state, because, story}`: the todo's story in sentences, from its events, the delivery that
        opened it and its endpoint's; whoever may read the todo may read its story (foreign ≡ unknown)."""
        todo = self._visible_todo(todo_id, caller)
        delivery = parse_id(DELIVERY_PREFIX, todo.delivery_id)
        return explain(self.store.stream(todo.id), now=self.clock.now(),
                       delivery=self.store.stream(delivery) if delivery is not None else (),
                       endpoint_stream=self.store.stream(endpoint_uuid_of(todo.endpoint_id)))

    def list_todos(
        self, *, caller: Caller, endpoint: str | None = None, state: str | None = None,
        queue: str | None = None, limit: int | None = None, max_limit: int = 1000,
        dead_letter: bool | None = None,
    ) -> list[dict[str, Any]]:
        """Rows newest first; agents never see quarantine. `dead_letter` keeps only (or no) dead letters."""
        return self.page_todos(caller=caller, endpoint=endpoint, state=state, queue=queue, limit=limit,
                               max_limit=max_limit, dead_letter=dead_letter)["todos"]

    def page_todos(
        self, *, caller: Caller, endpoint: str | None = None, state: str | None = None,
        queue: str | None = None, limit: int | None = None, max_limit: int = 1000,
        dead_letter: bool | None = None, cursor: str | None = None,
    ) -> dict[str, Any]:
        """`{todos, next_cursor?}`: one page of rows newest first; `next_cursor` (present only when
        more rows follow) continues after this page's last row, so a listing never stops silently."""
        limit = _check_limit(limit, 50, max_limit)
        after = _todo_cursor(cursor) if cursor is not None else None
        if state is not None and state not in STATES:
            raise InvalidArgument(f"state must be one of {', '.join(STATES)}")
        if queue is not None:
            check_queue_name(queue, allow_quarantine=True)
        hide: tuple[str, ...] = ()
        if caller.kind == "endpoint":
            scope = self.store.load(Endpoint, endpoint_uuid(caller.name))
            if scope is None:
                raise NotFound("endpoint not found")
            if queue is not None and queue not in scope.queues:
                raise Forbidden(f"queue {queue} is not in this endpoint's scope")
            endpoint_ids: list[str] | None = [scope.endpoint_id]
            hide = (QUARANTINE,)
        elif endpoint is not None:
            endpoint_ids = [self.endpoint(endpoint, caller=caller).endpoint_id]
        elif caller.superuser:
            endpoint_ids = None
        else:
            endpoint_ids = self.views.endpoint_ids_of(caller.name)
        self.views.catch_up()
        rows, last = self.views.page_todos(endpoint_ids=endpoint_ids, state=state, queue=queue, limit=limit,
                                           hide_queues=hide, dead_letter=dead_letter, after=after)
        answer: dict[str, Any] = {"todos": rows}
        if last is not None:
            answer["next_cursor"] = f"{last[0]}.{last[1]}"
        return answer

    def todo_counts(self, *, caller: Caller, endpoint: str | None = None) -> list[dict[str, Any]]:
        """How many todos per queue and state (dead letters apart) an operator has, with the oldest pending."""
        if caller.kind != "operator":
            raise Forbidden("counts are for operators")
        if endpoint is not None:
            endpoint_ids: list[str] | None = [self.endpoint(endpoint, caller=caller).endpoint_id]
        else:
            endpoint_ids = None if caller.superuser else self.views.endpoint_ids_of(caller.name)
        self.views.catch_up()
        return self.views.queue_counts(endpoint_ids)

    def fault_traces(self, todo_ids: Sequence[str], *, caller: Caller) -> dict[str, dict[str, Any]]:
        """Why each of these quarantined todos was held (its fault trace), for an operator's own todos."""
        if caller.kind != "operator":
            raise Forbidden("fault traces are for operators")
        self.views.catch_up()
        endpoint_ids = None if caller.superuser else self.views.endpoint_ids_of(caller.name)
        return self.views.fault_traces(list(todo_ids), endpoint_ids)

    def audit(self, *, after: int = 0, page: int = 1000):
        """The whole event log from a position, as JSON-ready records naming aggregates by public id."""
        while True:
            recorded = self.store.read_log(after, page)
            if not recorded:
                return
            for r in recorded:
                data = self.store.event_data(r.event)
                aggregate_type, aggregate = public_aggregate(r.event)
                yield {
                    "position": r.position, "time": data.pop("timestamp"),
                    "aggregate": aggregate, "aggregate_type": aggregate_type, "version": r.event.originator_version,
                    "type": type(r.event).__name__, "actor": data.pop("actor"), "cause": data.pop("cause"),
                    "data": _shown(data),
                }
            after = recorded[-1].position
