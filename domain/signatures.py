"""Who sent a delivery: the signature checks of the signed sources (CONTRACT §4, §11 and §17).

Given the raw body, the lower-cased headers and the clock's `now`, these functions check a
delivery's HMAC signature (and its freshness: cairn's `created_at`, the signed timestamp of
Standard Webhooks, Stripe and Slack), refusing with one reply that never says why. Nothing here
reads a clock, a database or the network (so not the `standardwebhooks` library, which reads the
wall clock: docs/adr/0039).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta

from domain.bodies import strict_json
from domain.errors import DomainError

SIGNED_SOURCES = ("github", "gitea", "cairn", "standard", "stripe", "slack")
CAIRN_WINDOW = timedelta(seconds=300)
TIMESTAMP_WINDOW = timedelta(seconds=300)  # how far a signed timestamp may be from now, either way
SIGNING_SECRET_PREFIX = "whsec_"
SIGNING_SECRET_BYTES = 32
SIGNATURE_REFUSED = "signature verification failed"
# what a signed delivery may carry once only, per source: its signature and what the signature covers
_FORGE_SIGNATURES = frozenset({"x-hub-signature-256", "x-gitea-signature", "x-cairn-signature"})
SIGNATURE_HEADERS_OF = {
    "github": _FORGE_SIGNATURES, "gitea": _FORGE_SIGNATURES, "cairn": _FORGE_SIGNATURES,
    "standard": frozenset({"webhook-signature", "webhook-timestamp", "webhook-id"}),
    "stripe": frozenset({"stripe-signature"}),
    "slack": frozenset({"x-slack-signature", "x-slack-request-timestamp"}),
}

_HEX_SHA256 = re.compile(r"[0-9a-fA-F]{64}")
_UNIX_SECONDS = re.compile(r"[0-9]{1,12}", re.ASCII)
_RFC3339 = re.compile(
    r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})", re.ASCII
)


class SignatureRefused(DomainError):
    """Raised when a signed source's delivery fails its check; the reply never says why."""

    code = "unauthorized"

    def __init__(self, reason: str) -> None:
        super().__init__(SIGNATURE_REFUSED)
        self.reason = reason  # for logs and tests only, never for the caller



def new_signing_secret(random_bytes: bytes, source_type: str | None = None) -> str:
    """A signing secret is `whsec_` and 64 lowercase hex digits of 32 random bytes; for Standard
    Webhooks, `whsec_` and the base64 of the 32 bytes (the key is those bytes, as the spec says)."""
    if len(random_bytes) != SIGNING_SECRET_BYTES:
        raise ValueError(f"a signing secret needs {SIGNING_SECRET_BYTES} random bytes")
    if source_type == "standard":
        return SIGNING_SECRET_PREFIX + base64.b64encode(random_bytes).decode()
    return SIGNING_SECRET_PREFIX + random_bytes.hex()


def check_single_signatures(source_type: str, header_names: Iterable[str]) -> None:
    """A signed delivery carries each signature header at most once: with two, which one was
    checked would depend on the parser (and an attacker could add a second)."""
    once_only = SIGNATURE_HEADERS_OF.get(source_type)
    if once_only is None:
        return
    seen: set[str] = set()
    for name in header_names:
        name = name.lower()
        if name in once_only:
            if name in seen:
                raise SignatureRefused(f"{name} sent more than once")
            seen.add(name)


def verify_signature(
    source_type: str, secret: str | None, headers: Mapping[str, str], body: bytes, now: datetime
) -> dict | None:
    """HMAC-SHA256 of the raw body, keyed by the secret exactly as shown; cairn also checks freshness.
    Standard Webhooks, Stripe and Slack sign a timestamp with the body, within ±300 s of now.

    Returns the parsed cairn body for `cairn`, else None; `generic` is not checked at all.
    """
    if source_type == "generic":
        return None
    if source_type not in SIGNED_SOURCES:
        raise SignatureRefused(f"unknown source type {source_type!r}")
    if not secret:
        raise SignatureRefused("the webhook has no signing secret")
    timed = _TIMED_SCHEMES.get(source_type)
    if timed is not None:
        timed(secret, headers, body, now)
        return None
    expected = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    if source_type == "github":
        _check_hex(_prefixed(headers, "x-hub-signature-256"), expected)
        return None
    if source_type == "gitea":
        plain = headers.get("x-gitea-signature", "").strip()
        _check_hex(plain or _prefixed(headers, "x-hub-signature-256"), expected)
        return None
    _check_hex(_prefixed(headers, "x-cairn-signature"), expected)
    return _check_cairn_body(headers, body, now)


def _prefixed(headers: Mapping[str, str], name: str) -> str:
    value = headers.get(name, "").strip()
    if not value:
        raise SignatureRefused(f"missing {name}")
    if not value.startswith("sha256="):
        raise SignatureRefused(f"{name} lacks the sha256= prefix")
    return value.removeprefix("sha256=")


def _check_hex(given: str, expected: str) -> None:
    if not _HEX_SHA256.fullmatch(given):
        raise SignatureRefused("the signature is not 64 hex digits")
    if not hmac.compare_digest(given.lower(), expected):
        raise SignatureRefused("the signature does not match the body")


def _check_cairn_body(headers: Mapping[str, str], body: bytes, now: datetime) -> dict:
    parsed = strict_json(body)
    if not isinstance(parsed, dict):
        raise SignatureRefused("a cairn body must be a JSON object")
    event_id = parsed.get("event_id")
    if not isinstance(event_id, str) or not event_id.strip() or "\x00" in event_id:
        raise SignatureRefused("a cairn body needs a non-empty string event_id (without NUL)")
    created_at = _rfc3339(parsed.get("created_at"))
    if created_at is None:
        raise SignatureRefused("a cairn body needs created_at as an RFC 3339 time")
    if abs(now - created_at) > CAIRN_WINDOW:
        raise SignatureRefused(f"cairn created_at {created_at.isoformat()} is outside ±300 s of now")
    header_id = headers.get("x-cairn-event-id")
    if header_id is not None and header_id != event_id:
        raise SignatureRefused("x-cairn-event-id does not match the body's event_id")
    return parsed


def _rfc3339(value: object) -> datetime | None:
    if not isinstance(value, str) or not _RFC3339.fullmatch(value):
        return None
    try:
        return datetime.fromisoformat(value.upper().replace("Z", "+00:00"))
    except ValueError:  # a leap second, month 13, ...
        return None


# --- the timestamped schemes: Standard Webhooks, Stripe, Slack (CONTRACT §17) --------------------


def verify_standard(secret: str, headers: Mapping[str, str], body: bytes, now: datetime) -> None:
    """Standard Webhooks: `webhook-signature` holds space-separated `v1,<base64 HMAC-SHA256>` of
    `{webhook-id}.{webhook-timestamp}.{body}`, keyed by the base64-decoded part of `whsec_<base64>`;
    any one `v1` may match; the timestamp within ±300 s of now."""
    message_id = _required(headers, "webhook-id")
    stamp = _timestamp(_required(headers, "webhook-timestamp"), now)
    given = [entry.removeprefix("v1,") for entry in _required(headers, "webhook-signature").split()
             if entry.startswith("v1,")]
    if not given:
        raise SignatureRefused("webhook-signature carries no v1 signature")
    signed = f"{message_id}.{stamp}.".encode() + body
    expected = base64.b64encode(hmac.new(standard_key(secret), signed, hashlib.sha256).digest()).decode()
    _any_matches(given, expected)


def standard_key(secret: str) -> bytes:
    """The HMAC key of a Standard Webhooks secret: the base64 after `whsec_` (padding optional)."""
    encoded = secret.removeprefix(SIGNING_SECRET_PREFIX)
    try:
        key = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise SignatureRefused("the signing secret is not whsec_ and base64") from None
    if not key:
        raise SignatureRefused("the signing secret is empty")
    return key


def verify_stripe(secret: str, headers: Mapping[str, str], body: bytes, now: datetime) -> None:
    """Stripe: `Stripe-Signature: t=<unix>,v1=<hex>[,v1=…]`, the hex HMAC-SHA256 of `{t}.{body}`
    keyed by the secret exactly as shown; any `v1` may match; `t` within ±300 s of now."""
    pairs = [item.strip().partition("=") for item in _required(headers, "stripe-signature").split(",")]
    stamps = [value for name, _, value in pairs if name == "t"]
    if len(stamps) != 1:
        raise SignatureRefused("stripe-signature needs exactly one t=")
    stamp = _timestamp(stamps[0], now)
    given = [value.lower() for name, _, value in pairs if name == "v1" and _HEX_SHA256.fullmatch(value)]
    if not given:
        raise SignatureRefused("stripe-signature carries no v1 signature of 64 hex digits")
    _any_matches(given, hmac.new(secret.encode(), f"{stamp}.".encode() + body, hashlib.sha256).hexdigest())


def verify_slack(secret: str, headers: Mapping[str, str], body: bytes, now: datetime) -> None:
    """Slack: `X-Slack-Signature: v0=<hex HMAC-SHA256 of "v0:{ts}:{body}">` keyed by the signing
    secret exactly as shown, `X-Slack-Request-Timestamp` within ±300 s of now."""
    stamp = _timestamp(_required(headers, "x-slack-request-timestamp"), now)
    given = _required(headers, "x-slack-signature")
    if not given.startswith("v0="):
        raise SignatureRefused("x-slack-signature lacks the v0= prefix")
    expected = hmac.new(secret.encode(), f"v0:{stamp}:".encode() + body, hashlib.sha256).hexdigest()
    _check_hex(given.removeprefix("v0="), expected)


_TIMED_SCHEMES = {"standard": verify_standard, "stripe": verify_stripe, "slack": verify_slack}


def _required(headers: Mapping[str, str], name: str) -> str:
    value = headers.get(name, "").strip()
    if not value:
        raise SignatureRefused(f"missing {name}")
    return value


def _timestamp(text: str, now: datetime) -> str:
    """Unix seconds (ASCII digits only) within ±300 s of now, as sent: the digits are what was signed."""
    text = text.strip()
    if not _UNIX_SECONDS.fullmatch(text):
        raise SignatureRefused("the signed timestamp is not unix seconds")
    if abs(now.timestamp() - int(text)) > TIMESTAMP_WINDOW.total_seconds():
        raise SignatureRefused(f"the signed timestamp {text} is outside ±300 s of now")
    return text


def _any_matches(given: list[str], expected: str) -> None:
    """Each given signature compared in constant time (all of them: which one matched leaks nothing)."""
    wanted = expected.encode()
    matches = [hmac.compare_digest(candidate.encode(errors="replace"), wanted) for candidate in given]
    if not any(matches):
        raise SignatureRefused("no signature matches the body")


def trust_of(source_type: str) -> tuple[str, bool]:
    """Signed sources are `signed` and verified; anything else trusts only the URL's token."""
    return ("signed", True) if source_type in SIGNED_SOURCES else ("token", False)
