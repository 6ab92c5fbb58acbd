"""The Todo aggregate: one durable unit of work and its leased attempts.

States (see docs/adr/0005-todo-lifecycle.md for the diagram):

- ``pending``: claimable from ``available_at`` on. Reached by ``TodoOpened``, ``TodoReleased``,
  ``LeaseExpired`` (attempts left), ``TodoRequeued`` (retry due, or an operator's retry). A push
  with ``not_before`` or a release with a delay (a snooze) leaves it pending but not claimable
  until then; ``DelayElapsed`` (the scheduler, within a second of that time) marks the moment it
  becomes claimable, which is when the doorbell rings for it.
- ``claimed``: one holder has a lease until ``lease_expires_at``. Reached by ``TodoClaimed``;
  ``LeaseRenewed`` moves the expiry. Left by complete, fail, release, or the lease lapsing.
- ``done``: final. Reached by ``TodoCompleted``, or by ``TodoDiscarded`` (an operator ends a
  quarantined todo without work).
- ``failed``: either awaiting a retry at ``next_retry_at`` (claimable once due, requeued by
  the scheduler) or, when the budget of ``MAX_ATTEMPTS`` claims is spent, a dead letter
  (``dead_letter`` true, ``next_retry_at`` None) that only an operator's retry revives.

A todo in the ``quarantine`` queue is pending but never claimable; ``TodoMoved`` releases it to
one of its endpoint's queues (claimable at once), ``TodoDiscarded`` ends it.

The events are shaped in domain/todo_events.py; the facts every adapter needs about them live
here, after the states (``state_after``, ``BECOMES_CLAIMABLE``, ``MAY_BECOME_CLAIMABLE``,
``ENDS_A_CLAIM``, ``MOVES_TIMER``, ``WAITING``): import them, never restate them. A todo's values
and their limits are in domain/todo_fields.py, its lease rules in domain/leases.py, the record of
each attempt in domain/attempts.py. Whether a claimable todo's queue admits a claim now is the queue's business
(domain/queue.py); a claim admitted under controls says so in ``TodoClaimed.admitted_under``.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from domain.attempts import Attempt
from domain.errors import Conflict, InvalidArgument
from domain.events import Aggregate, DomainEvent
from domain.leases import check_lease, fence_hash
from domain.names import QUARANTINE, TODO_PREFIX, format_id
from domain.payloads import JSON, json_stored
from domain.todo_events import (  # the events, with their lifecycle facts below
    TodoOpened, TodoClaimed, LeaseRenewed, TodoCompleted, TodoFailed, LeaseExpired,
    TodoReleased, DelayElapsed, TodoRequeued, TodoMoved, TodoDiscarded,
)
from domain.todo_fields import (
    CLAIMANT_MAX_BYTES, SUMMARY_MAX_BYTES, TRUST_MODES, check_checkpoint, cut_utf8, one_line_title, result_fields,
)
from domain.traces import parse_traceparent, span_id_for, trace_id_for, traceparent

MAX_ATTEMPTS = 5
RETRY_BASE_DELAY = timedelta(seconds=30)
RETRY_MAX_DELAY = timedelta(minutes=15)

PENDING, CLAIMED, DONE, FAILED = "pending", "claimed", "done", "failed"
STATES = (PENDING, CLAIMED, DONE, FAILED)
WAITING = (PENDING, FAILED)  # not claimed and not done: waiting for a claim, a retry or an operator


def retry_delay(attempt: int) -> timedelta:
    """30 s * 2^(attempt-1), capped at 15 minutes."""
    return min(RETRY_BASE_DELAY * (2 ** max(attempt - 1, 0)), RETRY_MAX_DELAY)


# --- the lifecycle facts of the events (domain/todo_events.py) -------------------------

TODO_EVENTS = (
    TodoOpened, TodoClaimed, LeaseRenewed, TodoCompleted, TodoFailed, LeaseExpired,
    TodoReleased, TodoRequeued, TodoMoved, TodoDiscarded, DelayElapsed,
)

# After one of these a todo may be claimable at once (unless in quarantine, dead-lettered or
# delayed): the doorbell scans for it.
BECOMES_CLAIMABLE = (TodoOpened, TodoReleased, LeaseExpired, TodoRequeued, TodoMoved, DelayElapsed)
# After one of these a todo may be claimable now or once a retry falls due: a cached list of
# claim candidates is stale.
MAY_BECOME_CLAIMABLE = (*BECOMES_CLAIMABLE, TodoFailed)
# These end a claim: a queue held at its max_in_flight may admit again.
ENDS_A_CLAIM = (TodoCompleted, TodoFailed, TodoReleased, LeaseExpired)
# These set, move or clear a lease, retry or delay timer: only they concern the timer scheduler.
MOVES_TIMER = (
    TodoOpened, TodoClaimed, LeaseRenewed, TodoFailed, TodoCompleted, TodoReleased, LeaseExpired, TodoRequeued,
    TodoDiscarded, DelayElapsed,
)


def moves_timer(event: DomainEvent) -> bool:
    """Whether this event sets, moves or clears a timer: a todo opened without `not_before` has none."""
    if isinstance(event, TodoOpened):
        return event.not_before is not None
    return isinstance(event, MOVES_TIMER)


def state_after(event: DomainEvent) -> tuple[str, bool]:
    """The todo's state and dead-letter flag right after this event."""
    match event:
        case TodoOpened() | TodoRequeued() | TodoMoved() | DelayElapsed():
            return PENDING, False
        case TodoClaimed() | LeaseRenewed():
            return CLAIMED, False
        case TodoCompleted() | TodoDiscarded():
            return DONE, False
        case TodoFailed():
            return FAILED, event.dead_letter
        case LeaseExpired() | TodoReleased():
            return (FAILED, True) if event.dead_letter else (PENDING, False)
    raise TypeError(f"not a todo transition: {type(event).__name__}")


def is_live_state(state: str, dead_letter: bool) -> bool:
    """Pending, claimed, or failed awaiting a retry; done and dead letters are finished."""
    return state in (PENDING, CLAIMED) or (state == FAILED and not dead_letter)


# --- aggregate ----------------------------------------------------------------------------


class Todo(Aggregate):
    """A todo decides its own transitions; the clock's `now` is always passed in."""

    @classmethod
    def open(
        cls,
        *,
        id: UUID,
        now: datetime,
        actor: str,
        endpoint_id: str,
        queue: str,
        source: str,
        title: str,
        trust_mode: str,
        payload: Any = None,
        payload_size: int = 0,
        kind: str | None = None,
        idempotency_key: str | None = None,
        routing: dict[str, Any] | None = None,
        delivery_id: str | None = None,
        cause: str = "push",
        not_before: datetime | None = None,
        payload_ref: dict[str, Any] | None = None,
        payload_form: str = JSON,
        payload_bytes: bytes | None = None,
        trace_parent: str | None = None,
    ) -> Todo:
        """Opens a pending todo on an endpoint's queue; its payload is named by reference (a JSON
        value is stored as its bytes; a delivery's todo names its delivery's body). With
        `not_before` in the future it is not claimable (nor rung) until then. Its trace continues
        the delivery's `traceparent` (`trace_parent`) when valid, else is minted from its id."""
        if trust_mode not in TRUST_MODES:
            raise InvalidArgument(f"unknown trust mode {trust_mode!r}")
        if not_before is not None and not_before <= now:
            not_before = None  # a time already past delays nothing
        if payload_ref is None and payload is not None:
            (payload_ref, payload_bytes), payload_form = json_stored(payload), JSON
        todo = cls()
        todo.id = id
        todo._record(
            TodoOpened,
            timestamp=now, actor=actor, cause=cause, endpoint_id=endpoint_id, queue=queue,
            source=source, kind=kind, title=one_line_title(title), trust_mode=trust_mode,
            payload_size=payload_size, idempotency_key=idempotency_key,
            routing=routing, delivery_id=delivery_id, not_before=not_before, payload_ref=payload_ref,
            payload_form=payload_form if payload_ref is not None else None, payload_bytes=payload_bytes,
            trace_id=trace_id_for(id, trace_parent),
            trace_parent=trace_parent.strip().lower() if parse_traceparent(trace_parent) else None,
        )
        return todo

    # -- queries of state

    @property
    def todo_id(self) -> str:
        return format_id(TODO_PREFIX, self.id)

    @property
    def is_live(self) -> bool:
        """Pending, claimed, or failed awaiting a retry: an idempotency key still maps here."""
        return is_live_state(self.state, self.dead_letter)

    def is_claimable(self, now: datetime) -> bool:
        """Pending and not delayed past now, or failed with its retry due — and not in quarantine,
        which nobody claims."""
        if self.queue == QUARANTINE:
            return False
        if self.state == PENDING:
            return self.available_at is None or self.available_at <= now
        return (
            self.state == FAILED and not self.dead_letter
            and self.next_retry_at is not None and self.next_retry_at <= now
        )

    def traceparent_of(self, attempt: Attempt) -> str:
        """The W3C `traceparent` of one of this todo's attempts."""
        return traceparent(self.trace_id, attempt.span_id or span_id_for(self.id, attempt.seq))

    def lease_lapsed(self, now: datetime) -> bool:
        return self.state == CLAIMED and self.lease_expires_at is not None and self.lease_expires_at <= now

    def delay_due(self, now: datetime) -> bool:
        """A delayed or snoozed pending todo whose time has come (the scheduler marks it)."""
        return self.state == PENDING and self.delayed and self.available_at is not None and self.available_at <= now

    def retry_due(self, now: datetime) -> bool:
        return (
            self.state == FAILED and not self.dead_letter
            and self.next_retry_at is not None and self.next_retry_at <= now
        )

    # -- commands

    def claim(
        self,
        *,
        now: datetime,
        holder: str,
        lease: timedelta,
        claimant: str | None = None,
        fence_token: str | None = None,
        admitted_under: dict[str, Any] | None = None,
    ) -> None:
        """Takes a claimable todo under a lease; each claim is one attempt of the budget. The
        caller has admitted it under its queue's controls (`admitted_under`, None: none set)."""
        if self.queue == QUARANTINE:
            raise Conflict(f"todo {self.todo_id} is quarantined: release it to a queue or discard it first")
        if not self.is_claimable(now):
            raise Conflict(f"todo {self.todo_id} is {self._state_words(now)}, not claimable")
        self._record(
            TodoClaimed,
            timestamp=now, actor=holder, cause="claim", attempt=self.attempt + 1,
            attempt_seq=self.attempt_seq + 1, holder=holder,
            claimant=cut_utf8(claimant, CLAIMANT_MAX_BYTES), lease_expires_at=now + lease,
            fence_hash=fence_hash(fence_token) if fence_token is not None else None,
            endpoint_id=self.endpoint_id, queue=self.queue, admitted_under=admitted_under,
            span_id=span_id_for(self.id, self.attempt_seq + 1),
        )

    def heartbeat(
        self, *, now: datetime, holder: str, lease: timedelta, fence_token: str | None = None,
        checkpoint: Any = None,
    ) -> None:
        """The holder extends its lease to now + ttl, saving a checkpoint (any JSON of at most 64 KiB)
        when given: the next claim resumes from the latest."""
        self._check_holder(now, holder, fence_token)
        self._record(
            LeaseRenewed, timestamp=now, actor=holder, cause="heartbeat",
            lease_expires_at=now + lease, checkpoint=check_checkpoint(checkpoint),
        )

    def complete(
        self, *, now: datetime, holder: str, result: Any = None, summary: str | None = None,
        fence_token: str | None = None,
    ) -> None:
        """The holder finishes the todo: done."""
        self._check_holder(now, holder, fence_token)
        self._record(
            TodoCompleted, timestamp=now, actor=holder, cause="complete",
            summary=cut_utf8(summary, SUMMARY_MAX_BYTES), **result_fields(result),
        )

    def fail(
        self, *, now: datetime, holder: str, result: Any = None, summary: str | None = None,
        fence_token: str | None = None,
    ) -> None:
        """The holder gives up this attempt: retry after backoff, or dead letter on the last."""
        self._check_holder(now, holder, fence_token)
        dead = self.attempt >= MAX_ATTEMPTS
        self._record(
            TodoFailed, timestamp=now, actor=holder, cause="fail",
            summary=cut_utf8(summary, SUMMARY_MAX_BYTES), **result_fields(result),
            next_retry_at=None if dead else now + retry_delay(self.attempt), dead_letter=dead,
        )

    def release(
        self, *, now: datetime, holder: str, summary: str | None = None,
        fence_token: str | None = None, delay: timedelta | None = None,
    ) -> None:
        """The holder hands the todo back: pending again, the attempt stays counted; with a delay
        (a snooze) not claimable until then."""
        self._check_holder(now, holder, fence_token)
        dead = self.attempt >= MAX_ATTEMPTS
        self._record(
            TodoReleased, timestamp=now, actor=holder, cause="release",
            summary=cut_utf8(summary, SUMMARY_MAX_BYTES), outcome="released", dead_letter=dead,
            available_at=now + delay if delay and not dead else None,
        )

    def revoke_lease(self, *, now: datetime, actor: str) -> None:
        """The holder's endpoint was revoked: its lease ends as if released."""
        if self.state != CLAIMED:
            raise Conflict(f"todo {self.todo_id} is {self._state_words()}, not claimed")
        self._record(
            TodoReleased, timestamp=now, actor=actor, cause="endpoint_revoked",
            summary=None, outcome="revoked", dead_letter=self.attempt >= MAX_ATTEMPTS,
        )

    def expire_lease(self, *, now: datetime) -> None:
        """A lapsed lease returns the todo to pending, or dead-letters it on the last attempt."""
        if not self.lease_lapsed(now):
            raise Conflict(f"todo {self.todo_id} has no lapsed lease")
        self._record(
            LeaseExpired, timestamp=now, actor="system", cause="lease_expired",
            dead_letter=self.attempt >= MAX_ATTEMPTS,
        )

    def elapse_delay(self, *, now: datetime) -> None:
        """A delayed or snoozed todo's time has come: claimable (and rung) from now."""
        if not self.delay_due(now):
            raise Conflict(f"todo {self.todo_id} has no delay due")
        self._record(DelayElapsed, timestamp=now, actor="system", cause="delay_elapsed")

    def requeue_due(self, *, now: datetime) -> None:
        """A failed todo whose retry is due becomes pending."""
        if not self.retry_due(now):
            raise Conflict(f"todo {self.todo_id} has no retry due")
        self._record(TodoRequeued, timestamp=now, actor="system", cause="retry_due")

    def retry_now(self, *, now: datetime, actor: str, cause: str = "operator_retry") -> None:
        """An operator revives a failed todo at once, with a fresh budget of attempts (`cause`: a
        bulk retry's bulk-action id, the same on each of its todos)."""
        if self.state != FAILED:
            raise Conflict(f"todo {self.todo_id} is {self._state_words()}, only a failed todo can be retried")
        self._record(
            TodoRequeued, timestamp=now, actor=actor, cause=cause, fresh_budget=True,
        )

    def move_from_quarantine(self, *, now: datetime, actor: str, queue: str) -> None:
        """Releases a pending quarantined todo to a queue (the caller checks the endpoint's scope)."""
        if self.queue != QUARANTINE:
            raise Conflict(f"todo {self.todo_id} is not in quarantine")
        if self.state != PENDING:
            raise Conflict(f"todo {self.todo_id} is {self._state_words()}; only a pending quarantined todo can be released")
        if queue == QUARANTINE:
            raise InvalidArgument("release to a queue other than quarantine")
        self._record(
            TodoMoved, timestamp=now, actor=actor, cause="quarantine_release", queue=queue,
            from_queue=self.queue, endpoint_id=self.endpoint_id, source=self.source, kind=self.kind,
            title=self.title,
        )

    def discard(self, *, now: datetime, actor: str, summary: str | None = None) -> None:
        """Ends a quarantined todo that is not claimed: done, with no result and no retry."""
        if self.queue != QUARANTINE:
            raise Conflict(f"todo {self.todo_id} is not in quarantine")
        if self.state not in WAITING:
            raise Conflict(f"todo {self.todo_id} is {self._state_words()}; only an unclaimed quarantined todo can be discarded")
        self._record(
            TodoDiscarded, timestamp=now, actor=actor, cause="quarantine_discard",
            summary=cut_utf8(summary, SUMMARY_MAX_BYTES),
        )

    # -- invariants

    def _check_holder(self, now: datetime, holder: str, fence_token: str | None) -> None:
        if self.state != CLAIMED:
            raise Conflict(f"todo {self.todo_id} is {self._state_words()}, not claimed")
        check_lease(self.todo_id, held_by=self.holder, expires_at=self.lease_expires_at, fenced_by=self.fence_hash,
                    now=now, holder=holder, fence_token=fence_token)

    def _state_words(self, now: datetime | None = None) -> str:
        if self.state == FAILED:
            return "dead-lettered" if self.dead_letter else "failed awaiting its retry"
        if self.state == PENDING and now is not None and self.available_at is not None and self.available_at > now:
            return f"delayed until {self.available_at.isoformat().replace('+00:00', 'Z')}"
        return self.state

    # -- evolution

    def _end_attempt(self, at: datetime, outcome: str, summary: str | None) -> None:
        self.attempts = (*self.attempts[:-1], self.attempts[-1].closed(at, outcome, summary))
        self.holder = None
        self.claimant = None
        self.lease_expires_at = None
        self.fence_hash = None

    def _mutate(self, event: DomainEvent) -> None:
        match event:
            case TodoOpened():
                self.endpoint_id = event.endpoint_id
                self.queue = event.queue
                self.source = event.source
                self.kind = event.kind
                self.title = event.title
                self.trust_mode = event.trust_mode
                self.payload_ref = event.payload_ref
                self.payload_form = event.payload_form
                self.payload_bytes = event.payload_bytes
                self.payload_size = event.payload_size
                self.idempotency_key = event.idempotency_key
                self.routing = event.routing
                self.delivery_id = event.delivery_id
                self.created_at = event.timestamp
                self.state = PENDING
                self.attempt = 0
                self.attempt_seq = 0
                self.attempts: tuple[Attempt, ...] = ()
                self.trace_id = event.trace_id or self.id.hex
                self.resume_from: Any = None  # the latest checkpoint (LeaseRenewed), across attempts
                self.holder = self.claimant = self.fence_hash = None
                self.lease_expires_at = self.next_retry_at = None
                self.dead_letter = False
                self.result_ref = self.result_bytes = None
                self.updated_at = event.timestamp
                self.available_at = event.not_before or event.timestamp
                self.delayed = event.not_before is not None
            case TodoClaimed():
                self.state = CLAIMED
                self.attempt = event.attempt
                self.attempt_seq = event.attempt_seq
                self.holder = event.holder
                self.claimant = event.claimant
                self.lease_expires_at = event.lease_expires_at
                self.fence_hash = event.fence_hash
                self.next_retry_at = None
                self.available_at = None
                self.delayed = False
                self.attempts = (*self.attempts, Attempt(event.attempt_seq, event.claimant, event.timestamp,
                                                         span_id=event.span_id))
            case LeaseRenewed():
                self.lease_expires_at = event.lease_expires_at
                if event.checkpoint is not None:
                    self.resume_from = event.checkpoint
                    self.attempts = (*self.attempts[:-1], self.attempts[-1].checkpointed(event.checkpoint))
            case TodoCompleted():
                self._end_attempt(event.timestamp, "completed", event.summary)
                self.state = DONE
                self.result_ref, self.result_bytes = event.result_ref, event.result_bytes
                self.available_at = None
            case TodoFailed():
                self._end_attempt(event.timestamp, "failed", event.summary)
                self.state = FAILED
                self.result_ref, self.result_bytes = event.result_ref, event.result_bytes
                self.next_retry_at = event.next_retry_at
                self.dead_letter = event.dead_letter
                self.available_at = event.next_retry_at
            case LeaseExpired():
                self._end_attempt(event.timestamp, "lease_expired", None)
                self._to_pending_or_dead(event.dead_letter, event.timestamp)
            case TodoReleased():
                self._end_attempt(event.timestamp, event.outcome, event.summary)
                self._to_pending_or_dead(event.dead_letter, event.available_at or event.timestamp)
                self.delayed = event.available_at is not None and not event.dead_letter
            case TodoRequeued():
                self.state = PENDING
                self.next_retry_at = None
                self.dead_letter = False
                self.available_at = event.timestamp
                self.delayed = False
                if event.fresh_budget:
                    self.attempt = 0
            case TodoMoved():
                self.queue = event.queue
                self.available_at = event.timestamp
            case TodoDiscarded():
                self.state = DONE
                self.next_retry_at = None
                self.dead_letter = False
                self.result_ref = self.result_bytes = None
                self.available_at = None
                self.delayed = False
            case DelayElapsed():
                self.delayed = False
            case _:  # pragma: no cover - a new event type without a branch is a bug
                raise TypeError(f"Todo cannot apply {type(event).__name__}")
        self.updated_at = event.timestamp

    def _to_pending_or_dead(self, dead_letter: bool, available_at: datetime) -> None:
        self.delayed = False
        if dead_letter:
            self.state = FAILED
            self.dead_letter = True
            self.next_retry_at = None
            self.available_at = None
        else:
            self.state = PENDING
            self.available_at = available_at
