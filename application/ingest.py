"""Ingest: one delivery to a webhook URL, verified, routed by its rules, recorded.

Ingest does its slow, refusable work (token lookup, signature, rule evaluation in a worker
process) before the write side, so a refused delivery leaves no trace; then ONE command
appends the DeliveryAccepted event with every todo it mints (all or nothing), and the 202
is sent only after that append is durable.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any
from uuid import UUID, uuid4

from application.access import holder_of, webhook_uuid
from application.ports import Clock, EventStore, RuleEngine, SecretBox, UnitOfWork, Views
from application.rules import rule_set_of
from application.todos import open_or_reuse
from domain.bodies import parse_payload_form
from domain.delivery import DELIVERY_PREFIX, Delivery
from domain.endpoint import Endpoint, endpoint_uuid_of
from domain.envelopes import envelope
from domain.errors import DomainError, NotFound
from domain.events import Aggregate
from domain.idempotency import IdempotencyKey, key_uuid
from domain.ingest import BODY_ID_FIELDS, delivery_id, delivery_kind, handshake_challenge, redact_headers
from domain.names import QUARANTINE, TODO_PREFIX, parse_id
from domain.once import OnceKey, once_uuid
from domain.payloads import ref_of
from domain.routing import Decision, NoMatch, decide, repeat_trace
from domain.rule_set import RuleSet
from domain.signatures import check_single_signatures, trust_of, verify_signature
from domain.subjects import subject_of
from domain.titles import derive_title
from domain.todo import Todo
from domain.trust import Actor
from domain.webhook import Webhook


MEMO_SIZE = 10_000
INLINE_BODY = 64 * 1024  # larger bodies are verified and parsed off the event loop (~0.1 ms per 10 KB)
_TOKEN = re.compile(r"[0-9a-f]{32}")


class StaleCopy(Exception):
    """Raised when a delivery decided on kept copies of its webhook and endpoints may have been
    decided wrongly: its command, run again on fresh state, found one changed, or the copies
    refused it. Ingest then reads them and decides again."""


class WouldWait(Exception):
    """Raised by a delivery prepared `inline` (on an event loop) at the first step that would wait."""


@contextmanager
def _confirmed_afresh(decided_on: tuple[tuple[UUID, int], ...]) -> Iterator[None]:
    """A refusal decided on copies becomes `StaleCopy` (refused only if fresh state refuses it too)."""
    try:
        yield
    except DomainError:
        if decided_on:
            raise StaleCopy("refused on kept copies; to be decided on fresh state") from None
        raise


@dataclass(frozen=True)
class Command:
    """A decided delivery: the handler that records it, what was read for it, and what its
    handler's answer makes of it."""

    handler: Callable[[UnitOfWork], tuple[list[dict[str, Any]], bool]]
    hints: dict[UUID, Any]
    done: Callable[[tuple[list[dict[str, Any]], bool]], Ingested]


@dataclass(frozen=True)
class Ingested:
    """What one accepted delivery did: the todos it opened or found (as its event records them)."""

    todos: list[dict[str, Any]]
    verified: bool
    trust_mode: str
    event_id: str
    decision: Decision
    repeat: bool = False  # `once` found a live todo for the subject (on some target)


@dataclass(frozen=True)
class Handshake:
    """A sender's verified handshake (Slack's `url_verification`): answered with its challenge;
    nothing is routed or stored (docs/adr/0039)."""

    challenge: str


def _delivery_key(webhook_id: str, headers: Mapping[str, str], source_type: str, parsed: object | None,
                  body: bytes) -> str:
    """The idempotency key of a delivery: the webhook, then the sender's delivery id."""
    return f"{webhook_id}:{delivery_id(headers, source_type, parsed, body)}"


class Ingest:
    def __init__(self, store: EventStore, views: Views, clock: Clock, engine: RuleEngine, box: SecretBox) -> None:
        self.store = store
        self.views = views
        self.clock = clock
        self.engine = engine
        self.box = box
        self._located: dict[str, tuple[UUID, UUID]] = {}
        # per webhook, what its last loaded version said: source type, id and targets (owner, then
        # routes), so one read fetches the webhook, its endpoints and the idempotency keys together
        self._shapes: dict[UUID, tuple[str, str, tuple[str, ...]]] = {}
        self._rule_sets: dict[tuple[UUID, int], RuleSet] = {}
        # per webhook, the copies of it and its endpoints (owner, then routes) its last read gave:
        # a delivery is decided on them without a read, and its append checks they are still
        # current (`DeliveryAccepted.decided_on`, docs/adr/0031)
        self._copies: dict[UUID, dict[UUID, Aggregate | None]] = {}

    def _load(self, wanted: list[tuple[type[Aggregate], UUID]], inline: bool) -> dict[UUID, Aggregate | None]:
        if not wanted:
            return {}
        if inline:
            raise WouldWait("a read of the store")
        return self.store.load_many(wanted)

    def _locate(self, digest: str, inline: bool = False) -> tuple[UUID, UUID] | None:
        """(webhook, owner endpoint) ids for a token hash; the pairing never changes, so it is memoised."""
        located = self._located.get(digest)
        if located is not None:
            return located
        if inline:
            raise WouldWait("a read of the token index")
        holder = holder_of(self.views, digest, "webhook")
        if holder is None:
            return None
        webhook = self.store.load(Webhook, webhook_uuid(holder))
        if webhook is None:
            return None
        if len(self._located) >= MEMO_SIZE:
            self._located.clear()
        located = self._located[digest] = (webhook.id, endpoint_uuid_of(webhook.endpoint_id))
        return located

    def resolve(self, token: str, *, headers: Mapping[str, str] | None = None, body: bytes = b"",
                copies: bool = False,
                inline: bool = False) -> tuple[Webhook, Endpoint, dict[UUID, Any], tuple[tuple[UUID, int], ...]]:
        """The live webhook whose current URL carries this token, its owner, what was read, and
        the streams decided on from copies (with their versions; none when all was read now).

        Given a delivery's (lowered) headers and body, the same read also fetches the
        idempotency keys it will name, as far as the webhook's last seen version predicts them:
        one round trip per delivery while nothing changes (`ingest` reads what a stale guess missed).
        With `copies`, the webhook and its endpoints are the copies the last read of them gave,
        and the keys are taken as absent, without a read: a key that exists makes the append lose
        its race, and the command runs again on fresh state.
        """
        if not _TOKEN.fullmatch(token or ""):
            raise NotFound("unknown webhook")
        digest = hashlib.sha256(token.encode()).hexdigest()
        located = self._locate(digest, inline)
        if located is None:
            raise NotFound("unknown webhook")
        webhook_id_, owner_id = located
        wanted: list[tuple[type[Aggregate], UUID]] = [(Webhook, webhook_id_), (Endpoint, owner_id)]
        shape = self._shapes.get(webhook_id_)
        if shape is not None:
            source_type, webhook_id, targets = shape
            wanted.extend((Endpoint, endpoint_uuid_of(t)) for t in targets[1:])
            if headers is not None and source_type not in BODY_ID_FIELDS:  # those ids are in the body
                key = _delivery_key(webhook_id, headers, source_type, None, body)
                wanted.extend((IdempotencyKey, key_uuid(t, key)) for t in targets)
        kept = self._copies.get(webhook_id_) if copies and shape is not None else None
        decided_on: tuple[tuple[UUID, int], ...] = ()
        if kept is not None and all(cls is IdempotencyKey or i in kept for cls, i in wanted):
            loaded = {i: None if cls is IdempotencyKey else kept[i] for cls, i in wanted}
            decided_on = tuple((a.id, a.version) for a in kept.values() if a is not None)
        else:
            loaded = self._load(wanted, inline)
            if len(self._copies) >= MEMO_SIZE:
                self._copies.clear()
            self._copies[webhook_id_] = {aggregate_id: loaded[aggregate_id]
                                         for cls, aggregate_id in wanted if cls is not IdempotencyKey}
        webhook, owner = loaded[webhook_id_], loaded[owner_id]
        # the aggregate, not the (eventually consistent) index, says which token is current
        with _confirmed_afresh(decided_on):
            if webhook is None or webhook.deleted or webhook.token_sha256 != digest:
                raise NotFound("unknown webhook")
            if owner is None or not owner.is_active(self.clock.now()):
                raise NotFound("unknown webhook")
        if len(self._shapes) >= MEMO_SIZE:
            self._shapes.clear()
        self._shapes[webhook_id_] = (webhook.source_type, webhook.webhook_id, webhook.targets)
        return webhook, owner, loaded, decided_on

    def _rules_of(self, webhook: Webhook) -> RuleSet:
        """The saved rule set, parsed once per webhook version."""
        key = (webhook.id, webhook.version)
        rule_set = self._rule_sets.get(key)
        if rule_set is None:
            if len(self._rule_sets) >= MEMO_SIZE:
                self._rule_sets.clear()
            rule_set = self._rule_sets[key] = rule_set_of(webhook)
        return rule_set

    def ingest(self, token: str, headers: Mapping[str, str], body: bytes, *,
               remote_addr: str | None = None) -> Ingested | Handshake:
        """Verifies, routes and records one delivery: decided on the copies of its webhook and
        endpoints kept from their last read if there are any, else (or if one has changed since)
        on what a read gives now."""
        try:
            return self._ingest(token, headers, body, remote_addr, copies=True)
        except StaleCopy:
            self._forget_copies(token)
            return self._ingest(token, headers, body, remote_addr, copies=False)

    async def ingest_async(self, token: str, headers: Mapping[str, str], body: bytes, *,
                           remote_addr: str | None = None,
                           offload: Callable[[Callable[[], Any]], Awaitable[Any]]) -> Ingested | Handshake:
        """`ingest` for a caller on an event loop: the deciding (which may read the store or ask
        the rule engine) runs through `offload`, off the loop; the commit is awaited, so no
        thread waits for the writer's batch."""
        try:
            command = None
            if len(body) <= INLINE_BODY:  # a larger one is verified and parsed on a thread
                with suppress(WouldWait):
                    command = self.prepare(token, headers, body, remote_addr, copies=True, inline=True)
            if command is None:
                command = await offload(partial(self.prepare, token, headers, body, remote_addr, copies=True))
            if isinstance(command, Handshake):  # nothing to record: the answer is its challenge
                return command
            return command.done(await self.store.run_async(command.handler, hints=command.hints))
        except StaleCopy:
            self._forget_copies(token)
            return await offload(partial(self._ingest, token, headers, body, remote_addr, copies=False))

    def _forget_copies(self, token: str) -> None:
        located = self._located.get(hashlib.sha256(token.encode()).hexdigest())
        if located is not None:
            self._copies.pop(located[0], None)

    def _ingest(self, token: str, headers: Mapping[str, str], body: bytes, remote_addr: str | None, *,
                copies: bool) -> Ingested | Handshake:
        command = self.prepare(token, headers, body, remote_addr, copies=copies)
        if isinstance(command, Handshake):
            return command
        return command.done(self.store.run(command.handler, hints=command.hints))

    def prepare(self, token: str, headers: Mapping[str, str], body: bytes, remote_addr: str | None, *,
                copies: bool, inline: bool = False) -> Command | Handshake:
        """Everything before the write side: the webhook resolved, the signature verified, the
        rules evaluated; the command that records the delivery, for the writer to run (or, for a
        sender's verified handshake, its answer: nothing is recorded).

        `inline`: on an event loop, which must not wait; `WouldWait` instead of a read of the
        store or a call to the rule engine (the caller then prepares it on a thread)."""
        lowered = {k.lower(): v for k, v in headers.items()}
        webhook, owner, loaded, decided_on = self.resolve(token, headers=lowered, body=body, copies=copies,
                                                          inline=inline)
        with _confirmed_afresh(decided_on):  # a refusal decided on copies is checked on fresh state
            check_single_signatures(webhook.source_type, (name for name, _ in headers.items()))
            received = self._receive(webhook, lowered, body)
            challenge = handshake_challenge(webhook.source_type, received.payload)
            if challenge is not None:
                if decided_on:  # no append checks the copies: a handshake is answered on fresh state
                    raise StaleCopy("a handshake is answered on what a read gives now")
                return Handshake(challenge)
            active = self._active_targets(received, loaded, decided_on, inline)
            decision = self._decide(received, owner, active, loaded, inline)
        recording = Recording(received, owner, decision, decided_on, remote_addr)
        # the webhook too when it is a copy (the command checks it), else it is not read there
        hints = {k: v for k, v in loaded.items() if decided_on or not isinstance(v, Webhook)}
        return Command(recording.handler, hints, recording.done)

    def _receive(self, webhook: Webhook, lowered: dict[str, str], body: bytes) -> Received:
        """The delivery verified and named: its signature checked, its kind, key and payload read."""
        secret = self.box.decrypt(webhook.secret_ciphertext) if webhook.secret_ciphertext else None
        now = self.clock.now()
        cairn = verify_signature(webhook.source_type, secret, lowered, body, now)
        trust_mode, verified = trust_of(webhook.source_type)
        content_type = lowered.get("content-type")
        payload, payload_form = parse_payload_form(body, content_type)
        named_by = cairn if cairn is not None else payload  # cairn's checked body, else the payload
        kind = delivery_kind(lowered, cairn, webhook.source_type, payload)
        redacted = redact_headers(lowered)
        sender = webhook.trust.actor(webhook.source_type, payload, verified=verified)
        return Received(
            webhook=webhook, body=body, now=now, trust_mode=trust_mode, verified=verified, kind=kind,
            key=_delivery_key(webhook.webhook_id, lowered, webhook.source_type, named_by, body),
            content_type=content_type, payload=payload, payload_form=payload_form, redacted=redacted,
            sender=sender,
        )

    def _active_targets(self, received: Received, loaded: dict[UUID, Any], decided_on: tuple[tuple[UUID, int], ...],
                        inline: bool) -> list[Endpoint]:
        """The webhook's targets that are active now, with the idempotency keys the delivery names
        read alongside (none is read unless the webhook's last version mispredicted them)."""
        webhook = received.webhook
        wanted = [
            *((Endpoint, endpoint_uuid_of(t)) for t, _ in webhook.routes),
            *((IdempotencyKey, key_uuid(t, received.key)) for t in webhook.targets),
        ]
        if decided_on:  # keys taken as absent, like the others (a cairn key is known only now)
            loaded.update({i: None for cls, i in wanted if cls is IdempotencyKey and i not in loaded})
        loaded.update(self._load([w for w in wanted if w[1] not in loaded], inline))  # none, unless a guess missed
        now = received.now
        return [e for t in webhook.targets if (e := loaded.get(endpoint_uuid_of(t))) is not None and e.is_active(now)]

    def _decide(self, received: Received, owner: Endpoint, active: list[Endpoint], loaded: dict[UUID, Any],
                inline: bool) -> Decision:
        """The rules' decision on the delivery's envelope (in the rule engine's worker process)."""
        webhook, sender = received.webhook, received.sender
        rule_set = self._rules_of(webhook)
        env = envelope(source=webhook.source_type, kind=received.kind, webhook_id=webhook.webhook_id,
                       trust_mode=received.trust_mode, verified=received.verified,
                       content_type=received.content_type, size=len(received.body), headers=received.redacted,
                       payload=received.payload, actor=sender)
        if rule_set.rules and inline:
            raise WouldWait("the rule engine is asked in a worker process")
        outcome = self.engine.evaluate(rule_set, env) if rule_set.rules else NoMatch()
        decision = decide(
            rule_set, outcome, targets=tuple(e.endpoint_id for e in active) or (owner.endpoint_id,),
            target_queue=webhook.target_queue, scopes={e.endpoint_id: e.queues for e in active},
            untrusted=sender if webhook.trust.holds(sender) else None,
            subject=subject_of(webhook.source_type, received.kind, received.payload), webhook_id=webhook.webhook_id,
        )
        if decision.once_subject is not None:  # read before the write side, as the keys are
            loaded.update(self._load([(OnceKey, once_uuid(t, decision.queue, decision.once_subject))
                                      for t in decision.endpoints], inline))
        return decision


@dataclass(slots=True)  # not frozen: a frozen dataclass sets each field through object.__setattr__
class Received:
    """One delivery, verified and named, as ingest read it before deciding on it (never changed)."""

    webhook: Webhook
    body: bytes
    now: datetime
    trust_mode: str
    verified: bool
    kind: str | None
    key: str
    content_type: str | None
    payload: object | None
    payload_form: str
    redacted: dict[str, str]
    sender: Actor


class Recording:
    """The write side of one decided delivery: its `handler` opens (or finds) a todo on each
    target the decision names and appends the DeliveryAccepted event, in one command; `done`
    makes the handler's answer the delivery's `Ingested`."""

    def __init__(self, received: Received, owner: Endpoint, decision: Decision,
                 decided_on: tuple[tuple[UUID, int], ...], remote_addr: str | None) -> None:
        self.received, self.owner, self.decision = received, owner, decision
        self.decided_on, self.remote_addr = decided_on, remote_addr
        self.versions = dict(decided_on)
        webhook = received.webhook
        self.title = derive_title(webhook.source_type, received.kind, received.payload, body=received.body,
                                  content_type=received.content_type)
        self.body_ref = ref_of(received.body)  # the delivery and each todo it opens name these bytes once (docs/adr/0027)
        self.queue = QUARANTINE if decision.faulted else decision.queue
        self.delivery_uuid = uuid4()
        self.event_id = f"{DELIVERY_PREFIX}{self.delivery_uuid.hex}"
        self.actor = f"webhook:{webhook.webhook_id}"

    def handler(self, uow: UnitOfWork) -> tuple[list[dict[str, Any]], bool]:
        received, decision, webhook = self.received, self.decision, self.received.webhook
        if self.decided_on:
            self._current(uow, Webhook, webhook.id)
            self._current(uow, Endpoint, self.owner.id)
        todos: list[dict[str, Any]] = []
        repeat = False
        for endpoint_id in ([] if decision.drop else decision.endpoints):
            target = self._current(uow, Endpoint, endpoint_uuid_of(endpoint_id))
            if target is not None and target.is_active(uow.now):
                ref, repeated = self._open_on(uow, target)
                todos.append(ref)
                repeat = repeat or repeated
        body = received.body
        uow.add(Delivery.accept(
            id=self.delivery_uuid, now=uow.now, actor=self.actor, webhook_id=webhook.webhook_id,
            endpoint_id=self.owner.endpoint_id, source=webhook.source_type, kind=received.kind,
            trust_mode=received.trust_mode, verified=received.verified, remote_addr=self.remote_addr,
            content_type=received.content_type, size=len(body), headers=received.redacted, body=body,
            body_ref=self.body_ref, payload_form=received.payload_form, delivery_key=received.key,
            disposition=decision.disposition, routing=repeat_trace(decision.trace) if repeat else decision.trace,
            todos=todos, sender_actor=received.sender.to_json(), decided_on=self.decided_on,
        ))
        return todos, repeat

    def done(self, result: tuple[list[dict[str, Any]], bool]) -> Ingested:
        todos, repeat = result
        return Ingested(todos=todos, verified=self.received.verified, trust_mode=self.received.trust_mode,
                        event_id=self.event_id, decision=self.decision, repeat=repeat)

    def _open_on(self, uow: UnitOfWork, target: Endpoint) -> tuple[dict[str, Any], bool]:
        """One todo on one target, or the live one its idempotency key (or, for `once`, its
        subject) already names; True for a `once` repeat."""
        received, decision, actor, webhook = self.received, self.decision, self.actor, self.received.webhook
        once = Once(uow, target.endpoint_id, self.queue, decision.once_subject, actor)
        body = received.body
        todo, created = open_or_reuse(uow, target.endpoint_id, received.key, lambda: once.bound(Todo.open(
            id=uuid4(), now=uow.now, actor=actor, endpoint_id=target.endpoint_id, queue=self.queue,
            source=webhook.source_type, title=self.title, trust_mode=received.trust_mode, payload_ref=self.body_ref,
            payload_form=received.payload_form, payload_bytes=body, payload_size=len(body), kind=received.kind,
            idempotency_key=received.key, routing=decision.trace, delivery_id=self.event_id, cause="ingest",
            trace_parent=received.redacted.get("traceparent"),  # the delivery's trace is the todo's parent
        )), actor=actor, reuse=once.live if decision.once_subject is not None else None)
        ref = {"id": todo.todo_id, "endpoint_id": target.endpoint_id, "queue": todo.queue, "created": created}
        return ref, once.repeat

    def _current(self, uow: UnitOfWork, cls: type[Aggregate], aggregate_id: UUID) -> Any:
        """The aggregate as this run sees it; one decided on from a copy must still be at the
        copy's version (a run on fresh state finds out when it is not)."""
        aggregate = uow.get(cls, aggregate_id)
        if aggregate_id in self.versions and (aggregate is None or aggregate.version != self.versions[aggregate_id]):
            raise StaleCopy(f"{cls.__name__} {aggregate_id} changed since ingest decided on it")
        return aggregate


class Once:
    """`once` on one target: the live todo its subject names on the queue, or the binding of a new
    one. The key's stream is (endpoint, queue, subject), so concurrent deliveries for a subject
    race on its version and the store lets one bind it (docs/adr/0024-trust-and-once.md)."""

    def __init__(self, uow: UnitOfWork, endpoint_id: str, queue: str, subject: str | None, actor: str) -> None:
        self.uow, self.endpoint_id, self.queue, self.subject, self.actor = uow, endpoint_id, queue, subject, actor
        self.key: OnceKey | None = None
        self.repeat = False

    def live(self) -> Todo | None:
        """The subject's live todo (a repeat), else None: the next todo opened binds the key."""
        if self.subject is None:
            return None
        self.key = self.uow.get(OnceKey, once_uuid(self.endpoint_id, self.queue, self.subject))
        if self.key is None:
            self.key = OnceKey.new(endpoint_id=self.endpoint_id, queue=self.queue, subject=self.subject)
            return None
        named = self.uow.get(Todo, parse_id(TODO_PREFIX, self.key.todo_id), fresh=True)
        self.repeat = named is not None and named.is_live
        return named if self.repeat else None

    def bound(self, todo: Todo) -> Todo:
        """The new todo, with the subject's key pointing at it."""
        if self.key is not None:
            self.key.bind(todo_id=todo.todo_id, now=self.uow.now, actor=self.actor, named_is_live=False)
            self.uow.add(self.key)
        return todo
