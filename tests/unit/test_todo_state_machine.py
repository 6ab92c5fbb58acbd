"""Random command sequences against a few todos, checked against an independent model.

The model below restates CONTRACT §6 and §11 in a few lines of plain data; it shares no code
with `domain.todo` except the aggregate it drives.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from uuid import UUID

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from domain.errors import Conflict, InvalidArgument
from domain.todo import (
    DelayElapsed,
    QUARANTINE,
    LeaseExpired,
    LeaseRenewed,
    Todo,
    TodoClaimed,
    TodoCompleted,
    TodoDiscarded,
    TodoFailed,
    TodoMoved,
    TodoReleased,
    TodoRequeued,
)
from domain.leases import effective_lease

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
BUDGET = 5
HOLDERS = ("endpoint:alpha-aaaa", "endpoint:beta-bbbb", "operator:admin")
OPERATOR = "operator:admin"
BIG_RESULT = "x" * 70_000

todo_index = st.integers(min_value=0, max_value=5)  # 0-2: that todo; 3-5: one the rule suits, if any
holders = st.sampled_from(HOLDERS)
actors = st.sampled_from(("the holder", "the holder", *HOLDERS))  # who calls a holder command
requested_leases = st.sampled_from([None, 0, -10, 1, 30, 60, 120, 300, 600, 100_000])
token_choices = st.sampled_from(["right", "right", "none", "wrong"])
results = st.sampled_from([None, {"ok": True}, BIG_RESULT])
summaries = st.sampled_from([None, "short", "é" * 1500])


@dataclass
class Model:
    """What a todo should be, written from the contract, not from the aggregate."""

    state: str = "pending"
    queue: str = "work"
    holder: str | None = None
    token: str | None = None
    lease_until: datetime | None = None
    retry_at: datetime | None = None
    dead: bool = False
    attempt: int = 0
    seq: int = 0
    accepted: int = 1  # the opening
    outcomes: list[str] = field(default_factory=list)
    snoozed_until: datetime | None = None  # a release with a delay: pending, not claimable before then
    snoozed: bool = False  # and DelayElapsed not recorded yet

    def claimable(self, now: datetime) -> bool:
        if self.queue == "quarantine":  # nobody claims a quarantined todo: release or discard it
            return False
        if self.state == "pending":
            return self.snoozed_until is None or self.snoozed_until <= now
        return (
            self.state == "failed" and not self.dead and self.retry_at is not None and self.retry_at <= now
        )

    def holds(self, holder: str, token: str | None, now: datetime) -> bool:
        return (
            self.state == "claimed" and self.holder == holder and now < self.lease_until
            and (self.token is None or token == self.token)
        )

    def end_attempt(self, outcome: str) -> None:
        self.outcomes.append(outcome)
        self.holder = self.token = self.lease_until = None

    def back_to_pending_or_dead(self, snooze_until: datetime | None = None) -> None:
        self.snoozed_until, self.snoozed = None, False
        if self.attempt >= BUDGET:
            self.state, self.dead, self.retry_at = "failed", True, None
        else:
            self.state = "pending"
            if snooze_until is not None:
                self.snoozed_until, self.snoozed = snooze_until, True


def model_lease(requested: float | None) -> timedelta:
    if requested is None or requested <= 0:
        return timedelta(seconds=300)
    return timedelta(seconds=min(requested, 86_400))


def model_backoff(attempt: int) -> timedelta:
    return timedelta(seconds=min(30 * 2 ** (attempt - 1), 900))


def aggregate_view(todo: Todo) -> dict:
    return {k: v for k, v in todo.__dict__.items() if k != "_pending"}


class TodoLifecycle(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = T0
        self.todos: list[Todo] = []
        self.models: list[Model] = []
        self.histories: list[list] = []
        self.tokens_issued = 0

    @initialize(count=st.integers(min_value=1, max_value=3), quarantined=st.integers(min_value=0, max_value=4))
    def open_todos(self, count: int, quarantined: int) -> None:
        for n in range(count):
            queue = "quarantine" if n == quarantined else "work"  # a faulted delivery's todo, at times
            todo = Todo.open(
                id=UUID(int=n + 1), now=self.now, actor=OPERATOR, endpoint_id="ep_1", queue=queue,
                source="operator", title=f"todo {n}", trust_mode="operator",
            )
            self.todos.append(todo)
            self.models.append(Model(queue=queue))
            self.histories.append(todo.collect_events())

    # -- driving helpers

    def pick(self, index: int, suits=lambda model: True) -> tuple[Todo, Model, list]:
        candidates = range(len(self.todos))
        if index >= 3:
            candidates = [i for i in candidates if suits(self.models[i])] or candidates
        i = candidates[index % len(candidates)]
        return self.todos[i], self.models[i], self.histories[i]

    def refused(self, todo: Todo, history: list, command, error=Conflict) -> None:
        version = todo.version
        before = aggregate_view(todo)
        try:
            command()
        except error:
            pass
        else:
            raise AssertionError(f"expected {error.__name__}, but the command was accepted")
        assert todo.collect_events() == []
        assert todo.version == version
        assert aggregate_view(todo) == before

    def accepted(self, todo: Todo, model: Model, history: list, command, event_type):
        command()
        events = todo.collect_events()
        assert len(events) == 1, events
        (event,) = events
        assert type(event) is event_type
        assert event.timestamp == self.now
        assert event.originator_version == len(history) + 1
        history.append(event)
        model.accepted += 1
        return event

    def caller(self, model: Model, actor: str) -> str:
        if actor == "the holder":
            return model.holder or HOLDERS[0]
        return actor

    def token_for(self, model: Model, choice: str) -> str | None:
        if choice == "none":
            return None
        if choice == "right":
            return model.token if model.token is not None else "unfenced"
        return "wrong-token"

    # -- rules

    @rule(seconds=st.one_of(st.integers(0, 120), st.integers(120, 1_200), st.just(0)))
    def advance_clock(self, seconds: int) -> None:
        self.now += timedelta(seconds=seconds)

    @rule(index=todo_index, holder=holders, fenced=st.booleans(), requested=requested_leases,
          claimant=st.sampled_from([None, "bot", "ß" * 100]))
    def claim(self, index, holder, fenced, requested, claimant) -> None:
        todo, model, history = self.pick(index, lambda m: m.claimable(self.now))
        token = None
        if fenced:
            self.tokens_issued += 1
            token = f"token-{self.tokens_issued}"
        lease = effective_lease(requested, None)
        assert lease == model_lease(requested)
        command = lambda: todo.claim(  # noqa: E731
            now=self.now, holder=holder, lease=lease, claimant=claimant, fence_token=token,
        )
        if not model.claimable(self.now):
            self.refused(todo, history, command)
            return
        event = self.accepted(todo, model, history, command, TodoClaimed)
        model.state, model.holder, model.token = "claimed", holder, token
        model.lease_until, model.retry_at = self.now + lease, None
        model.snoozed_until, model.snoozed = None, False
        model.attempt += 1
        model.seq += 1
        assert (event.attempt, event.attempt_seq, event.holder) == (model.attempt, model.seq, holder)
        assert event.lease_expires_at == model.lease_until
        assert event.claimant is None or len(event.claimant.encode()) <= 128

    @rule(index=todo_index, holder=actors, choice=token_choices, requested=requested_leases)
    def heartbeat(self, index, holder, choice, requested) -> None:
        todo, model, history = self.pick(index, lambda m: m.state == "claimed")
        holder = self.caller(model, holder)
        token = self.token_for(model, choice)
        lease = model_lease(requested)
        command = lambda: todo.heartbeat(now=self.now, holder=holder, lease=lease, fence_token=token)  # noqa: E731
        if not model.holds(holder, token, self.now):
            self.refused(todo, history, command)
            return
        event = self.accepted(todo, model, history, command, LeaseRenewed)
        model.lease_until = self.now + lease
        assert event.lease_expires_at == model.lease_until

    @rule(index=todo_index, holder=actors, choice=token_choices, result=results, summary=summaries)
    def complete(self, index, holder, choice, result, summary) -> None:
        todo, model, history = self.pick(index, lambda m: m.state == "claimed")
        holder = self.caller(model, holder)
        token = self.token_for(model, choice)
        command = lambda: todo.complete(  # noqa: E731
            now=self.now, holder=holder, result=result, summary=summary, fence_token=token,
        )
        if not model.holds(holder, token, self.now):
            self.refused(todo, history, command)
            return
        if result is BIG_RESULT:
            self.refused(todo, history, command, InvalidArgument)
            return
        event = self.accepted(todo, model, history, command, TodoCompleted)
        assert event.summary is None or len(event.summary.encode()) <= 2048
        model.end_attempt("completed")
        model.state = "done"

    @rule(index=todo_index, holder=actors, choice=token_choices, result=results, summary=summaries)
    def fail(self, index, holder, choice, result, summary) -> None:
        todo, model, history = self.pick(index, lambda m: m.state == "claimed")
        holder = self.caller(model, holder)
        token = self.token_for(model, choice)
        command = lambda: todo.fail(  # noqa: E731
            now=self.now, holder=holder, result=result, summary=summary, fence_token=token,
        )
        if not model.holds(holder, token, self.now):
            self.refused(todo, history, command)
            return
        if result is BIG_RESULT:
            self.refused(todo, history, command, InvalidArgument)
            return
        event = self.accepted(todo, model, history, command, TodoFailed)
        model.end_attempt("failed")
        model.state = "failed"
        if model.attempt >= BUDGET:
            model.dead, model.retry_at = True, None
        else:
            model.retry_at = self.now + model_backoff(model.attempt)
        assert (event.dead_letter, event.next_retry_at) == (model.dead, model.retry_at)

    @rule(index=todo_index, holder=actors, choice=token_choices, summary=summaries,
          snooze=st.one_of(st.none(), st.integers(1, 900)))
    def release(self, index, holder, choice, summary, snooze) -> None:
        todo, model, history = self.pick(index, lambda m: m.state == "claimed")
        holder = self.caller(model, holder)
        token = self.token_for(model, choice)
        delay = timedelta(seconds=snooze) if snooze else None
        command = lambda: todo.release(now=self.now, holder=holder, summary=summary, fence_token=token,  # noqa: E731
                                       delay=delay)
        if not model.holds(holder, token, self.now):
            self.refused(todo, history, command)
            return
        event = self.accepted(todo, model, history, command, TodoReleased)
        assert event.outcome == "released"
        model.end_attempt("released")
        model.back_to_pending_or_dead(self.now + delay if delay else None)
        assert event.available_at == model.snoozed_until

    @rule(index=todo_index)
    def elapse_delay(self, index) -> None:
        todo, model, history = self.pick(index, lambda m: m.snoozed)
        command = lambda: todo.elapse_delay(now=self.now)  # noqa: E731
        if not (model.state == "pending" and model.snoozed and model.snoozed_until <= self.now):
            self.refused(todo, history, command)
            return
        self.accepted(todo, model, history, command, DelayElapsed)
        model.snoozed = False

    @rule(index=todo_index)
    def revoke_the_holder(self, index) -> None:
        todo, model, history = self.pick(index, lambda m: m.state == "claimed")
        command = lambda: todo.revoke_lease(now=self.now, actor=OPERATOR)  # noqa: E731
        if model.state != "claimed":
            self.refused(todo, history, command)
            return
        event = self.accepted(todo, model, history, command, TodoReleased)
        assert event.outcome == "revoked"
        model.end_attempt("revoked")
        model.back_to_pending_or_dead()

    @rule(index=todo_index)
    def expire_lease(self, index) -> None:
        todo, model, history = self.pick(index, lambda m: m.state == "claimed")
        command = lambda: todo.expire_lease(now=self.now)  # noqa: E731
        if not (model.state == "claimed" and model.lease_until <= self.now):
            self.refused(todo, history, command)
            return
        self.accepted(todo, model, history, command, LeaseExpired)
        model.end_attempt("lease_expired")
        model.back_to_pending_or_dead()

    @rule(index=todo_index)
    def requeue_due(self, index) -> None:
        todo, model, history = self.pick(index, lambda m: m.state == "failed")
        command = lambda: todo.requeue_due(now=self.now)  # noqa: E731
        if not (model.state == "failed" and not model.dead and model.retry_at <= self.now):
            self.refused(todo, history, command)
            return
        event = self.accepted(todo, model, history, command, TodoRequeued)
        assert event.fresh_budget is False
        model.state, model.retry_at = "pending", None

    @rule(index=todo_index)
    def operator_retry(self, index) -> None:
        todo, model, history = self.pick(index, lambda m: m.state == "failed")
        command = lambda: todo.retry_now(now=self.now, actor=OPERATOR)  # noqa: E731
        if model.state != "failed":
            self.refused(todo, history, command)
            return
        event = self.accepted(todo, model, history, command, TodoRequeued)
        assert event.fresh_budget is True
        model.state, model.retry_at, model.dead, model.attempt = "pending", None, False, 0

    @rule(index=todo_index, queue=st.sampled_from(["work", "other", QUARANTINE]))
    def release_from_quarantine(self, index, queue) -> None:
        todo, model, history = self.pick(index, lambda m: m.queue == "quarantine")
        command = lambda: todo.move_from_quarantine(now=self.now, actor=OPERATOR, queue=queue)  # noqa: E731
        if model.queue != "quarantine" or model.state != "pending":
            self.refused(todo, history, command)
            return
        if queue == QUARANTINE:
            self.refused(todo, history, command, InvalidArgument)
            return
        event = self.accepted(todo, model, history, command, TodoMoved)
        assert (event.from_queue, event.queue) == (QUARANTINE, queue)
        model.queue = queue

    @rule(index=todo_index)
    def discard_from_quarantine(self, index) -> None:
        todo, model, history = self.pick(index, lambda m: m.queue == "quarantine")
        command = lambda: todo.discard(now=self.now, actor=OPERATOR, summary="noise")  # noqa: E731
        if model.queue != "quarantine" or model.state not in ("pending", "failed"):
            self.refused(todo, history, command)
            return
        self.accepted(todo, model, history, command, TodoDiscarded)
        model.state, model.retry_at, model.dead = "done", None, False

    @rule(index=todo_index, fenced=st.booleans())
    def bring_a_todo_to_its_last_attempt(self, index, fenced) -> None:
        """Spends the budget but one in a single step and claims the last attempt, so the
        random commands that follow often decide a 5th attempt."""
        index %= len(self.todos)
        _, model, _ = self.pick(index)
        if model.state != "pending" or not model.claimable(self.now):  # quarantined or snoozed
            return
        while model.attempt < BUDGET - 1:
            self.claim(index, HOLDERS[0], False, 60, None)
            self.fail(index, "the holder", "none", None, None)
            self.now = model.retry_at
            self.requeue_due(index)
        self.claim(index, HOLDERS[0], fenced, 300, "last")
        assert (model.state, model.attempt) == ("claimed", BUDGET)

    # -- invariants

    @invariant()
    def a_todo_has_at_most_one_live_lease(self) -> None:
        for todo in self.todos:
            claimed = todo.state == "claimed"
            assert claimed == (todo.holder is not None) == (todo.lease_expires_at is not None)
            assert todo.fence_hash is None or claimed
            open_attempts = [a for a in todo.attempts if a.ended_at is None]
            assert len(open_attempts) == (1 if claimed else 0)
            assert not open_attempts or open_attempts[0] is todo.attempts[-1]

    @invariant()
    def the_attempt_never_exceeds_the_budget(self) -> None:
        for todo in self.todos:
            assert 0 <= todo.attempt <= BUDGET

    @invariant()
    def a_dead_letter_is_never_claimable(self) -> None:
        for todo in self.todos:
            if todo.dead_letter:
                assert todo.state == "failed" and todo.next_retry_at is None
                for later in (self.now, self.now + timedelta(days=365)):
                    assert not todo.is_claimable(later)
                    assert not todo.retry_due(later)

    @invariant()
    def attempt_seqs_count_every_claim_and_are_never_reused(self) -> None:
        for todo in self.todos:
            assert [a.seq for a in todo.attempts] == list(range(1, todo.attempt_seq + 1))
            closed = [a.outcome for a in todo.attempts if a.ended_at is not None]
            assert set(closed) <= {"completed", "failed", "released", "lease_expired", "revoked"}

    @invariant()
    def replaying_the_history_rebuilds_the_live_todo(self) -> None:
        for todo, history in zip(self.todos, self.histories):
            assert todo.pending_events == ()
            assert [e.originator_version for e in history] == list(range(1, len(history) + 1))
            assert aggregate_view(Todo.replay(history)) == aggregate_view(todo)

    @invariant()
    def every_accepted_transition_appended_exactly_one_event(self) -> None:
        for todo, model, history in zip(self.todos, self.models, self.histories):
            assert todo.version == len(history) == model.accepted

    @invariant()
    def the_model_and_the_aggregate_agree(self) -> None:
        for todo, model in zip(self.todos, self.models):
            assert todo.state == model.state
            assert todo.queue == model.queue
            assert todo.holder == model.holder
            assert todo.lease_expires_at == model.lease_until
            assert todo.next_retry_at == model.retry_at
            assert todo.dead_letter == model.dead
            assert todo.attempt == model.attempt
            assert todo.attempt_seq == model.seq
            assert todo.is_claimable(self.now) == model.claimable(self.now)
            assert [a.outcome for a in todo.attempts if a.ended_at is not None] == model.outcomes


TodoLifecycle.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
test_the_todo_lifecycle_keeps_its_invariants_under_random_commands = TodoLifecycle.TestCase
