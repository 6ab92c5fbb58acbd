"""Webhook ingest: signatures, delivery ids and kinds, redaction, payloads and titles."""

from __future__ import annotations

import hashlib
import hmac
import json
from datetime import datetime, timedelta, timezone
from urllib.parse import urlencode

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from domain.errors import DomainError
from domain.bodies import parse_payload, strict_json
from domain.ingest import delivery_id, delivery_kind, redact_headers
from domain.names import DEFAULT_SOURCE_TYPES, REDACTED, SOURCE_TYPES
from domain.signatures import (
    CAIRN_WINDOW, SIGNED_SOURCES, TIMESTAMP_WINDOW, SignatureRefused, new_signing_secret, trust_of, verify_signature,
)
from domain.titles import _printable, derive_title
from domain.todo_fields import TITLE_MAX_CHARS, one_line_title
from tests.fixtures import cairn_event, fixture, fixture_json, hmac_hex, sign

NOW = datetime(2026, 1, 21, 15, 2, 30, tzinfo=timezone.utc)
SECRET = new_signing_secret(bytes(range(32)))
OTHER_SECRET = new_signing_secret(bytes(range(1, 33)))
CAIRN_ID = "evt_01JH8ZQ4W3V2K9M6T5R7Y1X0BC"


def refusal(source_type: str, headers: dict[str, str], body: bytes, *, secret: str | None = SECRET,
            now: datetime = NOW) -> str:
    """Verifies and expects a refusal; returns its (log-only) reason."""
    with pytest.raises(SignatureRefused) as refused:
        verify_signature(source_type, secret, headers, body, now)
    assert str(refused.value) == "signature verification failed"
    return refused.value.reason


# --- the signing secret and the refusal ---------------------------------------------------------


def test_a_signing_secret_is_whsec_and_64_lowercase_hex_of_32_bytes() -> None:
    secret = new_signing_secret(bytes([0xAB] * 32))
    assert secret == "whsec_" + "ab" * 32
    assert len(secret) == 6 + 64


@pytest.mark.parametrize("size", [0, 16, 31, 33])
def test_a_signing_secret_needs_exactly_32_random_bytes(size: int) -> None:
    with pytest.raises(ValueError):
        new_signing_secret(bytes(size))


def test_a_refusal_says_only_signature_verification_failed_and_keeps_its_reason_aside() -> None:
    refused = SignatureRefused("the signature does not match the body")
    assert isinstance(refused, DomainError)
    assert refused.code == "unauthorized"
    assert refused.message == str(refused) == "signature verification failed"
    assert refused.reason == "the signature does not match the body"


def test_source_types_are_the_signed_ones_and_generic() -> None:
    assert SOURCE_TYPES == ("github", "gitea", "cairn", "generic", "standard", "stripe", "slack")
    assert DEFAULT_SOURCE_TYPES == ("github", "gitea", "cairn", "generic")
    assert SIGNED_SOURCES == ("github", "gitea", "cairn", "standard", "stripe", "slack")
    assert CAIRN_WINDOW == TIMESTAMP_WINDOW == timedelta(seconds=300)


# --- github -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [
    "github_issues_opened.json", "github_issues_labeled.json", "github_pull_request_opened.json",
    "github_push.json", "github_ping.json",
])
def test_github_accepts_its_own_signature_over_the_raw_body(name: str) -> None:
    body = fixture(name)
    assert verify_signature("github", SECRET, sign("github", SECRET, body), body, NOW) is None


def test_github_accepts_an_upper_case_hex_digest() -> None:
    body = fixture("github_ping.json")
    headers = {"x-hub-signature-256": "sha256=" + hmac_hex(SECRET, body).upper()}
    assert verify_signature("github", SECRET, headers, body, NOW) is None


def test_github_refuses_a_signature_made_with_another_secret() -> None:
    body = fixture("github_issues_opened.json")
    reason = refusal("github", sign("github", OTHER_SECRET, body), body)
    assert "does not match" in reason


def test_github_refuses_a_body_changed_after_signing() -> None:
    body = fixture("github_issues_opened.json")
    reencoded = json.dumps(json.loads(body)).encode()  # same JSON, different bytes
    refusal("github", sign("github", SECRET, body), reencoded)
    refusal("github", sign("github", SECRET, body), body + b"\n")


def test_the_key_is_the_secret_exactly_as_shown_whsec_included() -> None:
    body = fixture("github_ping.json")
    without_prefix = SECRET.removeprefix("whsec_")
    refusal("github", sign("github", without_prefix, body), body)
    refusal("github", sign("github", bytes.fromhex(without_prefix).decode("latin-1"), body), body)
    assert hmac_hex(SECRET, body) == hmac.new(
        SECRET.encode("utf-8"), body, hashlib.sha256).hexdigest()


def test_github_refuses_a_delivery_without_the_signature_header() -> None:
    body = fixture("github_ping.json")
    assert "missing" in refusal("github", {}, body)
    assert "missing" in refusal("github", {"x-hub-signature-256": ""}, body)


def test_github_ignores_the_legacy_sha1_header() -> None:
    body = fixture("github_ping.json")
    sha1 = hmac.new(SECRET.encode(), body, hashlib.sha1).hexdigest()
    assert "missing" in refusal("github", {"x-hub-signature": f"sha1={sha1}"}, body)


def test_github_requires_the_sha256_prefix() -> None:
    body = fixture("github_ping.json")
    digest = hmac_hex(SECRET, body)
    assert "prefix" in refusal("github", {"x-hub-signature-256": digest}, body)
    assert "prefix" in refusal("github", {"x-hub-signature-256": f"sha1={digest}"}, body)
    assert "prefix" in refusal("github", {"x-hub-signature-256": f"SHA256={digest}"}, body)


@pytest.mark.parametrize("given", [
    "sha256=", "sha256=abc123", "sha256=" + "g" * 64, "sha256=" + "a" * 63, "sha256=" + "a" * 65,
    "sha256=" + "é" * 64, "sha256=" + "0" * 64 + " extra",
])
def test_github_refuses_a_malformed_digest(given: str) -> None:
    body = fixture("github_ping.json")
    refusal("github", {"x-hub-signature-256": given}, body)


def test_a_signed_source_without_a_secret_refuses_everything() -> None:
    body = fixture("github_ping.json")
    assert "no signing secret" in refusal("github", sign("github", "", body), body, secret=None)
    refusal("github", sign("github", "", body), body, secret="")


# --- gitea --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [
    "gitea_issues_opened.json", "gitea_pull_request_opened.json", "gitea_push.json",
])
def test_gitea_accepts_its_plain_hex_signature(name: str) -> None:
    body = fixture(name)
    headers = sign("gitea", SECRET, body)
    assert headers == {"x-gitea-signature": hmac_hex(SECRET, body)}
    assert verify_signature("gitea", SECRET, headers, body, NOW) is None


def test_gitea_falls_back_to_x_hub_signature_256_when_its_own_header_is_absent() -> None:
    body = fixture("gitea_push.json")
    assert verify_signature("gitea", SECRET, sign("github", SECRET, body), body, NOW) is None
    blank = {"x-gitea-signature": "", **sign("github", SECRET, body)}
    assert verify_signature("gitea", SECRET, blank, body, NOW) is None


def test_gitea_checks_its_own_header_when_both_are_sent() -> None:
    body = fixture("gitea_push.json")
    headers = {**sign("github", SECRET, body), **sign("gitea", OTHER_SECRET, body)}
    refusal("gitea", headers, body)


def test_gitea_refuses_a_wrong_signature() -> None:
    body = fixture("gitea_issues_opened.json")
    refusal("gitea", sign("gitea", OTHER_SECRET, body), body)
    refusal("gitea", sign("github", OTHER_SECRET, body), body)


def test_gitea_refuses_a_delivery_without_either_header() -> None:
    body = fixture("gitea_issues_opened.json")
    assert "missing" in refusal("gitea", {}, body)


def test_gitea_fallback_still_requires_the_sha256_prefix() -> None:
    body = fixture("gitea_issues_opened.json")
    assert "prefix" in refusal("gitea", {"x-hub-signature-256": hmac_hex(SECRET, body)}, body)


def test_gitea_own_header_takes_no_prefix() -> None:
    body = fixture("gitea_issues_opened.json")
    refusal("gitea", {"x-gitea-signature": "sha256=" + hmac_hex(SECRET, body)}, body)


# --- cairn --------------------------------------------------------------------------------------


def test_cairn_accepts_a_fresh_signed_event_and_returns_its_body() -> None:
    body = cairn_event(NOW)
    parsed = verify_signature("cairn", SECRET, sign("cairn", SECRET, body), body, NOW)
    assert parsed == json.loads(body)
    assert parsed["event_id"] == CAIRN_ID
    assert parsed["kind"] == "artifact.created"


def test_cairn_accepts_a_matching_event_id_header() -> None:
    body = cairn_event(NOW)
    headers = sign("cairn", SECRET, body, event_id=CAIRN_ID)
    assert headers["x-cairn-event-id"] == CAIRN_ID
    assert verify_signature("cairn", SECRET, headers, body, NOW)["event_id"] == CAIRN_ID


def test_cairn_refuses_an_event_id_header_that_differs_from_the_body() -> None:
    body = cairn_event(NOW)
    assert "x-cairn-event-id" in refusal("cairn", sign("cairn", SECRET, body, event_id="evt_other"), body)
    refusal("cairn", sign("cairn", SECRET, body, event_id=""), body)


@pytest.mark.parametrize("skew", [timedelta(seconds=300), timedelta(seconds=-300), timedelta(0)])
def test_cairn_accepts_created_at_within_300_seconds_either_way(skew: timedelta) -> None:
    body = cairn_event(NOW + skew)
    assert verify_signature("cairn", SECRET, sign("cairn", SECRET, body), body, NOW) is not None


@pytest.mark.parametrize("skew", [timedelta(seconds=301), timedelta(seconds=-301), timedelta(days=-1)])
def test_cairn_refuses_created_at_more_than_300_seconds_off(skew: timedelta) -> None:
    body = cairn_event(NOW + skew)
    assert "outside" in refusal("cairn", sign("cairn", SECRET, body), body)


def test_cairn_reads_created_at_offsets_and_fractions() -> None:
    for created_at in (
        "2026-01-21T17:02:30+02:00", "2026-01-21T10:02:30.123456789-05:00",
        "2026-01-21t15:02:30z", "2026-01-21 15:02:30Z",
    ):
        body = cairn_event(NOW, created_at=created_at)
        assert verify_signature("cairn", SECRET, sign("cairn", SECRET, body), body, NOW)


@pytest.mark.parametrize("created_at", [
    "2026-01-21", "2026-01-21T15:02:30", "15:02:30Z", "2026-01-21T15:02Z", "2026-W04-3T15:02:30Z",
    "2026-01-21T15:02:60Z", "2026-13-21T15:02:30Z", "yesterday", "", 1768993350, None, ["x"],
    "٢٠٢٦-01-21T15:02:30Z",
])
def test_cairn_refuses_created_at_that_is_not_an_rfc_3339_time(created_at: object) -> None:
    body = cairn_event(NOW, created_at=created_at)
    assert "created_at" in refusal("cairn", sign("cairn", SECRET, body), body)


def test_cairn_refuses_a_body_without_created_at() -> None:
    event = json.loads(cairn_event(NOW))
    del event["created_at"]
    body = json.dumps(event).encode()
    assert "created_at" in refusal("cairn", sign("cairn", SECRET, body), body)


@pytest.mark.parametrize("event_id", [None, "", "   ", 42, {"id": "x"}, "evt\x00nul"])
def test_cairn_refuses_a_body_without_a_usable_event_id(event_id: object) -> None:
    body = cairn_event(NOW, event_id=event_id)
    assert "event_id" in refusal("cairn", sign("cairn", SECRET, body), body)


def test_cairn_refuses_a_body_missing_event_id() -> None:
    event = json.loads(cairn_event(NOW))
    del event["event_id"]
    body = json.dumps(event).encode()
    assert "event_id" in refusal("cairn", sign("cairn", SECRET, body), body)


@pytest.mark.parametrize("body", [
    b"", b"not json", b"[1, 2, 3]", b'"a string"', b"null", b"\xff\xfe\x00", b'{"event_id": NaN}',
])
def test_cairn_refuses_a_signed_body_that_is_not_a_json_object(body: bytes) -> None:
    refusal("cairn", sign("cairn", SECRET, body), body)


def test_cairn_checks_the_signature_before_the_body() -> None:
    body = cairn_event(NOW - timedelta(hours=1))
    assert "does not match" in refusal("cairn", sign("cairn", OTHER_SECRET, body), body)


def test_cairn_requires_its_header_with_the_sha256_prefix() -> None:
    body = cairn_event(NOW)
    assert "missing" in refusal("cairn", {}, body)
    assert "missing" in refusal("cairn", sign("github", SECRET, body), body)
    assert "prefix" in refusal("cairn", {"x-cairn-signature": hmac_hex(SECRET, body)}, body)


# --- generic and unknown ------------------------------------------------------------------------


def test_generic_is_not_checked() -> None:
    assert verify_signature("generic", None, {}, b"anything at all", NOW) is None
    assert verify_signature("generic", SECRET, {"x-hub-signature-256": "sha256=bad"}, b"{}", NOW) is None


def test_an_unknown_source_type_is_refused() -> None:
    body = fixture("github_ping.json")
    assert "unknown source type" in refusal("gitlab", sign("github", SECRET, body), body)


def test_trust_follows_the_source_type() -> None:
    assert [trust_of(source) for source in SOURCE_TYPES] == [
        ("signed", True), ("signed", True), ("signed", True), ("token", False),
        ("signed", True), ("signed", True), ("signed", True),
    ]
    assert trust_of("something-else") == ("token", False)


header_names = st.sampled_from([
    "x-hub-signature-256", "x-gitea-signature", "x-cairn-signature", "x-cairn-event-id", "x-other",
])


@settings(max_examples=300, deadline=None)
@given(
    source_type=st.sampled_from([*SOURCE_TYPES, "unknown"]),
    secret=st.one_of(st.none(), st.just(SECRET), st.text(max_size=20)),
    headers=st.dictionaries(header_names, st.one_of(
        st.text(max_size=80), st.text(alphabet="0123456789abcdefABCDEF", min_size=64, max_size=64).map(
            lambda h: "sha256=" + h),
    )),
    body=st.one_of(st.binary(max_size=200), st.builds(
        lambda e: json.dumps(e).encode(),
        st.fixed_dictionaries({}, optional={
            "event_id": st.one_of(st.text(max_size=10), st.integers()),
            "created_at": st.one_of(st.text(max_size=30), st.just(NOW.isoformat())),
        }),
    )),
)
def test_verification_only_ever_answers_none_a_dict_or_a_refusal(source_type, secret, headers, body) -> None:
    try:
        result = verify_signature(source_type, secret, headers, body, NOW)
    except SignatureRefused as refused:
        assert str(refused) == "signature verification failed"
        assert refused.reason
        return
    if source_type == "cairn":
        assert isinstance(result, dict)
    else:
        assert result is None
        assert source_type != "unknown"


@settings(max_examples=100, deadline=None)
@given(body=st.binary(max_size=300), source_type=st.sampled_from(SIGNED_SOURCES))
def test_a_correct_signature_is_accepted_for_any_body_but_cairn_needs_its_fields(body, source_type) -> None:
    headers = sign(source_type, SECRET, body, now=NOW)
    if source_type == "cairn":
        with pytest.raises(SignatureRefused):
            verify_signature(source_type, SECRET, headers, body, NOW)
    else:
        assert verify_signature(source_type, SECRET, headers, body, NOW) is None


# --- delivery id --------------------------------------------------------------------------------


ALL_IDS = {
    "x-github-delivery": "72d3162e-cc78-11e3-81ab-4c9367dc0958",
    "x-gitea-delivery": "0a5b7c3e-9d1f-4e2a-8b6c-1d2e3f4a5b6c",
    "x-delivery-id": "dlv-0001",
    "webhook-id": "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W",
}


@pytest.mark.parametrize(("missing", "expected"), [
    ((), ALL_IDS["x-github-delivery"]),
    (("x-github-delivery",), ALL_IDS["x-gitea-delivery"]),
    (("x-github-delivery", "x-gitea-delivery"), CAIRN_ID),
])
def test_delivery_id_takes_the_first_present_in_order(missing: tuple[str, ...], expected: str) -> None:
    headers = {name: value for name, value in ALL_IDS.items() if name not in missing}
    assert delivery_id(headers, "cairn", {"event_id": CAIRN_ID}, b"{}") == expected


def test_delivery_id_falls_to_x_delivery_id_then_webhook_id() -> None:
    headers = {"x-delivery-id": "dlv-0001", "webhook-id": "msg_1"}
    assert delivery_id(headers, "generic", None, b"{}") == "dlv-0001"
    assert delivery_id({"webhook-id": "msg_1"}, "generic", None, b"{}") == "msg_1"
    assert delivery_id({"webhook-id": "msg_1"}, "cairn", {"event_id": CAIRN_ID}, b"{}") == CAIRN_ID


def test_delivery_id_without_any_sender_id_is_the_body_hash() -> None:
    body = fixture("github_push.json")
    expected = "sha256:" + hashlib.sha256(body).hexdigest()
    assert delivery_id({"content-type": "application/json"}, "github", None, body) == expected
    assert delivery_id({}, "generic", None, b"") == "sha256:" + hashlib.sha256(b"").hexdigest()


def test_the_cairn_body_names_the_delivery_only_for_a_cairn_webhook() -> None:
    body = b'{"event_id": "evt_1"}'
    assert delivery_id({}, "generic", {"event_id": "evt_1"}, body).startswith("sha256:")
    assert delivery_id({}, "cairn", {"event_id": "evt_1"}, body) == "evt_1"
    assert delivery_id({}, "cairn", {"event_id": 7}, body).startswith("sha256:")
    assert delivery_id({}, "cairn", None, body).startswith("sha256:")


@pytest.mark.parametrize("name", ["x-github-delivery", "x-gitea-delivery", "x-delivery-id", "webhook-id"])
def test_a_sender_id_of_256_bytes_is_used_and_one_of_257_is_skipped(name: str) -> None:
    at_limit, over = "d" * 256, "d" * 257
    assert delivery_id({name: at_limit}, "generic", None, b"x") == at_limit
    assert delivery_id({name: over}, "generic", None, b"x") == "sha256:" + hashlib.sha256(b"x").hexdigest()
    fallback = "x-delivery-id" if name in ("x-github-delivery", "x-gitea-delivery") else "webhook-id"
    if fallback != name:
        assert delivery_id({name: over, fallback: "next-1"}, "generic", None, b"x") == "next-1"


def test_the_256_limit_counts_utf8_bytes_not_characters() -> None:
    assert delivery_id({"x-delivery-id": "é" * 128}, "generic", None, b"x") == "é" * 128
    assert delivery_id({"x-delivery-id": "é" * 129, "webhook-id": "w"}, "generic", None, b"x") == "w"


def test_an_over_long_cairn_event_id_is_skipped_too() -> None:
    assert delivery_id({"webhook-id": "w"}, "cairn", {"event_id": "e" * 257}, b"x") == "w"


def test_an_empty_sender_id_is_not_present() -> None:
    assert delivery_id({"x-github-delivery": "", "x-gitea-delivery": "  ", "webhook-id": "w"},
                       "github", None, b"x") == "w"


# --- kind ---------------------------------------------------------------------------------------


def test_kind_is_the_github_event_header_first() -> None:
    # Gitea sends X-GitHub-Event as well as X-Gitea-Event; they agree.
    assert delivery_kind({"x-github-event": "issues", "x-gitea-event": "push"}, None) == "issues"
    assert delivery_kind({"x-gitea-event": "pull_request"}, None) == "pull_request"


def test_kind_falls_to_the_cairn_body_then_none() -> None:
    assert delivery_kind({}, {"kind": "artifact.created"}) == "artifact.created"
    assert delivery_kind({"x-github-event": "ping"}, {"kind": "artifact.created"}) == "ping"
    assert delivery_kind({}, {"kind": 3}) is None
    assert delivery_kind({}, {"kind": ""}) is None
    assert delivery_kind({}, {}) is None
    assert delivery_kind({"x-github-event": ""}, None) is None
    assert delivery_kind({"content-type": "application/json"}, None) is None


def test_a_kind_or_sender_id_with_a_nul_counts_as_absent() -> None:
    # no PostgreSQL text column can hold NUL: the read models would stop at such a delivery
    assert delivery_kind({}, {"kind": "artifact\x00created"}) is None
    assert delivery_kind({"x-github-event": "is\x00sues", "x-gitea-event": "push"}, None) == "push"
    body = b"{}"
    assert delivery_id({"x-github-delivery": "a\x00b", "x-delivery-id": "d-1"}, "github", None, body) == "d-1"


# --- redaction ----------------------------------------------------------------------------------


def test_signatures_credentials_and_cookies_are_redacted_and_names_lower_cased() -> None:
    body = fixture("github_ping.json")
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "GitHub-Hookshot/7b2c1f4",
        "X-GitHub-Event": "ping",
        "X-GitHub-Delivery": "72d3162e-cc78-11e3-81ab-4c9367dc0958",
        "X-GitHub-Hook-ID": "501339875",
        "X-Hub-Signature": "sha1=0123",
        "X-Hub-Signature-256": sign("github", SECRET, body)["x-hub-signature-256"],
        "X-Gitea-Signature": "abcd",
        "X-Gogs-Signature": "abcd",
        "X-Cairn-Signature": "sha256=abcd",
        "Authorization": "Bearer sb_secret",
        "Proxy-Authorization": "Basic dXNlcjpwYXNz",
        "Cookie": "session=s3cr3t",
        "Set-Cookie": "session=s3cr3t; HttpOnly",
    }
    original = dict(headers)
    stored = redact_headers(headers)
    assert headers == original
    assert stored == {
        "content-type": "application/json",
        "user-agent": "GitHub-Hookshot/7b2c1f4",
        "x-github-event": "ping",
        "x-github-delivery": "72d3162e-cc78-11e3-81ab-4c9367dc0958",
        "x-github-hook-id": "501339875",
        "x-hub-signature": REDACTED,
        "x-hub-signature-256": REDACTED,
        "x-gitea-signature": REDACTED,
        "x-gogs-signature": REDACTED,
        "x-cairn-signature": REDACTED,
        "authorization": REDACTED,
        "proxy-authorization": REDACTED,
        "cookie": REDACTED,
        "set-cookie": REDACTED,
    }
    assert REDACTED == "«redacted»"
    assert not any(SECRET in value or hmac_hex(SECRET, body) in value for value in stored.values())


def test_redaction_keeps_event_ids_and_ordinary_headers() -> None:
    headers = {"x-cairn-event-id": CAIRN_ID, "x-request-id": "abc", "x-signature-note": "kept"}
    assert redact_headers(headers) == headers


# --- payload ------------------------------------------------------------------------------------


def test_a_json_body_is_parsed_whatever_its_content_type_says() -> None:
    body = fixture("github_issues_opened.json")
    expected = fixture_json("github_issues_opened.json")
    assert parse_payload(body, "application/json") == expected
    assert parse_payload(body, "application/json; charset=utf-8") == expected
    assert parse_payload(body, None) == expected
    assert parse_payload(body, "text/plain") == expected


@pytest.mark.parametrize(("body", "value"), [
    (b"[1, 2, 3]", [1, 2, 3]), (b"42", 42), (b'"deploy finished"', "deploy finished"),
    (b"true", True), (b"  {\"a\": 1}\n", {"a": 1}), ("\ufeff{\"a\": 1}".encode(), {"a": 1}),
])
def test_any_json_value_is_a_payload(body: bytes, value: object) -> None:
    assert parse_payload(body, "application/json") == value


def test_githubs_form_mode_carries_the_json_in_the_payload_field() -> None:
    expected = fixture_json("github_push.json")
    body = urlencode({"payload": fixture("github_push.json").decode()}).encode()
    assert parse_payload(body, "application/x-www-form-urlencoded") == expected
    assert parse_payload(body, "Application/X-WWW-Form-Urlencoded; charset=utf-8") == expected


def test_a_form_body_without_a_usable_payload_field_is_no_payload() -> None:
    form = "application/x-www-form-urlencoded"
    assert parse_payload(b"payload=not-json", form) is None
    assert parse_payload(b"title=hello&name=x", form) is None
    assert parse_payload(b"", form) is None


def test_json_posted_as_a_form_still_parses() -> None:
    # `curl -d '{"title": "x"}'` labels a JSON body as a form.
    assert parse_payload(b'{"title": "x"}', "application/x-www-form-urlencoded") == {"title": "x"}


@pytest.mark.parametrize("body", [
    b"", b"   ", b"not json", b"{", b"\xff\xfe\xfd", b"<xml/>", b"NaN", b'{"a": Infinity}',
    b"[" * 100_000 + b"]" * 100_000, b"1" * 5000, b"\x00",
])
def test_anything_else_is_no_payload(body: bytes) -> None:
    assert parse_payload(body, "application/json") is None
    assert parse_payload(body, None) is None


@pytest.mark.parametrize("body", [
    b'{"title": "\\ud800"}', b'["\\uDFFF", 1]', b'{"\\udc00": 1}', b'"\xed\xa0\x80"',
    '{"a": "\ud800"}'.encode("utf-16", "surrogatepass"),
])
def test_json_with_a_lone_surrogate_is_no_payload(body: bytes) -> None:
    # it parses, but is not text: it could be neither stored nor shown
    assert parse_payload(body, "application/json") is None


def test_a_form_payload_field_with_a_lone_surrogate_is_no_payload() -> None:
    form = urlencode({"payload": '{"title": "\\ud800"}'}).encode()
    assert parse_payload(form, "application/x-www-form-urlencoded") is None


@pytest.mark.parametrize(("body", "value"), [
    (b'{"t": "\\ud83d\\ude00"}', {"t": "\U0001F600"}),  # an escaped pair is one character
    (b'{"t": "\\\\ud800"}', {"t": "\\ud800"}),  # an escaped backslash, then text
    ('{"t": "caf\u00e9"}'.encode("utf-16"), {"t": "caf\u00e9"}),
    (b'{"t": "a\\u0000b"}', {"t": "a\x00b"}),
])
def test_escapes_that_make_text_still_parse(body: bytes, value: object) -> None:
    assert parse_payload(body, "application/json") == value


@settings(max_examples=300, deadline=None)
@given(body=st.binary(max_size=300), content_type=st.one_of(
    st.none(), st.text(max_size=40),
    st.sampled_from(["application/json", "application/x-www-form-urlencoded"]),
))
def test_parse_payload_never_raises(body: bytes, content_type: str | None) -> None:
    parse_payload(body, content_type)


# --- titles -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("source_type", "kind", "name", "title"), [
    ("github", "issues", "github_issues_opened.json",
     "issues opened: octo-org/octo-repo#12 Uploader crashes when the artifact name contains a space"),
    ("github", "issues", "github_issues_labeled.json",
     "issues labeled: octo-org/octo-repo#12 Uploader crashes when the artifact name contains a space"),
    ("github", "pull_request", "github_pull_request_opened.json",
     "pull_request opened: octo-org/octo-repo#7 Retry uploads with exponential backoff"),
    ("github", "push", "github_push.json",
     "push: octo-org/octo-repo refs/heads/main (3 commits) — Release notes for 1.4.1"),
    ("github", "ping", "github_ping.json", "ping: octo-org/octo-repo"),
    ("gitea", "issues", "gitea_issues_opened.json",
     "issues opened: infra/deploy-scripts#3 Nightly backup role fails on hosts without rsync"),
    ("gitea", "pull_request", "gitea_pull_request_opened.json",
     "pull_request opened: infra/deploy-scripts#4 Install rsync before running the backup role"),
    ("gitea", "push", "gitea_push.json",
     "push: infra/deploy-scripts refs/heads/main (2 commits) — Pin the rsync package version"),
    ("cairn", "artifact.created", "cairn_artifact_created.json",
     "cairn artifact.created: nightly-build-2026-01-21.tar.gz"),
    ("github", "discussion", "github_discussion_created.json",
     "discussion created: octo-org/octo-repo#90 Welcome to discussions!"),
    ("github", "check_run", "github_check_run_created.json",
     "check_run created: octo-org/octo-repo upload-tests (queued)"),
    ("github", "check_suite", "github_check_suite_completed.json",
     "check_suite completed: octo-org/octo-repo Octo CI on retry-uploads (failure)"),
    ("github", "workflow_run", "github_workflow_run_completed.json",
     "workflow_run completed: octo-org/octo-repo CI #562 (failure)"),
    ("github", "workflow_job", "github_workflow_job_completed.json",
     "workflow_job completed: octo-org/octo-repo CI / test (3.12) (success)"),
    ("github", "push", "github_push_tag_created.json", "push: octo-org/octo-repo created tag v1.4.1"),
    ("github", "push", "github_push_tag_deleted.json", "push: octo-org/octo-repo deleted tag v1.4.0-rc1"),
    ("github", "push", "github_push_branch_deleted.json", "push: octo-org/octo-repo deleted branch retry-uploads"),
])
def test_each_fixture_gets_its_title(source_type: str, kind: str, name: str, title: str) -> None:
    payload = parse_payload(fixture(name), "application/json")
    assert derive_title(source_type, kind, payload) == title


def test_the_kind_of_a_fixture_delivery_comes_from_its_headers_or_body() -> None:
    body = cairn_event(NOW)
    cairn_body = verify_signature("cairn", SECRET, sign("cairn", SECRET, body), body, NOW)
    kind = delivery_kind({}, cairn_body)
    assert derive_title("cairn", kind, parse_payload(body, "application/json")) == (
        "cairn artifact.created: nightly-build-2026-01-21.tar.gz"
    )


def repo(full_name: str = "owner/repo") -> dict:
    owner, name = full_name.split("/")
    return {"full_name": full_name, "name": name, "owner": {"login": owner}}


@pytest.mark.parametrize(("kind", "payload", "title"), [
    ("issue_comment", {"action": "created", "issue": {"number": 12, "title": "Title"},
                       "comment": {"body": "me too"}, "repository": repo()},
     "issue_comment created: owner/repo#12 Title"),
    ("issue_comment", {"action": "created", "issue": {"number": 7, "title": "PR title",
                                                      "pull_request": {"url": "u"}},
                       "repository": repo()},
     "issue_comment created: owner/repo#7 PR title"),
    ("pull_request_review", {"action": "submitted", "review": {"state": "approved"},
                             "pull_request": {"number": 7, "title": "Add X"}, "repository": repo()},
     "pull_request_review submitted: owner/repo#7 Add X"),
    ("release", {"action": "published", "release": {"tag_name": "v1.2", "name": "Spring"},
                 "repository": repo()},
     "release published: owner/repo v1.2"),
    ("release", {"action": "published", "release": {"name": "Spring"}, "repository": repo()},
     "release published: owner/repo Spring"),
    ("workflow_run", {"action": "completed", "workflow_run": {"name": "CI", "conclusion": "failure"},
                      "repository": repo()},
     "workflow_run completed: owner/repo CI (failure)"),
    ("workflow_run", {"action": "requested", "workflow_run": {"name": "CI", "status": "queued", "conclusion": None,
                                                              "run_number": 3}, "repository": repo()},
     "workflow_run requested: owner/repo CI #3 (queued)"),
    ("workflow_job", {"action": "in_progress", "workflow_job": {"name": "build", "workflow_name": "build",
                                                                "status": "in_progress"}, "repository": repo()},
     "workflow_job in_progress: owner/repo build (in_progress)"),
    ("check_run", {"action": "completed", "check_run": {"name": "lint", "status": "completed",
                                                        "conclusion": "neutral"}, "repository": repo()},
     "check_run completed: owner/repo lint (neutral)"),
    ("check_run", {"action": "created", "check_run": "odd", "repository": repo()}, "check_run created: owner/repo"),
    ("discussion", {"action": "answered", "discussion": {"number": 4, "title": "How?"},
                    "issue": {"number": 9, "title": "not this"}, "repository": repo()},
     "discussion answered: owner/repo#4 How?"),
    ("discussion_comment", {"action": "created", "discussion": {"number": 4, "title": "How?"},
                            "comment": {"body": "so"}, "repository": repo()},
     "discussion_comment created: owner/repo#4 How?"),
    ("push", {"ref": "refs/heads/feature", "before": "0" * 40, "after": "a" * 40, "commits": [{}],
              "repository": repo()},
     "push: owner/repo created branch feature"),
    ("push", {"ref": "refs/heads/main", "before": "a" * 40, "after": "b" * 40, "created": False, "deleted": False,
              "commits": [{}], "repository": repo()},
     "push: owner/repo refs/heads/main (1 commit)"),
    ("check_suite", {"action": "requested", "repository": repo()}, "check_suite requested: owner/repo"),
    ("create", {"ref": "v1.2", "ref_type": "tag", "repository": repo()}, "create: owner/repo tag v1.2"),
    ("star", {"action": "created", "repository": {"name": "repo", "owner": {"login": "owner"}}},
     "star created: owner/repo"),
    ("membership", {"action": "added", "organization": {"login": "octo-org"}},
     "membership added: octo-org"),
    ("ping", {"zen": "Keep it logically awesome.", "hook_id": 1, "organization": {"login": "octo-org"}},
     "ping: octo-org"),
    ("ping", {"zen": "Keep it logically awesome.", "hook_id": 1}, "ping: Keep it logically awesome."),
    ("ping", {}, "ping"),
    ("push", {"ref": "refs/heads/main", "commits": [{}, {}, {}], "repository": repo()},
     "push: owner/repo refs/heads/main (3 commits)"),
    ("push", {"ref": "refs/tags/v1", "commits": [{"message": "x"}], "repository": repo(),
              "head_commit": {"message": "Tag it\n\nbody"}},
     "push: owner/repo refs/tags/v1 (1 commit) — Tag it"),
    ("push", {"ref": "refs/heads/gone", "deleted": True, "commits": [], "head_commit": None,
              "repository": repo()},
     "push: owner/repo deleted branch gone"),
    ("push", {"ref": "refs/tags/v1", "deleted": True, "after": "0" * 40, "commits": [], "repository": repo()},
     "push: owner/repo deleted tag v1"),
    ("issues", {"action": "opened", "issue": {"number": 5}}, "issues opened: #5"),
    ("issues", {"issue": {"title": "No number"}, "repository": repo()}, "issues: owner/repo No number"),
    ("issues", {"action": "deleted", "repository": repo()}, "issues deleted: owner/repo"),
])
def test_forge_titles(kind: str, payload: dict, title: str) -> None:
    assert derive_title("github", kind, payload) == title
    assert derive_title("gitea", kind, payload) == title


@pytest.mark.parametrize(("payload", "title"), [
    ({"kind": "artifact.created", "subject": "build.tar.gz", "artifact": {"name": "other"}},
     "cairn artifact.created: build.tar.gz"),
    ({"artifact": {"name": "report.pdf"}}, "cairn artifact.created: report.pdf"),
    ({"artifact": {"title": "Q3 report"}}, "cairn artifact.created: Q3 report"),
    ({"name": "top-level name", "artifact": {"name": "report.pdf"}},
     "cairn artifact.created: top-level name"),
    ({"artifact": {"size": 3}}, "cairn artifact.created"),
    ([], "cairn artifact.created"),
])
def test_cairn_titles(payload: object, title: str) -> None:
    assert derive_title("cairn", "artifact.created", payload) == title


def test_a_cairn_title_without_a_kind() -> None:
    assert derive_title("cairn", None, {"subject": "x"}) == "cairn event: x"


@pytest.mark.parametrize(("kind", "payload", "title"), [
    (None, {"title": "Disk almost full", "name": "n", "summary": "s", "message": "m"},
     "webhook: Disk almost full"),
    (None, {"name": "nightly", "summary": "s", "message": "m"}, "webhook: nightly"),
    (None, {"summary": "Backup finished", "message": "m"}, "webhook: Backup finished"),
    (None, {"message": "Deploy of api v2 succeeded"}, "webhook: Deploy of api v2 succeeded"),
    ("alert", {"title": "CPU high"}, "alert: CPU high"),
    (None, {"title": 404}, "webhook: 404"),
    (None, {"title": {"nested": "x"}, "name": ["list"], "summary": None, "message": "fallback"},
     "webhook: fallback"),
    (None, {"title": True}, "webhook delivery"),
    (None, {"title": "   "}, "webhook delivery"),
    (None, {"unrelated": 1}, "webhook delivery"),
    (None, None, "webhook delivery"),
    (None, [1, 2, 3], "webhook delivery"),
    (None, 3.5, "webhook delivery"),
    (None, "deploy finished", "webhook: deploy finished"),
    ("alert", None, "alert delivery"),
])
def test_generic_titles(kind: str | None, payload: object, title: str) -> None:
    assert derive_title("generic", kind, payload) == title


def test_a_forge_delivery_it_cannot_read_gets_a_generic_title() -> None:
    assert derive_title("github", None, None) == "webhook delivery"
    assert derive_title("github", "issues", None) == "issues delivery"
    assert derive_title("gitea", "push", ["not", "an", "object"]) == "push delivery"


@pytest.mark.parametrize(("body", "content_type", "title"), [
    (b"Disk full on web-3\nsecond line", "text/plain; charset=utf-8",
     "issues: not JSON, 30 bytes (text/plain): Disk full on web-3"),
    (b"\n\n  x=1&y=2", "application/x-www-form-urlencoded", "issues: not JSON, 11 bytes (application/x-www-form-urlencoded): x=1&y=2"),
    (b"\xff\xd8\xff\xe0", "image/jpeg", "issues: not JSON, 4 bytes (image/jpeg)"),
    (b"{truncated", None, "issues: not JSON, 10 bytes: {truncated"),
    (b"", None, "issues: empty body"),
    (b"null", "application/json", "issues delivery"),
])
def test_a_body_that_is_not_json_is_titled_by_its_size_type_and_first_line(body, content_type, title) -> None:
    assert derive_title("github", "issues", parse_payload(body, content_type), body=body,
                        content_type=content_type) == title


def test_a_long_text_body_cut_mid_character_still_gets_its_first_line() -> None:
    body = ("é" * 600).encode()  # 1200 bytes: the 1024-byte preview ends inside a character
    assert derive_title("generic", None, None, body=body, content_type="text/plain") == one_line_title(
        "webhook: not JSON, 1,200 bytes (text/plain): " + "é" * 512)


def test_a_short_body_that_is_not_utf8_near_its_end_gets_no_first_line() -> None:
    # the whole body was read (no preview cut), so a bad byte at its end is not a cut character
    for body in (b"\x00\x01\x02binary\xff", b"ouvert caf\xe9"):
        assert derive_title("github", "issues", None, body=body, content_type="application/octet-stream") == (
            f"issues: not JSON, {len(body)} bytes (application/octet-stream)")


def test_a_stored_envelope_without_its_body_is_titled_by_its_size() -> None:
    assert derive_title("generic", None, None, size=2048, content_type="text/csv") == (
        "webhook: not JSON, 2,048 bytes (text/csv)")


def test_a_title_is_one_line_without_control_characters() -> None:
    payload = {"action": "opened", "issue": {"number": 1, "title": "Line one\r\nLine two\x1b[31m red\x00"},
               "repository": repo()}
    assert derive_title("github", "issues", payload) == (
        "issues opened: owner/repo#1 Line one Line two [31m red"
    )
    assert derive_title("generic", "a\nb", {"title": "x\u2028y\tz"}) == "a b: x y z"


def test_a_long_title_is_cut_to_200_characters_with_an_ellipsis() -> None:
    payload = {"action": "opened", "issue": {"number": 1, "title": "word " * 100}, "repository": repo()}
    title = derive_title("github", "issues", payload)
    assert len(title) == TITLE_MAX_CHARS
    assert title.startswith("issues opened: owner/repo#1 word word")
    assert title.endswith("…")


def test_a_lone_surrogate_in_a_title_cannot_break_storage() -> None:
    payload = json.loads(b'{"title": "bad \\ud800 char"}')
    title = derive_title("generic", None, payload)
    assert title.encode("utf-8") == b"webhook: bad ? char"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=300),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(
        st.sampled_from([
            "action", "issue", "pull_request", "number", "title", "repository", "full_name", "name",
            "owner", "login", "ref", "commits", "total_commits", "head_commit", "message", "release",
            "tag_name", "ref_type", "zen", "organization", "subject", "artifact", "summary",
        ]) | st.text(max_size=10),
        children, max_size=8,
    ),
    max_leaves=40,
)


@settings(max_examples=500, deadline=None)
@given(
    source_type=st.sampled_from([*SOURCE_TYPES, "other"]),
    kind=st.one_of(st.none(), st.sampled_from([
        "issues", "pull_request", "issue_comment", "push", "ping", "release", "create",
        "workflow_run", "artifact.created",
    ]), st.text(max_size=300)),
    payload=json_values,
)
def test_a_title_never_fails_is_one_line_and_at_most_200_characters(source_type, kind, payload) -> None:
    title = derive_title(source_type, kind, payload)
    assert isinstance(title, str)
    assert 0 < len(title) <= TITLE_MAX_CHARS
    assert "\r" not in title and "\n" not in title
    assert title == title.strip()
    assert not any(ord(ch) < 0x20 or 0x7F <= ord(ch) < 0xA0 for ch in title)
    title.encode("utf-8")


@pytest.mark.parametrize(("source_type", "kind", "payload"), [
    ("github", "\x1b", {}), ("generic", "\x00\r\n", {"title": "\x1b\x07"}), ("cairn", "\t", {"subject": "\x7f"}),
    ("github", "push", {"head_commit": {"message": "\x1b\nreal"}}),
])
def test_a_title_of_nothing_but_control_characters_still_says_something(
    source_type: str, kind: str, payload: object
) -> None:
    title = derive_title(source_type, kind, payload)
    assert title in ("webhook delivery", "cairn event", "push delivery", "push")
    assert derive_title("github", "push", {}) == "push"


# --- the parse and the title's cleaning take the fast way only where it gives the same ---------


def _reference_json(text: bytes | str) -> object | None:
    """The payload as the standard library alone reads it (the parse before msgspec went first)."""
    from domain.bodies import _is_unicode, _may_hold_surrogate, _refuse_constant
    try:
        if isinstance(text, bytes):
            text = text.decode(json.detect_encoding(text), "surrogatepass")
        value = json.loads(text, parse_constant=_refuse_constant)
    except (ValueError, TypeError, RecursionError):
        return None
    return None if _may_hold_surrogate(text) and not _is_unicode(value) else value


ODD_DOCUMENTS = [
    b"123456789012345678901234567890", b"-18446744073709551617", b"1e400", b"-1e400", b"123.456e789",
    b"1.0000000000000000001", b"-0.0", b"-0", b"5e-324", b"2e-324", b'{"a":1,"a":2}', b'"\x01"', b'"\\ud800"',
    b'"\\udc00x"', b'"\\ud83d\\ude00"', b'"\xed\xa0\x80"', b"\xef\xbb\xbf{}", "{}".encode("utf-16"),
    '{"é": 1}'.encode("utf-32-le"), b"NaN", b"[Infinity]", b"[1,]", b'"\\u0000"', b"01", b"2.", b"", b"  ",
    b"[" * 5000 + b"]" * 5000, b'"\xff"', b' {"a": [1, 2.5e-3]} \n', b"true", b"null", b'"\x7f"', b'"\\/"',
]


@pytest.mark.parametrize("document", ODD_DOCUMENTS, ids=range(len(ODD_DOCUMENTS)))
def test_an_odd_document_parses_as_the_standard_library_reads_it(document: bytes) -> None:
    assert repr(strict_json(document)) == repr(_reference_json(document))
    try:
        text = document.decode("utf-8", "surrogatepass")  # as the `payload` field of a form body
    except UnicodeDecodeError:
        return
    assert repr(strict_json(text)) == repr(_reference_json(text))


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(JSON_VALUES, st.booleans())
def test_any_document_parses_as_the_standard_library_reads_it(value: object, ascii_only: bool) -> None:
    document = json.dumps(value, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")
    assert repr(strict_json(document)) == repr(_reference_json(document))


def test_a_title_loses_exactly_the_control_characters_and_lone_surrogates() -> None:
    import unicodedata

    def reference(text: str) -> str:
        cleaned = "".join(" " if unicodedata.category(ch) == "Cc" else ch for ch in text)
        return cleaned.encode(errors="replace").decode()

    every = "".join(chr(c) for c in range(0x3000)) + "\ud800 \udfff \U0001F600 \U000E0001 \u2028\u2029\u200b"
    for start in range(0, len(every), 64):
        assert _printable(every[start:start + 64]) == reference(every[start:start + 64])
    assert _printable("issues opened: #12 a title") == "issues opened: #12 a title"
