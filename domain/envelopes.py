"""The envelope a rule sees (CONTRACT §5): the delivery's facts, its sender, headers and payload.

`envelope` builds it at ingest; `envelope_with_payload` puts a stored delivery's payload back
into its stored envelope for replay and dry runs.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from domain.bodies import read_payload
from domain.payloads import JSON, TEXT
from domain.trust import Actor

NO_ACTOR = {"sender": None, "association": None, "trusted": None}


def envelope(*, source: str, kind: str | None, webhook_id: str, trust_mode: str, verified: bool,
             content_type: str | None, size: int, headers: Mapping[str, str], payload: Any,
             actor: Actor | None = None) -> dict[str, Any]:
    """What every rule sees: the delivery's facts, who sent it ({sender, association, trusted},
    nulls where absent), its (lower-cased, redacted) headers and payload."""
    return {
        "source": source, "kind": kind, "webhook_id": webhook_id, "trust_mode": trust_mode,
        "verified": verified, "content_type": content_type, "size": size,
        "actor": actor.to_json() if actor is not None else dict(NO_ACTOR),
        "headers": {str(name).lower(): value for name, value in headers.items()}, "payload": payload,
    }


_NO_PAYLOAD = '"payload":null}'


def envelope_with_payload(envelope_json: str, body: bytes, form: str | None) -> str:
    """A stored envelope (compact JSON, `"payload":null` last) with the payload its body holds.

    A JSON body in UTF-8 is spliced in as it was received, without parsing it in Python: it was
    checked as strict JSON at ingest, and jq reads it as it would read the re-encoded value."""
    if not envelope_json.endswith(_NO_PAYLOAD) or form == TEXT:
        return envelope_json
    if form == JSON and not body.startswith(b"\xef\xbb\xbf"):
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            text = None  # UTF-16 or -32 JSON: parsed and re-encoded below
        if text is not None:
            return f"{envelope_json[:-len('null}')]}{text}}}"
    content_type = json.loads(envelope_json).get("content_type") if form is None else None
    payload = read_payload(body, form, content_type)
    return f"{envelope_json[:-len('null}')]}{json.dumps(payload, separators=(',', ':'))}}}"
