"""A webhook's routing rules: read, save (after a dry run), test on one delivery, replay.

Rules are evaluated in the rule engine's worker processes (the RuleEngine port); the
decisions they lead to are the domain's (domain/routing.py, the rule set domain/rule_set.py).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping
from typing import Any, NoReturn

from application.access import Access, Caller
from application.hooks import Hooks
from application.payloads import delivery_payload, pruned_note
from application.ports import RuleEngine, Views
from domain.endpoint import Endpoint, endpoint_uuid_of
from domain.envelopes import envelope
from domain.errors import Conflict, InvalidArgument, NotFound
from domain.ingest import delivery_kind, redact_headers
from domain.signatures import trust_of
from domain.titles import derive_title
from domain.routing import Faulted, NoMatch, decide
from domain.rule_set import RuleSet, check_grant, parse_rule_set, rule_label
from domain.subjects import subject_of
from domain.webhook import Webhook

DRY_RUN_DELIVERIES = 50
# How many stored deliveries a replay reads when N is not given: the board and the CLI both use it.
DEFAULT_REPLAY_LAST = 1000  # CONTRACT §2: `rules replay --last N` defaults to 1000; the board uses it too
REPLAY_MAX, REPLAY_CHANGED_SHOWN = 100_000, 100


def _new_rule_id() -> str:
    return "rule_" + secrets.token_hex(12)


def rule_set_of(webhook: Webhook) -> RuleSet:
    """A webhook's saved rules."""
    return parse_rule_set(
        {"rules": webhook.rules, "default_action": webhook.default_action, "params": webhook.params},
        new_rule_id=_new_rule_id, require_ids=True,
    )


def _kind_and_title(envelope_json: str | bytes) -> tuple[str | None, str]:
    """A stored delivery's kind and the title its todo got (derived again from the envelope)."""
    env = json.loads(envelope_json)
    return env.get("kind"), derive_title(env.get("source"), env.get("kind"), env.get("payload"),
                                         size=env.get("size"), content_type=env.get("content_type"))


class Rules:
    def __init__(self, views: Views, access: Access, hooks: Hooks, engine: RuleEngine) -> None:
        self.views = views
        self.access = access
        self.hooks = hooks
        self.engine = engine

    def rules(self, webhook_id: str, *, caller: Caller) -> tuple[Webhook, RuleSet]:
        webhook, _ = self.access.webhook(webhook_id, caller)
        return webhook, rule_set_of(webhook)

    def _candidate(self, document: Mapping[str, Any], webhook: Webhook, owner: Endpoint, *,
                   require_ids: bool) -> RuleSet:
        if not isinstance(document, Mapping):
            raise InvalidArgument("rules must be an object {rules, default_action?, params?}")
        document = {k: v for k, v in document.items() if k != "webhook_id"}  # what `rules get` prints reads back
        rule_set = parse_rule_set(document, new_rule_id=_new_rule_id, require_ids=require_ids)
        check_grant(rule_set, allowed_queues=set(owner.webhook_queues), target_endpoint_ids=set(webhook.targets))
        self.engine.check_compiles(rule_set)
        return rule_set

    def set_rules(self, webhook_id: str, document: Mapping[str, Any], *, caller: Caller) -> tuple[Webhook, RuleSet]:
        """Validates, dry-runs over the 50 latest deliveries (any fault of the rules refuses; a
        timeout only when it happens twice), then saves.

        A delivery too large to read within the budget faults before any rule runs, whatever the
        rules: it says nothing about the candidate, so it refuses nothing (else one big delivery
        would lock a webhook's rules until 50 newer ones pushed it out)."""
        webhook, owner = self.access.webhook(webhook_id, caller)
        rule_set = self._candidate(document, webhook, owner, require_ids=False)
        self.views.catch_up()
        recent = self.views.recent_envelopes(webhook.webhook_id, DRY_RUN_DELIVERIES)
        if rule_set.rules and recent:
            outcomes = [outcome for outcome, _ in self.engine.evaluate_many(rule_set, [env for _, env in recent])]
            # A timeout may be the machine's (a loaded moment, a worker's first run), not the
            # rule's: those deliveries run once more, and a rule that is slow times out again.
            slow = [i for i, outcome in enumerate(outcomes) if isinstance(outcome, Faulted) and outcome.kind == "timeout"]
            if slow:
                again = self.engine.evaluate_many(rule_set, [recent[i][1] for i in slow])
                for i, (outcome, _) in zip(slow, again):
                    outcomes[i] = outcome
            for (event_id, _), outcome in zip(recent, outcomes):
                if isinstance(outcome, Faulted) and outcome.kind != "too_large":
                    index = outcome.index if outcome.index is not None and outcome.index < len(rule_set.rules) else None
                    named = rule_label(index, rule_set.rules[index].id if index is not None else None)
                    raise InvalidArgument(f"{named} faulted on delivery {event_id}: {outcome.kind}: {outcome.detail}")
        saved = rule_set.to_json()
        self.hooks.change(webhook_id, caller, lambda w, uow: w.set_rules(
            now=uow.now, actor=caller.label, rules=saved["rules"], default_action=saved["default_action"],
            params=saved["params"]))
        return webhook, rule_set

    def test_rules(self, webhook_id: str, *, caller: Caller, payload: Any = None, headers: Mapping[str, str] | None = None,
                   event_id: str | None = None, candidate: Mapping[str, Any] | None = None,
                   has_payload: bool = False) -> dict[str, Any]:
        """A dry run of saved or candidate rules on one payload or one stored delivery (one whose body
        retention pruned is a conflict that says so); saves nothing."""
        webhook, owner = self.access.webhook(webhook_id, caller)
        has_payload = has_payload or payload is not None  # the flag only marks a JSON null payload as given
        if has_payload == (event_id is not None):
            raise InvalidArgument("give exactly one of payload or event_id")
        rule_set = (self._candidate(candidate, webhook, owner, require_ids=True) if candidate is not None
                    else rule_set_of(webhook))
        if event_id is not None:
            self.views.catch_up()
            stored = self.views.delivery_envelope(webhook.webhook_id, event_id)
            if stored is None:
                self._refuse_missing(webhook, event_id, caller)
            env = json.loads(stored)
        else:
            lowered = {str(k).lower(): str(v) for k, v in (headers or {}).items()}
            body = json.dumps(payload, separators=(",", ":")).encode()
            trust_mode, verified = trust_of(webhook.source_type)
            env = envelope(
                source=webhook.source_type,
                kind=delivery_kind(lowered, payload if webhook.source_type == "cairn" and isinstance(payload, dict) else None,
                                   webhook.source_type, payload),
                webhook_id=webhook.webhook_id, trust_mode=trust_mode, verified=verified,
                content_type="application/json", size=len(body), headers=redact_headers(lowered), payload=payload,
            )
        # the webhook's trust as it is now decides, as it would for a delivery arriving now
        actor = webhook.trust.actor(webhook.source_type, env.get("payload"), verified=bool(env.get("verified")))
        env["actor"] = actor.to_json()
        outcome = self.engine.evaluate(rule_set, env) if rule_set.rules else NoMatch()
        decision = decide(rule_set, outcome, targets=webhook.targets, target_queue=webhook.target_queue,
                          scopes=self._scopes(webhook), untrusted=actor if webhook.trust.holds(actor) else None,
                          subject=subject_of(webhook.source_type, env.get("kind"), env.get("payload")),
                          webhook_id=webhook.webhook_id)
        return {"decision": decision.to_json(), "trace": decision.trace, "envelope": env}

    def _refuse_missing(self, webhook: Webhook, event_id: str, caller: Caller) -> NoReturn:
        """A delivery of this webhook whose body retention pruned is a conflict that says so; any
        other delivery the views do not hold (unknown, foreign, another webhook's) is not found."""
        delivery = self.access.delivery(event_id, caller)  # not_found: unknown or foreign
        if delivery.webhook_id == webhook.webhook_id:
            _, _, pruned = delivery_payload(self.hooks.store, delivery)
            if pruned is not None:
                raise Conflict(f"event {event_id} has no body to dry-run: {pruned_note(pruned)['text']}")
        raise NotFound(f"event {event_id} not found")

    def _scopes(self, webhook: Webhook) -> dict[str, tuple[str, ...]]:
        """Each target endpoint's queues (what `exclusive` picks by)."""
        loaded = self.hooks.store.load_many([(Endpoint, endpoint_uuid_of(t)) for t in webhook.targets])
        return {e.endpoint_id: e.queues for e in loaded.values() if e is not None}

    def replay(self, webhook_id: str, candidate: Mapping[str, Any], *, caller: Caller,
               last: int | None = None) -> dict[str, Any]:
        """Candidate rules against the saved ones over the last N stored deliveries (default 1000);
        each changed delivery is named by id, kind and title."""
        if last is None:
            last = DEFAULT_REPLAY_LAST
        if isinstance(last, bool) or not isinstance(last, int) or not 1 <= last <= REPLAY_MAX:
            raise InvalidArgument(f"last must be within 1..{REPLAY_MAX}")
        webhook, owner = self.access.webhook(webhook_id, caller)
        rule_set = self._candidate(candidate, webhook, owner, require_ids=True)
        saved = rule_set_of(webhook)
        self.views.catch_up()
        recent = self.views.recent_envelopes(webhook.webhook_id, last)
        outcomes = self.engine.evaluate_many(rule_set, [env for _, env in recent], compare_with=saved)
        counts: dict[str, int] = {}
        changed: list[dict[str, Any]] = []
        scopes = self._scopes(webhook)
        for (event_id, env_json), (after_outcome, before_outcome) in zip(recent, outcomes):
            after = decide(rule_set, after_outcome, targets=webhook.targets, target_queue=webhook.target_queue,
                           scopes=scopes)
            before = decide(saved, before_outcome, targets=webhook.targets, target_queue=webhook.target_queue,
                            scopes=scopes)
            key = ("faulted" if after.faulted else "held" if after.held else "drop" if after.drop
                   else f"queue:{after.queue}")
            counts[key] = counts.get(key, 0) + 1
            if after.to_json() != before.to_json() and len(changed) < REPLAY_CHANGED_SHOWN:
                kind, title = _kind_and_title(env_json)
                changed.append({"event_id": event_id, "kind": kind, "title": title,
                                "before": before.to_json(), "after": after.to_json()})
        return {"evaluated": len(recent), "decisions": counts, "changed": changed}
