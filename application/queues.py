"""Queue controls and bulk actions: the operator's commands on an endpoint's queues, and the one
admission step every claim goes through (docs/adr/0025-queue-admission.md).

`admit` applies domain/queue.py's rule to a claim in a queue with controls, against the queue's
committed load plus the claims of the same writer batch (`UnitOfWork.queue_load`); the store then
holds the commit to the same limits (projections/queue_load.py), so a claim admitted here on
stale counts fails its commit and is decided again on fresh state. A queue without controls
reads nothing.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from application.access import Access, Caller, touchable_endpoint
from application.ports import Clock, EventStore, UnitOfWork, Views
from domain.endpoint import Endpoint, endpoint_uuid_of
from domain.errors import InvalidArgument
from domain.names import QUARANTINE, TODO_PREFIX, check_queue_name, parse_id
from domain.queue import PAUSED, UNSET, QueueControls, Refusal, admission, soonest
from domain.todo import Todo

BULK_PREFIX = "ba_"
MAX_PUSH_DELAY = timedelta(days=3650)
BULK_CHUNK = 100
"""Todos one bulk-retry command changes (and commits) at a time."""

QueueLoads = dict[str, tuple[int, int]]  # queue -> (claimed now, claims under a rate in the last 60 s)


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


def not_before_of(not_before: object, delay_seconds: object) -> Callable[[datetime], datetime | None]:
    """When a pushed todo becomes claimable, given the command's `now`: an RFC 3339 time with its
    offset, or a delay in seconds from now (not both); None: at once."""
    if not_before is not None and delay_seconds is not None:
        raise InvalidArgument("give not_before or a delay, not both")
    if delay_seconds is not None:
        if (isinstance(delay_seconds, bool) or not isinstance(delay_seconds, (int, float))
                or not 0 <= delay_seconds <= MAX_PUSH_DELAY.total_seconds()):
            raise InvalidArgument(f"delay must be within 0..{int(MAX_PUSH_DELAY.total_seconds())} seconds"
                                  f" ({MAX_PUSH_DELAY.days}d)")
        delay = timedelta(seconds=delay_seconds)
        return lambda now: now + delay if delay else None
    if not_before is None:
        return lambda now: None
    moment = not_before
    if isinstance(not_before, str):
        try:
            moment = datetime.fromisoformat(not_before.strip())
        except ValueError:
            moment = None
    if not isinstance(moment, datetime) or moment.tzinfo is None or moment.year < 1971:
        raise InvalidArgument("not_before must be an RFC 3339 time with its offset, e.g. 2026-12-01T12:00:00Z")
    return lambda now: moment


def why_empty(refused: Mapping[str, Refusal]) -> dict[str, Any]:
    """What an empty `claim_next` says when its queues hold work they cannot hand out now: the
    refusal of the queue that admits again soonest (`domain.queue.soonest`), its reason with its own
    retry_after_seconds, which only a rate limit has (a max_in_flight frees when a claim ends, a
    pause when an operator resumes: no time is known)."""
    if not refused:
        return {}
    refusal = soonest(refused.values())
    why: dict[str, Any] = {"reason": refusal.reason}
    if refusal.retry_after_seconds is not None:
        why["retry_after_seconds"] = refusal.retry_after_seconds
    return why


class Queues:
    """The operator's side: set and read an endpoint's queue controls; retry dead letters in bulk."""

    def __init__(self, store: EventStore, views: Views, clock: Clock, access: Access) -> None:
        self.store = store
        self.views = views
        self.clock = clock
        self.access = access

    def set(self, ref: str, queue: str, *, caller: Caller, paused: Any = UNSET, max_in_flight: Any = UNSET,
            max_claims_per_minute: Any = UNSET) -> tuple[Endpoint, QueueLoads]:
        """Pauses, resumes or limits one of the endpoint's queues (an event when anything changed);
        the endpoint as now set and that queue's load."""
        check_queue_name(queue)
        endpoint_id = endpoint_uuid_of(ref)

        def handler(uow: UnitOfWork) -> Endpoint:
            endpoint = touchable_endpoint(uow, endpoint_id, ref, caller)
            endpoint.set_queue_controls(now=uow.now, actor=caller.label, queue=queue, paused=paused,
                                        max_in_flight=max_in_flight, max_claims_per_minute=max_claims_per_minute)
            return endpoint

        endpoint = self.store.run(handler)
        return endpoint, self.views.queue_loads(endpoint.endpoint_id, [queue], self.clock.now())

    def list(self, ref: str, *, caller: Caller) -> tuple[Endpoint, QueueLoads]:
        """The endpoint (with its queues' controls) and each queue's load now."""
        endpoint = self.access.endpoint(ref, caller)
        return endpoint, self.views.queue_loads(endpoint.endpoint_id, list(endpoint.queues), self.clock.now())

    def bulk_retry(self, ref: str, *, caller: Caller, dead_letters: object, queue: str | None = None,
                   dry_run: bool = False) -> tuple[int, str | None]:
        """Retries every dead letter of the endpoint (or of one of its queues) now, each with a fresh
        budget: one event per todo, all with the same bulk-action id as cause. How many (would be,
        with `dry_run`) retried, and that id (None for a dry run)."""
        if dead_letters is not True:
            raise InvalidArgument("dead_letters must be true: only dead letters are retried in bulk")
        if not isinstance(dry_run, bool):
            raise InvalidArgument("dry_run must be true or false")
        endpoint = self.access.endpoint(ref, caller)
        if queue is not None:
            check_queue_name(queue, allow_quarantine=True)
            if queue != QUARANTINE and queue not in endpoint.queues:
                # as `queue set` says: a mistyped queue is not "0 retried"
                raise InvalidArgument(f"queue {queue!r} is not one of endpoint {endpoint.slug}'s queues")
        self.views.catch_up()
        ids = [u for u in (parse_id(TODO_PREFIX, t) for t in self.views.dead_letter_ids(endpoint.endpoint_id, queue))
               if u is not None]
        if dry_run:
            return len(ids), None
        bulk_id = new_bulk_id()
        return sum(self._retry_chunk(ids[i:i + BULK_CHUNK], bulk_id, caller) for i in range(0, len(ids), BULK_CHUNK)), bulk_id

    def _retry_chunk(self, ids: list[UUID], bulk_id: str, caller: Caller) -> int:
        # read in one round trip before the writer's turn (a copy changed since only costs a re-run
        # on fresh state: a retried copy is written, so its version is checked at commit)
        copies = self.store.load_many([(Todo, todo_id) for todo_id in ids])

        def handler(uow: UnitOfWork) -> int:
            retried = 0
            for todo_id in ids:
                todo = uow.get(Todo, todo_id)
                if todo is not None and todo.state == "failed" and todo.dead_letter:
                    todo.retry_now(now=uow.now, actor=caller.label, cause=bulk_id)
                    retried += 1
            return retried

        return self.store.run(handler, hints=copies)
