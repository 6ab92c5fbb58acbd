"""Webhooks: create/rotate/delete, routes, rules (save, dry run, replay), ingest and deliveries.

Ingest does its slow, refusable work (token lookup, signature, rule evaluation in a worker
process) before the write side, so a refused delivery leaves no trace; then ONE command
appends the DeliveryAccepted event with every todo it mints (all or nothing), and the 202
is sent only after that append is durable.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
from collections.abc import Mapping, Sequence
from typing import Any, Protocol
from uuid import UUID, uuid4

from application.errors import ConfigurationError
from application.payloads import delivery_payload, pruned_note
from application.ports import UnitOfWork
from application.presenters import iso
from application.service import Caller, Switchboard
from domain.delivery import DELIVERY_PREFIX, Delivery, delivery_id_of
from domain.endpoint import SOURCE_TYPES, Endpoint, endpoint_uuid_of
from domain.errors import Conflict, Forbidden, InvalidArgument, NotFound
from domain.events import Aggregate
from domain.idempotency import IdempotencyKey, key_uuid
from domain.ingest import (
    SIGNED_SOURCES, check_single_signatures, delivery_id, delivery_kind, derive_title, new_signing_secret,
    parse_payload_form, redact_headers, trust_of, verify_signature,
)
from domain.payloads import ref_of
from domain.names import ENDPOINT_PREFIX, QUARANTINE, TODO_PREFIX, check_queue_name, format_id, parse_id
from domain.routing import (
    Decision, Faulted, Matched, NoMatch, RuleSet, check_grant, decide, envelope, parse_rule_set, rule_label,
)
from domain.todo import Todo
from domain.webhook import WEBHOOK_PREFIX, Webhook, WebhookCreated

DRY_RUN_DELIVERIES = 50
MEMO_SIZE = 10_000
# How many stored deliveries a replay reads when N is not given: the board and the CLI both use it.
DEFAULT_REPLAY_LAST = 1000  # CONTRACT §2: `rules replay --last N` defaults to 1000; the board uses it too
REPLAY_MAX, REPLAY_CHANGED_SHOWN = 100_000, 100
LOAD_PAGE = 500
_TOKEN = re.compile(r"[0-9a-f]{32}")


class RuleEngine(Protocol):
    def check_compiles(self, rule_set: RuleSet) -> None: ...

    def evaluate(self, rule_set: RuleSet, envelope: dict) -> Matched | NoMatch | Faulted: ...

    def evaluate_many(self, rule_set: RuleSet, envelopes_json: Sequence[str | bytes], *,
                      compare_with: RuleSet | None = None) -> list[tuple[Any, Any]]: ...


class SecretBox(Protocol):
    def encrypt(self, plaintext: str) -> str: ...

    def decrypt(self, token: str) -> str: ...


def _webhook_uuid(webhook_id: object) -> UUID:
    parsed = parse_id(WEBHOOK_PREFIX, webhook_id)
    if parsed is None:
        raise NotFound(f"webhook {webhook_id} not found")
    return parsed


def _opens(box: SecretBox, ciphertext: str) -> bool:
    try:
        box.decrypt(ciphertext)
    except ValueError:
        return False
    return True


def _delivery_key(webhook_id: str, headers: Mapping[str, str], source_type: str, cairn: dict | None,
                  body: bytes) -> str:
    """The idempotency key of a delivery: the webhook, then the sender's delivery id."""
    return f"{webhook_id}:{delivery_id(headers, source_type, cairn, body)}"


def _kind_and_title(envelope_json: str | bytes) -> tuple[str | None, str]:
    """A stored delivery's kind and the title its todo got (derived again from the envelope)."""
    env = json.loads(envelope_json)
    return env.get("kind"), derive_title(env.get("source"), env.get("kind"), env.get("payload"),
                                         size=env.get("size"), content_type=env.get("content_type"))


def _rule_set_of(webhook: Webhook) -> RuleSet:
    return parse_rule_set(
        {"rules": webhook.rules, "default_action": webhook.default_action, "params": webhook.params},
        new_rule_id=lambda: "rule_" + secrets.token_hex(12), require_ids=True,
    )


class Webhooks:
    """The webhook side of the application; shares the store, views and clock of `Switchboard`."""

    def __init__(self, app: Switchboard, engine: RuleEngine, box: SecretBox) -> None:
        self.app = app
        self.store = app.store
        self.views = app.views
        self.clock = app.clock
        self.engine = engine
        self.box = box
        self._located: dict[str, tuple[UUID, UUID]] = {}
        # per webhook, what its last loaded version said: source type, id and targets (owner, then
        # routes), so one read fetches the webhook, its endpoints and the idempotency keys together
        self._shapes: dict[UUID, tuple[str, str, tuple[str, ...]]] = {}
        self._rule_sets: dict[tuple[UUID, int], RuleSet] = {}

    # -- lifecycle -----------------------------------------------------------------------

    def _ingest_url(self, token: str) -> str:
        return f"{self.app.base_url}/webhooks/w/{token}"

    def _mint(self, source_type: str) -> tuple[str, str | None]:
        token = secrets.token_hex(16)
        secret = new_signing_secret(secrets.token_bytes(32)) if source_type in SIGNED_SOURCES else None
        return token, secret

    def create(self, *, caller: Caller, endpoint: str, source_type: str, target_queue: str) -> dict[str, Any]:
        """A new ingest URL for an endpoint, within its ceiling, source types and webhook queues."""
        if not source_type or not target_queue:
            raise InvalidArgument("source_type and target_queue are required")
        if source_type not in SOURCE_TYPES:
            raise InvalidArgument(f"unknown source type {source_type!r}")
        check_queue_name(target_queue)
        token, secret = self._mint(source_type)
        trust_mode, _ = trust_of(source_type)
        webhook_uuid = uuid4()
        endpoint_id = endpoint_uuid_of(endpoint)

        def handler(uow: UnitOfWork) -> Webhook:
            owner = uow.get(Endpoint, endpoint_id)
            if owner is None or not self.app.owns(caller, owner):
                raise NotFound(f"endpoint {endpoint} not found")
            webhook = Webhook.create(
                id=webhook_uuid, now=uow.now, actor=caller.label, endpoint_id=owner.endpoint_id,
                source_type=source_type, target_queue=target_queue, trust_mode=trust_mode,
                token_sha256=hashlib.sha256(token.encode()).hexdigest(),
                secret_ciphertext=self.box.encrypt(secret) if secret else None,
            )
            owner.attach_webhook(now=uow.now, actor=caller.label, webhook_id=webhook.webhook_id,
                                 source_type=source_type, target_queue=target_queue)
            uow.add(webhook)
            return webhook

        webhook = self.store.run(handler)
        return self._minted(webhook, token, secret)

    def _minted(self, webhook: Webhook, token: str, secret: str | None) -> dict[str, Any]:
        answer = {
            "webhook_id": webhook.webhook_id, "ingest_url": self._ingest_url(token),
            "source_type": webhook.source_type, "target_queue": webhook.target_queue,
            "trust_mode": webhook.trust_mode,
        }
        if secret is not None:
            answer["signing_secret"] = secret
        return answer

    def _visible(self, webhook_id: str, caller: Caller, *, live: bool = True) -> tuple[Webhook, Endpoint]:
        webhook = self.store.load(Webhook, _webhook_uuid(webhook_id))
        if webhook is None or (live and webhook.deleted):
            raise NotFound(f"webhook {webhook_id} not found")
        owner = self.store.load(Endpoint, endpoint_uuid_of(webhook.endpoint_id))
        if owner is None or not self.app.owns(caller, owner):
            raise NotFound(f"webhook {webhook_id} not found")
        return webhook, owner

    def _change(self, webhook_id: str, caller: Caller, change) -> Any:
        webhook_uuid = _webhook_uuid(webhook_id)
        self._visible(webhook_id, caller)

        def handler(uow: UnitOfWork) -> Any:
            webhook = uow.get(Webhook, webhook_uuid)
            if webhook is None or webhook.deleted:
                raise NotFound(f"webhook {webhook_id} not found")
            return change(webhook, uow)

        return self.store.run(handler)

    def rotate(self, webhook_id: str, *, caller: Caller) -> dict[str, Any]:
        """A new URL (and signing secret for signed sources); the old ones answer 404/401 at once."""
        def change(webhook: Webhook, uow: UnitOfWork):
            token, secret = self._mint(webhook.source_type)
            webhook.rotate(now=uow.now, actor=caller.label, token_sha256=hashlib.sha256(token.encode()).hexdigest(),
                           secret_ciphertext=self.box.encrypt(secret) if secret else None)
            return self._minted(webhook, token, secret)

        return self._change(webhook_id, caller, change)

    # -- the secret key ------------------------------------------------------------------

    def sealed_webhooks(self) -> list[Webhook]:
        """Every live webhook with a sealed signing secret, read from the log (not a read model)."""
        ids: list[UUID] = []
        after = 0
        while batch := self.store.read_log(after, 1000, types=(WebhookCreated,)):
            ids.extend(r.event.originator_id for r in batch)
            after = batch[-1].position
        webhooks: list[Webhook] = []
        for start in range(0, len(ids), LOAD_PAGE):
            loaded = self.store.load_many([(Webhook, i) for i in ids[start:start + LOAD_PAGE]])
            webhooks.extend(w for w in loaded.values() if w is not None and not w.deleted and w.secret_ciphertext)
        return webhooks

    def check_secrets_open(self, sealed: Sequence[Webhook]) -> None:
        """Raises ConfigurationError when the current key cannot open a sealed signing secret."""
        shut = [w.webhook_id for w in sealed if not _opens(self.box, w.secret_ciphertext)]
        if shut:
            raise ConfigurationError(
                f"the secret key cannot open the signing secrets of {len(shut)} of {len(sealed)} webhook(s)"
                f" (first {shut[0]}): they were sealed with another SWITCHBOARD_SECRET_KEY; start with that key,"
                " or run `switchboard secrets reseal` with the old key in SWITCHBOARD_SECRET_KEY_OLD")

    def reseal(self, old_box: SecretBox, *, caller: Caller) -> dict[str, Any]:
        """Re-seals, under the current key, every signing secret the old key opens (an event per
        webhook, all in one append); refused, changing nothing, when one opens under neither key."""
        ids = [w.id for w in self.sealed_webhooks()]

        def handler(uow: UnitOfWork) -> dict[str, Any]:
            resealed, current = [], 0
            for webhook_uuid in ids:
                webhook = uow.get(Webhook, webhook_uuid, fresh=True)
                if webhook is None or webhook.deleted or not webhook.secret_ciphertext:
                    continue
                if _opens(self.box, webhook.secret_ciphertext):
                    current += 1
                    continue
                try:
                    secret = old_box.decrypt(webhook.secret_ciphertext)
                except ValueError:
                    raise ConfigurationError(
                        f"neither SWITCHBOARD_SECRET_KEY nor SWITCHBOARD_SECRET_KEY_OLD opens the signing secret"
                        f" of webhook {webhook.webhook_id}; nothing was re-sealed") from None
                webhook.reseal_secret(now=uow.now, actor=caller.label, secret_ciphertext=self.box.encrypt(secret))
                resealed.append(webhook.webhook_id)
            return {"resealed": len(resealed), "already_current": current, "webhooks": resealed}

        return self.store.run(handler)

    def delete(self, webhook_id: str, *, caller: Caller) -> dict[str, Any]:
        def change(webhook: Webhook, uow: UnitOfWork):
            webhook.delete(now=uow.now, actor=caller.label)
            owner = uow.get(Endpoint, endpoint_uuid_of(webhook.endpoint_id))
            if owner is not None:
                owner.detach_webhook(now=uow.now, actor=caller.label, webhook_id=webhook.webhook_id)
            return {"webhook_id": webhook.webhook_id, "deleted": True}

        return self._change(webhook_id, caller, change)

    def list(self, *, caller: Caller, endpoint: str | None = None) -> dict[str, Any]:
        """Webhooks (never secrets or URLs); for an endpoint, also its ceiling."""
        self.views.catch_up()
        scope: Endpoint | None = None
        if caller.kind == "endpoint":
            scope = self.app.endpoint(caller.name, caller=caller)
        elif endpoint is not None:
            scope = self.app.endpoint(endpoint, caller=caller)
        if scope is not None:
            endpoint_ids: list[str] | None = [scope.endpoint_id]
        elif caller.superuser:
            endpoint_ids = None
        else:
            endpoint_ids = self.views.endpoint_ids_of(caller.name)
        rows = self.views.list_webhooks(endpoint_ids=endpoint_ids)
        answer: dict[str, Any] = {"webhooks": rows}
        if scope is not None:
            answer["ceiling"] = {
                "max": scope.webhook_max, "used": len(scope.webhook_ids),
                "allowed_source_types": list(scope.source_types), "allowed_queues": list(scope.webhook_queues),
            }
        return answer

    # -- routes --------------------------------------------------------------------------

    def _route_target(self, target_endpoint_id: str, owner: Endpoint) -> Endpoint:
        target = self.store.load(Endpoint, endpoint_uuid_of(target_endpoint_id)) if target_endpoint_id else None
        if target is None or not target.is_active(self.clock.now()) or target.owner != owner.owner:
            raise Forbidden("target endpoint is unknown, revoked or not yours")
        return target

    def add_route(self, webhook_id: str, target_endpoint_id: str, *, caller: Caller) -> dict[str, Any]:
        _, owner = self._visible(webhook_id, caller)
        target = self._route_target(target_endpoint_id, owner)
        self._change(webhook_id, caller, lambda w, uow: w.add_route(
            now=uow.now, actor=caller.label, target_endpoint_id=target.endpoint_id))
        return {"webhook_id": webhook_id, "target_endpoint_id": target.endpoint_id, "routed": True}

    def remove_route(self, webhook_id: str, target_endpoint_id: str, *, caller: Caller) -> dict[str, Any]:
        self._visible(webhook_id, caller)
        target_id = format_id(ENDPOINT_PREFIX, endpoint_uuid_of(target_endpoint_id))
        self._change(webhook_id, caller, lambda w, uow: w.remove_route(
            now=uow.now, actor=caller.label, target_endpoint_id=target_id))
        return {"webhook_id": webhook_id, "target_endpoint_id": target_id, "removed": True}

    def routes(self, webhook_id: str, *, caller: Caller) -> dict[str, Any]:
        webhook, _ = self._visible(webhook_id, caller)
        return {
            "webhook_id": webhook.webhook_id, "owner_endpoint_id": webhook.endpoint_id,
            "routes": [{"target_endpoint_id": t, "granted_at": iso(at)} for t, at in webhook.routes],
        }

    # -- rules ---------------------------------------------------------------------------

    def rules(self, webhook_id: str, *, caller: Caller) -> dict[str, Any]:
        webhook, _ = self._visible(webhook_id, caller)
        return {"webhook_id": webhook.webhook_id, **_rule_set_of(webhook).to_json()}

    def _candidate(self, document: Mapping[str, Any], webhook: Webhook, owner: Endpoint, *,
                   require_ids: bool) -> RuleSet:
        if not isinstance(document, Mapping):
            raise InvalidArgument("rules must be an object {rules, default_action?, params?}")
        document = {k: v for k, v in document.items() if k != "webhook_id"}  # what `rules get` prints reads back
        rule_set = parse_rule_set(document, new_rule_id=lambda: "rule_" + secrets.token_hex(12),
                                  require_ids=require_ids)
        check_grant(rule_set, allowed_queues=set(owner.webhook_queues), target_endpoint_ids=set(webhook.targets))
        self.engine.check_compiles(rule_set)
        return rule_set

    def set_rules(self, webhook_id: str, document: Mapping[str, Any], *, caller: Caller) -> dict[str, Any]:
        """Validates, dry-runs over the 50 latest deliveries (any fault of the rules refuses), then saves.

        A delivery too large to read within the budget faults before any rule runs, whatever the
        rules: it says nothing about the candidate, so it refuses nothing (else one big delivery
        would lock a webhook's rules until 50 newer ones pushed it out)."""
        webhook, owner = self._visible(webhook_id, caller)
        rule_set = self._candidate(document, webhook, owner, require_ids=False)
        self.views.catch_up()
        recent = self.views.recent_envelopes(webhook.webhook_id, DRY_RUN_DELIVERIES)
        if rule_set.rules and recent:
            outcomes = self.engine.evaluate_many(rule_set, [env for _, env in recent])
            for (event_id, _), (outcome, _) in zip(recent, outcomes):
                if isinstance(outcome, Faulted) and outcome.kind != "too_large":
                    index = outcome.index if outcome.index is not None and outcome.index < len(rule_set.rules) else None
                    named = rule_label(index, rule_set.rules[index].id if index is not None else None)
                    raise InvalidArgument(f"{named} faulted on delivery {event_id}: {outcome.kind}: {outcome.detail}")
        saved = rule_set.to_json()
        self._change(webhook_id, caller, lambda w, uow: w.set_rules(
            now=uow.now, actor=caller.label, rules=saved["rules"], default_action=saved["default_action"],
            params=saved["params"]))
        return {"webhook_id": webhook.webhook_id, **saved}

    def test_rules(self, webhook_id: str, *, caller: Caller, payload: Any = None, headers: Mapping[str, str] | None = None,
                   event_id: str | None = None, candidate: Mapping[str, Any] | None = None,
                   has_payload: bool = False) -> dict[str, Any]:
        """A dry run of saved or candidate rules on one payload or one stored delivery; saves nothing."""
        webhook, owner = self._visible(webhook_id, caller)
        has_payload = has_payload or payload is not None  # the flag only marks a JSON null payload as given
        if has_payload == (event_id is not None):
            raise InvalidArgument("give exactly one of payload or event_id")
        rule_set = (self._candidate(candidate, webhook, owner, require_ids=True) if candidate is not None
                    else _rule_set_of(webhook))
        if event_id is not None:
            self.views.catch_up()
            stored = self.views.delivery_envelope(webhook.webhook_id, event_id)
            if stored is None:
                raise NotFound(f"event {event_id} not found")
            env = json.loads(stored)
        else:
            lowered = {str(k).lower(): str(v) for k, v in (headers or {}).items()}
            body = json.dumps(payload, separators=(",", ":")).encode()
            trust_mode, verified = trust_of(webhook.source_type)
            env = envelope(
                source=webhook.source_type,
                kind=delivery_kind(lowered, payload if webhook.source_type == "cairn" and isinstance(payload, dict) else None),
                webhook_id=webhook.webhook_id, trust_mode=trust_mode, verified=verified,
                content_type="application/json", size=len(body), headers=redact_headers(lowered), payload=payload,
            )
        outcome = self.engine.evaluate(rule_set, env) if rule_set.rules else NoMatch()
        decision = decide(rule_set, outcome, targets=webhook.targets, target_queue=webhook.target_queue)
        return {"decision": decision.to_json(), "trace": decision.trace, "envelope": env}

    def replay(self, webhook_id: str, candidate: Mapping[str, Any], *, caller: Caller,
               last: int | None = None) -> dict[str, Any]:
        """Candidate rules against the saved ones over the last N stored deliveries (default 1000);
        each changed delivery is named by id, kind and title."""
        if last is None:
            last = DEFAULT_REPLAY_LAST
        if isinstance(last, bool) or not isinstance(last, int) or not 1 <= last <= REPLAY_MAX:
            raise InvalidArgument(f"last must be within 1..{REPLAY_MAX}")
        webhook, owner = self._visible(webhook_id, caller)
        rule_set = self._candidate(candidate, webhook, owner, require_ids=True)
        saved = _rule_set_of(webhook)
        self.views.catch_up()
        recent = self.views.recent_envelopes(webhook.webhook_id, last)
        outcomes = self.engine.evaluate_many(rule_set, [env for _, env in recent], compare_with=saved)
        counts: dict[str, int] = {}
        changed: list[dict[str, Any]] = []
        for (event_id, env_json), (after_outcome, before_outcome) in zip(recent, outcomes):
            after = decide(rule_set, after_outcome, targets=webhook.targets, target_queue=webhook.target_queue)
            before = decide(saved, before_outcome, targets=webhook.targets, target_queue=webhook.target_queue)
            key = "faulted" if after.faulted else "drop" if after.drop else f"queue:{after.queue}"
            counts[key] = counts.get(key, 0) + 1
            if after.to_json() != before.to_json() and len(changed) < REPLAY_CHANGED_SHOWN:
                kind, title = _kind_and_title(env_json)
                changed.append({"event_id": event_id, "kind": kind, "title": title,
                                "before": before.to_json(), "after": after.to_json()})
        return {"evaluated": len(recent), "decisions": counts, "changed": changed}

    # -- ingest --------------------------------------------------------------------------

    def _locate(self, digest: str) -> tuple[UUID, UUID] | None:
        """(webhook, owner endpoint) ids for a token hash; the pairing never changes, so it is memoised."""
        located = self._located.get(digest)
        if located is not None:
            return located
        subject = self.views.subject_of_credential(digest)
        if subject is None:
            self.views.catch_up()
            subject = self.views.subject_of_credential(digest)
        if subject is None or subject[0] != "webhook":
            return None
        webhook = self.store.load(Webhook, _webhook_uuid(subject[1]))
        if webhook is None:
            return None
        if len(self._located) >= MEMO_SIZE:
            self._located.clear()
        located = self._located[digest] = (webhook.id, endpoint_uuid_of(webhook.endpoint_id))
        return located

    def resolve(self, token: str, *, headers: Mapping[str, str] | None = None,
                body: bytes = b"") -> tuple[Webhook, Endpoint, dict[UUID, Any]]:
        """The live webhook whose current URL carries this token, its owner, and what was read.

        Given a delivery's (lowered) headers and body, the same read also fetches the
        idempotency keys it will name, as far as the webhook's last seen version predicts them:
        one round trip per delivery while nothing changes (`ingest` reads what a stale guess missed).
        """
        if not _TOKEN.fullmatch(token or ""):
            raise NotFound("unknown webhook")
        digest = hashlib.sha256(token.encode()).hexdigest()
        located = self._locate(digest)
        if located is None:
            raise NotFound("unknown webhook")
        webhook_uuid, owner_uuid = located
        wanted: list[tuple[type[Aggregate], UUID]] = [(Webhook, webhook_uuid), (Endpoint, owner_uuid)]
        shape = self._shapes.get(webhook_uuid)
        if shape is not None:
            source_type, webhook_id, targets = shape
            wanted.extend((Endpoint, endpoint_uuid_of(t)) for t in targets[1:])
            if headers is not None and source_type != "cairn":  # a cairn id is in the verified body
                key = _delivery_key(webhook_id, headers, source_type, None, body)
                wanted.extend((IdempotencyKey, key_uuid(t, key)) for t in targets)
        loaded = self.store.load_many(wanted)
        webhook, owner = loaded[webhook_uuid], loaded[owner_uuid]
        # the aggregate, not the (eventually consistent) index, says which token is current
        if webhook is None or webhook.deleted or webhook.token_sha256 != digest:
            raise NotFound("unknown webhook")
        if owner is None or not owner.is_active(self.clock.now()):
            raise NotFound("unknown webhook")
        if len(self._shapes) >= MEMO_SIZE:
            self._shapes.clear()
        self._shapes[webhook_uuid] = (webhook.source_type, webhook.webhook_id, webhook.targets)
        return webhook, owner, loaded

    def _rules_of(self, webhook: Webhook) -> RuleSet:
        """The saved rule set, parsed once per webhook version."""
        key = (webhook.id, webhook.version)
        rule_set = self._rule_sets.get(key)
        if rule_set is None:
            if len(self._rule_sets) >= MEMO_SIZE:
                self._rule_sets.clear()
            rule_set = self._rule_sets[key] = _rule_set_of(webhook)
        return rule_set

    def ingest(self, token: str, headers: Mapping[str, str], body: bytes, *,
               remote_addr: str | None = None) -> dict[str, Any]:
        """Verifies, routes and records one delivery; returns the 202 body."""
        lowered = {k.lower(): v for k, v in headers.items()}
        webhook, owner, loaded = self.resolve(token, headers=lowered, body=body)
        check_single_signatures(webhook.source_type, (name for name, _ in headers.items()))
        secret = self.box.decrypt(webhook.secret_ciphertext) if webhook.secret_ciphertext else None
        now = self.clock.now()
        cairn = verify_signature(webhook.source_type, secret, lowered, body, now)
        trust_mode, verified = trust_of(webhook.source_type)
        kind = delivery_kind(lowered, cairn)
        key = _delivery_key(webhook.webhook_id, lowered, webhook.source_type, cairn, body)
        content_type = lowered.get("content-type")
        payload, payload_form = parse_payload_form(body, content_type)
        redacted = redact_headers(lowered)
        rule_set = self._rules_of(webhook)
        wanted = [
            *((Endpoint, endpoint_uuid_of(t)) for t, _ in webhook.routes),
            *((IdempotencyKey, key_uuid(t, key)) for t in webhook.targets),
        ]
        loaded.update(self.store.load_many([w for w in wanted if w[1] not in loaded]))  # none, unless a guess missed
        targets = tuple(
            t for t in webhook.targets
            if (e := loaded.get(endpoint_uuid_of(t))) is not None and e.is_active(now)
        )
        env = envelope(source=webhook.source_type, kind=kind, webhook_id=webhook.webhook_id, trust_mode=trust_mode,
                       verified=verified, content_type=content_type, size=len(body), headers=redacted, payload=payload)
        outcome = self.engine.evaluate(rule_set, env) if rule_set.rules else NoMatch()
        decision = decide(rule_set, outcome, targets=targets or (owner.endpoint_id,), target_queue=webhook.target_queue)
        title = derive_title(webhook.source_type, kind, payload, body=body, content_type=content_type)
        body_ref = ref_of(body)  # the delivery and each todo it opens name these bytes once
        delivery_uuid = uuid4()
        event_id = f"{DELIVERY_PREFIX}{delivery_uuid.hex}"
        actor = f"webhook:{webhook.webhook_id}"
        def handler(uow: UnitOfWork) -> list[dict[str, Any]]:
            todos: list[dict[str, Any]] = []
            for endpoint_id in ([] if decision.drop else decision.endpoints):
                target = uow.get(Endpoint, endpoint_uuid_of(endpoint_id))
                if target is None or not target.is_active(uow.now):
                    continue
                todos.append(self._open_for(uow, target, decision, key, title=title, kind=kind,
                                            source=webhook.source_type, trust_mode=trust_mode,
                                            body_ref=body_ref, payload_form=payload_form, body=body,
                                            event_id=event_id, actor=actor))
            disposition = "faulted" if decision.faulted else "dropped" if decision.drop else "routed"
            uow.add(Delivery.accept(
                id=delivery_uuid, now=uow.now, actor=actor, webhook_id=webhook.webhook_id,
                endpoint_id=owner.endpoint_id, source=webhook.source_type, kind=kind, trust_mode=trust_mode,
                verified=verified, remote_addr=remote_addr, content_type=content_type, size=len(body),
                headers=redacted, body=body, body_ref=body_ref, payload_form=payload_form, delivery_key=key,
                disposition=disposition, routing=decision.trace, todos=todos,
            ))
            return todos

        todos = self.store.run(handler, hints={k: v for k, v in loaded.items() if not isinstance(v, Webhook)})
        first = todos[0] if todos else None
        answer: dict[str, Any] = {
            "todos": todos, "created": sum(1 for t in todos if t["created"]),
            "id": first["id"] if first else None, "queue": first["queue"] if first else None,
            "verified": verified, "trust_mode": trust_mode, "event_id": event_id,
        }
        if decision.drop:
            answer["dropped"] = True
        if decision.faulted:
            answer["faulted"] = True
        return answer

    @staticmethod
    def _open_for(uow: UnitOfWork, target: Endpoint, decision: Decision, key: str, **todo: Any) -> dict[str, Any]:
        """One todo on one target, or the live one its idempotency key already names."""
        queue = QUARANTINE if decision.faulted else decision.queue
        binding = uow.get(IdempotencyKey, key_uuid(target.endpoint_id, key))
        if binding is not None:
            existing = uow.get(Todo, parse_id(TODO_PREFIX, binding.todo_id), fresh=True)
            if existing is not None and existing.is_live:
                return {"id": existing.todo_id, "endpoint_id": target.endpoint_id, "queue": existing.queue,
                        "created": False}
        else:
            binding = IdempotencyKey.new(endpoint_id=target.endpoint_id, key=key)
        opened = Todo.open(
            id=uuid4(), now=uow.now, actor=todo["actor"], endpoint_id=target.endpoint_id, queue=queue,
            source=todo["source"], title=todo["title"], trust_mode=todo["trust_mode"],
            payload_ref=todo["body_ref"], payload_form=todo["payload_form"], payload_bytes=todo["body"],
            payload_size=len(todo["body"]), kind=todo["kind"], idempotency_key=key, routing=decision.trace,
            delivery_id=todo["event_id"], cause="ingest",
        )
        uow.add(opened)
        binding.bind(todo_id=opened.todo_id, now=uow.now, actor=todo["actor"])
        uow.add(binding)
        return {"id": opened.todo_id, "endpoint_id": target.endpoint_id, "queue": queue, "created": True}

    # -- deliveries ----------------------------------------------------------------------

    def list_events(self, *, caller: Caller, webhook_id: str | None = None, limit: int | None = None,
                    cursor: str | None = None, max_limit: int = 200) -> dict[str, Any]:
        """Stored deliveries newest first (no payload, no headers), paged by cursor."""
        if limit is None:
            limit = 50
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= max_limit:
            raise InvalidArgument(f"limit must be within 1..{max_limit}")
        before: int | None = None
        if cursor is not None:
            if not re.fullmatch(r"\d{1,19}", str(cursor)) or int(cursor) >= 2**63:
                raise InvalidArgument("bad cursor: give the next_cursor of the previous page")
            before = int(cursor)
        self.views.catch_up()
        if webhook_id is not None:
            webhook, _ = self._visible(webhook_id, caller, live=False)
            endpoint_ids: list[str] | None = None
            webhook_filter: str | None = webhook.webhook_id
        else:
            webhook_filter = None
            if caller.kind == "endpoint":
                endpoint_ids = [self.app.endpoint(caller.name, caller=caller).endpoint_id]
            elif caller.superuser:
                endpoint_ids = None
            else:
                endpoint_ids = self.views.endpoint_ids_of(caller.name)
        rows, next_position = self.views.list_deliveries(
            webhook_id=webhook_filter, endpoint_ids=endpoint_ids, limit=limit, before=before)
        answer: dict[str, Any] = {"events": rows}
        if next_position is not None:
            answer["next_cursor"] = str(next_position)
        return answer

    def get_event(self, event_id: str, *, caller: Caller, raw_body: bool = False) -> dict[str, Any]:
        """One delivery with redacted headers and payload, and the sender's delivery id.

        `body` is the body as received when it is not JSON, or always with `raw_body`."""
        delivery = self._visible_delivery(event_id, caller)
        body, payload, pruned = delivery_payload(self.store, delivery)
        shown = None if body is None or (payload is not None and not raw_body) else body.decode(errors="replace")
        return {
            "id": delivery.event_id, "delivery_id": delivery_id_of(delivery.delivery_key),
            "webhook_id": delivery.webhook_id, "endpoint_id": delivery.endpoint_id,
            "source": delivery.source, "kind": delivery.kind, "trust_mode": delivery.trust_mode,
            "verified": delivery.verified, "remote_addr": delivery.remote_addr,
            "content_type": delivery.content_type, "size": delivery.size, "headers": delivery.headers,
            "payload": payload, "body": shown, "body_sha256": delivery.body_ref["sha256"],
            "disposition": delivery.disposition, "routing": delivery.routing, "todos": delivery.todos,
            "received_at": iso(delivery.received_at),
            **({"payload_pruned": pruned_note(pruned)} if pruned is not None else {}),
        }

    def event_body(self, event_id: str, *, caller: Caller) -> tuple[bytes, str | None]:
        """A delivery's raw body exactly as received, and its content type."""
        delivery = self._visible_delivery(event_id, caller)
        body, _, pruned = delivery_payload(self.store, delivery)
        if body is None:
            raise Conflict(f"event {event_id}: {pruned_note(pruned)['text']}")
        return body, delivery.content_type

    def _visible_delivery(self, event_id: str, caller: Caller) -> Delivery:
        parsed = parse_id(DELIVERY_PREFIX, event_id)
        delivery = self.store.load(Delivery, parsed) if parsed else None
        if delivery is None:
            raise NotFound(f"event {event_id} not found")
        owner = self.store.load(Endpoint, endpoint_uuid_of(delivery.endpoint_id))
        if owner is None or not self.app.owns(caller, owner):
            raise NotFound(f"event {event_id} not found")
        return delivery
