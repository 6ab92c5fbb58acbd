"""The routing decision (CONTRACT §5): an evaluator's outcome turned into where a delivery goes.

Each rule sees the delivery's envelope (domain/envelopes.py); the first rule whose first output
is neither false nor null decides; a fault (jq error, time budget spent) fails closed into the
reserved `quarantine` queue on the owner endpoint. The rule set itself, its checks and the
grant are domain/rule_set.py; the static scan of jq programs domain/jq_scan.py; the subject
`once` counts by domain/subjects.py.

This module is pure: it turns an evaluator's outcome into a `Decision`. Compiling and running jq
happens elsewhere (`interfaces/rules`), behind the `Matched` / `NoMatch` / `Faulted` outcomes
defined here.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from domain.names import QUARANTINE
from domain.rule_set import RuleSet, copy_action
from domain.trust import Actor


# --- evaluator outcomes ----------------------------------------------------------------------


@dataclass(frozen=True)
class Matched:
    """The rule at `index` (0-based) is the first whose first output is neither false nor null."""

    index: int


@dataclass(frozen=True)
class NoMatch:
    """No rule matched (each produced nothing, false or null)."""


FAULT_REASONS = ("timeout", "error", "too_large")


@dataclass(frozen=True)
class Faulted:
    """Evaluation failed at rule `index` (None when no rule is to blame); reason is "timeout",
    "error: <jq message>" or "too_large: <what was too large>" (an envelope too big to read
    within the delivery's budget)."""

    index: int | None
    reason: str

    @property
    def kind(self) -> str:
        """Why, in one word of FAULT_REASONS: "timeout", "error" or "too_large"."""
        head = self.reason.partition(":")[0].strip()
        return head if head in FAULT_REASONS else "error"

    @property
    def detail(self) -> str:
        """What happened, for a person (rules named by number from 1, as people count)."""
        head, _, rest = self.reason.partition(":")
        if head.strip() in FAULT_REASONS and rest.strip():
            return rest.strip()
        if self.kind == "timeout":
            if self.index is None:
                return "the rules did not finish within the delivery's time budget"
            return f"rule #{self.index + 1} did not finish within its time budget"
        return self.reason if head.strip() not in FAULT_REASONS else self.kind


Outcome = Matched | NoMatch | Faulted


# --- the decision ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Decision:
    """Where a delivery goes: dropped, held in quarantine, or a queue on some of its target endpoints.

    `held` is a delivery an operator must look at first (an untrusted sender, or a rule's
    `{"quarantine": true}`); `once_subject` is set when the action asked for `once` and the
    delivery has a subject: each target then opens a todo only if none is live for it."""

    drop: bool
    queue: str | None
    endpoints: tuple[str, ...]
    faulted: bool
    trace: dict
    held: bool = False
    once_subject: str | None = None

    @property
    def disposition(self) -> str:
        """How the stored delivery is marked: routed, dropped, faulted or held."""
        return "faulted" if self.faulted else "held" if self.held else "dropped" if self.drop else "routed"

    def to_json(self) -> dict[str, Any]:
        out = {"drop": self.drop, "queue": self.queue, "endpoints": list(self.endpoints), "faulted": self.faulted}
        if self.held:
            out["held"] = True
        return out


def decide(rule_set: RuleSet, outcome: Outcome, *, targets: tuple[str, ...], target_queue: str,
           scopes: Mapping[str, Collection[str]] | None = None, untrusted: Actor | None = None,
           subject: str | None = None, webhook_id: str | None = None) -> Decision:
    """First match wins; no match takes the default action, else the target queue on every target;
    a fault holds one todo in `quarantine` on the owner (targets[0]), its trace saying why
    (`reason`: timeout, error or too_large, and a `detail` for people).

    `{"quarantine": true}` holds the delivery the same way (trace stage `rule` or `default`);
    `untrusted` (the actor of a delivery the webhook does not trust) holds whatever the rules
    chose except a drop (trace stage `untrusted`, naming `webhook_id`, whose trust refused it).
    `exclusive` keeps only the first target, in
    target order, whose scope (`scopes`, endpoint id → queues) contains the queue; `once` names
    the delivery's `subject` in the decision (none: the flag is ignored)."""
    targets = tuple(targets)
    decision = _decide(rule_set, outcome, targets, target_queue, scopes or {}, subject)
    if untrusted is None or decision.drop:
        return decision
    trace = {"stage": "untrusted", "actor": untrusted.named(), "webhook_id": webhook_id,
             "action": {"queue": QUARANTINE}, "rules": decision.trace}
    return Decision(drop=False, queue=QUARANTINE, endpoints=targets[:1], faulted=False, trace=trace, held=True)


def _decide(rule_set: RuleSet, outcome: Outcome, targets: tuple[str, ...], target_queue: str,
            scopes: Mapping[str, Collection[str]], subject: str | None) -> Decision:
    match outcome:
        case Matched(index=index):
            if not 0 <= index < len(rule_set.rules):
                raise ValueError(f"matched rule index {index} is out of range")
            rule = rule_set.rules[index]
            trace = {"stage": "rule", "rule_index": index, "rule_id": rule.id, "action": copy_action(rule.action)}
            return _apply(rule.action, targets, trace, scopes, subject)
        case NoMatch():
            action = rule_set.default_action if rule_set.default_action is not None else {"queue": target_queue}
            return _apply(action, targets, {"stage": "default", "action": copy_action(action)}, scopes, subject)
        case Faulted(index=index):
            trace: dict[str, Any] = {"stage": "fault"}
            if index is not None:
                trace["rule_index"] = index
                if 0 <= index < len(rule_set.rules):
                    trace["rule_id"] = rule_set.rules[index].id
            trace["reason"] = outcome.kind
            trace["detail"] = outcome.detail
            trace["action"] = {"queue": QUARANTINE}
            return Decision(drop=False, queue=QUARANTINE, endpoints=targets[:1], faulted=True, trace=trace)
    raise TypeError(f"not a routing outcome: {outcome!r}")


def _apply(action: Mapping[str, Any], targets: tuple[str, ...], trace: dict,
           scopes: Mapping[str, Collection[str]], subject: str | None) -> Decision:
    if action.get("drop") is True:
        return Decision(drop=True, queue=None, endpoints=(), faulted=False, trace=trace)
    if action.get("quarantine") is True:
        return Decision(drop=False, queue=QUARANTINE, endpoints=targets[:1], faulted=False, trace=trace, held=True)
    queue = action["queue"]
    chosen = action.get("endpoints")
    endpoints = targets if chosen is None else tuple(t for t in targets if t in chosen)
    if action.get("exclusive") is True:
        endpoints = next(((t,) for t in endpoints if queue in scopes.get(t, ())), ())
    once_subject = subject if action.get("once") is True else None
    if once_subject is not None:
        trace["subject"] = once_subject
    return Decision(drop=False, queue=queue, endpoints=endpoints, faulted=False, trace=trace,
                    once_subject=once_subject)


def repeat_trace(trace: Mapping[str, Any]) -> dict[str, Any]:
    """The stored delivery's trace when `once` found a live todo for its subject: `once: "repeat"`."""
    return {**trace, "once": "repeat"}
