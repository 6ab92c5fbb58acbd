"""The audit hash chain's SQL: the sealed links, the head, and the raw log they cover.

`sb_audit_chain` holds one row per sealed event (its position and chain hash); `sb_audit_head`
one row, the last sealed link, which a sealer locks while it seals (FOR UPDATE on PostgreSQL;
SQLite write transactions are serial), so with several processes each event is sealed once, in
log order. Tailing the log by position is safe here for the reason it is in projector.py: the
PostgreSQL recorder appends under a table lock, so positions become visible in commit order
(docs/adr/0001, docs/adr/0022).

The log is read raw — each event's stored JSON decoded to builtins, exactly as stored — not
through the typed codec, at a fraction of the cost (`audit verify` reads the whole log). Nothing
is filled in: an event recorded before a field existed has no such field in its line, so adding
a field to an event class never changes a sealed line (docs/adr/0028).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any
from uuid import UUID

import msgspec

from application.audit import LoggedEvent, Sealed, Unreadable
from interfaces.store.codec import EVENT_TYPES, stored_fields
from projections.base import micros

if TYPE_CHECKING:
    from interfaces.store.eventstore import SqlEventStore

log = logging.getLogger("switchboard.audit")

PAGE = 1000
CHAIN_DDL = (
    "CREATE TABLE IF NOT EXISTS sb_audit_chain (position BIGINT PRIMARY KEY, hash TEXT NOT NULL,"
    " sealed_at BIGINT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS sb_audit_head (id INTEGER PRIMARY KEY, position BIGINT NOT NULL,"
    " hash TEXT NOT NULL, time TEXT, sealed_at BIGINT)",
    "INSERT INTO sb_audit_head (id, position, hash) VALUES (1, 0, '" + "0" * 64 + "') ON CONFLICT (id) DO NOTHING",
)


_SORTED = msgspec.json.Encoder(order="sorted")


def sorted_json(value: Any) -> bytes:
    """`domain.audit.canonical_json`'s bytes for a value without floats, ~6x faster: msgspec sorts
    keys by code point and escapes strings exactly as Python's json does; only its float format
    differs (`1e16` for `1e+16`), so a value with a float goes through `canonical_json`
    (tests/unit/test_audit_encoding.py holds the two to that)."""
    return _SORTED.encode(value)


class FloatSpotter:
    """Decodes JSON and says whether it held a float (a float is seen as it is decoded)."""

    def __init__(self, type_: Any = Any) -> None:
        self.seen = False
        self._decoder = msgspec.json.Decoder(type_, float_hook=self._float)

    def _float(self, text: str) -> float:
        self.seen = True
        return float(text)

    def decode(self, data: bytes | str) -> tuple[Any, bool]:
        self.seen = False
        value = self._decoder.decode(data)
        return value, self.seen


def _required(cls: type) -> frozenset[str]:
    """The stored fields (the codec's `stored_fields`) every event of the class holds: those without a default."""
    stored = set(stored_fields(cls))
    return frozenset(f.name for f in dataclasses.fields(cls) if f.name in stored
                     and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)


class SqlChain:
    """The ChainStore port on the event store's database."""

    def __init__(self, store: SqlEventStore) -> None:
        self.store = store
        self.db = store.db
        self._sqlite = store.url.dialect == "sqlite"
        self._position = "rowid" if self._sqlite else "notification_id"
        self._decoder = FloatSpotter(dict)
        self._types = {topic: (cls.__module__, _required(cls)) for topic, cls in EVENT_TYPES.items()}

    # -- the raw log

    def _logged(self, position: int, originator: Any, version: int, topic: str, state: Any) -> LoggedEvent | Unreadable:
        known = self._types.get(topic)
        if known is None:
            return Unreadable(position, f"unknown event type {topic!r}")
        module, required = known
        try:
            raw, floats = self._decoder.decode(state)
            aggregate = originator.hex if isinstance(originator, UUID) else (
                originator if len(originator) == 32 else UUID(hex=originator).hex)  # SQLite holds the hex
        except (msgspec.DecodeError, ValueError, TypeError, AttributeError) as error:
            return Unreadable(position, f"its stored data is not readable: {error}")
        if not raw.keys() >= required:
            return Unreadable(position, f"its stored data is not a {topic}")
        return LoggedEvent(position, aggregate, version, topic, module, raw, floats)

    def read(self, after: int, limit: int, stop: int | None = None) -> list[LoggedEvent | Unreadable]:
        """Events after a position (up to `stop`), in log order."""
        p = self._position
        bound = f" AND {p} <= %s" if stop is not None else ""
        with self.db.transaction(write=False) as tx:
            rows = tx.execute(
                f"SELECT {p}, originator_id, originator_version, topic, state FROM stored_events"
                f" WHERE {p} > %s{bound} ORDER BY {p} LIMIT %s",
                (after, *(() if stop is None else (stop,)), limit), binary=True,
            )
        return [self._logged(*row) for row in rows]

    def payloads(self, digests: Sequence[str]) -> dict[str, bytes]:
        """The stored bytes of these digests (the payload store's); pruned ones are left out."""
        return {d: row.data for d, row in self.store.read_payloads(digests).items() if row.data is not None}

    # -- the chain

    def head(self) -> Sealed:
        """The last sealed link (position 0 and the zero hash before the first)."""
        rows = self.db.query("SELECT position, hash, time, sealed_at FROM sb_audit_head WHERE id = 1")
        position, hash_, time, sealed_at = rows[0]
        return Sealed(int(position), hash_, time, sealed_at)

    def seals(self, after: int, stop: int | None, limit: int) -> list[tuple[int, str]]:
        """(position, hash) of the links after a position (up to `stop`), in order."""
        bound = " AND position <= %s" if stop is not None else ""
        return [(int(p), h) for p, h in self.db.query(
            f"SELECT position, hash FROM sb_audit_chain WHERE position > %s{bound} ORDER BY position LIMIT %s",
            (after, *(() if stop is None else (stop,)), limit),
        )]

    def hash_at_or_before(self, position: int) -> str | None:
        """The hash of the last link at or before a position (None before the first link)."""
        rows = self.db.query(
            "SELECT hash FROM sb_audit_chain WHERE position <= %s ORDER BY position DESC LIMIT 1", (position,))
        return rows[0][0] if rows else None

    def last_position(self) -> int:
        return self.store.max_position()

    def count_after(self, position: int) -> int:
        """How many events the log holds after a position."""
        return int(self.db.query(f"SELECT count(*) FROM stored_events WHERE {self._position} > %s", (position,))[0][0])

    def seal(self, link: Callable[[str, Sequence[LoggedEvent | Unreadable]], list[tuple[int, str, str]]],
             now: Any) -> int:
        """Seals every event after the head, a page at a time; returns how many it sealed.

        `link(head_hash, events)` gives (position, hash, time) of each event it could seal, in
        order; it stops before an event it cannot read, which stays unsealed (and is reported).
        The hashes are computed outside any transaction (on SQLite a write transaction would hold
        back every writer meanwhile); the short one that stores them locks the head and finds it
        where the page began, or another process sealed first and the page is read again.
        """
        lock = " FOR UPDATE" if not self._sqlite else ""
        sealed = 0
        while True:
            head = self.head()
            events = self.read(head.position, PAGE)
            if not events:
                return sealed
            links = link(head.hash, events)
            if not links:
                return sealed
            with self.db.transaction() as tx:
                at = micros(now())
                if tx.execute(f"SELECT position FROM sb_audit_head WHERE id = 1{lock}")[0][0] != head.position:
                    continue  # sealed meanwhile by another process: from its head again
                if self._sqlite:
                    tx.executemany("INSERT INTO sb_audit_chain (position, hash, sealed_at) VALUES (%s, %s, %s)",
                                   [(pos, h, at) for pos, h, _ in links])
                else:  # one statement for the page, not one per link (each planned and run on its own)
                    tx.execute("INSERT INTO sb_audit_chain (position, hash, sealed_at)"
                               " SELECT p, h, %s FROM unnest(%s::bigint[], %s::text[]) AS l(p, h)",
                               (at, [pos for pos, _, _ in links], [h for _, h, _ in links]))
                last = links[-1]
                tx.execute("UPDATE sb_audit_head SET position = %s, hash = %s, time = %s, sealed_at = %s WHERE id = 1",
                           (last[0], last[1], last[2], at))
            sealed += len(links)
            if len(links) < len(events) or len(events) < PAGE:
                return sealed
