"""The payload store: content-addressed bytes, written in the transaction of the events naming them.

One row per distinct SHA-256 (docs/adr/0027-payloads-stored-once.md). A delivery's body and
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
from uuid import UUID

from domain.events import DomainEvent
import msgspec

from domain.payloads import PAYLOAD_FIELDS, Pruned, by_reference
from domain.retention import PayloadsPruned
from projections.base import Op, from_micros, micros

TABLE = "sb_blobs"
RAW, ZLIB = "raw", "zlib"
COMPRESS_FROM = 512  # bytes; smaller ones gain nothing worth a decompress
ZLIB_LEVEL = 1
READ_CHUNK = 500  # digests per SELECT

DDL = {
    "sqlite": (
        f"CREATE TABLE IF NOT EXISTS {TABLE} (sha256 TEXT PRIMARY KEY, size BIGINT NOT NULL,"
        " codec TEXT NOT NULL, data BLOB, named_at BIGINT NOT NULL, pruned_at BIGINT)",
    ),
    "postgres": (
        f"CREATE TABLE IF NOT EXISTS {TABLE} (sha256 TEXT PRIMARY KEY, size BIGINT NOT NULL,"
        " codec TEXT NOT NULL, data BYTEA, named_at BIGINT NOT NULL, pruned_at BIGINT)",
    ),
}
# One row once the payloads of events from before this store had a payload store were copied in.
UPGRADE_DDL = "CREATE TABLE IF NOT EXISTS sb_payloads_upgraded (through_position BIGINT NOT NULL)"
UPGRADE_PAGE = 500

# Each append that names bytes moves `named_at` (a prune spares what was named since its cutoff);
# a pruned row (data NULL) is filled again by new bytes with its digest; present bytes are kept.
# (SET expressions read the row as it was.)
_UPSERT = (
    f"INSERT INTO {TABLE} (sha256, size, codec, data, named_at) VALUES (%s, %s, %s, %s, %s)"
    f" ON CONFLICT (sha256) DO UPDATE SET named_at = excluded.named_at,"
    f" codec = CASE WHEN {TABLE}.data IS NULL THEN excluded.codec ELSE {TABLE}.codec END,"
    f" pruned_at = CASE WHEN {TABLE}.data IS NULL THEN NULL ELSE {TABLE}.pruned_at END,"
    f" data = COALESCE({TABLE}.data, excluded.data)"
)
PRUNE_CHUNK = 500


def prune_ops(digests: Sequence[str], now: datetime, cutoff: datetime) -> list[Op]:
    """Empties the rows of these digests that nothing named since the cutoff (the tombstone stays)."""
    ops: list[Op] = []
    for start in range(0, len(digests), PRUNE_CHUNK):
        chunk = list(digests[start:start + PRUNE_CHUNK])
        ops.append((
            f"UPDATE {TABLE} SET data = NULL, codec = 'raw', pruned_at = %s"
            f" WHERE sha256 IN ({', '.join(['%s'] * len(chunk))}) AND data IS NOT NULL AND named_at < %s",
            (micros(now), *chunk, micros(cutoff)),
        ))
    return ops


def retention_ops(events: Sequence[DomainEvent], query, *, sqlite: bool) -> tuple[list[Op], set[Any]]:
    """For each prune among the events: empty its rows, and write back the old events that hold
    those payloads inline by reference (read now: such an event changes only by a prune).
    Returns the ops and the ids of the aggregates whose stored events change."""
    ops: list[Op] = []
    changed: set[Any] = set()
    for event in events:
        if not isinstance(event, PayloadsPruned):
            continue
        ops += prune_ops(event.digests, event.timestamp, event.cutoff)
        keys = [key.split(":") for key in event.rewrites]
        for start in range(0, len(keys), PRUNE_CHUNK):
            chunk = keys[start:start + PRUNE_CHUNK]
            # no longer inline: the payload_holders read model says what a rebuild would say
            ops.append((f"DELETE FROM sb_inline_payloads WHERE event_key IN ({', '.join(['%s'] * len(chunk))})",
                        tuple(event.rewrites[start:start + PRUNE_CHUNK])))
            where = " OR ".join(["(originator_id = %s AND originator_version = %s)"] * len(chunk))
            params = [v for hex_id, version in chunk for v in (hex_id if sqlite else UUID(hex=hex_id), int(version))]
            for originator, version, topic, state in query(
                f"SELECT originator_id, originator_version, topic, state FROM stored_events WHERE {where}", params
            ):
                data = by_reference(topic, msgspec.json.decode(bytes(state)))
                ops.append(("UPDATE stored_events SET state = %s WHERE originator_id = %s AND originator_version = %s",
                            (msgspec.json.encode(data), originator, version)))
                changed.add(originator if isinstance(originator, UUID) else UUID(hex=originator))
    return ops, changed


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


_SELECT = f"SELECT sha256, size, codec, data, pruned_at FROM {TABLE} WHERE sha256"
READ_ANY = f"{_SELECT} = ANY(%s)"
"""PostgreSQL: the rows of a list of digests (one text[] parameter) in one statement."""


def stored_rows(rows: Iterable[Sequence[Any]]) -> dict[str, Stored]:
    """Rows of `sha256, size, codec, data, pruned_at` by digest."""
    found: dict[str, Stored] = {}
    for hex_digest, size, codec, data, pruned_at in rows:
        if data is None:
            found[hex_digest] = Stored(None, Pruned(hex_digest, int(size), from_micros(pruned_at)))
        else:
            found[hex_digest] = Stored(unpack(codec, data), None)
    return found


def read(query, digests: Sequence[str]) -> dict[str, Stored]:
    """The rows of these digests (absent ones are left out). `query(sql, params)` returns rows."""
    found: dict[str, Stored] = {}
    wanted = list(dict.fromkeys(digests))
    for start in range(0, len(wanted), READ_CHUNK):
        chunk = wanted[start:start + READ_CHUNK]
        found.update(stored_rows(query(f"{_SELECT} IN ({', '.join(['%s'] * len(chunk))})", chunk)))
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
