"""Who sent a delivery: the signature checks of the signed sources (CONTRACT §4 and §11).

Given the raw body, the lower-cased headers and the clock's `now`, these functions check a
delivery's HMAC signature (and cairn's freshness), refusing with one reply that never says why.
Nothing here reads a clock, a database or the network.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta

from domain.bodies import strict_json
from domain.errors import DomainError

SIGNED_SOURCES = ("github", "gitea", "cairn")
CAIRN_WINDOW = timedelta(seconds=300)
SIGNING_SECRET_PREFIX = "whsec_"
SIGNING_SECRET_BYTES = 32
SIGNATURE_REFUSED = "signature verification failed"
SIGNATURE_HEADERS = frozenset({"x-hub-signature-256", "x-gitea-signature", "x-cairn-signature"})

_HEX_SHA256 = re.compile(r"[0-9a-fA-F]{64}")
_RFC3339 = re.compile(
    r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})", re.ASCII
)


class SignatureRefused(DomainError):
    """Raised when a signed source's delivery fails its check; the reply never says why."""

    code = "unauthorized"

    def __init__(self, reason: str) -> None:
        super().__init__(SIGNATURE_REFUSED)
        self.reason = reason  # for logs and tests only, never for the caller



def new_signing_secret(random_bytes: bytes) -> str:
    """A signing secret is `whsec_` and 64 lowercase hex digits of 32 random bytes."""
    if len(random_bytes) != SIGNING_SECRET_BYTES:
        raise ValueError(f"a signing secret needs {SIGNING_SECRET_BYTES} random bytes")
    return SIGNING_SECRET_PREFIX + random_bytes.hex()


def check_single_signatures(source_type: str, header_names: Iterable[str]) -> None:
    """A signed delivery carries each signature header at most once: with two, which one was
    checked would depend on the parser (and an attacker could add a second)."""
    if source_type not in SIGNED_SOURCES:
        return
    seen: set[str] = set()
    for name in header_names:
        name = name.lower()
        if name in SIGNATURE_HEADERS:
            if name in seen:
                raise SignatureRefused(f"{name} sent more than once")
            seen.add(name)


def verify_signature(
    source_type: str, secret: str | None, headers: Mapping[str, str], body: bytes, now: datetime
) -> dict | None:
    """HMAC-SHA256 of the raw body, keyed by the secret exactly as shown; cairn also checks freshness.

    Returns the parsed cairn body for `cairn`, else None; `generic` is not checked at all.
    """
    if source_type == "generic":
        return None
    if source_type not in SIGNED_SOURCES:
        raise SignatureRefused(f"unknown source type {source_type!r}")
    if not secret:
        raise SignatureRefused("the webhook has no signing secret")
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


def trust_of(source_type: str) -> tuple[str, bool]:
    """Signed sources are `signed` and verified; anything else trusts only the URL's token."""
    return ("signed", True) if source_type in SIGNED_SOURCES else ("token", False)
