"""Routing rules (CONTRACT §5): the rule-set document, its checks, and the routing decision.

A webhook carries an ordered list of at most 32 jq rules, an optional default action and
params. Each rule sees the delivery's envelope; the first rule whose first output is neither
false nor null decides; a fault (jq error, time budget spent) fails closed into the reserved
`quarantine` queue on the owner endpoint. An action is `{"queue": Q}` (with `endpoints`, `once`
and `exclusive` optional), `{"drop": true}` or `{"quarantine": true}` (CONTRACT §5, §13).

This module is pure: it validates the document (structure, ids, actions, params size, and a
lexical scan for forbidden jq functions), checks actions against a grant, and turns an
evaluator's outcome into a `Decision`. Compiling and running jq happens elsewhere
(`interfaces/rules`), behind the `Matched` / `NoMatch` / `Faulted` outcomes defined here.

Rules are named in messages by number, counting from 1 as people do ("rule #3 (rule_ab12…): …"
is the rule at `rule_index` 2 of a trace, which counts from 0).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from domain.errors import DomainError, InvalidArgument
from domain.names import QUARANTINE, check_queue_name
from domain.trust import Actor

MAX_RULES = 32
EXPR_MAX_BYTES = 4096
NAME_MAX_CHARS = 200
PARAMS_MAX_BYTES = 16 * 1024
SCAN_CACHE_SIZE = 1024  # expressions whose scan is remembered
SUBJECT_SOURCES = ("github", "gitea")
SUBJECT_KINDS = ("issue", "pull_request")  # issues, issue_comment, pull_request_review, … (and Gitea's)
SUBJECT_PART_MAX_CHARS = 256
QUEUE_FLAGS = ("once", "exclusive")
NO_ACTOR = {"sender": None, "association": None, "trusted": None}

RULE_ERROR_CODES = frozenset({
    "too_many_rules", "invalid_rule", "invalid_expression", "forbidden_function",
    "invalid_params", "forbidden", "invalid_argument",
})

# jq builtins that reach outside the envelope (environment, other inputs, stderr, files,
# the process): refused wherever they would be called.
FORBIDDEN_FUNCTIONS = frozenset({
    "env", "input", "inputs", "input_filename", "debug", "stderr", "halt", "halt_error",
    "import", "include",
})
# Refused as `$NAME` (`$ENV`, `$__loc__`); `__loc__` is refused even without the `$`.
FORBIDDEN_VARIABLES = frozenset({"ENV", "__loc__"})

_RULE_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
_RULE_KEYS = frozenset({"id", "name", "expr", "action"})
_DOCUMENT_KEYS = frozenset({"rules", "default_action", "params"})
_IDENT = re.compile(r"(?:[a-zA-Z_][a-zA-Z_0-9]*::)*[a-zA-Z_][a-zA-Z_0-9]*")
_NUMBER = re.compile(r"[0-9.]+(?:[eE][+-]?[0-9]+)?")
_FORMAT = re.compile(r"@[a-zA-Z0-9_]+")
_FIELD = re.compile(r"[a-zA-Z_][a-zA-Z_0-9]*")


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
        out["action"] = _copy_action(self.action)
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
            "default_action": _copy_action(self.default_action) if self.default_action is not None else None,
            "params": json.loads(json.dumps(self.params)),
        }


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
            trace = {"stage": "rule", "rule_index": index, "rule_id": rule.id, "action": _copy_action(rule.action)}
            return _apply(rule.action, targets, trace, scopes, subject)
        case NoMatch():
            action = rule_set.default_action if rule_set.default_action is not None else {"queue": target_queue}
            return _apply(action, targets, {"stage": "default", "action": _copy_action(action)}, scopes, subject)
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


def subject_of(source: str, kind: str | None, payload: Any) -> str | None:
    """What `once` counts by: `<source>:<owner>/<repo>#<n>` for an issue or pull-request event of
    github or gitea (`n` from `issue.number`, `pull_request.number` or `number`), `cairn:<data.id>`
    for cairn; None where there is no subject."""
    if not isinstance(payload, Mapping):
        return None
    if source == "cairn":
        data = payload.get("data")
        ident = data.get("id") if isinstance(data, Mapping) else None
        text = _subject_part(ident)
        return f"cairn:{text}" if text else None
    if source not in SUBJECT_SOURCES or not isinstance(kind, str) or not kind.startswith(SUBJECT_KINDS):
        return None
    repo = _repository(payload.get("repository"))
    number = None
    for carrier in (payload.get("issue"), payload.get("pull_request"), payload):
        value = carrier.get("number") if isinstance(carrier, Mapping) else None
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            number = value
            break
    return f"{source}:{repo}#{number}" if repo and number is not None else None


def _repository(repository: Any) -> str | None:
    if not isinstance(repository, Mapping):
        return None
    full_name = _subject_part(repository.get("full_name"))
    if full_name and "/" in full_name:
        return full_name
    owner = repository.get("owner")
    owner_login = _subject_part(owner.get("login")) if isinstance(owner, Mapping) else None
    name = _subject_part(repository.get("name"))
    return f"{owner_login}/{name}" if owner_login and name else None


def _subject_part(value: Any) -> str | None:
    """A string or integer usable inside a subject (one line, no NUL, at most 256 characters)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, str) and value.strip() and len(value) <= SUBJECT_PART_MAX_CHARS and value.isprintable():
        return value
    return None


def envelope(*, source: str, kind: str | None, webhook_id: str, trust_mode: str, verified: bool,
             content_type: str | None, size: int, headers: Mapping[str, str], payload: Any,
             actor: Actor | None = None) -> dict[str, Any]:
    """What every rule sees: the delivery's facts, who sent it ({sender, association, trusted},
    nulls where absent), its (lower-cased, redacted) headers and payload."""
    return {
        "source": source, "kind": kind, "webhook_id": webhook_id, "trust_mode": trust_mode,
        "verified": verified, "content_type": content_type, "size": size,
        "actor": actor.to_json() if actor is not None else dict(NO_ACTOR),
        "headers": {str(name).lower(): value for name, value in headers.items()}, "payload": payload,
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


def _copy_action(action: Mapping[str, Any]) -> dict[str, Any]:
    copied = dict(action)
    if "endpoints" in copied:
        copied["endpoints"] = list(copied["endpoints"])
    return copied


# --- the lexical scan ------------------------------------------------------------------------


def find_forbidden(expr: str) -> str | None:
    """The first forbidden function or variable the jq expression would use (`env`, `$ENV`, …),
    else None. Mirrors jq 1.8's lexer: string literals and comments are skipped but string
    interpolations are code; `.env` (a field) and `{env: …}` (an object key) are not calls."""
    return _scan(expr)[0]


def without_comments(expr: str) -> str:
    """The expression with each `#` comment blanked out (as jq 1.8 reads comments), so that it
    can be embedded in a larger program without a trailing comment swallowing what follows."""
    pieces, last = [], 0
    for start, end in _scan(expr)[1]:
        pieces.append(expr[last:start])
        pieces.append(" ")
        last = end
    pieces.append(expr[last:])
    return "".join(pieces)


@lru_cache(maxsize=SCAN_CACHE_SIZE)
def _scan(expr: str) -> tuple[str | None, tuple[tuple[int, int], ...]]:
    """(first forbidden name, comment spans); remembered, as stored rules are re-read per delivery."""
    scanner = _Scanner(expr)
    found = scanner.run()
    return found, tuple(scanner.comments)


class _Scanner:
    """A tokenizer that follows jq 1.8's lexer (flex longest match) closely enough to see calls."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.stack: list[str] = []  # open brackets: "(", "[", "{", or "\\(" for an interpolation
        self.prev = ""  # the kind of the previous significant token
        self.found: list[str] = []  # forbidden names, in order of appearance
        self.comments: list[tuple[int, int]] = []  # (start, end) of each comment

    def run(self) -> str | None:
        """Scans the whole text; the first forbidden name, if any."""
        while self.pos < len(self.text):
            self._token()
        return self.found[0] if self.found else None

    def _token(self) -> None:
        text, pos = self.text, self.pos
        char = text[pos]
        if char in " \t\n\r":
            self.pos += 1
        elif char == "#":
            self.pos = _comment_end(text, pos)
            self.comments.append((pos, self.pos))
        elif char == '"':
            self._string()
        elif char == "$":
            self._variable()
        elif char == "@" and (fmt := _FORMAT.match(text, pos)):
            self._advance(fmt.end(), "format")
        elif char == "." or "0" <= char <= "9":
            self._dot_or_number()
        elif char == "_" or (char.isascii() and char.isalpha()):
            self._identifier()
        elif char in "([{":
            self.stack.append(char)
            self._advance(pos + 1, char)
        elif char in ")]}":
            top = self.stack[-1] if self.stack else ""
            if top != "\\(" or char == ")":  # a mismatched closer does not compile anyway
                if self.stack:
                    self.stack.pop()
            self._advance(pos + 1, "interpolation end" if top == "\\(" and char == ")" else char)
        elif text.startswith("?//", pos):
            self._advance(pos + 3, "?//")
        else:
            self._advance(pos + 1, char)

    def _advance(self, pos: int, kind: str) -> None:
        self.pos, self.prev = pos, kind

    def _string(self) -> None:
        """Skips a string literal; each interpolation `\\(…)` in it is scanned as code."""
        text, pos = self.text, self.pos + 1
        while pos < len(text):
            char = text[pos]
            if char == '"':
                self._advance(pos + 1, "literal")
                return
            if char != "\\":
                pos += 1
            elif not text.startswith("\\(", pos):
                pos += 2  # an escape, such as \" or \n
            else:
                self.stack.append("\\(")
                depth = len(self.stack)
                self._advance(pos + 2, "(")
                while self.pos < len(text) and not (self.prev == "interpolation end" and len(self.stack) < depth):
                    self._token()
                pos = self.pos
        self.pos = pos  # unterminated: jq refuses to compile it

    def _variable(self) -> None:
        text, pos = self.text, self.pos + 1
        while pos < len(text) and text[pos] in " \t\n\r":
            pos += 1  # `$ ENV` is a syntax error in jq 1.8; refuse it all the same
        ident = _IDENT.match(text, pos)
        if ident is None:
            self._advance(self.pos + 1, "$")
            return
        self._advance(ident.end(), "variable")
        # `$env` or `$input` are the rule's own variables; `$ENV` and `$__loc__` are jq's
        self.found.extend(f"${name}" for name in ident.group().split("::") if name in FORBIDDEN_VARIABLES)

    def _dot_or_number(self) -> None:
        text, pos = self.text, self.pos
        if text[pos] == "." and (field_name := _FIELD.match(text, pos + 1)):
            self._advance(field_name.end(), "field")  # `.env` is data, not the builtin
            return
        number = _NUMBER.match(text, pos)
        length = number.end() - pos if number else 1
        if text.startswith("..", pos) and length <= 2:
            self._advance(pos + 2, "..")
        elif length > 1 or text[pos] != ".":
            self._advance(pos + length, "literal")
        else:
            self._advance(pos + 1, ".")

    def _identifier(self) -> None:
        text = self.text
        ident = _IDENT.match(text, self.pos)
        if ident is None:  # unreachable: the caller saw [A-Za-z_]
            self._advance(self.pos + 1, "?")
            return
        prev = self.prev
        self._advance(ident.end(), "ident")
        names = ident.group().split("::")
        if self.stack and self.stack[-1] == "{" and prev in ("{", ",") and len(names) == 1:
            following = _skip_blank(text, self.pos)
            if text[following:following + 1] in (":", ",", "}") and not text.startswith("::", following):
                return  # an object key (`{env: 1}`), or `{env}` which means `{env: .env}`
        self.found.extend(name for name in names if name in FORBIDDEN_FUNCTIONS or name == "__loc__")


def _comment_end(text: str, pos: int) -> int:
    """jq 1.8: a comment runs to the end of the line; a backslash escapes the next character,
    so an odd number of backslashes before a newline continues the comment."""
    pos += 1
    while pos < len(text) and text[pos] != "\n":
        pos += 2 if text[pos] == "\\" else 1
    return min(pos, len(text))


def _skip_blank(text: str, pos: int) -> int:
    while pos < len(text):
        if text[pos] in " \t\n\r":
            pos += 1
        elif text[pos] == "#":
            pos = _comment_end(text, pos)
        else:
            break
    return pos
