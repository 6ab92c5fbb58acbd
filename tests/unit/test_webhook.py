"""Webhook and Delivery aggregates, and Endpoint's webhook ceiling: given events, when a command,
then events or an error (CONTRACT §4, §5, §7, §11 Routes)."""

from __future__ import annotations

import hashlib

from datetime import datetime, timedelta, timezone
from functools import partial
from uuid import UUID

import pytest

from domain.delivery import DELIVERY_PREFIX, Delivery, DeliveryAccepted
from domain.endpoint import (
    Endpoint,
    EndpointRevoked,
    EndpointVended,
    WebhookAttached,
    WebhookDetached,
    credential_hash,
)
from domain.errors import CeilingExceeded, Conflict, Forbidden, ForbiddenSourceType
from domain.webhook import (
    WEBHOOK_PREFIX,
    Webhook,
    WebhookCreated,
    WebhookDeleted,
    WebhookRotated,
    WebhookRouteAdded,
    WebhookRouteRemoved,
    WebhookRulesSet,
)

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
T1 = T0 + timedelta(minutes=1)
WEBHOOK_UUID = UUID("00000000-0000-4000-8000-0000000000a1")
WEBHOOK_ID = WEBHOOK_PREFIX + WEBHOOK_UUID.hex
ENDPOINT_UUID = UUID("00000000-0000-4000-8000-0000000000e1")
OWNER = "ep_" + "1" * 32
ROUTE_B = "ep_" + "b" * 32
ROUTE_C = "ep_" + "c" * 32
ACTOR = "endpoint:worker-ab12"
TOKEN_SHA = "a" * 64
RULES = [{"id": "r0", "expr": ".kind == \"push\"", "action": {"drop": True}}]


# --- given: events of a webhook's stream -------------------------------------------------------


def created(*, source_type: str = "github", secret: str | None = "cipher-1"):
    return partial(
        WebhookCreated, timestamp=T0, actor=ACTOR, cause="create_webhook", endpoint_id=OWNER,
        source_type=source_type, target_queue="builds", trust_mode="signed" if secret else "token",
        token_sha256=TOKEN_SHA, secret_ciphertext=secret,
    )


def route_added(target: str, at: datetime = T0):
    return partial(WebhookRouteAdded, timestamp=at, actor=ACTOR, cause="add_webhook_route",
                   target_endpoint_id=target)


def route_removed(target: str):
    return partial(WebhookRouteRemoved, timestamp=T1, actor=ACTOR, cause="remove_webhook_route",
                   target_endpoint_id=target)


def deleted():
    return partial(WebhookDeleted, timestamp=T1, actor=ACTOR, cause="delete_webhook")


def given(*makers) -> Webhook:
    events = [make(originator_id=WEBHOOK_UUID, originator_version=i + 1) for i, make in enumerate(makers)]
    return Webhook.replay(events)


def only_event(aggregate):
    events = aggregate.collect_events()
    assert len(events) == 1, events
    return events[0]


# --- create ------------------------------------------------------------------------------------


def test_create_records_everything_but_the_plain_token_and_secret():
    webhook = Webhook.create(
        id=WEBHOOK_UUID, now=T0, actor=ACTOR, endpoint_id=OWNER, source_type="github",
        target_queue="builds", trust_mode="signed", token_sha256=TOKEN_SHA, secret_ciphertext="cipher-1",
    )

    event = only_event(webhook)
    assert isinstance(event, WebhookCreated)
    assert (event.originator_id, event.originator_version) == (WEBHOOK_UUID, 1)
    assert (event.timestamp, event.actor, event.cause) == (T0, ACTOR, "create_webhook")
    assert (event.endpoint_id, event.source_type, event.target_queue, event.trust_mode) == (
        OWNER, "github", "builds", "signed")
    assert (event.token_sha256, event.secret_ciphertext) == (TOKEN_SHA, "cipher-1")
    assert webhook.webhook_id == WEBHOOK_ID
    assert webhook.deleted is False
    assert webhook.routes == () and webhook.rules == [] and webhook.default_action is None and webhook.params == {}
    assert webhook.targets == (OWNER,)


def test_a_replayed_webhook_equals_the_one_that_recorded_the_events():
    live = Webhook.create(
        id=WEBHOOK_UUID, now=T0, actor=ACTOR, endpoint_id=OWNER, source_type="generic",
        target_queue="builds", trust_mode="token", token_sha256=TOKEN_SHA, secret_ciphertext=None,
    )
    live.add_route(now=T1, actor=ACTOR, target_endpoint_id=ROUTE_B)
    live.set_rules(now=T1, actor=ACTOR, rules=RULES, default_action={"queue": "other"}, params={"p": 1})
    live.rotate(now=T1, actor=ACTOR, token_sha256="b" * 64, secret_ciphertext=None)

    replayed = Webhook.replay(live.collect_events())

    for name in ("endpoint_id", "source_type", "target_queue", "trust_mode", "token_sha256",
                 "secret_ciphertext", "routes", "rules", "default_action", "params", "deleted", "version"):
        assert getattr(replayed, name) == getattr(live, name), name


# --- rotate --------------------------------------------------------------------------------------


def test_rotate_replaces_the_token_hash_and_the_secret():
    webhook = given(created())

    webhook.rotate(now=T1, actor=ACTOR, token_sha256="b" * 64, secret_ciphertext="cipher-2")

    event = only_event(webhook)
    assert isinstance(event, WebhookRotated)
    assert (event.originator_version, event.timestamp, event.cause) == (2, T1, "rotate_webhook")
    assert (event.token_sha256, event.secret_ciphertext) == ("b" * 64, "cipher-2")
    assert (webhook.token_sha256, webhook.secret_ciphertext) == ("b" * 64, "cipher-2")


def test_rotating_a_generic_webhook_keeps_it_without_a_secret():
    webhook = given(created(source_type="generic", secret=None))

    webhook.rotate(now=T1, actor=ACTOR, token_sha256="c" * 64, secret_ciphertext=None)

    assert only_event(webhook).secret_ciphertext is None
    assert webhook.token_sha256 == "c" * 64


# --- delete --------------------------------------------------------------------------------------


def test_delete_records_the_deletion():
    webhook = given(created(), route_added(ROUTE_B))

    webhook.delete(now=T1, actor=ACTOR)

    event = only_event(webhook)
    assert isinstance(event, WebhookDeleted)
    assert (event.originator_version, event.cause) == (3, "delete_webhook")
    assert webhook.deleted is True


@pytest.mark.parametrize("command", [
    lambda w: w.delete(now=T1, actor=ACTOR),
    lambda w: w.rotate(now=T1, actor=ACTOR, token_sha256="b" * 64, secret_ciphertext=None),
    lambda w: w.set_rules(now=T1, actor=ACTOR, rules=[], default_action=None, params={}),
    lambda w: w.add_route(now=T1, actor=ACTOR, target_endpoint_id=ROUTE_C),
    lambda w: w.remove_route(now=T1, actor=ACTOR, target_endpoint_id=ROUTE_B),
    lambda w: w.remove_route(now=T1, actor=ACTOR, target_endpoint_id=ROUTE_C),
], ids=["delete", "rotate", "set_rules", "add_route", "remove_route", "remove_unknown_route"])
def test_any_change_to_a_deleted_webhook_is_a_conflict(command):
    webhook = given(created(), route_added(ROUTE_B), deleted())

    with pytest.raises(Conflict) as refused:
        command(webhook)

    assert refused.value.code == "conflict"
    assert WEBHOOK_ID in refused.value.message
    assert webhook.collect_events() == []
    assert webhook.version == 3


# --- rules ---------------------------------------------------------------------------------------


def test_set_rules_replaces_rules_default_action_and_params():
    webhook = given(created())

    webhook.set_rules(now=T1, actor=ACTOR, rules=RULES, default_action={"queue": "other"}, params={"p": [1]})

    event = only_event(webhook)
    assert isinstance(event, WebhookRulesSet)
    assert (event.cause, event.rules, event.default_action, event.params) == (
        "set_webhook_rules", RULES, {"queue": "other"}, {"p": [1]})
    assert (webhook.rules, webhook.default_action, webhook.params) == (RULES, {"queue": "other"}, {"p": [1]})

    webhook.set_rules(now=T1, actor=ACTOR, rules=[], default_action=None, params={})

    assert (webhook.rules, webhook.default_action, webhook.params) == ([], None, {})
    assert webhook.version == 3


# --- routes --------------------------------------------------------------------------------------


def test_add_route_records_the_target_and_when():
    webhook = given(created())

    assert webhook.add_route(now=T1, actor=ACTOR, target_endpoint_id=ROUTE_B) is True

    event = only_event(webhook)
    assert isinstance(event, WebhookRouteAdded)
    assert (event.target_endpoint_id, event.cause, event.timestamp) == (ROUTE_B, "add_webhook_route", T1)
    assert webhook.routes == ((ROUTE_B, T1),)


def test_adding_a_route_twice_answers_false_and_records_nothing():
    webhook = given(created(), route_added(ROUTE_B))

    assert webhook.add_route(now=T1, actor=ACTOR, target_endpoint_id=ROUTE_B) is False

    assert webhook.collect_events() == []
    assert webhook.routes == ((ROUTE_B, T0),)  # the first grant's time is kept
    assert webhook.version == 2


def test_a_route_to_the_owner_is_forbidden():
    webhook = given(created())

    with pytest.raises(Forbidden) as refused:
        webhook.add_route(now=T1, actor=ACTOR, target_endpoint_id=OWNER)

    assert refused.value.code == "forbidden"
    assert webhook.collect_events() == []
    assert webhook.targets == (OWNER,)


def test_remove_route_records_the_removal():
    webhook = given(created(), route_added(ROUTE_B), route_added(ROUTE_C))

    assert webhook.remove_route(now=T1, actor=ACTOR, target_endpoint_id=ROUTE_B) is True

    event = only_event(webhook)
    assert isinstance(event, WebhookRouteRemoved)
    assert (event.target_endpoint_id, event.cause) == (ROUTE_B, "remove_webhook_route")
    assert webhook.routes == ((ROUTE_C, T0),)


def test_removing_a_route_that_is_not_there_answers_false_and_records_nothing():
    webhook = given(created(), route_added(ROUTE_B), route_removed(ROUTE_B))

    assert webhook.remove_route(now=T1, actor=ACTOR, target_endpoint_id=ROUTE_B) is False
    assert webhook.remove_route(now=T1, actor=ACTOR, target_endpoint_id=ROUTE_C) is False

    assert webhook.collect_events() == []
    assert webhook.routes == ()


def test_targets_are_the_owner_then_the_routes_in_the_order_they_were_added():
    webhook = given(created(), route_added(ROUTE_C), route_added(ROUTE_B))
    assert webhook.targets == (OWNER, ROUTE_C, ROUTE_B)

    webhook.remove_route(now=T1, actor=ACTOR, target_endpoint_id=ROUTE_C)
    webhook.add_route(now=T1, actor=ACTOR, target_endpoint_id=ROUTE_C)

    assert webhook.targets == (OWNER, ROUTE_B, ROUTE_C)
    assert Webhook.replay(
        [make(originator_id=WEBHOOK_UUID, originator_version=i + 1) for i, make in enumerate(
            [created(), route_added(ROUTE_C), route_added(ROUTE_B)])] + webhook.collect_events()
    ).targets == (OWNER, ROUTE_B, ROUTE_C)


# --- the endpoint's side: attach and detach under the ceiling ------------------------------------


def endpoint(**overrides) -> Endpoint:
    fields = dict(
        id=ENDPOINT_UUID, now=T0, actor="operator:admin", slug="worker-ab12", agent="Worker",
        owner="admin", credential_sha256=credential_hash("sbk_secret"), queues=["builds", "deploys"],
        webhook_max=2, source_types=["github", "generic"], webhook_queues=["builds"],
    )
    fields.update(overrides)
    return Endpoint.replay(Endpoint.vend(**fields).collect_events())


def attach(ep: Endpoint, webhook_id: str, *, source_type: str = "github", target_queue: str = "builds"):
    ep.attach_webhook(now=T1, actor=ACTOR, webhook_id=webhook_id, source_type=source_type, target_queue=target_queue)


def test_attach_records_the_webhook_against_the_ceiling():
    ep = endpoint()

    attach(ep, WEBHOOK_ID)

    event = only_event(ep)
    assert isinstance(event, WebhookAttached)
    assert (event.webhook_id, event.cause, event.originator_version) == (WEBHOOK_ID, "create_webhook", 2)
    assert ep.webhook_ids == (WEBHOOK_ID,)


def test_a_source_type_outside_the_grant_is_forbidden_source_type():
    ep = endpoint()

    with pytest.raises(ForbiddenSourceType) as refused:
        attach(ep, WEBHOOK_ID, source_type="gitea")

    assert refused.value.code == "forbidden_source_type"
    assert ep.collect_events() == [] and ep.webhook_ids == ()


def test_a_queue_outside_the_webhook_queues_is_forbidden_even_when_it_is_a_todo_queue():
    ep = endpoint()

    with pytest.raises(Forbidden) as refused:
        attach(ep, WEBHOOK_ID, target_queue="deploys")

    assert refused.value.code == "forbidden"
    assert ep.collect_events() == [] and ep.webhook_ids == ()


def test_at_the_ceiling_attach_is_ceiling_exceeded():
    ep = endpoint()
    attach(ep, "wh_" + "1" * 32)
    attach(ep, "wh_" + "2" * 32)
    ep.collect_events()

    with pytest.raises(CeilingExceeded) as refused:
        attach(ep, "wh_" + "3" * 32)

    assert refused.value.code == "ceiling_exceeded"
    assert ep.collect_events() == []
    assert len(ep.webhook_ids) == 2


def test_a_ceiling_of_zero_refuses_the_first_webhook():
    ep = endpoint(webhook_max=0)

    with pytest.raises(CeilingExceeded):
        attach(ep, WEBHOOK_ID)


def test_a_revoked_endpoint_cannot_attach_a_webhook():
    ep = endpoint()
    ep.revoke(now=T1, actor="operator:admin")
    assert isinstance(only_event(ep), EndpointRevoked)

    with pytest.raises(Conflict) as refused:
        attach(ep, WEBHOOK_ID)

    assert refused.value.code == "conflict"
    assert ep.collect_events() == []


def test_detach_frees_a_place_under_the_ceiling():
    ep = endpoint()
    attach(ep, "wh_" + "1" * 32)
    attach(ep, "wh_" + "2" * 32)
    ep.collect_events()

    ep.detach_webhook(now=T1, actor=ACTOR, webhook_id="wh_" + "1" * 32)

    event = only_event(ep)
    assert isinstance(event, WebhookDetached)
    assert (event.webhook_id, event.cause) == ("wh_" + "1" * 32, "delete_webhook")
    assert ep.webhook_ids == ("wh_" + "2" * 32,)
    attach(ep, "wh_" + "3" * 32)
    assert ep.webhook_ids == ("wh_" + "2" * 32, "wh_" + "3" * 32)


def test_detaching_an_unknown_webhook_records_nothing():
    ep = endpoint()
    attach(ep, WEBHOOK_ID)
    ep.collect_events()

    ep.detach_webhook(now=T1, actor=ACTOR, webhook_id="wh_" + "9" * 32)

    assert ep.collect_events() == []
    assert ep.webhook_ids == (WEBHOOK_ID,)


def test_the_ceiling_survives_a_replay():
    vended = Endpoint.vend(
        id=ENDPOINT_UUID, now=T0, actor="operator:admin", slug="worker-ab12", agent="Worker", owner="admin",
        credential_sha256=credential_hash("sbk_secret"), queues=["builds"], webhook_max=1,
    )
    history = vended.collect_events()
    assert isinstance(history[0], EndpointVended)
    ep = Endpoint.replay(history)
    attach(ep, WEBHOOK_ID)
    history += ep.collect_events()

    replayed = Endpoint.replay(history)

    assert replayed.webhook_ids == (WEBHOOK_ID,)
    with pytest.raises(CeilingExceeded):
        attach(replayed, "wh_" + "2" * 32)


# --- deliveries ----------------------------------------------------------------------------------


DELIVERY_UUID = UUID("00000000-0000-4000-8000-0000000000d1")


def delivery_fields(**overrides):
    fields = dict(
        webhook_id=WEBHOOK_ID, endpoint_id=OWNER, source="github", kind="issues", trust_mode="signed",
        verified=True, remote_addr="203.0.113.9", content_type="application/json", size=11,
        headers={"x-github-event": "issues", "x-hub-signature-256": "«redacted»"}, body=b'{"a": "b"}\n',
        payload_form="json", delivery_key=f"{WEBHOOK_ID}:d-1", disposition="routed",
        routing={"stage": "default", "action": {"queue": "builds"}},
        todos=[{"id": "td_" + "1" * 32, "endpoint_id": OWNER, "queue": "builds", "created": True}],
    )
    fields.update(overrides)
    return fields


def test_accept_records_the_delivery_with_its_decision_and_todos():
    fields = delivery_fields()

    delivery = Delivery.accept(id=DELIVERY_UUID, now=T0, actor=f"webhook:{WEBHOOK_ID}", **fields)

    event = only_event(delivery)
    assert isinstance(event, DeliveryAccepted)
    assert (event.originator_id, event.originator_version) == (DELIVERY_UUID, 1)
    assert (event.timestamp, event.actor, event.cause) == (T0, f"webhook:{WEBHOOK_ID}", "ingest")
    for name, value in fields.items():
        if name != "body":
            assert getattr(event, name) == value, name
            assert getattr(delivery, name) == value, name
    # the body by reference (docs/adr/0027): its digest in the event, its bytes carried to the store
    body = fields["body"]
    assert (event.body, event.body_encoding) == (None, None)
    assert event.body_ref == {"sha256": hashlib.sha256(body).hexdigest(), "size": len(body)}
    assert event.body_bytes == body == delivery.body_bytes
    assert delivery.event_id == DELIVERY_PREFIX + DELIVERY_UUID.hex
    assert delivery.received_at == T0


def test_a_replayed_delivery_has_the_same_facts():
    accepted = Delivery.accept(id=DELIVERY_UUID, now=T0, actor="webhook:x",
                               **delivery_fields(disposition="dropped", todos=[], routing={
                                   "stage": "rule", "rule_index": 0, "rule_id": "r0", "action": {"drop": True}}))

    replayed = Delivery.replay(accepted.collect_events())

    assert replayed.event_id == accepted.event_id
    assert (replayed.disposition, replayed.todos, replayed.routing["rule_id"]) == ("dropped", [], "r0")
    assert replayed.body_ref["sha256"] == hashlib.sha256(b'{"a": "b"}\n').hexdigest()
    assert replayed.version == 1


def test_accept_requires_every_field():
    fields = delivery_fields()
    del fields["routing"]

    with pytest.raises(TypeError):
        Delivery.accept(id=DELIVERY_UUID, now=T0, actor="webhook:x", **fields)


def test_a_body_that_is_not_utf8_is_kept_exactly():
    raw = b"\xff\xfe binary \x00"
    delivery = Delivery.accept(id=DELIVERY_UUID, now=T0, actor="webhook:x", **delivery_fields(body=raw, payload_form="text"))

    event = only_event(delivery)

    assert event.body_bytes == raw and event.body_ref["size"] == len(raw)