"""Queue controls and bulk actions: the operator's commands on an endpoint's queues, and the one
admission step every claim goes through (docs/adr/0019-queue-admission.md).

`admit` applies domain/queue.py's rule to a claim in a queue with controls, against the queue's
committed load plus the claims of the same writer batch (`UnitOfWork.queue_load`); the store then
holds the commit to the same limits (projections/queue_load.py), so a claim admitted here on
stale counts fails its commit and is decided again on fresh state. A queue without controls
reads nothing.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping
from typing import Any
from uuid import UUID

from application.ports import Clock, EventStore, UnitOfWork
from domain.endpoint import Endpoint, endpoint_uuid_of
from domain.errors import InvalidArgument, NotFound
from domain.names import TODO_PREFIX, check_queue_name, parse_id
from domain.queue import PAUSED, UNSET, QueueControls, Refusal, admission
from domain.todo import Todo

BULK_PREFIX = "ba_"
BULK_CHUNK = 100
"""Todos one bulk-retry command changes (and commits) at a time."""


def refusal_of(uow: UnitOfWork, endpoint_id: str, queue: str, controls: QueueControls | None) -> Refusal | None:
    """Why this queue admits no claim now (None: it admits one, or has no controls)."""
    if controls is None or not controls.controlled:
        return None
    if controls.paused:
        return Refusal(PAUSED)
    load = uow.queue_load(endpoint_id, queue)
    refusal = admission(controls, in_flight=load.in_flight, recent_claims=load.recent_claims, now=uow.now)
    if refusal is None:
        return None  # the commit's own check holds it to the limit if the load was behind
    load = uow.queue_load(endpoint_id, queue, fresh=True)  # a refusal is confirmed on committed counts
    return admission(controls, in_flight=load.in_flight, recent_claims=load.recent_claims, now=uow.now)


def admit(uow: UnitOfWork, controls: Mapping[str, QueueControls], todo: Todo) -> dict[str, Any] | None:
    """Admits a claim of this todo under its queue's controls: the controls to record with the
    claim (None: the queue has none); a refused claim is a `conflict` naming the reason."""
    queue_controls = controls.get(todo.queue)
    refusal = refusal_of(uow, todo.endpoint_id, todo.queue, queue_controls)
    if refusal is not None:
        raise refusal.conflict(todo.todo_id, todo.queue)
    if queue_controls is None or not queue_controls.controlled:
        return None
    return {"max_in_flight": queue_controls.max_in_flight,
            "max_claims_per_minute": queue_controls.max_claims_per_minute}


def new_bulk_id() -> str:
    return BULK_PREFIX + secrets.token_hex(16)


class QueueControlsService:
    """The operator's side: set and read an endpoint's queue controls; retry dead letters in bulk."""

    def __init__(self, store: EventStore, views: Any, clock: Clock, owns: Callable[[Any, Endpoint], bool]) -> None:
        self.store = store
        self.views = views
        self.clock = clock
        self.owns = owns

    def _endpoint(self, ref: str, caller: Any) -> Endpoint:
        endpoint = self.store.load(Endpoint, endpoint_uuid_of(ref))
        if endpoint is None or not self.owns(caller, endpoint):
            raise NotFound(f"endpoint {ref} not found")
        return endpoint

    def set(self, ref: str, queue: str, *, caller: Any, paused: Any = UNSET, max_in_flight: Any = UNSET,
            max_claims_per_minute: Any = UNSET) -> dict[str, Any]:
        """Pauses, resumes or limits one of the endpoint's queues (an event when anything changed)."""
        check_queue_name(queue)
        endpoint_id = endpoint_uuid_of(ref)

        def handler(uow: UnitOfWork) -> Endpoint:
            endpoint = uow.get(Endpoint, endpoint_id)
            if endpoint is None or not self.owns(caller, endpoint):
                raise NotFound(f"endpoint {ref} not found")
            endpoint.set_queue_controls(now=uow.now, actor=caller.label, queue=queue, paused=paused,
                                        max_in_flight=max_in_flight, max_claims_per_minute=max_claims_per_minute)
            return endpoint

        endpoint = self.store.run(handler)
        return self._views(endpoint, [queue])[0]

    def list(self, ref: str, *, caller: Any) -> dict[str, Any]:
        """Each of the endpoint's queues with its controls and its load now."""
        endpoint = self._endpoint(ref, caller)
        return {"endpoint_id": endpoint.endpoint_id, "slug": endpoint.slug,
                "queues": self._views(endpoint, list(endpoint.queues))}

    def _views(self, endpoint: Endpoint, queues: list[str]) -> list[dict[str, Any]]:
        loads = self.views.queue_loads(endpoint.endpoint_id, queues, self.clock.now())
        return [
            {"queue": q, **endpoint.controls_of(q).as_dict(), "in_flight": loads[q][0],
             "claims_last_minute": loads[q][1] if endpoint.controls_of(q).max_claims_per_minute else None}
            for q in queues
        ]

    def bulk_retry(self, ref: str, *, caller: Any, dead_letters: object, queue: str | None = None,
                   dry_run: bool = False) -> dict[str, Any]:
        """Retries every dead letter of the endpoint (or of one of its queues) now, each with a fresh
        budget: one event per todo, all with the same bulk-action id as cause."""
        if dead_letters is not True:
            raise InvalidArgument("dead_letters must be true: only dead letters are retried in bulk")
        if not isinstance(dry_run, bool):
            raise InvalidArgument("dry_run must be true or false")
        endpoint = self._endpoint(ref, caller)
        if queue is not None:
            check_queue_name(queue, allow_quarantine=True)
        self.views.catch_up()
        ids = [u for u in (parse_id(TODO_PREFIX, t) for t in self.views.dead_letter_ids(endpoint.endpoint_id, queue))
               if u is not None]
        if dry_run:
            return {"would_retry": len(ids)}
        bulk_id = new_bulk_id()
        retried = sum(self._retry_chunk(ids[i:i + BULK_CHUNK], bulk_id, caller) for i in range(0, len(ids), BULK_CHUNK))
        return {"retried": retried, "bulk_action_id": bulk_id}

    def _retry_chunk(self, ids: list[UUID], bulk_id: str, caller: Any) -> int:
        def handler(uow: UnitOfWork) -> int:
            retried = 0
            for todo_id in ids:
                todo = uow.get(Todo, todo_id, fresh=True)
                if todo is not None and todo.state == "failed" and todo.dead_letter:
                    todo.retry_now(now=uow.now, actor=caller.label, cause=bulk_id)
                    retried += 1
            return retried

        return self.store.run(handler)
