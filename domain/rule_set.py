"""The rule-set document (CONTRACT §5): rules, actions and params, their checks at save.

A webhook carries an ordered list of at most 32 jq rules, an optional default action and
params. `parse_rule_set` validates the document (structure, ids, actions, params size, and the
lexical scan for forbidden jq functions, domain/jq_scan.py); `check_grant` checks its actions
against the owner's grant. An action is `{"queue": Q}` (with `endpoints`, `once` and
`exclusive` optional), `{"drop": true}` or `{"quarantine": true}` (CONTRACT §5, §13).

Rules are named in messages by number, counting from 1 as people do ("rule #3 (rule_ab12…): …"
is the rule at `rule_index` 2 of a trace, which counts from 0).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from domain.errors import DomainError, InvalidArgument
from domain.jq_scan import find_forbidden
from domain.names import check_queue_name

MAX_RULES = 32
EXPR_MAX_BYTES = 4096
NAME_MAX_CHARS = 200
PARAMS_MAX_BYTES = 16 * 1024
QUEUE_FLAGS = ("once", "exclusive")

RULE_ERROR_CODES = frozenset({
    "too_many_rules", "invalid_rule", "invalid_expression", "forbidden_function",
    "invalid_params", "forbidden", "invalid_argument",
})

_RULE_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
_RULE_KEYS = frozenset({"id", "name", "expr", "action"})
_DOCUMENT_KEYS = frozenset({"rules", "default_action", "params"})


class RuleError(DomainError):
    """Raised when a rule set is refused at save; `code` says why and the message names the rule."""

    def __init__(self, code: str, message: str) -> None:
        if code not in RULE_ERROR_CODES:
            raise ValueError(f"unknown rule error code {code!r}")
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Rule:
    """One routing rule: a jq expression over the envelope and the action taken when it matches."""

    id: str
    expr: str
    action: dict
    name: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id}
        if self.name is not None:
            out["name"] = self.name
        out["expr"] = self.expr
        out["action"] = copy_action(self.action)
        return out


@dataclass(frozen=True)
class RuleSet:
    """A webhook's ordered rules, its default action (None: the webhook's target queue) and params."""

    rules: tuple[Rule, ...] = ()
    default_action: dict | None = None
    params: dict = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "rules": [rule.to_json() for rule in self.rules],
            "default_action": copy_action(self.default_action) if self.default_action is not None else None,
            "params": json.loads(json.dumps(self.params)),
        }


def rule_label(index: int | None, rule_id: str | None = None) -> str:
    """How messages name the rule at 0-based `index`: "rule #3 (rule_ab12…)", counting from 1."""
    if index is None:
        return "the rules"
    return f"rule #{index + 1} ({rule_id})" if rule_id else f"rule #{index + 1}"


# --- parsing and checks ----------------------------------------------------------------------


def parse_rule_set(obj: Any, *, new_rule_id: Callable[[], str], require_ids: bool = False) -> RuleSet:
    """Validates `{rules, default_action?, params?}`: at most 32 rules with unique ids, valid
    actions, params of at most 16 KiB, and no forbidden jq function in any expression."""
    if not isinstance(obj, Mapping):
        raise RuleError("invalid_argument", "rules must be an object {rules, default_action?, params?}")
    unknown = sorted(str(key) for key in obj if key not in _DOCUMENT_KEYS)
    if unknown:
        raise RuleError("invalid_argument", f"unknown field(s) {', '.join(unknown)}: "
                                            "expected rules, default_action, params")
    rules_in = obj.get("rules")
    if not isinstance(rules_in, list | tuple):
        raise RuleError("invalid_argument", "rules must be a list")
    if len(rules_in) > MAX_RULES:
        raise RuleError("too_many_rules", f"{len(rules_in)} rules: at most {MAX_RULES} are allowed")
    rules: list[Rule] = []
    seen: set[str] = set()
    for index, raw in enumerate(rules_in):
        rule = _parse_rule(index, raw, new_rule_id=new_rule_id, require_ids=require_ids)
        if rule.id in seen:
            raise RuleError("invalid_rule", f"{rule_label(index, rule.id)}: duplicate id")
        seen.add(rule.id)
        rules.append(rule)
    default_raw = obj.get("default_action")
    default_action = None if default_raw is None else _parse_action(default_raw, "default action")
    return RuleSet(rules=tuple(rules), default_action=default_action, params=_parse_params(obj.get("params")))


def _parse_rule(index: int, raw: Any, *, new_rule_id: Callable[[], str], require_ids: bool) -> Rule:
    if not isinstance(raw, Mapping):
        raise RuleError("invalid_rule", f"{rule_label(index)}: must be an object {{id?, name?, expr, action}}")
    raw_id = raw.get("id")
    label = rule_label(index, raw_id if isinstance(raw_id, str) and _RULE_ID.fullmatch(raw_id) else None)
    unknown = sorted(str(key) for key in raw if key not in _RULE_KEYS)
    if unknown:
        raise RuleError("invalid_rule", f"{label}: unknown field(s) {', '.join(unknown)}")
    if raw_id is None:
        if require_ids:
            raise RuleError("invalid_rule", f"{label}: id is required")
        rule_id = new_rule_id()
        label = rule_label(index, rule_id)
    elif isinstance(raw_id, str) and _RULE_ID.fullmatch(raw_id):
        rule_id = raw_id
    else:
        raise RuleError("invalid_rule", f"{label}: id must be 1-64 of [A-Za-z0-9_-]")
    name = raw.get("name")
    if name is not None and (not isinstance(name, str) or len(name) > NAME_MAX_CHARS):
        raise RuleError("invalid_rule", f"{label}: name must be a string of at most {NAME_MAX_CHARS} characters")
    expr = raw.get("expr")
    if not isinstance(expr, str) or not expr.strip():
        raise RuleError("invalid_rule", f"{label}: expr must be a non-empty jq expression")
    try:
        expr_bytes = len(expr.encode())
    except UnicodeEncodeError:
        raise RuleError("invalid_rule", f"{label}: expr is not valid Unicode") from None
    if expr_bytes > EXPR_MAX_BYTES:
        raise RuleError("invalid_rule", f"{label}: expr is {expr_bytes} bytes, at most {EXPR_MAX_BYTES}")
    if "action" not in raw:
        raise RuleError("invalid_rule", f"{label}: action is required")
    action = _parse_action(raw["action"], label)
    forbidden = find_forbidden(expr)
    if forbidden is not None:
        raise RuleError("forbidden_function", f"{label}: {forbidden} is not allowed in rules")
    return Rule(id=rule_id, expr=expr, action=action, name=name)


def _parse_action(raw: Any, label: str) -> dict[str, Any]:
    shapes = ('{"queue": Q, "endpoints"?: [ids], "once"?: bool, "exclusive"?: bool}, {"drop": true}'
              ' or {"quarantine": true}')
    if not isinstance(raw, Mapping):
        raise RuleError("invalid_rule", f"{label}: action must be one of {shapes}")
    keys = set(raw)
    for flag in ("drop", "quarantine"):
        if keys == {flag}:
            if raw[flag] is not True:
                raise RuleError("invalid_rule", f"{label}: {flag} must be true")
            return {flag: True}
    if "queue" not in keys or not keys <= {"queue", "endpoints", *QUEUE_FLAGS}:
        raise RuleError("invalid_rule", f"{label}: action must be one of {shapes}")
    try:
        queue = check_queue_name(raw["queue"])
    except InvalidArgument as error:
        raise RuleError("invalid_rule", f"{label}: {error.message}") from None
    action: dict[str, Any] = {"queue": queue}
    if "endpoints" in keys:
        endpoints = raw["endpoints"]
        if (not isinstance(endpoints, list | tuple) or not endpoints
                or not all(isinstance(e, str) and e for e in endpoints)):
            raise RuleError("invalid_rule", f"{label}: endpoints must be a non-empty list of endpoint ids")
        if len(set(endpoints)) != len(endpoints):
            raise RuleError("invalid_rule", f"{label}: endpoints lists an endpoint twice")
        action["endpoints"] = list(endpoints)
    for flag in QUEUE_FLAGS:
        if flag in keys:
            if not isinstance(raw[flag], bool):
                raise RuleError("invalid_rule", f"{label}: {flag} must be true or false")
            if raw[flag]:
                action[flag] = True
    return action


def _parse_params(raw: Any) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise RuleError("invalid_params", "params must be a JSON object")
    try:
        encoded = json.dumps(raw, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        size = len(encoded.encode())
    except (TypeError, ValueError):
        raise RuleError("invalid_params", "params must be plain JSON (no NaN, no non-string keys)") from None
    if size > PARAMS_MAX_BYTES:
        raise RuleError("invalid_params", f"params are {size} bytes encoded, at most {PARAMS_MAX_BYTES}")
    copied = json.loads(encoded)
    if copied != raw:  # e.g. integer keys, which JSON would silently turn into strings
        raise RuleError("invalid_params", "params must be plain JSON (no NaN, no non-string keys)")
    return copied


def check_grant(rule_set: RuleSet, *, allowed_queues: set[str], target_endpoint_ids: set[str]) -> None:
    """Every action's queue is one the owner may route webhooks to, and its endpoints are
    among the webhook's targets."""
    actions = [(rule_label(i, rule.id), rule.action) for i, rule in enumerate(rule_set.rules)]
    if rule_set.default_action is not None:
        actions.append(("default action", rule_set.default_action))
    for label, action in actions:
        if action.get("drop") is True or action.get("quarantine") is True:
            continue
        if action["queue"] not in allowed_queues:
            raise RuleError("forbidden", f"{label}: queue {action['queue']!r} is outside the grant")
        for endpoint_id in action.get("endpoints", ()):
            if endpoint_id not in target_endpoint_ids:
                raise RuleError("forbidden", f"{label}: endpoint {endpoint_id!r} is not a target of this webhook")


def copy_action(action: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of an action that shares no list with it (documents and traces hand actions out)."""
    copied = dict(action)
    if "endpoints" in copied:
        copied["endpoints"] = list(copied["endpoints"])
    return copied
