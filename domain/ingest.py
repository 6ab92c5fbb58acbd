"""Webhook ingest: naming one delivery and what of it is stored (CONTRACT §4, §11 and §17).

Given the lower-cased headers (and a cairn body already checked by domain/signatures.py, or the
payload of a source that names its deliveries in the body), these functions name the delivery
(its id and kind) and redact what is stored. The body's payload is
read by domain/bodies.py, the title derived by domain/titles.py. Nothing here does I/O.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from domain.names import REDACTED

DELIVERY_ID_MAX_BYTES = 256
REDACTED_HEADERS = frozenset({
    "x-hub-signature", "x-hub-signature-256", "x-gitea-signature", "x-gogs-signature",
    "x-cairn-signature", "authorization", "cookie", "set-cookie", "proxy-authorization",
    "webhook-signature", "stripe-signature", "x-slack-signature",
})
DELIVERY_ID_HEADERS_FIRST = ("x-github-delivery", "x-gitea-delivery")
DELIVERY_ID_HEADERS_LAST = ("x-delivery-id", "webhook-id")
BODY_ID_FIELDS = {"cairn": "event_id", "stripe": "id", "slack": "event_id"}  # who names a delivery in its body
BODY_KIND_SOURCES = ("standard", "stripe", "slack")  # whose kind is read from the body (`type`)


def delivery_id(
    headers: Mapping[str, str], source_type: str, parsed: object | None, body: bytes
) -> str:
    """The first present sender id of at most 256 bytes, else `sha256:` and the body's hash.

    `parsed` is the body as the source's check read it (cairn) or its payload (stripe, slack):
    those sources name a delivery in the body; Standard Webhooks by its signed `webhook-id`."""
    field = BODY_ID_FIELDS.get(source_type)
    body_id = parsed.get(field) if field is not None and isinstance(parsed, dict) else None
    own = headers.get("webhook-id") if source_type == "standard" else body_id
    first, after_forges = (None, own) if source_type == "cairn" else (own, None)  # cairn's, as §4 lists it
    candidates = (
        first,
        *(headers.get(name) for name in DELIVERY_ID_HEADERS_FIRST),
        after_forges,
        *(headers.get(name) for name in DELIVERY_ID_HEADERS_LAST),
    )
    for candidate in candidates:
        if (
            isinstance(candidate, str) and candidate.strip() and "\x00" not in candidate
            and len(candidate.encode(errors="replace")) <= DELIVERY_ID_MAX_BYTES
        ):
            return candidate
    return "sha256:" + hashlib.sha256(body).hexdigest()


def delivery_kind(headers: Mapping[str, str], cairn_body: dict | None, source_type: str | None = None,
                  payload: object | None = None) -> str | None:
    """`X-GitHub-Event`, else `X-Gitea-Event`, else the cairn body's `kind`, else None; for Standard
    Webhooks and Stripe the payload's `type`, for Slack its `event.type`, else its `type`.

    A kind with a NUL character counts as absent: no database text column can hold it."""
    if source_type in BODY_KIND_SOURCES:
        return _body_kind(source_type, payload)
    for value in (headers.get("x-github-event"), headers.get("x-gitea-event")):
        if value and value.strip() and "\x00" not in value:
            return value
    kind = cairn_body.get("kind") if isinstance(cairn_body, dict) else None
    return kind if isinstance(kind, str) and kind.strip() and "\x00" not in kind else None


def handshake_challenge(source_type: str, payload: object | None) -> str | None:
    """The challenge of a Slack `url_verification` body (answered with it, never routed), else None."""
    if source_type != "slack" or not isinstance(payload, dict) or payload.get("type") != "url_verification":
        return None
    challenge = payload.get("challenge")
    return challenge if isinstance(challenge, str) else None


def _body_kind(source_type: str, payload: object | None) -> str | None:
    if not isinstance(payload, dict):
        return None
    event = payload.get("event") if source_type == "slack" else None
    for kind in (event.get("type") if isinstance(event, dict) else None, payload.get("type")):
        if isinstance(kind, str) and kind.strip() and "\x00" not in kind:
            return kind
    return None


def redact_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """Names lower-cased; signatures, credentials and cookies replaced by «redacted»."""
    redacted: dict[str, str] = {}
    for name, value in headers.items():
        lowered = name.lower()
        redacted[lowered] = REDACTED if lowered in REDACTED_HEADERS else value
    return redacted
