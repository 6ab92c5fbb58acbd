"""Runs projections: catch-up from their tracked position, rebuild from zero, verify.

A catch-up applies a page of events and moves the projection's tracking row in ONE
transaction. The tracking row is locked (`FOR UPDATE` on PostgreSQL; SQLite write
transactions are serial), so two processes catching up the same projection apply each
event once. Tailing by position is safe because the PostgreSQL recorder appends under a
table lock: positions become visible in commit order (docs/adr/0001).
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from projections.base import Projection, Tracking
from interfaces.store.eventstore import SqlEventStore
from interfaces.store.ops import run_ops

PAGE = 1000


@dataclass
class Difference:
    projection: str
    table: str
    missing: list[tuple] = field(default_factory=list)
    unexpected: list[tuple] = field(default_factory=list)


class Projector:
    """Keeps the asynchronous read models up to date, and rebuilds or verifies any of them."""

    def __init__(self, store: SqlEventStore) -> None:
        self.store = store
        self.db = store.db
        self._lock = threading.Lock()

    def positions(self) -> dict[str, int]:
        return {name: pos for name, pos in self.db.query("SELECT name, position FROM sb_tracking")}

    def lag(self) -> dict[str, int]:
        head = self.store.max_position()
        return {name: max(head - pos, 0) for name, pos in self.positions().items()}

    def catch_up(self, names: Sequence[str] | None = None) -> int:
        """Applies every event not yet projected; returns how many events were read.

        One pass serves every asynchronous projection: the log is read and decoded once per
        page, and all their rows and tracking positions move in one transaction.
        """
        chosen = [p for p in self.store.projections
                  if not p.inline and (names is None or p.name in names)]
        if not chosen:
            return 0
        applied = 0
        with self._lock:
            while True:
                count = self._catch_up_page(chosen)
                applied += count
                if count < PAGE:
                    return applied

    def _catch_up_page(self, chosen: Sequence[Projection]) -> int:
        lock = " FOR UPDATE" if self.db.dialect == "postgres" else ""
        marks = ", ".join(["%s"] * len(chosen))
        with self.db.transaction(derived=True) as tx:
            positions = dict(tx.execute(
                f"SELECT name, position FROM sb_tracking WHERE name IN ({marks}) ORDER BY name{lock}",
                [p.name for p in chosen],
            ))
            start = min(positions[p.name] for p in chosen)
            recorded = self.store.read_log_in(tx, start, PAGE)
            if not recorded:
                return 0
            ops = [op for projection in chosen for r in recorded if r.position > positions[projection.name]
                   for op in projection.ops(r.event, r.position)]
            ops.append((  # never backwards: a projection added later starts behind the others
                f"UPDATE sb_tracking SET position = %s WHERE name IN ({marks}) AND position < %s",
                (recorded[-1].position, *(p.name for p in chosen), recorded[-1].position),
            ))
            tx.apply_ops(ops)  # on PostgreSQL coalesced, in one round trip
            return len(recorded)

    def rebuild(self) -> dict[str, int]:
        """Replaces every read model with one built from the whole log (for a stopped server)."""
        counts: dict[str, int] = {}
        with self.db.transaction() as tx:
            for projection in self.store.projections:
                for table in projection.tables:
                    tx.execute(f"DELETE FROM {table}")
            after, total = 0, 0
            while True:  # on this transaction's connection (a pool of one would wait for itself)
                recorded = self.store.read_log_in(tx, after, PAGE)
                if not recorded:
                    break
                # coalesced as a catch-up page's are (the same bound on a statement's parameters)
                tx.apply_ops([op for projection in self.store.projections for r in recorded
                              for op in projection.ops(r.event, r.position)])
                after = recorded[-1].position
                total += len(recorded)
            for projection in self.store.projections:
                tx.execute("UPDATE sb_tracking SET position = %s WHERE name = %s", (after, projection.name))
                counts[projection.name] = total
        return counts

    def verify(self) -> list[Difference]:
        """Rebuilds every read model in memory and compares it with the live one (read-only)."""
        with self.db.transaction(write=False, snapshot=True) as tx:
            positions = {name: pos for name, pos in tx.execute("SELECT name, position FROM sb_tracking")}
            live = {
                (p.name, table): _rows(tx, table)
                for p in self.store.projections for table in p.tables
            }
        differences: list[Difference] = []
        # one pass over the log feeds every projection's shadow, each up to its own position
        # (the log is decoded once, not once per read model)
        shadows = {}
        for projection in self.store.projections:
            shadow = shadows[projection.name] = sqlite3.connect(":memory:")
            for statement in projection.ddl:
                shadow.execute(statement)
        stops = {p.name: positions.get(p.name, 0) for p in self.store.projections}
        last, after = max(stops.values(), default=0), 0
        while after < last:
            recorded = [r for r in self.store.read_log(after, PAGE * 5) if r.position <= last]
            if not recorded:
                break
            for projection in self.store.projections:
                stop = stops[projection.name]
                ops = [op for r in recorded if r.position <= stop for op in projection.ops(r.event, r.position)]
                run_ops(shadows[projection.name].cursor(), ops, "?")
            after = recorded[-1].position
        for projection in self.store.projections:
            shadow = shadows[projection.name]
            for table in projection.tables:
                expected = _rows(shadow.cursor(), table, sqlite=True)
                actual = live[(projection.name, table)]
                missing = sorted(expected - actual, key=repr)
                unexpected = sorted(actual - expected, key=repr)
                if missing or unexpected:
                    differences.append(Difference(projection.name, table, missing[:20], unexpected[:20]))
            shadow.close()
        return differences


def _rows(tx: Any, table: str, *, sqlite: bool = False) -> set[tuple]:
    if sqlite:
        tx.execute(f"SELECT * FROM {table}")
        rows = tx.fetchall()
    else:
        rows = tx.execute(f"SELECT * FROM {table}")
    return {tuple(_normal(v) for v in row) for row in rows}


def _normal(value: Any) -> Any:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, memoryview):
        return bytes(value)
    return value


__all__ = ["Projector", "Difference", "Tracking"]
