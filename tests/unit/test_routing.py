"""Routing rules, the pure part: the rule-set document, the forbidden-function scan, the grant,
and the decision taken from an evaluator's outcome (CONTRACT §5)."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest

from domain.errors import DomainError
from domain.envelopes import envelope
from domain.jq_scan import find_forbidden, without_comments
from domain.routing import Decision, Faulted, Matched, NoMatch, decide
from domain.rule_set import Rule, RuleError, RuleSet, check_grant, parse_rule_set, rule_label

TARGETS = ("ep_owner", "ep_b", "ep_c")


def minted() -> Callable[[], str]:
    counter = itertools.count()
    return lambda: f"rule_{next(counter):024x}"


def parse(document: dict, **kwargs) -> RuleSet:
    return parse_rule_set(document, new_rule_id=minted(), **kwargs)


def refusal(document: object, **kwargs) -> RuleError:
    with pytest.raises(RuleError) as caught:
        parse_rule_set(document, new_rule_id=minted(), **kwargs)
    return caught.value


def rule(expr: str = "true", action: dict | None = None, **extra) -> dict:
    return {"expr": expr, "action": action if action is not None else {"queue": "work"}, **extra}


# --- the document ----------------------------------------------------------------------------


def test_a_valid_document_is_parsed_with_ids_minted_where_omitted():
    rule_set = parse({
        "rules": [rule(".kind == \"push\"", name="pushes"), rule("true", {"drop": True}, id="keep-1")],
        "default_action": {"queue": "triage"},
        "params": {"repos": ["a/b"]},
    })
    assert [r.id for r in rule_set.rules] == ["rule_000000000000000000000000", "keep-1"]
    assert rule_set.rules[0] == Rule(id="rule_000000000000000000000000", expr='.kind == "push"',
                                     action={"queue": "work"}, name="pushes")
    assert rule_set.default_action == {"queue": "triage"}
    assert rule_set.params == {"repos": ["a/b"]}


def test_to_json_round_trips_through_parse_with_required_ids():
    rule_set = parse({"rules": [rule(name="n"), rule(action={"queue": "q", "endpoints": ["ep_b"]})],
                      "params": {"x": 1}})
    document = rule_set.to_json()
    assert document == {
        "rules": [
            {"id": "rule_000000000000000000000000", "name": "n", "expr": "true", "action": {"queue": "work"}},
            {"id": "rule_000000000000000000000001", "expr": "true", "action": {"queue": "q", "endpoints": ["ep_b"]}},
        ],
        "default_action": None,
        "params": {"x": 1},
    }
    assert parse(document, require_ids=True) == rule_set


def test_an_empty_rule_list_with_absent_options_is_the_empty_rule_set():
    assert parse({"rules": []}) == RuleSet()
    assert parse({"rules": [], "default_action": None, "params": None}) == RuleSet()


def test_rule_error_is_a_domain_error_with_its_code_on_the_instance():
    error = refusal({"rules": [rule()] * 33})
    assert isinstance(error, DomainError)
    assert error.code == "too_many_rules" and "33" in error.message
    assert str(error) == error.message
    with pytest.raises(ValueError):
        RuleError("no_such_code", "x")


def test_thirty_two_rules_are_allowed_and_thirty_three_are_too_many():
    assert len(parse({"rules": [rule()] * 32}).rules) == 32
    assert refusal({"rules": [rule()] * 33}).code == "too_many_rules"


@pytest.mark.parametrize("document", [None, [], "rules", {"rules": {}}, {"rules": "x"}, {},
                                      {"rules": [], "extra": 1}])
def test_a_document_of_the_wrong_shape_is_an_invalid_argument(document):
    assert refusal(document).code == "invalid_argument"


@pytest.mark.parametrize("bad_rule, says", [
    ("true", "must be an object"),
    ({"expr": "true"}, "action is required"),
    ({"action": {"queue": "work"}}, "expr"),
    (rule(""), "expr"),
    (rule("   "), "expr"),
    (rule(7), "expr"),
    (rule("." * 4097), "4097 bytes"),
    (rule("\"" + "é" * 2047 + "\""), "4096"),  # 2 + 4094 = 4096 bytes: fine (checked below)
    (rule(when="x"), "unknown field"),
    (rule(id=""), "id must be"),
    (rule(id="has space"), "id must be"),
    (rule(id="x" * 65), "id must be"),
    (rule(id=5), "id must be"),
    (rule(name=3), "name"),
    (rule(name="n" * 201), "name"),
    (rule(action={"queue": "quarantine"}), "reserved"),
    (rule(action={"queue": "Bad Queue"}), "invalid queue name"),
    (rule(action={"queue": ""}), "invalid queue name"),
    (rule(action={"queue": "work", "priority": 1}), "action must be"),
    (rule(action={"drop": False}), "drop must be true"),
    (rule(action={"drop": True, "queue": "work"}), "action must be"),
    (rule(action={}), "action must be"),
    (rule(action="work"), "action must be"),
    (rule(action={"queue": "work", "endpoints": []}), "non-empty list"),
    (rule(action={"queue": "work", "endpoints": "ep_b"}), "non-empty list"),
    (rule(action={"queue": "work", "endpoints": [1]}), "non-empty list"),
    (rule(action={"queue": "work", "endpoints": ["ep_b", "ep_b"]}), "twice"),
])
def test_an_invalid_rule_is_refused_naming_it(bad_rule, says):
    document = {"rules": [rule(id="first"), bad_rule]}
    if says == "4096":
        assert parse(document).rules[1].expr.startswith('"é')
        return
    error = refusal(document)
    assert error.code == "invalid_rule"
    assert error.message.startswith("rule #2")
    assert says in error.message


def test_the_message_carries_the_rule_id_when_there_is_one():
    error = refusal({"rules": [rule(id="keep"), rule(id="mine", action={"queue": "quarantine"})]})
    assert error.message.startswith("rule #2 (mine): ")


def test_rule_ids_must_be_unique():
    error = refusal({"rules": [rule(id="same"), rule(id="same")]})
    assert (error.code, error.message) == ("invalid_rule", "rule #2 (same): duplicate id")


def test_ids_are_required_when_asked_for():
    error = refusal({"rules": [rule(id="a"), rule()]}, require_ids=True)
    assert error.code == "invalid_rule" and error.message == "rule #2: id is required"


@pytest.mark.parametrize("default_action", [{"queue": "quarantine"}, {"drop": False}, {"queue": "w", "x": 1}, "w"])
def test_an_invalid_default_action_is_refused_as_the_default_action(default_action):
    error = refusal({"rules": [], "default_action": default_action})
    assert error.code == "invalid_rule" and error.message.startswith("default action: ")


@pytest.mark.parametrize("params", [[], "x", 3, {"big": "x" * (16 * 1024)}, {"nan": float("nan")}, {1: "x"}])
def test_params_must_be_a_json_object_of_at_most_16_kib(params):
    assert refusal({"rules": [], "params": params}).code == "invalid_params"


def test_params_of_exactly_16_kib_are_accepted_and_copied():
    params = {"k": "x" * (16 * 1024 - len('{"k":""}'))}
    rule_set = parse({"rules": [], "params": params})
    assert rule_set.params == params and rule_set.params is not params


# --- forbidden functions ---------------------------------------------------------------------


@pytest.mark.parametrize("expr, name", [
    ("env", "env"),
    ("env.HOME", "env"),
    ("$ENV", "$ENV"),
    ("$ENV.PATH", "$ENV"),
    ("{$ENV}", "$ENV"),
    ("$ ENV", "$ENV"),
    ("input", "input"),
    ("inputs", "inputs"),
    ("[inputs] | length", "inputs"),
    ("input_filename", "input_filename"),
    ("debug", "debug"),
    ('debug("here")', "debug"),
    ("stderr", "stderr"),
    ("halt", "halt"),
    ("halt_error(1)", "halt_error"),
    ('import "lib" as lib; .', "import"),
    ('include "lib"; .', "include"),
    ("$__loc__", "$__loc__"),
    ("{$__loc__}", "$__loc__"),
    ('"\\(env)"', "env"),  # an interpolation is code
    ('"a\\("b\\(input)")"', "input"),  # nested interpolations
    ('@base64 "x\\($ENV)"', "$ENV"),
    ('"\\(")")" | env', "env"),  # a ")" inside a string inside an interpolation
    (".a | env?", "env"),
    ("{a: env}", "env"),
    ("{(env | tostring): 1}", "env"),
    ("{a: .x | env}", "env"),
    (".[env:]", "env"),
    ("def env: 1; env", "env"),
    ("x::env", "env"),
    ("1 # a comment\n| env", "env"),
    ("1 # an even number of backslashes ends it \\\\\n| env", "env"),
    (".a?//env", "env"),
])
def test_a_forbidden_function_is_found(expr, name):
    assert find_forbidden(expr) == name
    error = refusal({"rules": [rule(id="ok"), rule(expr, id="bad")]})
    assert error.code == "forbidden_function"
    assert error.message.startswith("rule #2 (bad): ") and name in error.message


@pytest.mark.parametrize("expr", [
    ".env",  # field access
    ".payload.env",
    '."env"',
    ".env?",
    '.["env"]',
    '"env"',  # string literals
    '"input" == .x',
    '"say \\"env\\" \\\\"',
    '.headers["x-debug"] == "halt"',
    "{env: 1}",  # object keys, and {env} meaning {env: .env}
    "{env}",
    "{a: 1, env: 2}",
    "{if: 1, input: 2}",
    "$env",  # the rule's own variables
    ". as $input | $input",
    ". as $env_x | $env_x",
    "input_line_number",  # other builtins that merely share a prefix
    "environment",
    "debugger",
    "# env, input, $ENV in a comment\n.",
    "1 # a comment continued by a backslash \\\nenv",
    '.payload | has("env")',
    'getpath(["env"])',
    '@base64 "input"',
])
def test_what_only_looks_like_a_forbidden_function_is_allowed(expr):
    assert find_forbidden(expr) is None
    assert parse({"rules": [rule(expr)]}).rules[0].expr == expr


@pytest.mark.parametrize("expr, stripped", [
    ("1 # c\n+ 2", "1  \n+ 2"),
    ('"#" + "x" # y', '"#" + "x"  '),
    ('"\\(1 # c\n+ 2)#"', '"\\(1  \n+ 2)#"'),
    (".a # tail \\", ".a  "),
    ("1 # a \\\n + 5", "1  "),
])
def test_comments_are_blanked_out_for_embedding(expr, stripped):
    assert without_comments(expr) == stripped


# --- the grant -------------------------------------------------------------------------------


def test_actions_within_the_grant_pass():
    rule_set = parse({"rules": [rule(action={"queue": "work"}), rule(action={"drop": True}),
                                rule(action={"queue": "ops", "endpoints": ["ep_b"]})],
                      "default_action": {"queue": "ops"}})
    check_grant(rule_set, allowed_queues={"work", "ops"}, target_endpoint_ids=set(TARGETS))


@pytest.mark.parametrize("document, starts", [
    ({"rules": [rule(id="a"), rule(id="b", action={"queue": "secret"})]}, "rule #2 (b): queue 'secret'"),
    ({"rules": [rule(id="a", action={"queue": "work", "endpoints": ["ep_other"]})]}, "rule #1 (a): endpoint 'ep_other'"),
    ({"rules": [], "default_action": {"queue": "secret"}}, "default action: queue 'secret'"),
])
def test_an_action_outside_the_grant_is_forbidden_naming_the_rule(document, starts):
    with pytest.raises(RuleError) as caught:
        check_grant(parse(document), allowed_queues={"work"}, target_endpoint_ids=set(TARGETS))
    assert caught.value.code == "forbidden"
    assert caught.value.message.startswith(starts)


# --- the decision ----------------------------------------------------------------------------


SET = parse({"rules": [
    rule(id="all", action={"queue": "everyone"}),
    rule(id="some", action={"queue": "picked", "endpoints": ["ep_c", "ep_owner"]}),
    rule(id="gone", action={"drop": True}),
]})


def test_a_matched_queue_action_goes_to_every_target():
    decision = decide(SET, Matched(0), targets=TARGETS, target_queue="inbox")
    assert decision == Decision(drop=False, queue="everyone", endpoints=TARGETS, faulted=False, trace={
        "stage": "rule", "rule_index": 0, "rule_id": "all", "action": {"queue": "everyone"}})


def test_a_matched_action_with_endpoints_goes_only_to_those_in_target_order():
    decision = decide(SET, Matched(1), targets=TARGETS, target_queue="inbox")
    assert decision.endpoints == ("ep_owner", "ep_c") and decision.queue == "picked"
    assert decision.trace == {"stage": "rule", "rule_index": 1, "rule_id": "some",
                              "action": {"queue": "picked", "endpoints": ["ep_c", "ep_owner"]}}


def test_endpoints_no_longer_among_the_targets_are_skipped():
    decision = decide(SET, Matched(1), targets=("ep_b",), target_queue="inbox")
    assert (decision.drop, decision.endpoints) == (False, ())


def test_a_matched_drop_makes_no_todo():
    decision = decide(SET, Matched(2), targets=TARGETS, target_queue="inbox")
    assert decision.to_json() == {"drop": True, "queue": None, "endpoints": [], "faulted": False}
    assert decision.trace["stage"] == "rule" and decision.trace["action"] == {"drop": True}


def test_no_match_without_a_default_goes_to_the_target_queue_on_every_target():
    decision = decide(SET, NoMatch(), targets=TARGETS, target_queue="inbox")
    assert decision.to_json() == {"drop": False, "queue": "inbox", "endpoints": list(TARGETS), "faulted": False}
    assert decision.trace == {"stage": "default", "action": {"queue": "inbox"}}


@pytest.mark.parametrize("default_action, expected", [
    ({"queue": "triage"}, {"drop": False, "queue": "triage", "endpoints": list(TARGETS), "faulted": False}),
    ({"queue": "triage", "endpoints": ["ep_b"]}, {"drop": False, "queue": "triage", "endpoints": ["ep_b"], "faulted": False}),
    ({"drop": True}, {"drop": True, "queue": None, "endpoints": [], "faulted": False}),
])
def test_no_match_takes_the_default_action(default_action, expected):
    rule_set = parse({"rules": [rule()], "default_action": default_action})
    decision = decide(rule_set, NoMatch(), targets=TARGETS, target_queue="inbox")
    assert decision.to_json() == expected
    assert decision.trace == {"stage": "default", "action": default_action}


def test_a_fault_holds_one_todo_in_quarantine_on_the_owner():
    decision = decide(SET, Faulted(1, "timeout"), targets=TARGETS, target_queue="inbox")
    assert decision.to_json() == {"drop": False, "queue": "quarantine", "endpoints": ["ep_owner"], "faulted": True}
    assert decision.trace == {"stage": "fault", "rule_index": 1, "rule_id": "some", "reason": "timeout",
                              "detail": "rule #2 did not finish within its time budget",
                              "action": {"queue": "quarantine"}}


def test_a_fault_no_rule_is_blamed_for_has_no_rule_in_its_trace():
    decision = decide(SET, Faulted(None, "error: parse error"), targets=TARGETS, target_queue="inbox")
    assert decision.trace == {"stage": "fault", "reason": "error", "detail": "parse error",
                              "action": {"queue": "quarantine"}}
    assert decide(SET, Faulted(None, "x"), targets=(), target_queue="inbox").endpoints == ()


def test_a_matched_index_outside_the_rules_is_a_programming_error():
    with pytest.raises(ValueError):
        decide(SET, Matched(3), targets=TARGETS, target_queue="inbox")


def test_the_trace_does_not_share_the_rule_sets_action():
    decision = decide(SET, Matched(1), targets=TARGETS, target_queue="inbox")
    decision.trace["action"]["endpoints"].append("ep_x")
    assert SET.rules[1].action["endpoints"] == ["ep_c", "ep_owner"]


def test_the_envelope_has_the_contract_keys_and_lower_cased_headers():
    env = envelope(source="github", kind="issues", webhook_id="wh_1", trust_mode="signed", verified=True,
                   content_type="application/json", size=12, headers={"X-GitHub-Event": "issues"},
                   payload={"a": 1})
    assert list(env) == ["source", "kind", "webhook_id", "trust_mode", "verified", "content_type", "size",
                         "actor", "headers", "payload"]
    assert env["actor"] == {"sender": None, "association": None, "trusted": None}
    assert env["headers"] == {"x-github-event": "issues"}


def test_rules_are_named_by_position_and_id():
    assert rule_label(2, "rule_ab") == "rule #3 (rule_ab)"
    assert rule_label(0) == "rule #1"
    assert rule_label(None) == "the rules"


@pytest.mark.parametrize(("outcome", "reason", "detail"), [
    (Faulted(0, "timeout"), "timeout", "rule #1 did not finish within its time budget"),
    (Faulted(None, "timeout"), "timeout", "the rules did not finish within the delivery's time budget"),
    (Faulted(2, "error: explode input must be a string"), "error", "explode input must be a string"),
    (Faulted(None, "error: rule worker crashed"), "error", "rule worker crashed"),
    (Faulted(None, "too_large: the 5,242,880-byte envelope could not be read within the 250 ms delivery budget"),
     "too_large", "the 5,242,880-byte envelope could not be read within the 250 ms delivery budget"),
    (Faulted(None, "something odd"), "error", "something odd"),
])
def test_a_fault_trace_says_why(outcome, reason, detail):
    trace = decide(SET, outcome, targets=TARGETS, target_queue="inbox").trace
    assert (trace["stage"], trace["reason"], trace["detail"]) == ("fault", reason, detail)
    assert trace["action"] == {"queue": "quarantine"}
    assert ("rule_index" in trace) == (outcome.index is not None)
