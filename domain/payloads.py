"""Payloads stored once: content-addressed by SHA-256, named in events by reference.

A delivery's body, a todo's payload and a todo's result live once each, as bytes, keyed by a
SHA-256 (docs/adr/0027-payloads-stored-once.md): of a body's exact bytes; of a JSON value's
canonical JSON (keys sorted), while its bytes keep the keys' order. An event names them with the
reference `{"sha256": "<hex>", "size": <n>}` in a field of its own (`body_ref`, `payload_ref`,
`result_ref`); the delivery and every todo it opens name the same bytes, so they share one copy.

Events written before this carry their payloads inline (`body` + `body_encoding`, `payload`,
`result`). `upcast` reads such an event as a by-reference one whose bytes came with it, so the
rest of the code knows one shape. The digest of an inline value is defined here once, as the
audit chain digests it (`canonical_json`, the delivery's exact body), so an inline event, the same event by reference, and
the same event with its payload pruned all name the same digest — which is what lets the audit
chain seal an event once and verify it after its payload is gone (docs/audit.md: the chain
reads `<field>_ref` where the inline field was).

Pure: no I/O. The bytes an event names travel with it to the store in a *carried* field (never
serialized) and are written in the transaction that appends the event.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

# How a payload is read back from its bytes.
JSON, FORM, TEXT = "json", "form", "text"
PAYLOAD_FORMS = (JSON, FORM, TEXT)


def carried(default: Any = None) -> Any:
    """A dataclass field that travels with an event to the store but is never serialized."""
    return dataclasses.field(default=default, repr=False, compare=False, metadata={"carried": True})


def is_carried(f: dataclasses.Field) -> bool:
    return bool(f.metadata.get("carried"))


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def ref_of(data: bytes) -> dict[str, Any]:
    """The reference an event carries for these bytes: `{"sha256": <hex>, "size": <n>}`."""
    return {"sha256": digest(data), "size": len(data)}


def json_bytes(value: Any) -> bytes:
    """The bytes a JSON value (a pushed payload, a result) is stored as: compact, its keys in the
    order given (as it is shown back), UTF-8 without ASCII escapes."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def canonical_json(value: Any) -> bytes:
    """The bytes a JSON value is digested over, as the audit chain digests an inline value
    (docs/audit.md): keys sorted, compact, UTF-8. Same length as `json_bytes`."""
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def json_stored(value: Any) -> tuple[dict[str, Any], bytes]:
    """A JSON value's reference (over its canonical JSON, so an inline event and the same event by
    reference seal alike) and the bytes stored for it (its keys in their order)."""
    return {"sha256": digest(canonical_json(value)), "size": len(canonical_json(value))}, json_bytes(value)


def inline_body_bytes(body: str, encoding: str | None) -> bytes:
    """The exact bytes of an inline (pre-blob) delivery body."""
    return base64.b64decode(body) if encoding == "base64" else body.encode("utf-8", "surrogatepass")


@dataclass(frozen=True)
class Pruned:
    """Where a payload's bytes were: they were removed by retention at `at`."""

    sha256: str
    size: int
    at: datetime

    def sentence(self, iso_at: str, noun: str = "payload") -> str:
        return f"{noun} pruned at {iso_at} (sha256 {self.sha256}, {self.size} bytes)"


# Which fields of which event name which bytes: (inline field, reference field, carried field).
# The inline field of an old event holds text (a body: with `body_encoding`) or a JSON value.
PAYLOAD_FIELDS: dict[str, tuple[tuple[str, str, str], ...]] = {
    "DeliveryAccepted": (("body", "body_ref", "body_bytes"),),
    "TodoOpened": (("payload", "payload_ref", "payload_bytes"),),
    "TodoCompleted": (("result", "result_ref", "result_bytes"),),
    "TodoFailed": (("result", "result_ref", "result_bytes"),),
}


def inline_stored(topic: str, field: str, data: dict[str, Any]) -> tuple[dict[str, Any], bytes] | None:
    """The reference and bytes of an inline payload field of an old event (None: nothing inline)."""
    value = data.get(field)
    if value is None:
        return None  # no payload or result: nothing stored, nothing to prune
    if topic == "DeliveryAccepted":
        raw = inline_body_bytes(value, data.get("body_encoding"))
        return ref_of(raw), raw
    return json_stored(value)


def upcast(topic: str, data: dict[str, Any]) -> dict[str, Any]:
    """An old event's data (payloads inline) as a by-reference event whose bytes came with it:
    the inline field becomes None, the reference names the bytes, the carried field holds them.
    A by-reference event is returned as it is."""
    fields = PAYLOAD_FIELDS.get(topic)
    if not fields:
        return data
    for inline, reference, carried_field in fields:
        if data.get(reference) is not None:
            continue
        stored = inline_stored(topic, inline, data)
        if stored is None:
            continue
        data[reference], data[carried_field] = stored
        data[inline] = None
        if topic == "TodoOpened":
            data.setdefault("payload_form", JSON)
    return data


def by_reference(topic: str, data: dict[str, Any]) -> dict[str, Any]:
    """An old event's stored data with its inline payloads replaced by their references and
    nothing else changed (what a prune writes back: the audit chain reads it as it read the
    inline event)."""
    for inline, reference, _ in PAYLOAD_FIELDS.get(topic, ()):
        if data.get(reference) is None:
            stored = inline_stored(topic, inline, data)
            if stored is not None:
                data[reference], data[inline] = stored[0], None
    return data
