"""Trusted senders, the pure part (CONTRACT §13): who sent a forge delivery, the webhook's policy,
its events, and the routing decision for untrusted senders, `quarantine`, `once` and `exclusive`.
Payloads are GitHub's and Gitea's documented examples (tests/fixtures)."""

from __future__ import annotations

import itertools
from datetime import datetime, timedelta, timezone
from uuid import UUID

import pytest

from domain.errors import Conflict, InvalidArgument
from domain.names import QUARANTINE
from domain.envelopes import envelope
from domain.routing import Decision, Faulted, Matched, NoMatch, decide, repeat_trace
from domain.rule_set import RuleError, check_grant, parse_rule_set
from domain.subjects import subject_of
from domain.trust import (
    MAX_TRUSTED_SENDERS, NO_POLICY, Actor, TrustPolicy, check_trusted_associations, check_trusted_senders,
    sender_of,
)
from domain.webhook import Webhook, WebhookTrustSet
from tests.fixtures import fixture_json

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
TARGETS = ("ep_owner", "ep_b", "ep_c")

ISSUES = fixture_json("github_issues_opened.json")  # octocat-alice, issue MEMBER
PULL = fixture_json("github_pull_request_opened.json")  # hubot-bob, pull request MEMBER
COMMENT = fixture_json("github_issue_comment_created.json")  # drive-by-dana, comment NONE on a MEMBER's issue
REVIEW = fixture_json("github_pull_request_review_submitted.json")  # reviewer-riley, review COLLABORATOR
GITEA_ISSUE = fixture_json("gitea_issues_opened.json")  # carol, no associations in Gitea's payloads


def parse(document: dict):
    counter = itertools.count()
    return parse_rule_set(document, new_rule_id=lambda: f"rule_{next(counter):024x}")


# --- who sent it -------------------------------------------------------------------------------


@pytest.mark.parametrize(("source", "payload", "expected"), [
    ("github", ISSUES, ("octocat-alice", "MEMBER")),
    ("github", PULL, ("hubot-bob", "MEMBER")),
    ("github", COMMENT, ("drive-by-dana", "NONE")),  # the comment's association, not the issue's
    ("github", REVIEW, ("reviewer-riley", "COLLABORATOR")),  # the review's, not the pull request's
    ("gitea", GITEA_ISSUE, ("carol", None)),
    ("cairn", ISSUES, (None, None)),  # only forges name a sender
    ("github", None, (None, None)),
    ("github", ["not", "an", "object"], (None, None)),
    ("github", {"sender": {"login": 7}, "issue": {"author_association": 3}}, (None, None)),
])
def test_the_actor_is_the_sender_login_and_the_first_present_association(source, payload, expected):
    assert sender_of(source, payload) == expected


def test_a_comment_without_an_association_does_not_borrow_the_issue_authors():
    payload = {**COMMENT, "comment": {k: v for k, v in COMMENT["comment"].items() if k != "author_association"}}
    assert payload["issue"]["author_association"] == "MEMBER"
    assert sender_of("github", payload) == ("drive-by-dana", None)


# --- the policy --------------------------------------------------------------------------------


def test_with_no_lists_every_verified_delivery_is_trusted_and_nothing_is_held():
    actor = NO_POLICY.actor("github", COMMENT, verified=True)
    assert actor == Actor("drive-by-dana", "NONE", True)
    assert not NO_POLICY.holds(actor)
    unverified = NO_POLICY.actor("generic", {"sender": {"login": "x"}}, verified=False)
    assert unverified == Actor(None, None, False) and not NO_POLICY.holds(unverified)


@pytest.mark.parametrize(("policy", "payload", "trusted"), [
    (TrustPolicy(senders=("octocat-alice",)), ISSUES, True),  # a listed login passes
    (TrustPolicy(senders=("octocat-alice",)), COMMENT, False),  # anyone else is held
    (TrustPolicy(associations=("COLLABORATOR",)), REVIEW, True),  # a listed association passes
    (TrustPolicy(associations=("MEMBER",)), COMMENT, False),  # the issue author's MEMBER does not count
    (TrustPolicy(associations=("MEMBER",)), PULL, True),
    (TrustPolicy(senders=("nobody",), associations=("OWNER",)), REVIEW, False),
    (TrustPolicy(senders=("carol",)), GITEA_ISSUE, True),
    (TrustPolicy(associations=("MEMBER", "OWNER", "COLLABORATOR", "CONTRIBUTOR")), GITEA_ISSUE, False),
])
def test_a_listed_login_or_association_is_trusted_and_anyone_else_is_held(policy, payload, trusted):
    source = "gitea" if payload is GITEA_ISSUE else "github"
    actor = policy.actor(source, payload, verified=True)
    assert actor.trusted is trusted
    assert policy.holds(actor) is not trusted


def test_logins_compare_case_insensitively():
    policy = TrustPolicy(senders=check_trusted_senders(["OctoCat-Alice"]))
    assert policy.senders == ("octocat-alice",)
    assert policy.admits("OCTOCAT-ALICE", None)
    assert policy.admits(None, "member") is False
    assert TrustPolicy(associations=("MEMBER",)).admits(None, "member")


def test_sender_lists_are_checked_lower_cased_and_deduplicated():
    assert check_trusted_senders(None) == ()
    assert check_trusted_senders(["Bob", "bob", "dependabot[bot]", "a.b_c-d"]) == ("bob", "dependabot[bot]", "a.b_c-d")
    assert len(check_trusted_senders([f"u{i}" for i in range(MAX_TRUSTED_SENDERS)])) == MAX_TRUSTED_SENDERS


@pytest.mark.parametrize("logins", [
    "alice", ["has space"], [""], [7], ["x" * 101], ["evil]"], [f"u{i}" for i in range(MAX_TRUSTED_SENDERS + 1)],
])
def test_a_bad_sender_list_is_refused_as_invalid_argument(logins):
    with pytest.raises(InvalidArgument) as caught:
        check_trusted_senders(logins)
    assert caught.value.code == "invalid_argument"


def test_associations_are_the_four_of_the_contract_in_a_fixed_order():
    assert check_trusted_associations(["member", "OWNER", "owner"]) == ("OWNER", "MEMBER")
    for bad in (["NONE"], ["FIRST_TIMER"], "OWNER", [None]):
        with pytest.raises(InvalidArgument):
            check_trusted_associations(bad)


# --- the webhook's events ----------------------------------------------------------------------


def webhook(source_type: str = "github") -> Webhook:
    hook = Webhook.create(id=UUID(int=1), now=T0, actor="operator:admin", endpoint_id="ep_owner",
                          source_type=source_type, target_queue="inbox", trust_mode="signed",
                          token_sha256="a" * 64, secret_ciphertext="c")
    hook.collect_events()
    return hook


def test_setting_trust_records_one_event_with_actor_and_cause_and_replays():
    hook = webhook()
    assert hook.trust == NO_POLICY
    hook.set_trust(now=T0 + timedelta(seconds=1), actor="operator:admin", senders=["Alice"],
                   associations=["member"])
    [event] = hook.collect_events()
    assert isinstance(event, WebhookTrustSet)
    assert (event.actor, event.cause) == ("operator:admin", "set_webhook_trust")
    assert (event.trusted_senders, event.trusted_associations) == (["alice"], ["MEMBER"])
    assert hook.trust == TrustPolicy(("alice",), ("MEMBER",))
    created = Webhook.create(id=UUID(int=1), now=T0, actor="operator:admin", endpoint_id="ep_owner",
                             source_type="github", target_queue="inbox", trust_mode="signed",
                             token_sha256="a" * 64, secret_ciphertext="c").collect_events()
    assert Webhook.replay([*created, event]).trust == hook.trust


def test_clearing_trust_trusts_everyone_again():
    hook = webhook("gitea")
    hook.set_trust(now=T0, actor="operator:admin", senders=["carol"], associations=None)
    hook.set_trust(now=T0, actor="operator:admin", senders=[], associations=[])
    assert hook.trust == NO_POLICY and not hook.trust.active
    assert len(hook.collect_events()) == 2


def test_setting_the_trust_it_has_records_nothing():
    """As an unchanged `queue set`: saving the same lists again (as checked) is no event."""
    hook = webhook()
    hook.set_trust(now=T0, actor="operator:admin", senders=["Alice", "bob"], associations=["member"])
    assert len(hook.collect_events()) == 1
    assert hook.set_trust(now=T0, actor="operator:admin", senders=["alice", "BOB", "alice"],
                          associations=["MEMBER"]) == TrustPolicy(("alice", "bob"), ("MEMBER",))
    assert hook.collect_events() == []
    hook.set_trust(now=T0, actor="operator:admin", senders=["bob", "alice"], associations=["MEMBER"])
    assert len(hook.collect_events()) == 1  # another order is another list (the order is kept)
    fresh = webhook()
    fresh.set_trust(now=T0, actor="operator:admin", senders=[], associations=None)  # nothing to clear
    assert fresh.collect_events() == []


@pytest.mark.parametrize("source_type", ["cairn", "generic"])
def test_trust_is_refused_for_sources_that_name_no_sender(source_type):
    with pytest.raises(InvalidArgument, match="github and gitea"):
        webhook(source_type).set_trust(now=T0, actor="operator:admin", senders=["a"], associations=None)


def test_trust_is_refused_on_a_deleted_webhook_and_a_bad_list_records_nothing():
    hook = webhook()
    with pytest.raises(InvalidArgument):
        hook.set_trust(now=T0, actor="operator:admin", senders=["ok"], associations=["NONE"])
    assert hook.collect_events() == [] and hook.trust == NO_POLICY
    hook.delete(now=T0, actor="operator:admin")
    with pytest.raises(Conflict):
        hook.set_trust(now=T0, actor="operator:admin", senders=["a"], associations=None)


# --- the envelope ------------------------------------------------------------------------------


def test_the_envelope_carries_the_actor_with_nulls_where_absent():
    actor = TrustPolicy(senders=("alice",)).actor("github", COMMENT, verified=True)
    env = envelope(source="github", kind="issue_comment", webhook_id="wh_1", trust_mode="signed", verified=True,
                   content_type="application/json", size=1, headers={}, payload=COMMENT, actor=actor)
    assert env["actor"] == {"sender": "drive-by-dana", "association": "NONE", "trusted": False}
    plain = envelope(source="generic", kind=None, webhook_id="wh_1", trust_mode="token", verified=False,
                     content_type=None, size=0, headers={}, payload=None,
                     actor=NO_POLICY.actor("generic", None, verified=False))
    assert plain["actor"] == {"sender": None, "association": None, "trusted": False}


# --- actions: quarantine, once, exclusive ------------------------------------------------------


def test_the_quarantine_action_parses_and_passes_the_grant():
    rule_set = parse({"rules": [{"id": "r", "expr": "true", "action": {"quarantine": True}}],
                      "default_action": {"quarantine": True}})
    assert rule_set.rules[0].action == {"quarantine": True} and rule_set.default_action == {"quarantine": True}
    check_grant(rule_set, allowed_queues=set(), target_endpoint_ids=set())


def test_once_and_exclusive_parse_on_queue_actions_and_false_is_the_same_as_absent():
    rule_set = parse({"rules": [
        {"id": "a", "expr": "true", "action": {"queue": "q", "once": True, "exclusive": True}},
        {"id": "b", "expr": "true", "action": {"queue": "q", "endpoints": ["ep_b"], "once": False}},
    ]})
    assert rule_set.rules[0].action == {"queue": "q", "once": True, "exclusive": True}
    assert rule_set.rules[1].action == {"queue": "q", "endpoints": ["ep_b"]}
    assert parse(rule_set.to_json()) == rule_set


@pytest.mark.parametrize(("action", "says"), [
    ({"quarantine": False}, "quarantine must be true"),
    ({"quarantine": True, "queue": "q"}, "action must be one of"),
    ({"drop": True, "once": True}, "action must be one of"),
    ({"queue": "q", "once": "yes"}, "once must be true or false"),
    ({"queue": "q", "exclusive": 1}, "exclusive must be true or false"),
    ({"once": True}, "action must be one of"),
    ({"queue": "q", "later": True}, "action must be one of"),
])
def test_bad_flags_are_refused_at_save_naming_the_rule(action, says):
    with pytest.raises(RuleError) as caught:
        parse({"rules": [{"id": "r7", "expr": "true", "action": action}]})
    assert caught.value.code == "invalid_rule"
    assert caught.value.message.startswith("rule #1 (r7): ") and says in caught.value.message


def test_a_quarantine_action_holds_one_todo_on_the_owner_with_stage_rule():
    rule_set = parse({"rules": [{"id": "hold", "expr": "true", "action": {"quarantine": True}}]})
    decision = decide(rule_set, Matched(0), targets=TARGETS, target_queue="inbox")
    assert decision == Decision(drop=False, queue=QUARANTINE, endpoints=("ep_owner",), faulted=False, held=True,
                                trace={"stage": "rule", "rule_index": 0, "rule_id": "hold",
                                       "action": {"quarantine": True}})
    assert decision.disposition == "held"
    assert decision.to_json() == {"drop": False, "queue": QUARANTINE, "endpoints": ["ep_owner"], "faulted": False,
                                  "held": True}


def test_an_untrusted_delivery_is_held_on_the_owner_whatever_the_rules_chose():
    rule_set = parse({"rules": [{"id": "all", "expr": "true", "action": {"queue": "work", "once": True}}]})
    dana = Actor("drive-by-dana", "NONE", False)
    decision = decide(rule_set, Matched(0), targets=TARGETS, target_queue="inbox", untrusted=dana,
                      subject="github:octo-org/octo-repo#12", webhook_id="wh_1")
    assert (decision.queue, decision.endpoints, decision.held, decision.faulted) == (QUARANTINE, ("ep_owner",), True, False)
    assert decision.once_subject is None  # a held todo is not the subject's live todo
    assert decision.trace["stage"] == "untrusted"
    assert decision.trace["actor"] == {"sender": "drive-by-dana", "association": "NONE"}
    assert decision.trace["rules"]["rule_id"] == "all" and decision.trace["webhook_id"] == "wh_1"
    assert decision.disposition == "held"


def test_an_untrusted_delivery_the_rules_drop_is_dropped_and_a_fault_under_it_is_still_held():
    rule_set = parse({"rules": [{"id": "d", "expr": "true", "action": {"drop": True}}]})
    dana = Actor("drive-by-dana", "NONE", False)
    assert decide(rule_set, Matched(0), targets=TARGETS, target_queue="inbox", untrusted=dana).disposition == "dropped"
    faulted = decide(rule_set, Faulted(0, "timeout"), targets=TARGETS, target_queue="inbox", untrusted=dana)
    assert faulted.disposition == "held" and faulted.trace["rules"]["stage"] == "fault"


def test_once_names_the_subject_in_the_decision_and_trace_and_is_ignored_without_one():
    rule_set = parse({"rules": [], "default_action": {"queue": "work", "once": True}})
    decision = decide(rule_set, NoMatch(), targets=TARGETS, target_queue="inbox", subject="github:o/r#1")
    assert decision.once_subject == "github:o/r#1" and decision.trace["subject"] == "github:o/r#1"
    assert decision.endpoints == TARGETS
    assert decide(rule_set, NoMatch(), targets=TARGETS, target_queue="inbox").once_subject is None
    plain = decide(parse({"rules": []}), NoMatch(), targets=TARGETS, target_queue="inbox", subject="github:o/r#1")
    assert plain.once_subject is None and "subject" not in plain.trace
    assert repeat_trace(decision.trace) == {**decision.trace, "once": "repeat"}
    assert "once" not in decision.trace


def test_exclusive_keeps_only_the_first_target_in_order_whose_scope_has_the_queue():
    rule_set = parse({"rules": [{"id": "x", "expr": "true", "action": {"queue": "work", "exclusive": True}}]})
    scopes = {"ep_owner": ["triage"], "ep_b": ["work", "triage"], "ep_c": ["work"]}
    decision = decide(rule_set, Matched(0), targets=TARGETS, target_queue="inbox", scopes=scopes)
    assert decision.endpoints == ("ep_b",)
    assert decide(rule_set, Matched(0), targets=TARGETS, target_queue="inbox",
                  scopes={**scopes, "ep_owner": ["work"]}).endpoints == ("ep_owner",)
    assert decide(rule_set, Matched(0), targets=TARGETS, target_queue="inbox", scopes={}).endpoints == ()
    chosen = parse({"rules": [{"id": "x", "expr": "true",
                               "action": {"queue": "work", "endpoints": ["ep_c", "ep_owner"], "exclusive": True}}]})
    assert decide(chosen, Matched(0), targets=TARGETS, target_queue="inbox", scopes=scopes).endpoints == ("ep_c",)


# --- subjects ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("source", "kind", "payload", "subject"), [
    ("github", "issues", ISSUES, "github:octo-org/octo-repo#12"),
    ("github", "issue_comment", COMMENT, "github:octo-org/octo-repo#12"),
    ("github", "pull_request", PULL, "github:octo-org/octo-repo#7"),
    ("github", "pull_request_review", REVIEW, "github:octo-org/octo-repo#7"),
    ("gitea", "issues", GITEA_ISSUE, "gitea:infra/deploy-scripts#3"),
    ("github", "push", fixture_json("github_push.json"), None),  # not an issue or pull-request event
    ("github", "issues", {"number": 4, "repository": {"name": "r", "owner": {"login": "o"}}}, "github:o/r#4"),
    ("github", "issues", {"issue": {"number": 4}}, None),  # no repository
    ("github", "issues", {"issue": {"number": "4"}, "repository": {"full_name": "o/r"}}, None),
    ("github", None, ISSUES, None),
    ("cairn", "artifact.created", {"data": {"id": "art_1"}}, "cairn:art_1"),
    ("cairn", "artifact.created", {"data": {"id": 42}}, "cairn:42"),
    ("cairn", "artifact.created", fixture_json("cairn_artifact_created.json"), None),  # no data.id
    ("generic", "issues", ISSUES, None),
])
def test_the_subject_is_the_issue_or_pull_request_or_the_cairn_data_id(source, kind, payload, subject):
    assert subject_of(source, kind, payload) == subject


# --- once keys ---------------------------------------------------------------------------------


def test_a_once_key_has_one_stream_per_endpoint_queue_and_subject():
    from domain.once import OnceKey, once_uuid

    key = OnceKey.new(endpoint_id="ep_a", queue="work", subject="github:o/r#1")
    assert key.id == once_uuid("ep_a", "work", "github:o/r#1")
    assert len({once_uuid(*parts) for parts in (("ep_a", "work", "s"), ("ep_b", "work", "s"),
                                                ("ep_a", "other", "s"), ("ep_a", "work", "t"))}) == 4


def test_a_once_key_binds_a_todo_and_rebinds_only_once_that_todo_is_no_longer_live():
    from domain.once import OnceKey, OnceKeyBound

    key = OnceKey.new(endpoint_id="ep_a", queue="work", subject="github:o/r#1")
    key.bind(todo_id="td_1", now=T0, actor="webhook:wh_1", named_is_live=False)
    with pytest.raises(Conflict, match="already has live todo td_1"):
        key.bind(todo_id="td_2", now=T0, actor="webhook:wh_1", named_is_live=True)
    key.bind(todo_id="td_2", now=T0, actor="webhook:wh_1", named_is_live=False)
    events = key.collect_events()
    assert [(e.originator_version, e.todo_id, e.cause) for e in events] == [(1, "td_1", "once"), (2, "td_2", "once")]
    assert all(isinstance(e, OnceKeyBound) for e in events)
    replayed = OnceKey.replay(events)
    assert (replayed.todo_id, replayed.subject, replayed.version) == ("td_2", "github:o/r#1", 2)
