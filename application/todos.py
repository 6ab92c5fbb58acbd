"""The todo lifecycle's commands: push, claim, heartbeat, complete, fail, release, retry,
quarantine release and discard, and the scheduler's timers. Each returns the Todo it changed;
a claim, whose answer is the full todo, also the payloads that answer shows (`Claims`)."""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar
from uuid import UUID

from application.access import (
    Caller, EndpointScope, active_endpoint, scope_of, touchable_endpoint, touchable_todo, todo_uuid,
)
from application.payloads import unread
from application.ports import EventStore, PayloadSource, UnitOfWork
from application.queues import admit, not_before_of, refusal_of
from domain.endpoint import endpoint_uuid, endpoint_uuid_of
from domain.errors import Conflict, Forbidden, InvalidArgument
from domain.idempotency import KEY_MAX_BYTES, IdempotencyKey, key_uuid
from domain.names import check_queue_name
from domain.queue import QueueRefused, Refusal, check_delay_seconds
from domain.leases import effective_lease
from domain.todo import CLAIMED, Todo

CLAIM_CANDIDATES = 8
MAX_CLAIM_BATCH = 100  # todos one claim_next may take at once (`max`)

Claimed = tuple[Todo, "str | None"]  # a claimed todo and its lease token (fence), if one was asked for
T = TypeVar("T")


@dataclass(frozen=True)
class Claims:
    """What one claim command took, and the payloads and results its answer shows that were not
    at hand, read in the claim's own transaction before it committed: a committed claim is
    never answered with an error for want of its payload, and a read that fails commits nothing
    (docs/adr/0027)."""

    taken: list[Claimed]
    payloads: PayloadSource

    @property
    def todos(self) -> list[Todo]:
        return [todo for todo, _ in self.taken]

    @property
    def fences(self) -> list[str | None]:
        return [fence for _, fence in self.taken]


def open_or_reuse(uow: UnitOfWork, endpoint_id: str, key: str | None, open_todo: Callable[[], Todo], *,
                  actor: str, reuse: Callable[[], Todo | None] | None = None) -> tuple[Todo, bool]:
    """The live todo an endpoint's idempotency key already names (and False), or the live todo
    `reuse` finds after it (a `once` subject's; False, and the key stays unbound), or the new todo
    `open_todo` opens (and True), the key then bound to it."""
    binding = None
    if key is not None:
        binding = uow.get(IdempotencyKey, key_uuid(endpoint_id, key))
        if binding is not None:
            existing = uow.get(Todo, todo_uuid(binding.todo_id), fresh=True)
            if existing is not None and existing.is_live:
                return existing, False
        else:
            binding = IdempotencyKey.new(endpoint_id=endpoint_id, key=key)
    if reuse is not None and (live := reuse()) is not None:
        return live, False
    todo = open_todo()
    uow.add(todo)
    if binding is not None:
        binding.bind(todo_id=todo.todo_id, now=uow.now, actor=actor)
        uow.add(binding)
    return todo, True


def _check_push(title: object, key: object, payload: Any) -> int:
    """Refuses a bad title, key or payload; the payload's size in bytes."""
    if not isinstance(title, str) or not title.strip():
        raise InvalidArgument("title is required")
    if key is not None and (not isinstance(key, str) or not key or len(key.encode()) > KEY_MAX_BYTES):
        raise InvalidArgument(f"key must be 1..{KEY_MAX_BYTES} bytes")
    try:  # UTF-8 encodable too: a lone surrogate is not text any store can keep
        size = len(json.dumps(payload, separators=(",", ":")).encode())
        json.dumps([title, payload], ensure_ascii=False).encode()
    except (TypeError, ValueError):
        raise InvalidArgument("payload must be JSON and title and payload valid Unicode text") from None
    return size


class Todos:
    """Commands on todos; every one asks application/access.py who may touch the todo."""

    def __init__(self, store: EventStore) -> None:
        self.store = store
        self.on_refused: Callable[[str, str], None] = lambda queue, reason: None
        """Told of each claim a queue's controls refused (queue, reason): the metric's counter."""

    def _act(self, todo_id: str, caller: Caller,
             command: Callable[[Todo, UnitOfWork, EndpointScope], None]) -> Todo:
        """Loads the todo the caller may touch, applies one domain command, and saves it."""
        return self._act_and(todo_id, caller, command, lambda todo, _: todo)

    def _act_and(self, todo_id: str, caller: Caller, command: Callable[[Todo, UnitOfWork, EndpointScope], None],
                 answer: Callable[[Todo, UnitOfWork], T]) -> T:
        """`_act`, answering what `answer` makes of the changed todo (in the same unit of work)."""
        parsed = todo_uuid(todo_id)  # a malformed id is refused before the store is asked

        def handler(uow: UnitOfWork) -> T:
            todo, scope = touchable_todo(uow, parsed, todo_id, caller)
            command(todo, uow, scope)
            return answer(todo, uow)

        return self.store.run(handler)

    # -- the operator's side -------------------------------------------------------------

    def push(self, ref: str, title: str, *, caller: Caller, queue: str | None = None, payload: Any = None,
             key: str | None = None, not_before: object = None, delay_seconds: object = None) -> tuple[Todo, bool]:
        """An operator-authored todo; with a key, a repeat while the first is live returns it (False).
        With `not_before` (RFC 3339) or `delay_seconds` it is pending but not claimable until then."""
        later = not_before_of(not_before, delay_seconds)
        payload_size = _check_push(title, key, payload)
        endpoint_id = endpoint_uuid_of(ref)
        todo_id = UUID(bytes=secrets.token_bytes(16), version=4)

        def handler(uow: UnitOfWork) -> tuple[Todo, bool]:
            endpoint = touchable_endpoint(uow, endpoint_id, ref, caller)
            if not endpoint.is_active(uow.now):
                raise Conflict(f"endpoint {endpoint.slug} is revoked or expired")
            target = check_queue_name(queue) if queue is not None else endpoint.queues[0]
            if target not in endpoint.queues:
                raise Forbidden(f"queue {target} is not in endpoint {endpoint.slug}'s scope")
            return open_or_reuse(uow, endpoint.endpoint_id, key, lambda: Todo.open(
                id=todo_id, now=uow.now, actor=caller.label, endpoint_id=endpoint.endpoint_id,
                queue=target, source="operator", title=title, trust_mode="operator", payload=payload,
                payload_size=payload_size, idempotency_key=key, not_before=later(uow.now),
            ), actor=caller.label)

        return self.store.run(handler)

    def retry(self, todo_id: str, *, caller: Caller) -> Todo:
        """Retry now: a failed todo is pending at once with a fresh budget."""
        return self._act(todo_id, caller, lambda todo, uow, _: todo.retry_now(now=uow.now, actor=caller.label))

    def release_quarantined(self, todo_id: str, queue: str, *, caller: Caller) -> Todo:
        """An operator releases a pending quarantined todo to one of its endpoint's queues."""
        if caller.kind != "operator":
            raise Forbidden("only an operator can release a quarantined todo")
        target = check_queue_name(queue)

        def command(todo: Todo, uow: UnitOfWork, scope: EndpointScope) -> None:
            if target not in scope.queues:
                raise Forbidden(f"queue {target} is not in the endpoint's scope")
            todo.move_from_quarantine(now=uow.now, actor=caller.label, queue=target)

        return self._act(todo_id, caller, command)

    def discard_quarantined(self, todo_id: str, *, caller: Caller, summary: str | None = None) -> Todo:
        """An operator ends a quarantined todo without work."""
        if caller.kind != "operator":
            raise Forbidden("only an operator can discard a quarantined todo")
        return self._act(todo_id, caller, lambda todo, uow, _: todo.discard(
            now=uow.now, actor=caller.label, summary=summary))

    # -- the lease holder's side (agents, or an operator on the board) -------------------

    def claim(self, todo_id: str, *, caller: Caller, lease_ttl_seconds: float | None = None,
              claimant: str | None = None, require_fence: bool = False) -> Claims:
        """Claims one claimable todo under a lease; each claim is one attempt."""
        fence = secrets.token_urlsafe(24) if require_fence else None

        def command(todo: Todo, uow: UnitOfWork, scope: EndpointScope) -> None:
            under = admit(uow, scope.controls, todo) if todo.is_claimable(uow.now) else None
            todo.claim(now=uow.now, holder=caller.label, claimant=claimant, fence_token=fence,
                       lease=effective_lease(lease_ttl_seconds, scope.default_lease), admitted_under=under)

        try:
            return self._act_and(todo_id, caller, command,
                                 lambda todo, uow: Claims([(todo, fence)], uow.needs_payloads(unread([todo]))))
        except QueueRefused as refused:
            self._count_refused(refused.queue, refused.refusal)
            raise

    def _count_refused(self, queue: str, refusal: Refusal) -> None:
        try:
            self.on_refused(queue, refusal.reason)
        except Exception:  # a counter that cannot count must not turn a refusal into a failure
            pass

    def claim_next(self, *, caller: Caller, queue: str | None = None, lease_ttl_seconds: float | None = None,
                   claimant: str | None = None, require_fence: bool = False,
                   max_todos: int | None = None) -> tuple[Claims, dict[str, Refusal]]:
        """Claims the oldest claimable todo across the endpoint's queues (or the one given); with
        `max_todos`, up to that many at once (oldest first, one lease and one attempt each). A queue
        whose controls admit no claim now is passed by; when nothing is taken, the refusals of the
        queues that hold claimable work back come with the (empty) answer."""
        if caller.kind != "endpoint":
            raise Forbidden("claim_next is for endpoints")
        if max_todos is not None and (isinstance(max_todos, bool) or not 1 <= max_todos <= MAX_CLAIM_BATCH):
            raise InvalidArgument(f"max must be 1..{MAX_CLAIM_BATCH}")
        want = 1 if max_todos is None else max_todos
        endpoint_id = endpoint_uuid(caller.name)

        refused: dict[str, Refusal] = {}

        def handler(uow: UnitOfWork) -> Claims:
            scope = caller.scope or scope_of(active_endpoint(uow, endpoint_id))
            if queue is not None and queue not in scope.queues:
                raise Forbidden(f"queue {queue} is not in this endpoint's scope")
            queues = [queue] if queue is not None else list(scope.queues)
            lease = effective_lease(lease_ttl_seconds, scope.default_lease)
            taken: list[Claimed] = []  # a re-run after a lost race starts over
            refused.clear()
            for q in scope.controls:  # a queue that cannot admit now is not even looked in
                if q in queues and (refusal := refusal_of(uow, scope.endpoint_id, q, scope.controls[q])):
                    refused[q] = refusal
                    queues.remove(q)
            for todo in self._claimable(uow, scope.endpoint_id, queues, want):
                under = None
                if todo.queue in scope.controls:
                    if refusal := refusal_of(uow, scope.endpoint_id, todo.queue, scope.controls[todo.queue]):
                        refused[todo.queue] = refusal  # full now (this batch's claims count)
                        queues.remove(todo.queue)  # its other candidates are passed by
                        continue
                    under = admit(uow, scope.controls, todo)
                fence = secrets.token_urlsafe(24) if require_fence else None
                todo.claim(now=uow.now, holder=caller.label, lease=lease, claimant=claimant, fence_token=fence,
                           admitted_under=under)
                taken.append((todo, fence))
                if len(taken) == want:
                    break
            if not taken:  # only the refusals that hold work back are said (an empty queue says nothing)
                for q in [q for q in refused if not uow.claimable(scope.endpoint_id, [q], 1)]:
                    del refused[q]
            return Claims(taken, uow.needs_payloads(unread([todo for todo, _ in taken])))

        claims = self.store.run(handler)
        if claims.taken:
            return claims, {}
        for q, refusal in refused.items():
            self._count_refused(q, refusal)
        return claims, dict(refused)

    @staticmethod
    def _claimable(uow: UnitOfWork, endpoint_id: str, queues: list[str], want: int):
        """Claimable todos of these queues, oldest first; candidates taken meanwhile by another
        process are skipped, not fatal (each is read again fresh before it is given up). A queue the
        caller removes from `queues` meanwhile yields nothing more."""
        seen: set[UUID] = set()
        while queues:
            candidates = [c for c in uow.claimable(endpoint_id, queues, max(CLAIM_CANDIDATES, want) + len(seen))
                          if c not in seen]
            if not candidates:
                return
            for candidate in candidates:
                seen.add(candidate)
                todo = uow.get(Todo, candidate)
                if todo is not None and not todo.is_claimable(uow.now):
                    todo = uow.get(Todo, candidate, fresh=True)
                if todo is not None and todo.is_claimable(uow.now) and todo.queue in queues:
                    yield todo

    def heartbeat(self, todo_id: str, *, caller: Caller, lease_ttl_seconds: float | None = None,
                  lease_token: str | None = None, checkpoint: Any = None) -> Todo:
        """The holder extends its lease to now + ttl, with a checkpoint the next claim resumes from."""
        return self._act(todo_id, caller, lambda todo, uow, scope: todo.heartbeat(
            now=uow.now, holder=caller.label, fence_token=lease_token,
            lease=effective_lease(lease_ttl_seconds, scope.default_lease), checkpoint=checkpoint,
        ))

    def complete(self, todo_id: str, *, caller: Caller, result: Any = None, summary: str | None = None,
                 lease_token: str | None = None) -> Todo:
        return self._act(todo_id, caller, lambda todo, uow, _: todo.complete(
            now=uow.now, holder=caller.label, result=result, summary=summary, fence_token=lease_token,
        ))

    def fail(self, todo_id: str, *, caller: Caller, result: Any = None, summary: str | None = None,
             lease_token: str | None = None) -> Todo:
        return self._act(todo_id, caller, lambda todo, uow, _: todo.fail(
            now=uow.now, holder=caller.label, result=result, summary=summary, fence_token=lease_token,
        ))

    def release(self, todo_id: str, *, caller: Caller, summary: str | None = None,
                lease_token: str | None = None, delay_seconds: object = None) -> Todo:
        """The holder hands the todo back; with `delay_seconds` (0..86400) a snooze."""
        delay = check_delay_seconds(delay_seconds)
        return self._act(todo_id, caller, lambda todo, uow, _: todo.release(
            now=uow.now, holder=caller.label, summary=summary, fence_token=lease_token, delay=delay,
        ))

    def revoke_lease(self, todo_id: str, holder: str, *, caller: Caller) -> bool:
        """Ends a revoked endpoint's lease on this todo, if it still holds one."""
        todo_uuid_ = todo_uuid(todo_id)

        def handler(uow: UnitOfWork) -> bool:
            todo = uow.get(Todo, todo_uuid_, fresh=True)
            if todo is None or todo.state != CLAIMED or todo.holder != holder:
                return False
            todo.revoke_lease(now=uow.now, actor=caller.label)
            return True

        return self.store.run(handler)

    # -- the scheduler's commands --------------------------------------------------------

    def fire_timers(self, todo_ids: Sequence[str]) -> int:
        """Expires lapsed leases, requeues due retries and marks elapsed delays among these todos;
        returns how many moved."""
        uuids = [todo_uuid(t) for t in todo_ids]

        def handler(uow: UnitOfWork) -> int:
            moved = 0
            for todo_uuid_ in uuids:
                todo = uow.get(Todo, todo_uuid_)
                if todo is None:
                    continue
                if not (todo.lease_lapsed(uow.now) or todo.retry_due(uow.now) or todo.delay_due(uow.now)):
                    todo = uow.get(Todo, todo_uuid_, fresh=True)
                if todo.lease_lapsed(uow.now):
                    todo.expire_lease(now=uow.now)
                elif todo.retry_due(uow.now):
                    todo.requeue_due(now=uow.now)
                elif todo.delay_due(uow.now):
                    todo.elapse_delay(now=uow.now)
                else:
                    continue
                moved += 1
            return moved

        return self.store.run(handler)
