"""The timestamped senders of CONTRACT §17: Standard Webhooks, Stripe and Slack. Their signatures
(valid, wrong, missing, stale, future, several in one header), the published test vectors, a
cross-check with the `standardwebhooks` reference library, and how their deliveries are named,
redacted and titled."""

from __future__ import annotations

import base64
import hashlib
import json
from datetime import datetime, timedelta, timezone

import pytest
import standardwebhooks

from domain.ingest import delivery_id, delivery_kind, handshake_challenge, redact_headers
from domain.names import REDACTED
from domain.signatures import (
    SignatureRefused, check_single_signatures, new_signing_secret, standard_key, verify_signature,
)
from domain.titles import derive_title
from tests.fixtures import hmac_hex, sign

NOW = datetime(2026, 1, 21, 15, 2, 30, tzinfo=timezone.utc)
HEX_SECRET = new_signing_secret(bytes(range(32)))
STANDARD_SECRET = new_signing_secret(bytes(range(32)), "standard")
SECRETS = {"standard": STANDARD_SECRET, "stripe": HEX_SECRET, "slack": HEX_SECRET}
TIMED = ("standard", "stripe", "slack")
BODY = b'{"type":"invoice.paid","id":"evt_1","event_id":"Ev1","data":{"object":{"id":"in_1"}}}'
SIGNATURE_HEADER = {"standard": "webhook-signature", "stripe": "stripe-signature", "slack": "x-slack-signature"}


def refusal(source_type: str, headers: dict[str, str], body: bytes = BODY, *, secret: str | None = None,
            now: datetime = NOW) -> str:
    with pytest.raises(SignatureRefused) as refused:
        verify_signature(source_type, secret or SECRETS[source_type], headers, body, now)
    assert str(refused.value) == "signature verification failed"
    return refused.value.reason


# --- the secret -------------------------------------------------------------------------------------


def test_a_standard_secret_is_whsec_and_the_base64_of_32_random_bytes() -> None:
    secret = new_signing_secret(bytes([0xAB] * 32), "standard")
    assert secret == "whsec_" + base64.b64encode(bytes([0xAB] * 32)).decode()
    assert standard_key(secret) == bytes([0xAB] * 32)
    assert new_signing_secret(bytes([0xAB] * 32), "stripe") == "whsec_" + "ab" * 32


@pytest.mark.parametrize("secret", ["whsec_", "whsec_!!!!", "whsec_a"])
def test_a_standard_secret_that_is_not_base64_refuses_every_delivery(secret: str) -> None:
    headers = sign("standard", STANDARD_SECRET, BODY, now=NOW)
    assert refusal("standard", headers, secret=secret)


# --- every timestamped scheme alike ---------------------------------------------------------------


@pytest.mark.parametrize("source_type", TIMED)
def test_a_correct_signature_over_the_raw_body_is_accepted(source_type: str) -> None:
    headers = sign(source_type, SECRETS[source_type], BODY, now=NOW)
    assert verify_signature(source_type, SECRETS[source_type], headers, BODY, NOW) is None


@pytest.mark.parametrize("source_type", TIMED)
def test_the_body_changed_by_one_byte_is_refused(source_type: str) -> None:
    headers = sign(source_type, SECRETS[source_type], BODY, now=NOW)
    assert "match" in refusal(source_type, headers, BODY + b" ")


@pytest.mark.parametrize("source_type", TIMED)
def test_another_secret_is_refused(source_type: str) -> None:
    other = new_signing_secret(bytes(range(1, 33)), source_type)
    assert "match" in refusal(source_type, sign(source_type, other, BODY, now=NOW))


@pytest.mark.parametrize("source_type", TIMED)
def test_a_missing_signature_header_is_refused(source_type: str) -> None:
    headers = sign(source_type, SECRETS[source_type], BODY, now=NOW)
    del headers[SIGNATURE_HEADER[source_type]]
    assert "missing" in refusal(source_type, headers)


@pytest.mark.parametrize("source_type", ["standard", "slack"])
def test_a_missing_timestamp_header_is_refused(source_type: str) -> None:
    headers = sign(source_type, SECRETS[source_type], BODY, now=NOW)
    del headers["webhook-timestamp" if source_type == "standard" else "x-slack-request-timestamp"]
    assert "missing" in refusal(source_type, headers)


def test_a_standard_delivery_without_its_id_is_refused() -> None:
    headers = sign("standard", STANDARD_SECRET, BODY, now=NOW)
    del headers["webhook-id"]
    assert "missing webhook-id" in refusal("standard", headers)


def test_a_standard_id_other_than_the_signed_one_is_refused() -> None:
    headers = sign("standard", STANDARD_SECRET, BODY, now=NOW) | {"webhook-id": "msg_other"}
    assert "match" in refusal("standard", headers)


@pytest.mark.parametrize("source_type", TIMED)
@pytest.mark.parametrize("offset", [301, -301, 86400, -86400])
def test_a_stale_or_future_timestamp_is_refused_even_when_correctly_signed(source_type: str, offset: int) -> None:
    signed_at = NOW - timedelta(seconds=offset)
    headers = sign(source_type, SECRETS[source_type], BODY, now=signed_at)
    assert "outside ±300 s" in refusal(source_type, headers)


@pytest.mark.parametrize("source_type", TIMED)
@pytest.mark.parametrize("offset", [300, -300, 0])
def test_a_timestamp_within_300_seconds_either_way_is_accepted(source_type: str, offset: int) -> None:
    headers = sign(source_type, SECRETS[source_type], BODY, now=NOW - timedelta(seconds=offset))
    assert verify_signature(source_type, SECRETS[source_type], headers, BODY, NOW) is None


@pytest.mark.parametrize("source_type", TIMED)
@pytest.mark.parametrize("stamp", ["", "soon", "1.7e9", "-1769007750", "１７６９００７７５０", "1769007750.5"])
def test_a_timestamp_that_is_not_unix_seconds_is_refused(source_type: str, stamp: str) -> None:
    if source_type == "standard":
        headers = sign("standard", STANDARD_SECRET, BODY, now=NOW) | {"webhook-timestamp": stamp}
    elif source_type == "slack":
        headers = sign("slack", HEX_SECRET, BODY, now=NOW) | {"x-slack-request-timestamp": stamp}
    else:
        headers = {"stripe-signature": f"t={stamp},v1={hmac_hex(HEX_SECRET, f'{stamp}.'.encode() + BODY)}"}
    assert refusal(source_type, headers)


@pytest.mark.parametrize("source_type", TIMED)
def test_a_signature_header_sent_twice_is_refused(source_type: str) -> None:
    name = SIGNATURE_HEADER[source_type]
    with pytest.raises(SignatureRefused):
        check_single_signatures(source_type, [name, "content-type", name.upper()])
    check_single_signatures(source_type, [name, "content-type"])
    check_single_signatures("generic", [name, name])


# --- Standard Webhooks ------------------------------------------------------------------------------


def test_the_standard_webhooks_published_test_vector_verifies() -> None:
    """From the spec's reference library, standard-webhooks/standard-webhooks,
    libraries/python/tests/test_webhooks.py `test_sign_function`."""
    headers = {"webhook-id": "msg_p5jXN8AQM9LWM0D4loKWxJek", "webhook-timestamp": "1614265330",
               "webhook-signature": "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="}
    body = b'{"test": 2432232314}'
    at = datetime.fromtimestamp(1614265330, timezone.utc)
    assert verify_signature("standard", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", headers, body, at) is None
    # the same file's wrong signature (last character changed) is refused
    wrong = headers | {"webhook-signature": "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OA="}
    assert refusal("standard", wrong, body, secret="whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", now=at)
    assert refusal("standard", headers, body, secret="whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
                   now=at + timedelta(seconds=301))


def test_any_one_of_several_standard_signatures_may_match() -> None:
    good = sign("standard", STANDARD_SECRET, BODY, now=NOW)
    # as the reference library's test_multi_sig_payload_is_valid: wrong v1, a v2, the right one, wrong v1
    others = ["v1,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc=", "v2,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc="]
    several = " ".join([*others, good["webhook-signature"], others[0]])
    assert verify_signature("standard", STANDARD_SECRET, good | {"webhook-signature": several}, BODY, NOW) is None
    assert "match" in refusal("standard", good | {"webhook-signature": " ".join(others)})


def test_a_standard_signature_without_a_v1_entry_is_refused() -> None:
    good = sign("standard", STANDARD_SECRET, BODY, now=NOW)
    bare = good["webhook-signature"].removeprefix("v1,")
    assert "no v1" in refusal("standard", good | {"webhook-signature": bare})
    assert "no v1" in refusal("standard", good | {"webhook-signature": "v1a," + bare})


def test_our_standard_signatures_verify_in_the_reference_library_and_its_verify_in_ours() -> None:
    now = datetime.now(timezone.utc)  # the library reads the wall clock; ours is given `now`
    library = standardwebhooks.Webhook(STANDARD_SECRET)
    ours = sign("standard", STANDARD_SECRET, BODY, now=now, message_id="msg_ours")
    assert library.verify(BODY, ours) == json.loads(BODY)

    stamp = datetime.fromtimestamp(int(now.timestamp()), timezone.utc)
    theirs = {"webhook-id": "msg_theirs", "webhook-timestamp": str(int(stamp.timestamp())),
              "webhook-signature": library.sign("msg_theirs", stamp, BODY)}
    assert verify_signature("standard", STANDARD_SECRET, theirs, BODY, now) is None
    with pytest.raises(standardwebhooks.webhooks.WebhookVerificationError):
        library.verify(BODY + b" ", ours)
    assert refusal("standard", theirs, BODY + b" ", secret=STANDARD_SECRET, now=now)


@pytest.mark.parametrize("body", [b"", b"\xff\xfe not utf-8", b"x" * 70_000])
def test_the_reference_library_and_ours_agree_on_odd_bodies(body: bytes) -> None:
    now = datetime.now(timezone.utc)
    library = standardwebhooks.Webhook(STANDARD_SECRET)
    stamp = datetime.fromtimestamp(int(now.timestamp()), timezone.utc)
    theirs = {"webhook-id": "msg_1", "webhook-timestamp": str(int(stamp.timestamp())),
              "webhook-signature": library.sign("msg_1", stamp, body)}
    assert theirs == sign("standard", STANDARD_SECRET, body, now=stamp, message_id="msg_1")
    assert verify_signature("standard", STANDARD_SECRET, theirs, body, now) is None


# --- Stripe -----------------------------------------------------------------------------------------


def test_any_one_of_several_stripe_v1_signatures_may_match_and_v0_is_ignored() -> None:
    stamp = str(int(NOW.timestamp()))
    right = hmac_hex(HEX_SECRET, f"{stamp}.".encode() + BODY)
    wrong = hmac_hex(HEX_SECRET, b"something else")
    header = f"t={stamp},v1={wrong},v0={right},v1={right}"
    assert verify_signature("stripe", HEX_SECRET, {"stripe-signature": header}, BODY, NOW) is None
    assert "match" in refusal("stripe", {"stripe-signature": f"t={stamp},v1={wrong},v0={right}"})


def test_a_stripe_header_without_one_t_or_any_v1_is_refused() -> None:
    stamp = str(int(NOW.timestamp()))
    right = hmac_hex(HEX_SECRET, f"{stamp}.".encode() + BODY)
    assert "t=" in refusal("stripe", {"stripe-signature": f"v1={right}"})
    assert "t=" in refusal("stripe", {"stripe-signature": f"t={stamp},t={stamp},v1={right}"})
    assert "no v1" in refusal("stripe", {"stripe-signature": f"t={stamp}"})
    assert "no v1" in refusal("stripe", {"stripe-signature": f"t={stamp},v1=abc"})


def test_a_stripe_signature_is_keyed_by_the_secret_exactly_as_shown() -> None:
    stamp = str(int(NOW.timestamp()))
    stripped = HEX_SECRET.removeprefix("whsec_")
    header = f"t={stamp},v1={hmac_hex(stripped, f'{stamp}.'.encode() + BODY)}"
    assert "match" in refusal("stripe", {"stripe-signature": header})


# --- Slack ------------------------------------------------------------------------------------------


def test_the_slack_documented_example_verifies() -> None:
    """Slack's own worked example, "Verifying requests from Slack" (api.slack.com/authentication/
    verifying-requests-from-slack): a slash command's form body, its timestamp and signature."""
    body = (b"token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&channel_id=G8PSS9T3V"
            b"&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&command=%2Fwebhook-collect&text="
            b"&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN"
            b"&trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c")
    headers = {"x-slack-request-timestamp": "1531420618",
               "x-slack-signature": "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503"}
    at = datetime.fromtimestamp(1531420618, timezone.utc)
    assert verify_signature("slack", "8f742231b10e8888abcd99yyyzzz85a5", headers, body, at) is None
    assert refusal("slack", headers, body, secret="8f742231b10e8888abcd99yyyzzz85a5", now=at + timedelta(hours=1))


def test_a_slack_signature_needs_its_v0_prefix() -> None:
    headers = sign("slack", HEX_SECRET, BODY, now=NOW)
    assert "v0=" in refusal("slack", headers | {"x-slack-signature": headers["x-slack-signature"][3:]})
    assert "v0=" in refusal("slack", headers | {"x-slack-signature": "v1=" + headers["x-slack-signature"][3:]})


def test_a_slack_url_verification_yields_its_challenge_and_nothing_else_does() -> None:
    body = {"token": "t", "challenge": "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P",
            "type": "url_verification"}
    assert handshake_challenge("slack", body) == body["challenge"]
    assert handshake_challenge("stripe", body) is None
    assert handshake_challenge("generic", body) is None
    assert handshake_challenge("slack", {"type": "event_callback", "challenge": "x"}) is None
    assert handshake_challenge("slack", {"type": "url_verification", "challenge": 7}) is None
    assert handshake_challenge("slack", None) is None


# --- naming, redaction, titles ----------------------------------------------------------------------


def test_the_new_sources_name_their_deliveries_as_section_17_says() -> None:
    headers = {"webhook-id": "msg_1", "x-delivery-id": "d-1"}
    payload = {"id": "evt_1", "event_id": "Ev1"}
    assert delivery_id(headers, "standard", payload, BODY) == "msg_1"
    assert delivery_id(headers, "stripe", payload, BODY) == "evt_1"
    assert delivery_id(headers, "slack", payload, BODY) == "Ev1"
    # without their own id they fall back as every source does
    assert delivery_id(headers, "stripe", {"id": 7}, BODY) == "d-1"
    assert delivery_id({}, "slack", None, BODY) == "sha256:" + hashlib.sha256(BODY).hexdigest()
    assert delivery_id({"webhook-id": "w" * 257, "x-delivery-id": "d-1"}, "standard", None, BODY) == "d-1"


def test_the_new_sources_read_their_kind_from_the_body() -> None:
    assert delivery_kind({}, None, "stripe", {"type": "invoice.paid"}) == "invoice.paid"
    assert delivery_kind({}, None, "standard", {"type": "user.created"}) == "user.created"
    assert delivery_kind({}, None, "standard", {"data": {}}) is None
    slack = {"type": "event_callback", "event": {"type": "message"}}
    assert delivery_kind({}, None, "slack", slack) == "message"
    assert delivery_kind({}, None, "slack", {"type": "event_callback"}) == "event_callback"
    assert delivery_kind({}, None, "slack", {"type": "event_callback", "event": {"type": "a\x00b"}}) == "event_callback"
    assert delivery_kind({"x-github-event": "push"}, None, "stripe", {"type": "charge.failed"}) == "charge.failed"
    assert delivery_kind({}, None, "stripe", "not an object") is None


def test_the_new_signature_headers_are_redacted() -> None:
    headers = {**sign("standard", STANDARD_SECRET, BODY, now=NOW), **sign("stripe", HEX_SECRET, BODY, now=NOW),
               **sign("slack", HEX_SECRET, BODY, now=NOW)}
    stored = redact_headers(headers)
    assert stored["webhook-signature"] == stored["stripe-signature"] == stored["x-slack-signature"] == REDACTED
    assert stored["webhook-id"] == headers["webhook-id"]
    assert stored["x-slack-request-timestamp"] == headers["x-slack-request-timestamp"]


@pytest.mark.parametrize(("source_type", "kind", "payload", "title"), [
    ("stripe", "invoice.paid", {"type": "invoice.paid", "data": {"object": {"id": "in_1MtHbE", "customer_email":
                                                                            "billing@example.com"}}},
     "invoice.paid: in_1MtHbE (billing@example.com)"),
    ("stripe", "charge.refunded", {"data": {"object": {"id": "ch_3"}}}, "charge.refunded: ch_3"),
    ("stripe", None, {"data": "odd"}, "webhook delivery"),
    ("slack", "message", {"type": "event_callback", "event": {"type": "message", "channel": "C123",
                                                               "text": "deploy is\nstuck"}},
     "message in C123: deploy is stuck"),
    ("slack", "reaction_added", {"event": {"type": "reaction_added", "reaction": "eyes", "item": {"channel": "C9"}}},
     "reaction_added in C9: eyes"),
    ("slack", "app_home_opened", {"event": {"type": "app_home_opened", "user": "U9"}}, "app_home_opened by U9"),
    ("standard", "user.created", {"type": "user.created", "data": {"id": "u_1"}}, "user.created: u_1"),
    ("standard", "issue.opened", {"type": "issue.opened", "data": {"title": "Disk full"}}, "issue.opened: Disk full"),
    ("standard", None, {"data": {}}, "webhook delivery"),
])
def test_the_new_sources_get_a_title_that_says_what_arrived(source_type, kind, payload, title) -> None:
    assert derive_title(source_type, kind, payload) == title
