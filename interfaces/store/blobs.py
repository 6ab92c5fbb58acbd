"""The payload store: content-addressed bytes, written in the transaction of the events naming them.

One row per distinct SHA-256 (docs/adr/0019-payloads-stored-once.md). A delivery's body and
every todo it opens name one row; a second delivery of the same bytes names it again. Rows are
written by the append itself (`ops_for`, run as inline ops by the recorder), so an event never
names bytes that are not there, and nothing acknowledged is lost. Retention empties a row's
`data` and sets `pruned_at` (a tombstone: the digest, size and time stay for `todo show`); new
bytes with that digest fill it again.

On SQLite the bytes are zlib-compressed when that pays; on PostgreSQL TOAST compresses them
(lz4 where the server has it, set at open like the other large columns).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from domain.events import DomainEvent
from domain.payloads import PAYLOAD_FIELDS, Pruned
from projections.base import Op, from_micros, micros

TABLE = "sb_blobs"
RAW, ZLIB = "raw", "zlib"
COMPRESS_FROM = 512  # bytes; smaller ones gain nothing worth a decompress
ZLIB_LEVEL = 1
READ_CHUNK = 500  # digests per SELECT

DDL = {
    "sqlite": (
        f"CREATE TABLE IF NOT EXISTS {TABLE} (sha256 TEXT PRIMARY KEY, size BIGINT NOT NULL,"
        " codec TEXT NOT NULL, data BLOB, created_at BIGINT NOT NULL, pruned_at BIGINT)",
    ),
    "postgres": (
        f"CREATE TABLE IF NOT EXISTS {TABLE} (sha256 TEXT PRIMARY KEY, size BIGINT NOT NULL,"
        " codec TEXT NOT NULL, data BYTEA, created_at BIGINT NOT NULL, pruned_at BIGINT)",
    ),
}
# One row once the payloads of events from before this store had a payload store were copied in.
UPGRADE_DDL = "CREATE TABLE IF NOT EXISTS sb_payloads_upgraded (through_position BIGINT NOT NULL)"
UPGRADE_PAGE = 500

# A pruned row (data NULL) is filled again by new bytes with its digest; a present one is kept.
_UPSERT = (
    f"INSERT INTO {TABLE} (sha256, size, codec, data, created_at) VALUES (%s, %s, %s, %s, %s)"
    f" ON CONFLICT (sha256) DO UPDATE SET codec = excluded.codec, data = excluded.data, pruned_at = NULL"
    f" WHERE {TABLE}.data IS NULL"
)


def carried_blobs(events: Iterable[DomainEvent]) -> dict[str, bytes]:
    """The bytes the events carry, by hex digest (each once)."""
    blobs: dict[str, bytes] = {}
    for event in events:
        for _, reference, carried in PAYLOAD_FIELDS.get(type(event).__name__, ()):
            data = getattr(event, carried, None)
            ref = getattr(event, reference, None)
            if data is not None and ref is not None:
                blobs.setdefault(ref["sha256"], data)
    return blobs


def ops_for(blobs: dict[str, bytes], now: datetime, *, compress: bool) -> list[Op]:
    """The upserts that store these bytes (compressed first where that pays)."""
    ops: list[Op] = []
    at = micros(now)
    for hex_digest, data in blobs.items():
        codec, stored = RAW, data
        if compress and len(data) >= COMPRESS_FROM:
            packed = zlib.compress(data, ZLIB_LEVEL)
            if len(packed) < len(data) * 0.9:
                codec, stored = ZLIB, packed
        ops.append((_UPSERT, (hex_digest, len(data), codec, stored, at)))
    return ops


@dataclass(frozen=True)
class Stored:
    """What the payload store holds for one digest: the bytes, or the tombstone of a prune."""

    data: bytes | None
    pruned: Pruned | None


def unpack(codec: str, data: Any) -> bytes:
    raw = bytes(data)
    return zlib.decompress(raw) if codec == ZLIB else raw


def read(query, digests: Sequence[str]) -> dict[str, Stored]:
    """The rows of these digests (absent ones are left out). `query(sql, params)` returns rows."""
    found: dict[str, Stored] = {}
    wanted = list(dict.fromkeys(digests))
    for start in range(0, len(wanted), READ_CHUNK):
        chunk = wanted[start:start + READ_CHUNK]
        marks = ", ".join(["%s"] * len(chunk))
        rows = query(f"SELECT sha256, size, codec, data, pruned_at FROM {TABLE} WHERE sha256 IN ({marks})",
                     chunk)
        for hex_digest, size, codec, data, pruned_at in rows:
            if data is None:
                found[hex_digest] = Stored(None, Pruned(hex_digest, int(size), from_micros(pruned_at)))
            else:
                found[hex_digest] = Stored(unpack(codec, data), None)
    return found


def upgrade(tx: Any, decode: Any, *, sqlite: bool) -> int:
    """Copies the inline payloads of events written before payloads were stored once into the
    payload store, once per store (under the caller's migration lock); returns how many events
    were read. `decode(topic, originator_id, version, state)` is the event codec's (it upcasts).

    Nothing is rewritten: the events keep their inline payloads until retention prunes them."""
    tx.execute(UPGRADE_DDL)
    if tx.execute("SELECT through_position FROM sb_payloads_upgraded"):
        return 0
    position = "rowid" if sqlite else "notification_id"
    topics = list(PAYLOAD_FIELDS)
    marks = ", ".join(["%s"] * len(topics))
    after, read = 0, 0
    while True:
        rows = tx.execute(
            f"SELECT {position}, originator_id, originator_version, topic, state FROM stored_events"
            f" WHERE {position} > %s AND topic IN ({marks}) ORDER BY {position} LIMIT %s",
            (after, *topics, UPGRADE_PAGE), binary=not sqlite,
        )
        if not rows:
            break
        events = [decode(topic, originator, version, bytes(state)) for _, originator, version, topic, state in rows]
        if events:
            tx.run_ops(ops_for(carried_blobs(events), events[-1].timestamp, compress=sqlite))
        after, read = rows[-1][0], read + len(rows)
    head = tx.execute(f"SELECT max({position}) FROM stored_events")
    tx.execute("INSERT INTO sb_payloads_upgraded (through_position) VALUES (%s)", ((head[0][0] if head else 0) or 0,))
    return read
