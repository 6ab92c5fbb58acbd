"""End to end: the senders of CONTRACT §17 (Standard Webhooks, Stripe, Slack) against a real
`switchboard serve` over real HTTP, once on SQLite and once on PostgreSQL.

Webhooks are made through the CLI (`webhook create --source …`), the way an operator would; each
delivery is signed as its sender signs it. A refusal stores nothing, and neither does Slack's
`url_verification` handshake (docs/adr/0039).
"""

from __future__ import annotations

import json
import re
import time
import uuid
from datetime import datetime, timedelta, timezone

import pytest
import standardwebhooks

from tests.e2e._ingest import CLI, REDACTED, REFUSED_401, Stack, assert_accepted, assert_error
from tests.fixtures import hmac_hex, sign

SENDERS = ("standard", "stripe", "slack")


@pytest.fixture(scope="module")
def stack(module_store_url, tmp_path_factory):
    stack = Stack(module_store_url, tmp_path_factory.mktemp("senders")).start()
    yield stack
    stack.close()


@pytest.fixture(scope="module")
def owner(stack):
    return stack.vend("senders", ["inbox"], webhook_max=10, source_types=["github", *SENDERS])


@pytest.fixture(scope="module")
def hooks(stack, owner):
    made = {}
    for source in SENDERS:
        made[source] = stack.cli.json("webhook", "create", "--endpoint", owner["slug"], "--source", source,
                                      "--queue", "inbox")
        assert made[source]["ingest_url"].startswith(f"{stack.server.base}/webhooks/w/")
    return made


def _standard(hook):
    message_id = f"msg_{uuid.uuid4().hex}"
    body = json.dumps({"type": "user.created", "timestamp": "2026-01-21T15:02:30Z",
                       "data": {"id": "u_42", "title": "Ada Lovelace signed up"}}).encode()
    return body, sign("standard", hook["signing_secret"], body, message_id=message_id), message_id, \
        "user.created", "user.created: Ada Lovelace signed up"


def _stripe(hook):
    event_id = f"evt_{uuid.uuid4().hex[:24]}"
    body = json.dumps({"id": event_id, "object": "event", "type": "invoice.paid", "api_version": "2024-06-20",
                       "data": {"object": {"id": "in_1MtHbELkdIwHu7ix", "object": "invoice",
                                           "customer_email": "billing@example.com", "amount_paid": 2000}}}).encode()
    return body, sign("stripe", hook["signing_secret"], body), event_id, "invoice.paid", \
        "invoice.paid: in_1MtHbELkdIwHu7ix (billing@example.com)"


def _slack(hook):
    event_id = f"Ev{uuid.uuid4().hex[:10].upper()}"
    body = json.dumps({"token": "legacy", "team_id": "T0001", "type": "event_callback", "event_id": event_id,
                       "event_time": 1769007750,
                       "event": {"type": "message", "channel": "C123ABC", "user": "U2147483697",
                                 "text": "the deploy is stuck\nat step 3", "ts": "1769007750.000200"}}).encode()
    return body, sign("slack", hook["signing_secret"], body), event_id, "message", \
        "message in C123ABC: the deploy is stuck at step 3"


MAKERS = {"standard": _standard, "stripe": _stripe, "slack": _slack}


def test_the_cli_mints_each_sender_a_signing_secret_of_its_own_form(hooks):
    assert re.fullmatch(r"whsec_[A-Za-z0-9+/]{43}=", hooks["standard"]["signing_secret"])
    for source in ("stripe", "slack"):
        assert re.fullmatch(r"whsec_[0-9a-f]{64}", hooks[source]["signing_secret"])
    assert {hook["trust_mode"] for hook in hooks.values()} == {"signed"}


@pytest.mark.parametrize("source", SENDERS)
def test_a_signed_delivery_becomes_a_todo_named_as_its_sender_names_it(stack, owner, hooks, source):
    hook = hooks[source]
    body, headers, delivery_id, kind, title = MAKERS[source](hook)
    before = stack.counts()

    answer = assert_accepted(stack.post(hook["ingest_url"], body, {"content-type": "application/json", **headers}),
                             trust_mode="signed", verified=True, queue="inbox", created=1,
                             endpoint_ids=[owner["endpoint_id"]])

    after = stack.counts()
    assert after["deliveries"] == before["deliveries"] + 1 and after["todos"] == before["todos"] + 1
    todo = stack.app.get_todo(answer["id"], caller=CLI)
    assert (todo["source"], todo["kind"], todo["title"], todo["trust_mode"]) == (source, kind, title, "signed")
    assert todo["payload"] == json.loads(body)
    stored = stack.webhooks.get_event(answer["event_id"], caller=CLI)
    assert stored["verified"] is True and stored["kind"] == kind and stored["delivery_id"] == delivery_id
    signature_header = {"standard": "webhook-signature", "stripe": "stripe-signature",
                        "slack": "x-slack-signature"}[source]
    assert stored["headers"][signature_header] == REDACTED

    # the sender retries the same delivery (newly signed, as senders do): the same todo answers
    again = stack.post(hook["ingest_url"], body, {"content-type": "application/json",
                                                  **_resigned(source, hook, body, headers)})
    repeat = assert_accepted(again, trust_mode="signed", verified=True, queue="inbox", created=0)
    assert repeat["id"] == answer["id"]


def _resigned(source, hook, body, headers):
    later = datetime.now(timezone.utc) + timedelta(seconds=1)
    if source == "standard":
        return sign("standard", hook["signing_secret"], body, now=later, message_id=headers["webhook-id"])
    return sign(source, hook["signing_secret"], body, now=later)


def _wrong_secret(source, hook, body, headers):
    return sign(source, "whsec_" + "0" * 64 if source != "standard" else "whsec_" + "A" * 44, body)


def _stale(source, hook, body, headers):
    return sign(source, hook["signing_secret"], body, now=datetime.now(timezone.utc) - timedelta(seconds=400))


def _future(source, hook, body, headers):
    return sign(source, hook["signing_secret"], body, now=datetime.now(timezone.utc) + timedelta(seconds=400))


def _unsigned(source, hook, body, headers):
    return {}


@pytest.mark.parametrize("source", SENDERS)
@pytest.mark.parametrize("spoil", [_wrong_secret, _stale, _future, _unsigned], ids=lambda f: f.__name__.strip("_"))
def test_a_bad_signature_is_401_and_stores_nothing(stack, hooks, source, spoil):
    hook = hooks[source]
    body, headers, *_ = MAKERS[source](hook)
    before = stack.counts()
    response = stack.post(hook["ingest_url"], body, {"content-type": "application/json",
                                                     **spoil(source, hook, body, headers)})
    assert_error(response, 401, REFUSED_401)
    assert stack.counts() == before


def test_a_tampered_body_is_401_and_stores_nothing(stack, hooks):
    for source in SENDERS:
        hook = hooks[source]
        body, headers, *_ = MAKERS[source](hook)
        before = stack.counts()
        tampered = body.replace(b"}", b', "extra": 1}', 1)
        assert_error(stack.post(hook["ingest_url"], tampered, {"content-type": "application/json", **headers}),
                     401, REFUSED_401)
        assert stack.counts() == before


def test_a_slack_url_verification_is_answered_with_its_challenge_and_stores_nothing(stack, hooks):
    hook = hooks["slack"]
    challenge = "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P"
    body = json.dumps({"token": "Jhj5dZrVaK7ZwHHjRyZWjbDl", "challenge": challenge,
                       "type": "url_verification"}).encode()
    # a delivery first, so that the server keeps copies of the webhook (docs/adr/0031)
    first, headers, *_ = _slack(hook)
    stack.post(hook["ingest_url"], first, {"content-type": "application/json", **headers})
    before = stack.counts()

    for _ in range(2):  # on the server's kept copies and again
        response = stack.post(hook["ingest_url"], body, {"content-type": "application/json",
                                                         **sign("slack", hook["signing_secret"], body)})
        assert response.status_code == 200, response.text
        assert response.headers["content-type"].startswith("application/json")
        assert response.json() == {"challenge": challenge}
    assert stack.counts() == before

    unsigned = stack.post(hook["ingest_url"], body, {"content-type": "application/json"})
    assert_error(unsigned, 401, REFUSED_401)
    wrong = stack.post(hook["ingest_url"], body, {"content-type": "application/json",
                                                  **sign("slack", "whsec_" + "0" * 64, body)})
    assert_error(wrong, 401, REFUSED_401)
    assert stack.counts() == before


def test_a_url_verification_to_a_stripe_webhook_is_an_ordinary_delivery(stack, hooks):
    hook = hooks["stripe"]
    body = json.dumps({"id": f"evt_{uuid.uuid4().hex}", "type": "url_verification", "challenge": "x"}).encode()
    answer = assert_accepted(stack.post(hook["ingest_url"], body, {"content-type": "application/json",
                                                                   **sign("stripe", hook["signing_secret"], body)}),
                             trust_mode="signed", verified=True, queue="inbox", created=1)
    assert "challenge" not in answer


def test_a_signature_made_by_the_standardwebhooks_library_is_accepted(stack, hooks):
    hook = hooks["standard"]
    library = standardwebhooks.Webhook(hook["signing_secret"])
    message_id = f"msg_{uuid.uuid4().hex}"
    stamp = datetime.fromtimestamp(int(time.time()), timezone.utc)
    body = b'{"type":"ping","data":{"name":"from the reference library"}}'
    headers = {"webhook-id": message_id, "webhook-timestamp": str(int(stamp.timestamp())),
               "webhook-signature": library.sign(message_id, stamp, body), "content-type": "application/json"}
    answer = assert_accepted(stack.post(hook["ingest_url"], body, headers), trust_mode="signed", verified=True,
                             queue="inbox", created=1)
    todo = stack.app.get_todo(answer["id"], caller=CLI)
    assert (todo["kind"], todo["title"]) == ("ping", "ping: from the reference library")


def test_stripe_with_several_v1_signatures_accepts_when_any_matches(stack, hooks):
    hook = hooks["stripe"]
    body, _, *_ = _stripe(hook)
    stamp = str(int(time.time()))
    right = hmac_hex(hook["signing_secret"], f"{stamp}.".encode() + body)
    header = f"t={stamp},v1={'0' * 64},v1={right}"
    assert_accepted(stack.post(hook["ingest_url"], body, {"content-type": "application/json",
                                                          "stripe-signature": header}),
                    trust_mode="signed", verified=True, queue="inbox", created=1)


def test_an_endpoint_vended_with_the_default_source_types_may_not_create_the_new_ones(stack):
    plain = stack.vend("plain", ["inbox"])
    listed = stack.cli.json("endpoint", "list")["endpoints"]
    assert [e["source_types"] for e in listed if e["slug"] == plain["slug"]] == [["github", "gitea", "cairn", "generic"]]
    for source in SENDERS:
        stack.cli.run("webhook", "create", "--endpoint", plain["slug"], "--source", source, "--queue", "inbox",
                      ).refused("forbidden_source_type")
