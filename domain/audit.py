"""The audit hash chain: digest references, the canonical line, and the chain rule.

Pure and stdlib-only, so that docs/audit.md and docs/audit_verify.py can say the same thing in a
few dozen lines. Every event of the log is sealed in log order:

    hash(n) = sha256_hex(hash(n-1) + "\\n" + canonical(line n)),   hash(0) = ZERO_HASH

`line n` is the event's `audit export` line without `hash`, `prev_hash` and `digests`, with each
digested field of `data` (a payload, a result, a body, a secret) replaced by its reference
`{"sha256": <hex>, "size": <bytes>}`, so a line reads the same whether the value is inline, stored
elsewhere by that reference, pruned, or withheld.

One reference shape (`Ref`) for every kind of stored content. A value is digested over:
- a delivery `body`: the raw bytes received (`body_encoding` says how `data.body` holds them:
  `utf-8` text, or `base64`);
- anything else (payloads, results, password hashes): its canonical JSON (`canonical_json`).

An event that carries the reference instead of the value (payload stored once, by digest) keeps it
in `<field>_ref`; `export_parts` then yields the same line as for the inline event, which is what
keeps old inline events and new by-reference events verifiable by one rule.

An export made with `--payloads` also carries, under `payloads`, the stored bytes each reference
names (`payload_entry`), keyed by SHA-256; the chain never covers them (they are checked against
the sealed references instead), so a line seals the same with or without them.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Callable, Mapping
from typing import Any, TypedDict

ZERO_HASH = "0" * 64
REDACTED = "«redacted»"  # domain.names.REDACTED: a secret withheld from the export
BODY = "body"  # digested over the raw bytes
JSON = "json"  # digested over the canonical JSON of the value

# The digested fields of each event type, and how each is digested.
DIGESTED: dict[str, dict[str, str]] = {
    "DeliveryAccepted": {"body": BODY},
    "TodoOpened": {"payload": JSON},
    "TodoCompleted": {"result": JSON},
    "TodoFailed": {"result": JSON},
    "OperatorCreated": {"password_hash": JSON},
    "OperatorPasswordReset": {"password_hash": JSON},
}
# Digested fields the export never shows (it shows REDACTED): secrets, covered by the chain all the same.
SECRET_FIELDS = frozenset({"password_hash"})
REF_SUFFIX = "_ref"
PAYLOADS = "payloads"  # an export line's stored bytes by SHA-256 (`--payloads`), outside the chain
# How an entry of `payloads` holds its bytes: the text of UTF-8 bytes, base64 of any bytes, or a
# JSON value whose canonical JSON the bytes are (a pushed payload, a result: digested that way).
UTF8, BASE64, JSON_VALUE = "utf-8", "base64", "json"
ENCODINGS = (UTF8, BASE64, JSON_VALUE)


class Ref(TypedDict):
    """A reference to stored content: its SHA-256 (lower-case hex) and its size in bytes."""

    sha256: str
    size: int


def ref_of(content: bytes) -> Ref:
    """The reference of these exact bytes."""
    return {"sha256": hashlib.sha256(content).hexdigest(), "size": len(content)}


def is_ref(value: Any) -> bool:
    """Whether a value has the reference shape (exactly `sha256` as 64 hex digits and `size`)."""
    return (
        isinstance(value, dict) and value.keys() == {"sha256", "size"}
        and isinstance(value["sha256"], str) and len(value["sha256"]) == 64
        and isinstance(value["size"], int) and not isinstance(value["size"], bool) and value["size"] >= 0
    )


def canonical_json(value: Any) -> bytes:
    """JSON with keys sorted by code point, no whitespace, non-ASCII kept as UTF-8 (Python's json)."""
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def body_bytes(text: str, encoding: str | None) -> bytes:
    """The raw bytes of a delivery body as the log holds it (`domain.delivery.decode_body`)."""
    return base64.b64decode(text) if encoding == "base64" else text.encode("utf-8")


Encode = Callable[[Any], bytes]
"""`canonical_json`, or an encoder that gives the same bytes for the values it is used on."""


def value_ref(kind: str, value: Any, data: Mapping[str, Any], encode: Encode = canonical_json) -> Ref:
    """The reference of a digested field's value (`data` gives a body its encoding)."""
    if kind == BODY:
        return ref_of(body_bytes(value, data.get("body_encoding")))
    return ref_of(encode(value))


def export_parts(event_type: str, data: dict[str, Any], encode: Encode = canonical_json
                 ) -> tuple[dict[str, Any], dict[str, Ref]]:
    """An event's data as exported, and the reference of each digested field.

    `data` is changed in place: a by-reference field (`<field>_ref`) leaves data (its content is
    not in the event), a secret is shown as REDACTED.
    """
    fields = DIGESTED.get(event_type)
    if not fields:
        return data, {}
    digests: dict[str, Ref] = {}
    for name, kind in fields.items():
        stored = data.pop(name + REF_SUFFIX, None)
        if stored is not None:
            digests[name] = {"sha256": stored["sha256"], "size": stored["size"]}
            data.pop(name, None)
        elif name in data:
            digests[name] = value_ref(kind, data[name], data, encode)
        else:
            continue
        if name in SECRET_FIELDS and name in data:
            data[name] = REDACTED
    return data, digests


def payload_entry(sha256: str, stored: bytes) -> dict[str, Any]:
    """How an export carries the bytes stored under a reference: `{"encoding", "content"}`.

    A JSON value digested over its canonical JSON (a pushed payload, a result: stored with its
    keys in the order given) is given as that value (`json`); bytes digested as they are (a body)
    as UTF-8 text, or base64 when they are not UTF-8. Bytes that match their digest neither way
    (a damaged store) are given as base64, as they are, for the verifier to refuse.
    """
    try:
        value = json.loads(stored)
        if hashlib.sha256(canonical_json(value)).hexdigest() == sha256:
            return {"encoding": JSON_VALUE, "content": value}
    except ValueError:  # not JSON (or not UTF-8, or NaN): bytes as they are
        pass
    if hashlib.sha256(stored).hexdigest() == sha256:
        try:
            return {"encoding": UTF8, "content": stored.decode("utf-8")}
        except UnicodeDecodeError:
            pass
    return {"encoding": BASE64, "content": base64.b64encode(stored).decode("ascii")}


def entry_bytes(entry: Any, encode: Encode = canonical_json) -> bytes:
    """The bytes an entry of `payloads` stands for (ValueError/TypeError when it is not one)."""
    if not isinstance(entry, dict) or entry.keys() != {"encoding", "content"}:
        raise ValueError("not an {encoding, content} object")
    encoding, content = entry["encoding"], entry["content"]
    if encoding == JSON_VALUE:
        return encode(content)
    if not isinstance(content, str):
        raise TypeError(f"{encoding} content must be a string")
    if encoding == UTF8:
        return content.encode("utf-8")
    if encoding == BASE64:
        return base64.b64decode(content, validate=True)
    raise ValueError(f"encoding must be one of {', '.join(ENCODINGS)}")


def canonical_line(record: Mapping[str, Any], encode: Encode = canonical_json) -> bytes:
    """The sealed bytes of an export line: without hash/prev_hash/digests/payloads, digests in place."""
    line = dict(record)
    line.pop("hash", None)
    line.pop("prev_hash", None)
    line.pop(PAYLOADS, None)
    digests = line.pop("digests", None)
    if digests:
        line["data"] = {**line.get("data", {}), **digests}
    return encode(line)


def chain_hash(prev_hash: str, line: bytes) -> str:
    """The hash of one link: sha256_hex(prev_hash + "\\n" + line)."""
    return hashlib.sha256(prev_hash.encode("ascii") + b"\n" + line).hexdigest()


def check_digests(record: Mapping[str, Any], encode: Encode = canonical_json) -> str | None:
    """Why a value present in an export line does not match its reference, or None."""
    data = record.get("data") or {}
    fields = DIGESTED.get(record.get("type", ""), {})
    for name, ref in (record.get("digests") or {}).items():
        if not is_ref(ref):
            return f"digests.{name} is not a {{sha256, size}} reference"
        if name not in data or (name in SECRET_FIELDS and data[name] == REDACTED):
            continue  # pruned, stored elsewhere, or withheld: the reference alone is sealed
        try:
            actual = value_ref(fields.get(name, JSON), data[name], data, encode)
        except (ValueError, TypeError):
            return f"data.{name} cannot be read as its digest says"
        if actual != ref:
            return f"data.{name} does not match its digest (sha256 {actual['sha256'][:12]}…, {actual['size']} bytes)"
    return check_payloads(record, encode)


def check_payloads(record: Mapping[str, Any], encode: Encode = canonical_json) -> str | None:
    """Why an entry of an export line's `payloads` does not match the reference it is keyed by, or None."""
    payloads = record.get(PAYLOADS)
    if payloads is None:
        return None
    if not isinstance(payloads, dict):
        return "payloads is not an object"
    sizes = {ref["sha256"]: ref["size"] for ref in (record.get("digests") or {}).values() if is_ref(ref)}
    for sha256, entry in payloads.items():
        if sha256 not in sizes:
            return f"payloads.{sha256[:12]}… is named by none of its digests"
        try:
            actual = ref_of(entry_bytes(entry, encode))
        except (ValueError, TypeError) as error:
            return f"payloads.{sha256[:12]}… cannot be read: {error}"
        if actual != {"sha256": sha256, "size": sizes[sha256]}:
            return (f"payloads.{sha256[:12]}… does not match its digest (sha256 {actual['sha256'][:12]}…, "
                    f"{actual['size']} bytes)")
    return None


# --- verifying --------------------------------------------------------------------------------

ALTERED, MISSING, DUPLICATED, OUT_OF_ORDER, INSERTED = "altered", "missing", "duplicated", "out of order", "inserted"


class Break(Exception):
    """Raised when the chain does not verify: the first bad position, what is wrong, and how we know."""

    def __init__(self, position: int | None, kind: str, detail: str) -> None:
        where = f" at position {position}" if position is not None else ""
        super().__init__(f"chain broken{where}: {kind} ({detail})")
        self.position = position
        self.kind = kind
        self.detail = detail


def check_order(positions: list[int]) -> None:
    """Positions of an export must rise strictly: the first one duplicated or out of order is named."""
    seen: set[int] = set()
    last: int | None = None
    for index, position in enumerate(positions):
        if last is not None and position <= last:
            if position in seen:
                raise Break(position, DUPLICATED, f"line {index + 1} repeats position {position}")
            expected = sorted(positions)
            k = next(k for k, (a, b) in enumerate(zip(positions, expected)) if a != b)
            raise Break(expected[k], OUT_OF_ORDER, f"line {k + 1} holds position {positions[k]}, where position "
                                                   f"{expected[k]} belongs")
        seen.add(position)
        last = position


class Chain:
    """Re-computes the chain over export records, one at a time, in log order.

    Each record must link to the one before (`prev_hash`), hash to its own `hash`, carry values
    that match their digests, and continue its aggregate's versions (1, 2, 3, … — a full log
    starts every aggregate at 1).
    """

    def __init__(self, prev_hash: str = ZERO_HASH) -> None:
        self.start = prev_hash
        self.head = prev_hash
        self.count = 0
        self.position: int | None = None
        self._versions: dict[str, tuple[int, int]] = {}

    def add(self, record: Mapping[str, Any], encode: Encode = canonical_json, *, check_values: bool = True) -> str:
        """Checks the next record; returns its hash, or raises Break. `check_values=False`: its digests
        were just computed from its values (the store's own log), so they are not computed twice."""
        position = record.get("position")
        if record.get("prev_hash") != self.head:
            link = f"prev_hash {str(record.get('prev_hash'))[:12]}… is not {self.head[:12]}…"
            if self.position is not None and position == self.position + 2:
                raise Break(position - 1, MISSING, f"the event between positions {self.position} and {position} "
                                                   f"is absent: {link}")
            after = "the start" if self.position is None else f"position {self.position}"
            raise Break(position, MISSING, f"an event between {after} and this one is absent: {link}")
        try:
            computed = chain_hash(self.head, canonical_line(record, encode))
        except (TypeError, ValueError, AttributeError) as error:  # e.g. `digests` or `data` not an object
            raise Break(position, ALTERED, f"it is not an export line: {error}") from None
        if computed != record.get("hash"):
            why = check_digests(record, encode) or f"its line hashes to {computed[:12]}…, not {str(record.get('hash'))[:12]}…"
            raise Break(position, ALTERED, why)
        why = check_digests(record, encode) if check_values else None
        if why:
            raise Break(position, ALTERED, why)
        self._check_version(record)
        self.head, self.count, self.position = computed, self.count + 1, position
        return computed

    def seen(self, aggregate: str, version: int) -> int | None:
        """The position of this aggregate's version if it came already (its latest version only)."""
        last = self._versions.get(aggregate)
        return last[1] if last is not None and last[0] >= version else None

    def _check_version(self, record: Mapping[str, Any]) -> None:
        aggregate, version, position = record.get("aggregate"), record.get("version"), record.get("position")
        last = self._versions.get(aggregate)
        if last is not None and version == last[0] + 1:  # the usual case, first
            self._versions[aggregate] = (version, position)
            return
        if last is None:
            if version != 1 and self.start == ZERO_HASH:
                raise Break(position, OUT_OF_ORDER, f"{aggregate} starts at version {version}")
        elif isinstance(version, int) and version <= last[0]:
            raise Break(position, DUPLICATED, f"{aggregate} version {version} is already in the log (up to version "
                                              f"{last[0]} at position {last[1]})")
        elif version != last[0] + 1:
            raise Break(position, OUT_OF_ORDER, f"{aggregate} version {version} follows version {last[0]} "
                                                f"(position {last[1]})")
        self._versions[aggregate] = (version, position)
