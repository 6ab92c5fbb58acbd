"""A todo's story in plain sentences, from its events alone (CONTRACT §14 Explain).

`explain` is pure: given the todo's stream, the delivery that opened it (if any), its endpoint's
stream and `now`, it tells where the todo came from, each attempt (who, when, how it ended, its
summary, the checkpoints saved and the one a claim resumed from) and *because*: why the todo is in
its present state now; `attempts` lists them as every full todo does (CONTRACT §18). Loading the events and deciding
who may read them is the query's business (`Switchboard.explain`); the edges only present it.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from application.ports import Recorded
from application.presenters import attempt_view, iso
from domain.delivery import DeliveryAccepted, delivery_id_of
from domain.endpoint import EndpointRevoked, EndpointVended, QueueControlsSet
from domain.events import SYSTEM, DomainEvent
from domain.names import QUARANTINE
from domain.queue import Refusal
from domain.todo import (
    CLAIMED, DONE, ENDS_A_CLAIM, FAILED, MAX_ATTEMPTS, PENDING, DelayElapsed, LeaseExpired, LeaseRenewed, Todo, TodoClaimed, TodoCompleted,
    TodoDiscarded, TodoFailed, TodoMoved, TodoOpened, TodoReleased, TodoRequeued,
)

OPERATOR_RETRY = "operator_retry"
SUMMARY_QUOTED_CHARS = 200  # a summary longer than this is quoted cut, with an ellipsis


def who(actor: str) -> str:
    """An event's actor as a person reads it: `endpoint worker-ab12`, `admin`, `the CLI`, `Switchboard`."""
    kind, _, name = actor.partition(":")
    if actor == SYSTEM:
        return "Switchboard"
    if kind == "operator":
        return "the CLI" if name == "cli" else name
    if kind == "endpoint":
        return f"endpoint {name}"
    return actor


def ordinal(n: int) -> str:
    """1st, 2nd, 3rd, 4th, … 11th, 12th, 13th, 21st."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def quoted(summary: str | None) -> str:
    """A summary in quotes on one line (cut past 200 characters), or nothing."""
    if not summary:
        return ""
    line = " ".join(summary.split())
    if len(line) > SUMMARY_QUOTED_CHARS:
        line = line[: SUMMARY_QUOTED_CHARS - 1] + "…"
    return f"“{line}”"


def _said(summary: str | None) -> str:
    text = quoted(summary)
    return f": {text}" if text else ""


def rule_named(trace: dict[str, Any]) -> str:
    """`rule 2 (triage)`: numbered from 1, as people count (`rule_index` counts from 0)."""
    index, rule_id = trace.get("rule_index"), trace.get("rule_id")
    number = f"rule {index + 1}" if isinstance(index, int) and not isinstance(index, bool) else "a rule"
    return f"{number} ({rule_id})" if rule_id else number


def routed_by(trace: dict[str, Any] | None) -> str:
    """How the routing trace sent the delivery where it went, as a clause."""
    if not trace:
        return ""
    stage = trace.get("stage")
    if stage == "rule":
        if (trace.get("action") or {}).get("quarantine") is True:
            return f"{rule_named(trace)} holds it in quarantine"
        return f"routed by {rule_named(trace)}"
    if stage == "default":
        return "no rule matched, so the default action routed it"
    if stage == "fault":
        reason = trace.get("reason", "error")
        detail = f": {trace['detail']}" if trace.get("detail") else ""
        where = rule_named(trace) if "rule_index" in trace or "rule_id" in trace else "the rules"
        return f"{where} faulted ({reason}{detail}), so it is held in quarantine"
    if stage == "untrusted":
        return f"{_untrusted(trace)}, so it is held in quarantine"
    return f"routing stage {stage}" if stage else ""


def _untrusted(trace: dict[str, Any]) -> str:
    actor = trace.get("actor") or {}
    sender, association = actor.get("sender"), actor.get("association")
    by = f" by {trace['webhook_id']}" if trace.get("webhook_id") else ""
    named = f"sender {sender}" if sender else "the sender (none named)"
    as_what = f" (association {association})" if association else ""
    return f"{named} is not trusted{by}{as_what}"


def held_because(trace: dict[str, Any] | None, delivery_id: str | None) -> str:
    """Why a todo sits in quarantine, from its routing trace."""
    trace = trace or {}
    stage = trace.get("stage")
    on = f" on delivery {delivery_id}" if delivery_id else ""
    if stage == "untrusted":
        return f"held: {_untrusted(trace)}; an operator releases or discards it"
    if stage == "fault":
        reason = trace.get("reason", "error")
        detail = f": {trace['detail']}" if trace.get("detail") else ""
        return (f"held: {rule_named(trace) if 'rule_index' in trace or 'rule_id' in trace else 'the rules'} "
                f"faulted ({reason}{detail}){on}; an operator releases or discards it")
    if stage in ("rule", "default"):
        return f"held: {rule_named(trace) if stage == 'rule' else 'the default action'} holds it in quarantine{on}; an operator releases or discards it"
    return "held in quarantine; an operator releases or discards it"


class _Story:
    """The sentences, one per event (successive lease renewals are told as one)."""

    def __init__(self) -> None:
        self.lines: list[dict[str, Any]] = []

    def tell(self, recorded: Recorded, text: str) -> None:
        self.lines.append({"position": recorded.position, "time": iso(recorded.event.timestamp), "text": text})


def explain(
    todo_stream: Sequence[Recorded], *, now: datetime, delivery: Sequence[Recorded] = (),
    endpoint_stream: Sequence[Recorded] = (), held: Refusal | None = None,
) -> dict[str, Any]:
    """`{state, because, story: [{position, time, text}]}` for one todo, from the events alone.

    `delivery` is the stream of the delivery that opened the todo (empty for a push);
    `endpoint_stream` is its endpoint's (its slug, revocation and expiry). `now` decides only
    what the clock decides: whether a lease has lapsed or a retry is due. `held` is the one fact
    not in these events: what its queue's limits refuse at `now` (max_in_flight, rate), which the
    *because* of a todo claimable but for them adds; the story stays the events'."""
    todo = Todo.replay([r.event for r in todo_stream])
    if todo is None:
        raise ValueError("a todo's story needs its events")
    endpoint = _endpoint_facts(endpoint_stream)
    story = _Story()
    _tell_todo(story, todo_stream, endpoint, _delivery_facts(delivery))
    opened_at = todo_stream[0].position
    queues = {r.event.queue for r in todo_stream if isinstance(r.event, TodoOpened | TodoMoved)}
    finished_at = todo_stream[-1].position if todo.state == DONE or todo.dead_letter else None
    for recorded in endpoint_stream:
        if recorded.position < opened_at or (finished_at is not None and recorded.position > finished_at):
            continue
        match recorded.event:
            case EndpointRevoked():
                story.tell(recorded, f"Endpoint {endpoint['slug']} was revoked by {who(recorded.event.actor)}.")
            case QueueControlsSet(queue=queue) if queue in queues:
                story.tell(recorded, _controls_text(recorded.event))
    story.lines.sort(key=lambda line: line["position"])
    return {"state": todo.state, "because": _because(todo, todo_stream, endpoint, now, held), "story": story.lines,
            "attempts": [attempt_view(todo, a) for a in todo.attempts]}


def _controls_text(event: QueueControlsSet) -> str:
    """`Queue q was paused by admin (at most 3 in flight).`: the controls as an operator set them."""
    limits = [f"at most {event.max_in_flight} in flight"] if event.max_in_flight is not None else []
    if event.max_claims_per_minute is not None:
        limits.append(f"at most {event.max_claims_per_minute} claims a minute")
    state = "paused" if event.paused else "running"
    return (f"Queue {event.queue} was set by {who(event.actor)}: {state}, "
            f"{', '.join(limits) if limits else 'no limits'}.")


def _endpoint_facts(endpoint_stream: Sequence[Recorded]) -> dict[str, Any]:
    facts: dict[str, Any] = {"slug": None, "revoked_at": None, "revoked_by": None, "expires_at": None,
                             "paused": {}}
    for recorded in endpoint_stream:
        match recorded.event:
            case EndpointVended(slug=slug, expires_at=expires_at):
                facts["slug"], facts["expires_at"] = slug, expires_at
            case EndpointRevoked(timestamp=at, actor=actor):
                facts["revoked_at"], facts["revoked_by"] = at, actor
            case QueueControlsSet(queue=queue, paused=paused, actor=actor, timestamp=at):
                facts["paused"] = {**facts["paused"], queue: (actor, at) if paused else None}
    return facts


def _delivery_facts(delivery: Sequence[Recorded]) -> tuple[str, str]:
    """`to webhook wh_…, the sender's delivery id …, signed and verified`: what the stored delivery adds."""
    for recorded in delivery:
        if isinstance(event := recorded.event, DeliveryAccepted):
            checked = "signed and verified" if event.verified else f"not signed (trust mode {event.trust_mode})"
            return (f" to webhook {event.webhook_id}", f", the sender's delivery id {delivery_id_of(event.delivery_key)}, "
                    f"{checked}")
    return ("", "")


def _tell_todo(story: _Story, stream: Sequence[Recorded], endpoint: dict[str, Any],
               delivered: tuple[str, str]) -> None:
    attempt = seq = 0
    holder: str | None = None
    lease_until: datetime | None = None
    renewals: list[Recorded] = []

    checkpoint: tuple[int, datetime] | None = None  # (attempt, when) of the latest checkpoint

    def flush_renewals() -> None:
        if renewals:
            story.tell(renewals[-1], _renewals_text(renewals))
            renewals.clear()

    def ended(text: str, dead: bool) -> str:
        if dead:
            return f"{text} That was the {ordinal(attempt)} attempt of {MAX_ATTEMPTS}: dead letter."
        return text

    for recorded in stream:
        event = recorded.event
        if not isinstance(event, LeaseRenewed):
            flush_renewals()
        match event:
            case TodoOpened():
                story.tell(recorded, _opened_text(event, endpoint, delivered))
            case TodoClaimed():
                attempt, seq, holder, lease_until = event.attempt, event.attempt_seq, event.holder, event.lease_expires_at
                story.tell(recorded, _claimed_text(event, checkpoint))
            case LeaseRenewed():
                lease_until = event.lease_expires_at
                renewals.append(recorded)
                if event.checkpoint is not None:
                    checkpoint = (attempt, event.timestamp)
            case TodoCompleted():
                result = " with a result" if event.result is not None or event.result_ref is not None else ""
                story.tell(recorded, f"Attempt {attempt} was completed by {who(event.actor)}{result}{_said(event.summary)}.")
            case TodoFailed():
                text = f"Attempt {attempt} failed ({who(event.actor)}){_said(event.summary)}."
                if not event.dead_letter and event.next_retry_at is not None:
                    text += f" Retry at {iso(event.next_retry_at)}."
                story.tell(recorded, ended(text, event.dead_letter))
            case LeaseExpired():
                by = f" held by {who(holder)}" if holder else ""
                text = f"The lease of attempt {attempt}{by} lapsed (it ran to {iso(lease_until)})."
                story.tell(recorded, ended(text if event.dead_letter else f"{text} Pending again.", event.dead_letter))
            case TodoReleased(outcome="revoked"):
                text = f"Attempt {attempt} ended when endpoint {endpoint['slug']} was revoked ({who(event.actor)})."
                story.tell(recorded, ended(text if event.dead_letter else f"{text} Pending again.", event.dead_letter))
            case TodoReleased():
                text = f"Attempt {attempt} was released by {who(event.actor)}{_said(event.summary)}."
                again = (f"{text} Pending, but not claimable until {iso(event.available_at)} (a delay)."
                         if event.available_at is not None else f"{text} Pending again.")
                story.tell(recorded, ended(text if event.dead_letter else again, event.dead_letter))
            case DelayElapsed():
                story.tell(recorded, "Its delay ended: claimable again.")
            case TodoRequeued(fresh_budget=True):
                bulk = "" if event.cause == OPERATOR_RETRY else f" (bulk retry {event.cause})"
                attempt = 0
                story.tell(recorded, f"Retried by {who(event.actor)}{bulk} with a fresh budget of "
                                     f"{MAX_ATTEMPTS} attempts: pending again.")
            case TodoRequeued():
                story.tell(recorded, f"Its retry fell due: pending again, for attempt {attempt + 1} of {MAX_ATTEMPTS}.")
            case TodoMoved():
                story.tell(recorded, f"Released from {event.from_queue} to queue {event.queue} by {who(event.actor)}.")
            case TodoDiscarded():
                story.tell(recorded, f"Discarded from quarantine by {who(event.actor)}{_said(event.summary)}: done, with no work.")
            case _:  # pragma: no cover - a new todo event without words is a bug (Todo.replay refuses it first)
                raise TypeError(f"no words for {type(event).__name__}")
        if isinstance(event, ENDS_A_CLAIM):
            holder, lease_until = None, None
    flush_renewals()


def _claimed_text(event: TodoClaimed, checkpoint: tuple[int, datetime] | None) -> str:
    """`Attempt 2 of 5 was claimed by …, lease until …; it resumes from the checkpoint attempt 1 saved at …`."""
    overall = f" (claim {event.attempt_seq} overall)" if event.attempt_seq != event.attempt else ""
    claimant = f" as {quoted(event.claimant)}" if event.claimant else ""
    fenced = ", fenced" if event.fence_hash else ""
    if event.admitted_under:
        fenced += f", admitted under the queue's limits {_limits(event.admitted_under)}"
    resumes = (f"; it resumes from the checkpoint attempt {checkpoint[0]} saved at {iso(checkpoint[1])}"
               if checkpoint is not None else "")
    return (f"Attempt {event.attempt} of {MAX_ATTEMPTS}{overall} was claimed by {who(event.holder)}{claimant}, "
            f"lease until {iso(event.lease_expires_at)}{fenced}{resumes}.")


def _renewals_text(renewals: Sequence[Recorded]) -> str:
    """`The lease was extended 3 times, last by … to …, saving 2 checkpoints.`: successive renewals as one."""
    last = renewals[-1]
    times = "" if len(renewals) == 1 else f" {len(renewals)} times, last"
    saved = sum(1 for r in renewals if r.event.checkpoint is not None)
    saving = "" if not saved else ", saving a checkpoint" if saved == 1 else f", saving {saved} checkpoints"
    return f"The lease was extended{times} by {who(last.event.actor)} to {iso(last.event.lease_expires_at)}{saving}."


def _opened_text(event: TodoOpened, endpoint: dict[str, Any], delivered: tuple[str, str]) -> str:
    where = f"endpoint {endpoint['slug'] or event.endpoint_id}, queue {event.queue}"
    kind = f", kind {event.kind}" if event.kind else ""
    if event.delivery_id:
        how = routed_by(event.routing)
        webhook, facts = delivered
        text = f"Opened on {where}, from delivery {event.delivery_id}{webhook} (source {event.source}{kind}{facts})"
        return f"{text}: {how}." if how else f"{text}."
    key = f", idempotency key {quoted(event.idempotency_key)}" if event.idempotency_key else ""
    later = f" Not claimable before {iso(event.not_before)}." if event.not_before is not None else ""
    return f"Pushed by {who(event.actor)} to {where} (source {event.source}{kind}{key}).{later}"


def _because(todo: Todo, stream: Sequence[Recorded], endpoint: dict[str, Any], now: datetime,
             held: Refusal | None) -> str:
    last = stream[-1].event
    if todo.state == DONE:
        if isinstance(last, TodoDiscarded):
            return f"done: discarded from quarantine by {who(last.actor)} at {iso(last.timestamp)}{_said(last.summary)}"
        closed = todo.attempts[-1] if todo.attempts else None
        return (f"done: attempt {todo.attempt} was completed by {who(last.actor)} at {iso(last.timestamp)}"
                f"{_said(closed.summary if closed else None)}")
    if todo.state == FAILED and todo.dead_letter:
        nth = f"the {ordinal(todo.attempt)} attempt"
        match last:
            case LeaseExpired():
                how = f"{nth}'s lease lapsed at {iso(last.timestamp)}"
            case TodoReleased(outcome="revoked"):
                how = f"{nth} ended at {iso(last.timestamp)} when endpoint {endpoint['slug']} was revoked"
            case TodoReleased():
                how = f"{nth} was released at {iso(last.timestamp)} with no attempts left{_said(last.summary)}"
            case _:
                how = f"{nth} failed at {iso(last.timestamp)}{_said(getattr(last, 'summary', None))}"
        return f"dead letter: {how}; only an operator's retry revives it"
    revoked = _revoked(endpoint, now)
    if todo.state == FAILED:
        failed = todo.attempts[-1] if todo.attempts else None
        after = f"attempt {todo.attempt} failed at {iso(failed.ended_at)}{_said(failed.summary)}" if failed else "it failed"
        if todo.next_retry_at is not None and todo.next_retry_at <= now:
            return f"failed, retry due since {iso(todo.next_retry_at)} (Switchboard makes it pending within a second): {after}"
        return f"failed, awaiting its retry at {iso(todo.next_retry_at)}: {after}{revoked}"
    if todo.state == CLAIMED:
        claimant = f" ({quoted(todo.claimant)})" if todo.claimant else ""
        since = todo.attempts[-1].claimed_at if todo.attempts else None
        text = f"claimed by {who(todo.holder)}{claimant} since {iso(since)}, attempt {todo.attempt} of {MAX_ATTEMPTS}"
        if todo.lease_lapsed(now):
            return f"{text}; its lease lapsed at {iso(todo.lease_expires_at)} and Switchboard ends it within a second"
        return f"{text}; lease until {iso(todo.lease_expires_at)}"
    if todo.queue == QUARANTINE:
        return held_because(todo.routing, todo.delivery_id)
    delayed = _delayed(todo, stream, now)
    if delayed:
        return f"{delayed}{revoked}"
    paused = endpoint["paused"].get(todo.queue)
    if paused is not None and not revoked:
        return (f"pending, but queue {todo.queue} paused by {who(paused[0])} at {iso(paused[1])}: "
                "no claim is admitted until it is resumed")
    return f"pending: {_pending_since(todo, last)}{revoked or _held(todo.queue, held, now)}"


def _held(queue: str, held: Refusal | None, now: datetime) -> str:
    """`; but queue q has 2 todos claimed (max_in_flight 2), so …`: what the queue's limits hold
    back at `now`, and until when."""
    if held is None:
        return ""
    if held.retry_after is not None:  # a rate: its window frees a place then
        until = f"no claim is admitted before {iso(now + held.retry_after)}"
    else:  # max_in_flight (a pause is told from the events, never given here)
        until = f"no claim is admitted until {'it' if held.load == 1 else 'one of them'} ends"
    return f"; but queue {queue} {held.words}, so {until}"


def _delayed(todo: Todo, stream: Sequence[Recorded], now: datetime) -> str:
    """`not claimable until …: released with a delay by …` while a delay runs, else nothing."""
    if todo.state != PENDING or not todo.delayed or todo.available_at is None:
        return ""
    setter = next(r.event for r in reversed(stream) if isinstance(r.event, TodoOpened | TodoReleased))
    how = (f"released with a delay by {who(setter.actor)} at {iso(setter.timestamp)}"
           if isinstance(setter, TodoReleased) else f"pushed by {who(setter.actor)} with not_before")
    if todo.available_at <= now:
        return f"pending: its delay ended at {iso(todo.available_at)} ({how}); Switchboard marks it claimable within a second"
    return f"not claimable until {iso(todo.available_at)}: {how}"


def _pending_since(todo: Todo, last: DomainEvent) -> str:
    at = iso(last.timestamp)
    match last:
        case TodoOpened(delivery_id=None):
            return f"claimable since it was pushed at {at}"
        case TodoOpened():
            return f"claimable since it was opened from delivery {last.delivery_id} at {at}"
        case TodoReleased(outcome="revoked"):
            return f"claimable since {at}, when its holder's endpoint was revoked"
        case TodoReleased():
            return f"claimable since {who(last.actor)} released attempt {todo.attempt} at {at}"
        case LeaseExpired():
            return f"claimable since the lease of attempt {todo.attempt} lapsed at {at}"
        case TodoRequeued(fresh_budget=True):
            return f"claimable since {who(last.actor)} retried it with a fresh budget at {at}"
        case TodoRequeued():
            return f"claimable since its retry fell due at {at}"
        case TodoMoved():
            return f"claimable since {who(last.actor)} released it from quarantine to queue {last.queue} at {at}"
        case DelayElapsed():
            return f"claimable since its delay ended at {at}"
    return f"claimable since {at}"


def _limits(controls: dict[str, Any]) -> str:
    shown = [f"{name} {value}" for name, value in controls.items() if value is not None]
    return f"({', '.join(shown)})" if shown else ""


def _revoked(endpoint: dict[str, Any], now: datetime) -> str:
    if endpoint["revoked_at"] is not None:
        return (f"; but endpoint {endpoint['slug']} was revoked by {who(endpoint['revoked_by'])} at "
                f"{iso(endpoint['revoked_at'])}, so none of its agents can claim it")
    if endpoint["expires_at"] is not None and endpoint["expires_at"] <= now:
        return (f"; but endpoint {endpoint['slug']} expired at {iso(endpoint['expires_at'])}, "
                "so none of its agents can claim it")
    return ""
