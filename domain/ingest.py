"""Webhook ingest: naming one delivery and what of it is stored (CONTRACT §4 and §11).

Given the lower-cased headers (and a cairn body already checked by domain/signatures.py), these
functions name the delivery (its id and kind) and redact what is stored. The body's payload is
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
})
DELIVERY_ID_HEADERS_FIRST = ("x-github-delivery", "x-gitea-delivery")
DELIVERY_ID_HEADERS_LAST = ("x-delivery-id", "webhook-id")


def delivery_id(
    headers: Mapping[str, str], source_type: str, cairn_body: dict | None, body: bytes
) -> str:
    """The first present sender id of at most 256 bytes, else `sha256:` and the body's hash."""
    from_cairn = source_type == "cairn" and isinstance(cairn_body, dict)
    cairn_id = cairn_body.get("event_id") if from_cairn else None
    candidates = (
        *(headers.get(name) for name in DELIVERY_ID_HEADERS_FIRST),
        cairn_id,
        *(headers.get(name) for name in DELIVERY_ID_HEADERS_LAST),
    )
    for candidate in candidates:
        if (
            isinstance(candidate, str) and candidate.strip() and "\x00" not in candidate
            and len(candidate.encode(errors="replace")) <= DELIVERY_ID_MAX_BYTES
        ):
            return candidate
    return "sha256:" + hashlib.sha256(body).hexdigest()


def delivery_kind(headers: Mapping[str, str], cairn_body: dict | None) -> str | None:
    """`X-GitHub-Event`, else `X-Gitea-Event`, else the cairn body's `kind`, else None.

    A kind with a NUL character counts as absent: no database text column can hold it."""
    for value in (headers.get("x-github-event"), headers.get("x-gitea-event")):
        if value and value.strip() and "\x00" not in value:
            return value
    kind = cairn_body.get("kind") if isinstance(cairn_body, dict) else None
    return kind if isinstance(kind, str) and kind.strip() and "\x00" not in kind else None


def redact_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """Names lower-cased; signatures, credentials and cookies replaced by «redacted»."""
    redacted: dict[str, str] = {}
    for name, value in headers.items():
        lowered = name.lower()
        redacted[lowered] = REDACTED if lowered in REDACTED_HEADERS else value
    return redacted
