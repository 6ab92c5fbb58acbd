"""The doorbell's SQL: rings due for some endpoints, and the once-only claim of a ring.

`sb_doorbell` is the inline projection of pending todos (projections/doorbell.py). `sb_rings` is
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


@dataclass(frozen=True)
class DueRing:
    """Ring `ring_no` of one pending spell of one todo, due now."""

    todo_id: str
    endpoint_id: str
    queue: str
    source: str | None
    kind: str | None
    title: str
    spell: int
    ring_no: int

    @property
    def key(self) -> tuple[str, int, int]:
        return (self.todo_id, self.spell, self.ring_no)


class SqlRings:
    """Reads `sb_doorbell`, writes `sb_rings`."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def due(self, endpoint_ids: Sequence[str], now: datetime, grace: timedelta = RING_GRACE) -> list[DueRing]:
        """Rings of these endpoints' pending todos whose time came less than `grace` ago, oldest first
        (one index range per ring of the schedule)."""
        if not endpoint_ids:
            return []
        marks = ", ".join(["%s"] * len(endpoint_ids))
        windows = " OR ".join(["(pending_since > %s AND pending_since <= %s)"] * len(RING_OFFSETS))
        bounds: list[int] = []
        for offset in RING_OFFSETS:
            bounds += [micros(now - offset - grace), micros(now - offset)]
        rows = self.db.query(
            "SELECT todo_id, endpoint_id, queue, source, kind, title, spell, pending_since FROM sb_doorbell"
            f" WHERE endpoint_id IN ({marks}) AND pending_since IS NOT NULL AND ({windows})"
            " ORDER BY pending_since, todo_id",
            (*endpoint_ids, *bounds),
        )
        due: list[DueRing] = []
        now_us = micros(now)
        for todo_id, endpoint_id, queue, source, kind, title, spell, since in rows:
            number = ring_due(timedelta(microseconds=now_us - since), grace)
            if number is not None:
                due.append(DueRing(todo_id, endpoint_id, queue, source, kind, title, int(spell), number))
        return due

    def take(self, ring: DueRing, now: datetime) -> bool:
        """Claims the ring for this process: True exactly once across every process."""
        with self.db.transaction() as tx:
            tx.execute(
                "INSERT INTO sb_rings (todo_id, spell, ring_no, rung_at) VALUES (%s, %s, %s, %s)"
                " ON CONFLICT (todo_id, spell, ring_no) DO NOTHING",
                (ring.todo_id, ring.spell, ring.ring_no, micros(now)),
            )
            return tx.rowcount == 1

    def prune(self, now: datetime) -> None:
        """Forgets rings older than the longest schedule (none of their spells can ring again)."""
        self.db.query("DELETE FROM sb_rings WHERE rung_at < %s", (micros(now - KEEP_RINGS),))
