"""The application's facade for the interfaces (CLI, HTTP, MCP, board): every command and query
of the contract's todo lifecycle, operators and endpoints.

It only delegates — to one module per capability — and presents what they return:

- application/access.py      who may see and touch what (the one policy), `Caller`
- application/operators.py   operators, tokens, the installation's base URL
- application/endpoints.py   vend, authenticate, revoke, default lease
- application/todos.py       the todo lifecycle's commands, `open_or_reuse` for idempotency keys
- application/queues.py      queue controls (admission of every claim), delays, bulk retry
- application/queries.py     todos, history, explain, listings, counts, webhooks and deliveries
- application/audit.py       the audit export (one record per event), its hash chain, verification
- application/explain.py     a todo's story in sentences, from its events (pure)
- application/presenters.py  how every answer looks (the one place answers are shaped)

The webhook side (webhooks, rules, ingest) has its own facade in application/webhooks.py.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from application import presenters as present
from application.access import Access, Caller, EndpointScope
from application.audit import AuditLog
from application.endpoints import Endpoints
from application.operators import Operators
from application.payloads import full_todos
from application.ports import Clock, EventStore, PasswordHasher, Views
from application.queries import Queries
from application.queues import Queues, why_empty
from application.todos import Todos
from domain.queue import UNSET
from domain.endpoint import Endpoint

__all__ = ["Caller", "EndpointScope", "Switchboard"]


class Switchboard:
    """The application, as the interfaces call it."""

    def __init__(
        self, store: EventStore, views: Views, clock: Clock, hasher: PasswordHasher, base_url: str,
        audit_log: AuditLog,
    ) -> None:
        self.audit_log = audit_log
        self.store = store
        self.views = views
        self.clock = clock
        self.base_url = base_url.rstrip("/")
        self.access = Access(store, views)
        self.operators = Operators(store, views, hasher)
        self.todos = Todos(store)
        self.endpoints = Endpoints(store, views, clock, self.todos)
        self.queries = Queries(store, views, self.access)
        self.queues = Queues(store, views, clock, self.access)

    @property
    def on_refused(self):
        """Told of each claim a queue's controls refused (queue, reason): the metric's counter."""
        return self.todos.on_refused

    @on_refused.setter
    def on_refused(self, counter) -> None:
        self.todos.on_refused = counter

    @property
    def hasher(self) -> PasswordHasher:
        return self.operators.hasher

    @hasher.setter
    def hasher(self, hasher: PasswordHasher) -> None:
        self.operators.hasher = hasher

    # -- operators -----------------------------------------------------------------------

    def create_operator(self, name: str, password: str | None = None, *, caller: Caller) -> dict[str, Any]:
        return {"name": name, "password": self.operators.create(name, password, caller=caller)}

    def ensure_admin(self) -> str | None:
        return self.operators.ensure_admin()

    def reset_password(self, name: str, password: str | None = None, *, caller: Caller) -> dict[str, Any]:
        return {"name": name, "password": self.operators.reset_password(name, password, caller=caller)}

    def record_base_url(self, base_url: str, *, caller: Caller) -> bool:
        return self.operators.record_base_url(base_url, caller=caller)

    def recorded_base_url(self) -> str | None:
        return self.operators.recorded_base_url()

    def mint_operator_token(self, name: str, *, caller: Caller) -> dict[str, Any]:
        return {"name": name, "token": self.operators.mint_token(name, caller=caller)}

    def verify_password(self, name: str, password: str) -> bool:
        return self.operators.verify_password(name, password)

    def authenticate_operator_token(self, token: str) -> Caller | None:
        return self.operators.authenticate_token(token)

    def operator_exists(self, name: str) -> bool:
        return self.operators.exists(name)

    # -- endpoints -----------------------------------------------------------------------

    def vend(self, agent: str, *, queues: list[str], caller: Caller, **options: Any) -> dict[str, Any]:
        """Vends an endpoint; the credential appears in this answer and never again."""
        endpoint, credential = self.endpoints.vend(agent, queues=queues, caller=caller, **options)
        return present.vended(endpoint, credential, self.base_url)

    def endpoint(self, ref: str, *, caller: Caller) -> Endpoint:
        """The endpoint named by slug or id, if the caller may see it."""
        return self.access.endpoint(ref, caller)

    def authenticate_endpoint(self, credential: str) -> Endpoint | None:
        return self.endpoints.authenticate(credential)

    def endpoint_caller(self, endpoint: Endpoint | str) -> Caller:
        return self.endpoints.caller_of(endpoint)

    def revoke(self, ref: str, *, caller: Caller) -> dict[str, Any]:
        endpoint, released = self.endpoints.revoke(ref, caller=caller)
        return present.endpoint_view(endpoint) | {"released_leases": released}

    def set_default_lease(self, ref: str, seconds: int | None, *, caller: Caller) -> dict[str, Any]:
        return present.default_lease_view(self.endpoints.set_default_lease(ref, seconds, caller=caller))

    default_lease_view = staticmethod(present.default_lease_view)

    def list_endpoints(self, *, caller: Caller) -> list[dict[str, Any]]:
        return self.endpoints.list(caller=caller)

    # -- queue controls and bulk actions ---------------------------------------------------

    def set_queue_controls(self, ref: str, queue: str, *, caller: Caller, paused: Any = UNSET,
                           max_in_flight: Any = UNSET, max_claims_per_minute: Any = UNSET) -> dict[str, Any]:
        endpoint, loads = self.queues.set(ref, queue, caller=caller, paused=paused, max_in_flight=max_in_flight,
                                          max_claims_per_minute=max_claims_per_minute)
        return present.queue_views(endpoint, [queue], loads)[0]

    def queue_controls(self, ref: str, *, caller: Caller) -> dict[str, Any]:
        endpoint, loads = self.queues.list(ref, caller=caller)
        return {"endpoint_id": endpoint.endpoint_id, "slug": endpoint.slug,
                "queues": present.queue_views(endpoint, endpoint.queues, loads)}

    def bulk_retry(self, ref: str, *, caller: Caller, dead_letters: object, queue: str | None = None,
                   dry_run: bool = False) -> dict[str, Any]:
        count, bulk_id = self.queues.bulk_retry(ref, caller=caller, dead_letters=dead_letters, queue=queue,
                                                dry_run=dry_run)
        return {"would_retry": count} if bulk_id is None else {"retried": count, "bulk_action_id": bulk_id}

    # -- todos -----------------------------------------------------------------------------

    def push(self, ref: str, title: str, *, caller: Caller, queue: str | None = None, payload: Any = None,
             key: str | None = None, not_before: object = None, delay_seconds: object = None) -> dict[str, Any]:
        todo, created = self.todos.push(ref, title, caller=caller, queue=queue, payload=payload, key=key,
                                        not_before=not_before, delay_seconds=delay_seconds)
        return {"todo": present.todo_row(todo), "created": created}

    def retry(self, todo_id: str, *, caller: Caller) -> dict[str, Any]:
        return present.todo_row(self.todos.retry(todo_id, caller=caller))

    def release_quarantined(self, todo_id: str, queue: str, *, caller: Caller) -> dict[str, Any]:
        return present.todo_row(self.todos.release_quarantined(todo_id, queue, caller=caller))

    def discard_quarantined(self, todo_id: str, *, caller: Caller, summary: str | None = None) -> dict[str, Any]:
        return present.todo_row(self.todos.discard_quarantined(todo_id, caller=caller, summary=summary))

    def claim(self, todo_id: str, *, caller: Caller, lease_ttl_seconds: float | None = None,
              claimant: str | None = None, require_fence: bool = False) -> dict[str, Any]:
        claims = self.todos.claim(todo_id, caller=caller, lease_ttl_seconds=lease_ttl_seconds,
                                  claimant=claimant, require_fence=require_fence)
        return full_todos(claims.payloads, claims.todos, claims.fences)[0]

    def claim_next(self, *, caller: Caller, queue: str | None = None, lease_ttl_seconds: float | None = None,
                   claimant: str | None = None, require_fence: bool = False,
                   max_todos: int | None = None) -> dict[str, Any]:
        claims, refused = self.todos.claim_next(caller=caller, queue=queue, lease_ttl_seconds=lease_ttl_seconds,
                                                claimant=claimant, require_fence=require_fence, max_todos=max_todos)
        full = full_todos(claims.payloads, claims.todos, claims.fences)
        return present.claimed(full, batch=max_todos is not None, why=why_empty(refused))

    def heartbeat(self, todo_id: str, *, caller: Caller, lease_ttl_seconds: float | None = None,
                  lease_token: str | None = None, checkpoint: Any = None) -> dict[str, Any]:
        return present.todo_row(self.todos.heartbeat(
            todo_id, caller=caller, lease_ttl_seconds=lease_ttl_seconds, lease_token=lease_token,
            checkpoint=checkpoint))

    def complete(self, todo_id: str, *, caller: Caller, result: Any = None, summary: str | None = None,
                 lease_token: str | None = None) -> dict[str, Any]:
        return present.todo_row(self.todos.complete(
            todo_id, caller=caller, result=result, summary=summary, lease_token=lease_token))

    def fail(self, todo_id: str, *, caller: Caller, result: Any = None, summary: str | None = None,
             lease_token: str | None = None) -> dict[str, Any]:
        return present.todo_row(self.todos.fail(
            todo_id, caller=caller, result=result, summary=summary, lease_token=lease_token))

    def release(self, todo_id: str, *, caller: Caller, summary: str | None = None,
                lease_token: str | None = None, delay_seconds: float | None = None) -> dict[str, Any]:
        return present.todo_row(self.todos.release(todo_id, caller=caller, summary=summary, lease_token=lease_token,
                                                   delay_seconds=delay_seconds))

    def fire_timers(self, todo_ids: Sequence[str]) -> int:
        return self.todos.fire_timers(todo_ids)

    # -- queries -------------------------------------------------------------------------

    def get_todo(self, todo_id: str, *, caller: Caller) -> dict[str, Any]:
        return full_todos(self.store, [self.queries.todo(todo_id, caller=caller)])[0]

    # -- what the clock decides, by this application's clock (the board shows it) --------

    def todo_now(self, todo_id: str, *, caller: Caller) -> dict[str, Any]:
        """`get_todo` plus `claimable`: whether a claim would be taken now (`Todo.is_claimable`)."""
        todo = self.queries.todo(todo_id, caller=caller)
        return full_todos(self.store, [todo])[0] | {"claimable": todo.is_claimable(self.clock.now())}

    def endpoints_now(self, *, caller: Caller) -> list[dict[str, Any]]:
        """`list_endpoints`, each row with its `status` now (see `presenters.with_status`)."""
        now = self.clock.now()
        return [present.with_status(row, now) for row in self.list_endpoints(caller=caller)]

    def history(self, todo_id: str, *, caller: Caller, payloads: bool = True) -> dict[str, Any]:
        return self.queries.history(todo_id, caller=caller, payloads=payloads)

    def explain(self, todo_id: str, *, caller: Caller) -> dict[str, Any]:
        """The todo's story and why it is in its state now, by this application's clock."""
        return self.queries.explain(todo_id, caller=caller, now=self.clock.now())

    def list_todos(self, *, caller: Caller, endpoint: str | None = None, state: str | None = None,
                   queue: str | None = None, limit: int | None = None, max_limit: int = 1000,
                   dead_letter: bool | None = None) -> list[dict[str, Any]]:
        """Rows newest first (the first page of `page_todos`)."""
        return self.queries.page_todos(caller=caller, endpoint=endpoint, state=state, queue=queue, limit=limit,
                                       max_limit=max_limit, dead_letter=dead_letter)["todos"]

    def page_todos(self, *, caller: Caller, **filters: Any) -> dict[str, Any]:
        return self.queries.page_todos(caller=caller, **filters)

    def todo_counts(self, *, caller: Caller, endpoint: str | None = None) -> list[dict[str, Any]]:
        return self.queries.todo_counts(caller=caller, endpoint=endpoint)

    def queue_waiting(self, queue: str, *, caller: Caller) -> dict[str, Any]:
        """What is claimable now in one of the agent's queues (its MCP resource), by this application's clock."""
        return self.queries.queue_waiting(queue, caller=caller, now=self.clock.now())

    def fault_traces(self, todo_ids: Sequence[str], *, caller: Caller) -> dict[str, dict[str, Any]]:
        return self.queries.fault_traces(todo_ids, caller=caller)

    def audit(self, *, after: int = 0, payloads: bool = False) -> Iterator[dict[str, Any]]:
        """The log from a position as `audit export` writes it (application/audit.py `record_of`)."""
        return self.audit_log.export(after=after, payloads=payloads)
