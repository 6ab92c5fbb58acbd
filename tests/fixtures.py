"""Webhook test fixtures: realistic bodies from tests/fixtures/ and the signatures senders send.

Shared by the ingest unit tests and the HTTP end-to-end tests.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).parent / "fixtures"


def fixture(name: str) -> bytes:
    """The raw bytes of tests/fixtures/<name>, exactly as a sender would post them."""
    return (FIXTURES / name).read_bytes()


def fixture_json(name: str) -> Any:
    return json.loads(fixture(name))


def cairn_event(
    now: datetime, name: str = "cairn_artifact_created.json", **changes: Any
) -> bytes:
    """A Cairn body with `created_at` set to `now` (RFC 3339, UTC) and any other field changed."""
    body = fixture_json(name)
    body["created_at"] = now.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")
    body.update(changes)
    return json.dumps(body).encode()


def hmac_hex(secret: str, body: bytes) -> str:
    """HMAC-SHA256 of the raw body keyed by the secret exactly as shown (`whsec_` included)."""
    return hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def sign(source_type: str, secret: str, body: bytes, *, event_id: str | None = None,
         now: datetime | None = None, message_id: str | None = None) -> dict[str, str]:
    """The signature headers (lower-cased names) a sender of this source type attaches; the
    timestamped schemes (standard, stripe, slack) sign `now` (default: the wall clock)."""
    stamp = str(int((now or datetime.now(timezone.utc)).timestamp()))
    if source_type == "standard":
        message_id = message_id or "msg_" + hashlib.sha256(body).hexdigest()[:24]
        key = base64.b64decode(secret.removeprefix("whsec_") + "=" * (-len(secret.removeprefix("whsec_")) % 4))
        mac = hmac.new(key, f"{message_id}.{stamp}.".encode() + body, hashlib.sha256).digest()
        return {"webhook-id": message_id, "webhook-timestamp": stamp,
                "webhook-signature": "v1," + base64.b64encode(mac).decode()}
    if source_type == "stripe":
        return {"stripe-signature": f"t={stamp},v1={hmac_hex(secret, f'{stamp}.'.encode() + body)}"}
    if source_type == "slack":
        return {"x-slack-request-timestamp": stamp,
                "x-slack-signature": "v0=" + hmac_hex(secret, f"v0:{stamp}:".encode() + body)}
    digest = hmac_hex(secret, body)
    if source_type == "github":
        return {"x-hub-signature-256": f"sha256={digest}"}
    if source_type == "gitea":
        return {"x-gitea-signature": digest}
    if source_type == "cairn":
        headers = {"x-cairn-signature": f"sha256={digest}"}
        if event_id is not None:
            headers["x-cairn-event-id"] = event_id
        return headers
    if source_type == "generic":
        return {}
    raise ValueError(f"unknown source type {source_type!r}")
