"""Endpoint, Operator and IdempotencyKey aggregates, and the rules for names and ids."""

from __future__ import annotations

import hashlib
import pickle
from datetime import datetime, timedelta, timezone
from uuid import UUID, SafeUUID

import pytest

from domain.endpoint import (
    ALL_VERBS,
    DefaultLeaseSet,
    Endpoint,
    EndpointRevoked,
    EndpointVended,
    credential_hash,
)
from domain.errors import Conflict, InvalidArgument
from domain.idempotency import IdempotencyKey, KeyBound, key_uuid
from domain.names import (
    ENDPOINT_PREFIX,
    TODO_PREFIX,
    check_queue_name,
    format_id,
    parse_id,
    slugify,
    uuid_of_hex,
)
from domain.operator import ApiTokenMinted, Operator, OperatorCreated, check_operator_name, operator_uuid
from domain.leases import effective_lease

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
ENDPOINT_UUID = UUID("00000000-0000-4000-8000-0000000000e1")
OPERATOR = "operator:admin"
VERBS_OF_CONTRACT_SECTION_7 = (
    "list_todos", "get_todo", "claim", "claim_next", "heartbeat", "complete", "fail", "release",
    "create_webhook", "list_webhooks", "rotate_webhook", "delete_webhook", "add_webhook_route",
    "remove_webhook_route", "list_webhook_routes", "list_webhook_rules", "set_webhook_rules",
    "test_webhook_rules", "list_webhook_events", "get_webhook_event", "get_default_lease",
    "set_default_lease",
)


def vend(**overrides) -> Endpoint:
    fields = dict(
        id=ENDPOINT_UUID, now=T0, actor=OPERATOR, slug="worker-ab12", agent="Worker",
        owner="admin", credential_sha256=credential_hash("sbk_secret"), queues=["builds"],
    )
    fields.update(overrides)
    return Endpoint.vend(**fields)


def vended(**overrides) -> Endpoint:
    """An endpoint rebuilt from its vend event, with nothing pending."""
    return Endpoint.replay(vend(**overrides).collect_events())


def only_event(aggregate):
    events = aggregate.collect_events()
    assert len(events) == 1, events
    return events[0]


# --- vend -------------------------------------------------------------------------------------


def test_vending_records_the_scope_with_every_default():
    endpoint = vend(agent="  Worker  ")
    event = only_event(endpoint)
    assert isinstance(event, EndpointVended)
    assert event.agent == "Worker"
    assert event.queues == ("builds",)
    assert event.verbs == ALL_VERBS
    assert set(ALL_VERBS) == set(VERBS_OF_CONTRACT_SECTION_7)
    assert event.webhook_max == 5
    assert event.source_types == ("github", "gitea", "cairn", "generic")
    assert event.webhook_queues == ("builds",)
    assert event.expires_at is None
    assert event.default_lease_seconds is None
    assert (event.timestamp, event.actor, event.cause, event.originator_version) == (T0, OPERATOR, "vend", 1)
    assert endpoint.principal == "endpoint:worker-ab12"
    assert endpoint.endpoint_id == "ep_" + ENDPOINT_UUID.hex
    assert endpoint.default_lease == timedelta(seconds=300)


def test_vending_stores_only_the_hash_of_the_credential():
    event = only_event(vend())
    assert event.credential_sha256 == hashlib.sha256(b"sbk_secret").hexdigest()
    assert "sbk_secret" not in repr(event)


def test_webhook_queues_default_to_the_endpoint_queues():
    assert vend(queues=["a", "b"]).webhook_queues == ("a", "b")
    assert vend(queues=["a", "b"], webhook_queues=[]).webhook_queues == ("a", "b")
    assert vend(queues=["a", "b"], webhook_queues=["b"]).webhook_queues == ("b",)


def test_repeated_queues_verbs_and_source_types_are_kept_once_in_order():
    endpoint = vend(queues=["b", "a", "b"], verbs=["claim", "claim", "fail"], source_types=["gitea", "gitea"])
    assert endpoint.queues == ("b", "a")
    assert endpoint.verbs == ("claim", "fail")
    assert endpoint.source_types == ("gitea",)


def test_vending_accepts_a_narrow_scope():
    endpoint = vend(verbs=["list_todos", "claim"], source_types=["github"], webhook_max=0)
    assert (endpoint.verbs, endpoint.source_types, endpoint.webhook_max) == (("list_todos", "claim"), ("github",), 0)


@pytest.mark.parametrize("agent", ["", "   "])
def test_vending_requires_an_agent_name(agent):
    with pytest.raises(InvalidArgument):
        vend(agent=agent)


def test_vending_requires_a_queue():
    with pytest.raises(InvalidArgument):
        vend(queues=[])


@pytest.mark.parametrize("queue", ["", "Builds", "a b", "q/x", "é", "x" * 65, "quarantine"])
def test_vending_refuses_a_bad_queue_name(queue):
    with pytest.raises(InvalidArgument):
        vend(queues=[queue])
    with pytest.raises(InvalidArgument):
        vend(webhook_queues=[queue])


def test_vending_refuses_an_unknown_verb():
    with pytest.raises(InvalidArgument, match="delete_todo"):
        vend(verbs=["claim", "delete_todo"])


def test_vending_refuses_an_unknown_source_type():
    with pytest.raises(InvalidArgument, match="gitlab"):
        vend(source_types=["github", "gitlab"])


@pytest.mark.parametrize("webhook_max", [-1, 1001, True, 2.5, "5"])
def test_vending_refuses_a_webhook_ceiling_out_of_range(webhook_max):
    with pytest.raises(InvalidArgument):
        vend(webhook_max=webhook_max)


@pytest.mark.parametrize("ttl", [timedelta(0), timedelta(seconds=-1)])
def test_vending_refuses_a_lifetime_that_is_not_positive(ttl):
    with pytest.raises(InvalidArgument):
        vend(ttl=ttl)


@pytest.mark.parametrize("seconds", [59, 86401, 0, -300, 300.0, True])
def test_vending_refuses_a_default_lease_out_of_range(seconds):
    with pytest.raises(InvalidArgument):
        vend(default_lease_seconds=seconds)


def test_a_default_lease_set_at_vend_is_the_lease_of_a_claim_that_names_none():
    endpoint = vend(default_lease_seconds=900)
    assert endpoint.default_lease == timedelta(seconds=900)
    assert effective_lease(None, endpoint.default_lease) == timedelta(seconds=900)
    assert effective_lease(60, endpoint.default_lease) == timedelta(seconds=60)


# --- expiry and revocation --------------------------------------------------------------------


def test_an_endpoint_without_a_lifetime_stays_active():
    assert vend().is_active(T0 + timedelta(days=10_000))


def test_an_endpoint_expires_at_the_end_of_its_lifetime():
    endpoint = vend(ttl=timedelta(days=7))
    assert endpoint.expires_at == T0 + timedelta(days=7)
    assert endpoint.is_active(T0 + timedelta(days=7) - timedelta(microseconds=1))
    assert not endpoint.is_active(T0 + timedelta(days=7))


def test_revoking_makes_the_endpoint_inactive_at_once():
    endpoint = vended()
    endpoint.revoke(now=T0 + timedelta(hours=1), actor=OPERATOR)
    event = only_event(endpoint)
    assert isinstance(event, EndpointRevoked)
    assert (event.actor, event.cause, event.originator_version) == (OPERATOR, "revoke", 2)
    assert (endpoint.revoked, endpoint.revoked_at) == (True, T0 + timedelta(hours=1))
    assert not endpoint.is_active(T0 + timedelta(hours=1))


def test_revoking_a_revoked_endpoint_is_a_conflict():
    endpoint = vended()
    endpoint.revoke(now=T0, actor=OPERATOR)
    endpoint.collect_events()
    with pytest.raises(Conflict):
        endpoint.revoke(now=T0 + timedelta(hours=1), actor=OPERATOR)
    assert endpoint.collect_events() == []


# --- default lease ----------------------------------------------------------------------------


@pytest.mark.parametrize("seconds", [60, 300, 3600, 86400])
def test_the_default_lease_can_be_set_within_60_to_86400_seconds(seconds):
    endpoint = vended()
    endpoint.set_default_lease(now=T0, actor="endpoint:worker-ab12", seconds=seconds)
    event = only_event(endpoint)
    assert isinstance(event, DefaultLeaseSet)
    assert (event.default_lease_seconds, event.cause) == (seconds, "set_default_lease")
    assert endpoint.default_lease == timedelta(seconds=seconds)


def test_clearing_the_default_lease_restores_300_seconds():
    endpoint = vended(default_lease_seconds=900)
    endpoint.set_default_lease(now=T0, actor=OPERATOR, seconds=None)
    assert only_event(endpoint).default_lease_seconds is None
    assert endpoint.default_lease == timedelta(seconds=300)


@pytest.mark.parametrize("seconds", [0, 59, 86401, -1, 120.5, "300", False])
def test_a_default_lease_out_of_range_is_refused(seconds):
    endpoint = vended()
    with pytest.raises(InvalidArgument):
        endpoint.set_default_lease(now=T0, actor=OPERATOR, seconds=seconds)
    assert endpoint.collect_events() == []
    assert endpoint.default_lease_seconds is None


def test_a_revoked_endpoint_cannot_change_its_default_lease():
    endpoint = vended()
    endpoint.revoke(now=T0, actor=OPERATOR)
    endpoint.collect_events()
    with pytest.raises(Conflict):
        endpoint.set_default_lease(now=T0, actor=OPERATOR, seconds=600)
    assert endpoint.collect_events() == []


def test_replaying_an_endpoint_rebuilds_it_exactly():
    endpoint = vend(ttl=timedelta(days=1), webhook_queues=["hooks"], default_lease_seconds=120)
    endpoint.set_default_lease(now=T0 + timedelta(minutes=1), actor=OPERATOR, seconds=600)
    endpoint.revoke(now=T0 + timedelta(minutes=2), actor=OPERATOR)
    history = endpoint.collect_events()
    assert [type(e) for e in history] == [EndpointVended, DefaultLeaseSet, EndpointRevoked]
    rebuilt = Endpoint.replay(history)
    assert {k: v for k, v in rebuilt.__dict__.items() if k != "_pending"} == {
        k: v for k, v in endpoint.__dict__.items() if k != "_pending"
    }


# --- operator ---------------------------------------------------------------------------------


def test_creating_an_operator_records_its_name_and_password_hash():
    operator = Operator.create(name="alice", password_hash="$argon2id$x", now=T0, actor="system")
    event = only_event(operator)
    assert isinstance(event, OperatorCreated)
    assert (event.name, event.password_hash, event.cause) == ("alice", "$argon2id$x", "create_operator")
    assert operator.id == operator_uuid("alice")
    assert operator.token_hashes == ()


def test_an_operator_id_is_derived_from_its_name():
    assert operator_uuid("alice") == operator_uuid("alice")
    assert operator_uuid("alice") != operator_uuid("bob")


def test_minting_a_token_records_only_its_hash():
    operator = Operator.replay(
        Operator.create(name="alice", password_hash="h", now=T0, actor="system").collect_events()
    )
    operator.mint_token(token_sha256="aa" * 32, now=T0 + timedelta(minutes=1), actor="operator:alice")
    operator.mint_token(token_sha256="bb" * 32, now=T0 + timedelta(minutes=2), actor="operator:alice")
    events = operator.collect_events()
    assert [type(e) for e in events] == [ApiTokenMinted, ApiTokenMinted]
    assert [e.originator_version for e in events] == [2, 3]
    assert operator.token_hashes == ("aa" * 32, "bb" * 32)


@pytest.mark.parametrize("name", ["admin", "Alice", "a", "ops.team-1_x", "x" * 64])
def test_an_operator_name_is_1_to_64_of_letters_digits_dot_dash_underscore(name):
    assert check_operator_name(name) == name


@pytest.mark.parametrize("name", ["", "x" * 65, "a b", "bob@example", "é", None, 7])
def test_a_bad_operator_name_is_refused(name):
    with pytest.raises(InvalidArgument):
        check_operator_name(name)
    with pytest.raises(InvalidArgument):
        Operator.create(name=name, password_hash="h", now=T0, actor="system")


# --- idempotency key --------------------------------------------------------------------------


def test_a_key_is_one_stream_per_endpoint_and_key():
    assert IdempotencyKey.new(endpoint_id="ep_1", key="k").id == key_uuid("ep_1", "k")
    assert key_uuid("ep_1", "k") != key_uuid("ep_2", "k")
    assert key_uuid("ep_1", "k") != key_uuid("ep_1", "k2")


def test_binding_a_key_points_it_at_a_todo():
    key = IdempotencyKey.new(endpoint_id="ep_1", key="deploy-42")
    assert key.todo_id is None
    key.bind(todo_id="td_" + "a" * 32, now=T0, actor=OPERATOR)
    event = only_event(key)
    assert isinstance(event, KeyBound)
    assert (event.endpoint_id, event.key, event.todo_id, event.cause) == ("ep_1", "deploy-42", "td_" + "a" * 32, "dedup")
    assert event.originator_version == 1
    assert key.todo_id == "td_" + "a" * 32


def test_rebinding_a_key_points_it_at_the_newer_todo():
    key = IdempotencyKey.new(endpoint_id="ep_1", key="k")
    key.bind(todo_id="td_" + "a" * 32, now=T0, actor=OPERATOR)
    key.bind(todo_id="td_" + "b" * 32, now=T0 + timedelta(hours=1), actor=OPERATOR)
    history = key.collect_events()
    rebuilt = IdempotencyKey.replay(history)
    assert [e.originator_version for e in history] == [1, 2]
    assert (rebuilt.todo_id, rebuilt.endpoint_id, rebuilt.key, rebuilt.id) == (
        "td_" + "b" * 32, "ep_1", "k", key.id,
    )


# --- names and ids ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["a", "builds", "ci.main", "team_1-x", "0", "x" * 64])
def test_a_queue_name_is_1_to_64_of_lowercase_letters_digits_dot_underscore_dash(name):
    assert check_queue_name(name) == name


@pytest.mark.parametrize("name", ["", "x" * 65, "Builds", "a b", "a/b", "a:b", "ü", "a\n", None, 3])
def test_a_bad_queue_name_is_refused(name):
    with pytest.raises(InvalidArgument):
        check_queue_name(name)


def test_the_quarantine_queue_is_reserved_unless_allowed():
    with pytest.raises(InvalidArgument, match="reserved"):
        check_queue_name("quarantine")
    assert check_queue_name("quarantine", allow_quarantine=True) == "quarantine"


def test_an_id_is_its_prefix_and_32_lowercase_hex():
    value = UUID("0123456789abcdef0123456789abcdef")
    assert format_id(TODO_PREFIX, value) == "td_0123456789abcdef0123456789abcdef"
    assert parse_id(TODO_PREFIX, format_id(TODO_PREFIX, value)) == value
    assert parse_id(ENDPOINT_PREFIX, "ep_" + value.hex) == value


@pytest.mark.parametrize(
    "text",
    [
        "ep_0123456789abcdef0123456789abcdef",  # another kind of id
        "td_0123456789abcdef0123456789abcde",  # 31 hex
        "td_0123456789abcdef0123456789abcdef0",  # 33 hex
        "td_0123456789ABCDEF0123456789ABCDEF",  # upper case
        "td_0123456789abcdef0123456789abcdeg",
        "td_01234567-89ab-cdef-0123-456789abcdef",
        "0123456789abcdef0123456789abcdef",
        "",
        None,
        42,
    ],
)
def test_text_that_is_not_an_id_of_the_kind_parses_to_none(text):
    assert parse_id(TODO_PREFIX, text) is None


@pytest.mark.parametrize("digits", ["0123456789abcdef0123456789abcdef", "0" * 32, "f" * 32, "9b2e4f0c6d1a4e7fa3c85b6d2e1f0a94"])
def test_a_uuid_made_from_hex_digits_is_the_uuid_the_library_makes(digits):
    expected = UUID(hex=digits)
    for made in (uuid_of_hex(digits), uuid_of_hex(digits.encode())):  # text, or as PostgreSQL sends it
        assert made == expected and hash(made) == hash(expected) and {expected: 1}[made] == 1
        assert (str(made), repr(made), made.hex, made.bytes, made.version) == (
            str(expected), repr(expected), expected.hex, expected.bytes, expected.version)
        assert pickle.loads(pickle.dumps(made)) == expected
        assert made.is_safe is SafeUUID.unknown
        with pytest.raises(TypeError):
            made.int = 1  # immutable, as every UUID


@pytest.mark.parametrize(
    ("agent", "slug"),
    [
        ("Worker", "worker"),
        ("Code Review Bot", "code-review-bot"),
        ("  --Ünïcödé  Agent!! ", "unicode-agent"),
        ("claude_code/v2", "claude-code-v2"),
        ("日本語", "agent"),
        ("", "agent"),
        ("!!!", "agent"),
    ],
)
def test_an_agent_name_slugifies_to_lowercase_ascii_words(agent, slug):
    assert slugify(agent) == slug


def test_a_slug_is_at_most_40_characters_and_does_not_end_with_a_dash():
    assert slugify("a" * 50) == "a" * 40
    assert slugify("a" * 39 + " b") == "a" * 39
    assert len(slugify("word " * 30)) <= 40
    assert not slugify("word " * 30).endswith("-")
