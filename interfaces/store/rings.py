"""The doorbell's SQL: rings due for some endpoints, and the once-only claim of a ring.

`sb_claimable` holds each pending todo's spell, inline (projections/claimable.py). `sb_rings` is
not a read model: it records which ring of which pending spell has been taken by a process, so
that with several processes on one database each ring is sent once (the primary key decides,
`INSERT … ON CONFLICT DO NOTHING`). Old rows are pruned once no ring of theirs can be due.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from domain.doorbell import RING_GRACE, RING_OFFSETS, ring_due
from interfaces.store.database import Database
from projections.base import micros

RINGS_DDL = (
    "CREATE TABLE IF NOT EXISTS sb_rings (todo_id TEXT NOT NULL, spell BIGINT NOT NULL,"
    " ring_no INTEGER NOT NULL, rung_at BIGINT NOT NULL, PRIMARY KEY (todo_id, spell, ring_no))",
    "CREATE INDEX IF NOT EXISTS sb_rings_rung_at ON sb_rings (rung_at)",
)
KEEP_RINGS = RING_OFFSETS[-1] + 2 * RING_GRACE
DUE_PER_SCAN = 100
"""Rings one scan reads at most (the next scan, 10 ms later, reads on)."""


@dataclass(frozen=True)
class DueRing:
    """Ring `ring_no` of one pending spell of one todo, due now."""

    todo_id: str
    endpoint_id: str
    queue: str
    source: str | None
    kind: str | None
    title: str | None
    """None only for a todo whose row the upgrade of docs/adr/0036 found no ring text for."""
    spell: int
    ring_no: int

    @property
    def key(self) -> tuple[str, int, int]:
        return (self.todo_id, self.spell, self.ring_no)


class SqlRings:
    """Reads the pending spells of `sb_claimable`, writes `sb_rings`."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def due(self, endpoint_ids: Sequence[str], now: datetime, grace: timedelta = RING_GRACE,
            limit: int = DUE_PER_SCAN) -> list[DueRing]:
        """Rings of these endpoints' pending todos whose time came less than `grace` ago and that no
        process has taken yet, oldest first, at most `limit` (one index range per ring of the
        schedule; a scan never re-reads the rings it already took)."""
        if not endpoint_ids:
            return []
        marks = ", ".join(["%s"] * len(endpoint_ids))
        window = "(d.pending_since > %s AND d.pending_since <= %s)"
        windows = " OR ".join([window] * len(RING_OFFSETS))
        number = "CASE " + " ".join(f"WHEN {window} THEN {n}" for n in range(len(RING_OFFSETS))) + " END"
        bounds: list[int] = []
        for offset in RING_OFFSETS:
            bounds += [micros(now - offset - grace), micros(now - offset)]
        rows = self.db.query(
            "SELECT d.todo_id, d.endpoint_id, d.queue, d.source, d.kind, d.title, d.spell, d.pending_since"
            f" FROM sb_claimable d WHERE d.endpoint_id IN ({marks}) AND d.pending_since IS NOT NULL AND ({windows})"
            " AND d.queue <> 'quarantine'"
            " AND NOT EXISTS (SELECT 1 FROM sb_rings r WHERE r.todo_id = d.todo_id AND r.spell = d.spell"
            f" AND r.ring_no = {number}) ORDER BY d.pending_since, d.todo_id LIMIT %s",
            (*endpoint_ids, *bounds, *bounds, limit),
        )
        due: list[DueRing] = []
        now_us = micros(now)
        for todo_id, endpoint_id, queue, source, kind, title, spell, since in rows:
            ring_no = ring_due(timedelta(microseconds=now_us - since), grace)
            if ring_no is not None:
                due.append(DueRing(todo_id, endpoint_id, queue, source, kind, title, int(spell), ring_no))
        return due

    def take(self, ring: DueRing, now: datetime) -> bool:
        """Claims the ring for this process: True exactly once across every process."""
        return ring.key in self.take_all([ring], now)

    def take_all(self, rings: Sequence[DueRing], now: datetime) -> set[tuple[str, int, int]]:
        """Claims these rings for this process in one statement; the keys of those it got (each
        ring is got exactly once across every process)."""
        if not rings:
            return set()
        values = ", ".join(["(%s, %s, %s, %s)"] * len(rings))
        params: list[object] = []
        for ring in rings:
            params += [ring.todo_id, ring.spell, ring.ring_no, micros(now)]
        rows = self.db.query(
            f"INSERT INTO sb_rings (todo_id, spell, ring_no, rung_at) VALUES {values}"
            " ON CONFLICT (todo_id, spell, ring_no) DO NOTHING RETURNING todo_id, spell, ring_no",
            params,
        )
        return {(todo_id, int(spell), int(ring_no)) for todo_id, spell, ring_no in rows}

    def prune(self, now: datetime) -> None:
        """Forgets rings older than the longest schedule (none of their spells can ring again)."""
        self.db.query("DELETE FROM sb_rings WHERE rung_at < %s", (micros(now - KEEP_RINGS),))
