"""Claim lanes: the writers of several processes that claim from one queue split its head.

Every writer offers a claim the oldest claimable todos. Two `serve` processes claiming from one
queue at once both take its head: whichever appends second loses the version check, and its
whole batch (the completions in it too) runs again on fresh state (docs/adr/0035).

So a writer that claims from a queue says so in `sb_claimers` (its own row, every `REFRESH` by the
store's clock while it claims there) and reads who else has within `ALIVE`. With N writers there,
the one of rank r among them (their ids sorted) offers a claim the todos of lane r first
(`todo_id.int % N == r`) among the oldest candidates (`Lane.window`: `WINDOW` × N × what the claim
asks for, at most `CANDIDATES_PER_BATCH`), then the others of that window, then the rest, oldest
first each. Every writer reads the same rows, so N writers take N disjoint parts, as many as there
are of them: no part is left to nobody (ADR 35 measured that lanes nobody holds pile up at the
head, where everybody falls back to them and races again). A writer that joins is counted by the
others within `REFRESH` (at once by one that loses a race to it); one whose store closes at once,
one that stops claiming (or dies) after `ALIVE`. Each change costs a few races. A writer keeps to
its lane only for `HOLD` after a race it lost there: processes that claim in turn take the oldest. A todo is passed by for at most the
window; correctness never rests on lanes (the append's version check decides who claims). A writer
alone claims oldest first.

Used on the writer thread only (claims read the store, which an event loop's batch may not).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol
from uuid import UUID, uuid4

import psycopg

from application.errors import StoreUnavailable
from interfaces.store.candidates import CANDIDATES_PER_BATCH, QueueKey
from interfaces.store.database import Database
from projections.base import micros

log = logging.getLogger("switchboard.store")

CLAIMERS_DDL = (
    # unlogged: its rows are rewritten every second and worth nothing after a crash (the writers
    # say they claim again within REFRESH), and a commit that wrote only them waits for no flush
    "CREATE UNLOGGED TABLE IF NOT EXISTS sb_claimers (endpoint_id TEXT NOT NULL, queues TEXT NOT NULL,"
    " writer TEXT NOT NULL, seen_at BIGINT NOT NULL, PRIMARY KEY (endpoint_id, queues, writer))",
    "CREATE INDEX IF NOT EXISTS sb_claimers_seen_at ON sb_claimers (seen_at)",
)
"""PostgreSQL only: SQLite has one writer process, and no lanes."""
HOLD = timedelta(seconds=5)
"""A writer offers its lane's todos first only for that long after it lost a claim race there:
processes that claim in turn, never at once, each take the oldest (CONTRACT §6)."""
REFRESH = timedelta(seconds=1)
"""How often a writer that claims from a queue renews its row there and reads the others'."""
ALIVE = timedelta(seconds=3)
"""A writer whose row is older than that claims there no more."""
FORGET = timedelta(minutes=10)
"""Rows older than that are deleted (by any writer, at most once per FORGET each)."""
WINDOW = 4
"""Per writer: a lane's todos are offered first among the oldest `WINDOW × N × limit` candidates,
at most `CANDIDATES_PER_BATCH` (ADR 35: with two writers, 4 × limit each still lost a race in
a batch of 40; 8 ×, one in 100)."""


class Claimers(Protocol):
    """Where the writers say which queues they claim from."""

    def seen(self, key: QueueKey, writer: str, now: datetime) -> Sequence[str]:
        """Says that `writer` claims from the queues of `key` at `now`; answers every writer that
        has within `ALIVE` (its own row may be missing from the answer)."""

    def leave(self, writer: str) -> None:
        """`writer` claims nowhere any more (its store closes)."""


@dataclass(frozen=True)
class Lane:
    lane: int
    """This writer's rank among the writers claiming there."""
    lanes: int
    """How many they are (at least 2)."""

    def window(self, limit: int) -> int:
        """The oldest candidates within which this lane's todos are offered first."""
        return max(limit, min(WINDOW * self.lanes * limit, CANDIDATES_PER_BATCH))

    def order(self, ids: Sequence[UUID], limit: int) -> list[UUID]:
        head = ids[:self.window(limit)]
        ours = [i for i in head if i.int % self.lanes == self.lane]
        if not ours or len(ours) == len(head):
            return list(ids)
        return ours + [i for i in head if i.int % self.lanes != self.lane] + list(ids[len(head):])


class ClaimLanes:
    """One writer's lanes, per (endpoint, queues) as claims name them; without `claimers` (SQLite,
    one process) none."""

    def __init__(self, claimers: Claimers | None = None, writer: str | None = None) -> None:
        self.writer = writer or uuid4().hex
        self._claimers = claimers
        self._known: dict[QueueKey, tuple[datetime, Lane | None]] = {}
        self._lost: dict[QueueKey, datetime] = {}
        """When this writer last lost a claim race there."""
        self._failing = False

    def current(self, key: QueueKey, now: datetime) -> Lane | None:
        """This writer's lane in `key` now (None while it claims there alone): it says it claims
        there, and reads who else does, once per REFRESH (and after a clock that went back). Lanes
        only spare races: when that fails, the claim goes on in the lane it had, and it is tried
        again after REFRESH."""
        if self._claimers is None:
            return None
        known = self._known.get(key)
        if known is None or not known[0] <= now < known[0] + REFRESH:
            lane = known[1] if known is not None else None
            try:
                writers = sorted({*self._claimers.seen(key, self.writer, now), self.writer})
            except (StoreUnavailable, psycopg.Error) as error:
                if not self._failing:
                    log.warning("claim lanes: the writers claiming from a queue not read (%s); claims go on", error)
                self._failing = True
            else:
                lane = Lane(writers.index(self.writer), len(writers)) if len(writers) > 1 else None
                self._failing = False
            for gone in [k for k, (at, _) in self._known.items() if not at <= now < at + ALIVE]:
                del self._known[gone]
            known = self._known[key] = (now, lane)
        lost = self._lost.get(key)
        return known[1] if lost is not None and lost <= now < lost + HOLD else None

    def leave(self) -> None:
        """This writer claims nowhere any more: the others count one writer less at once, not after
        ALIVE (best effort: its rows age out anyway)."""
        if self._claimers is not None and self._known:
            try:
                self._claimers.leave(self.writer)
            except (StoreUnavailable, psycopg.Error):
                pass

    def lost(self, keys: Iterable[QueueKey], now: datetime) -> None:
        """A batch that read these queues' candidates lost its append to another writer: one that
        began claiming there since this writer last read who does, it may be. Read again at the
        next claim there, not at the next REFRESH."""
        for key in keys:
            self._known.pop(key, None)
            self._lost[key] = now

    def held(self, now: datetime) -> dict[QueueKey, Lane]:
        """The lanes this writer holds now (as last read)."""
        return {key: lane for key, (at, lane) in self._known.items()
                if lane is not None and at <= now < at + REFRESH
                and (lost := self._lost.get(key)) is not None and lost <= now < lost + HOLD}


class SqlClaimers:
    """`Claimers` in PostgreSQL's `sb_claimers`, on the claim reads' connections (`indexed_column`:
    the writer thread never waits for the request pool): one statement says and reads, and now and
    then another deletes the rows of writers long gone, or dated far ahead by a clock that was."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self._swept: datetime | None = None

    def seen(self, key: QueueKey, writer: str, now: datetime) -> list[str]:
        endpoint_id, queues = key
        named = ",".join(queues)  # queue names hold no comma (domain/names.py)
        writers = self.db.indexed_column(
            "WITH mine AS (INSERT INTO sb_claimers (endpoint_id, queues, writer, seen_at) VALUES (%s, %s, %s, %s)"
            " ON CONFLICT (endpoint_id, queues, writer) DO UPDATE SET seen_at = excluded.seen_at)"
            " SELECT writer FROM sb_claimers WHERE endpoint_id = %s AND queues = %s AND seen_at BETWEEN %s AND %s",
            (endpoint_id, named, writer, micros(now), endpoint_id, named, micros(now - ALIVE), micros(now + ALIVE)),
        )
        if self._swept is None or not self._swept <= now < self._swept + FORGET:
            self._swept = now
            try:  # its own statement, so that no statement locks rows of several writers and one of its own
                self.db.indexed_column("DELETE FROM sb_claimers WHERE seen_at < %s OR seen_at > %s",
                                       (micros(now - FORGET), micros(now + FORGET)))
            except psycopg.Error as error:  # tidying only: the next sweep deletes them
                log.warning("claim lanes: old rows of sb_claimers not deleted: %s", error)
        return [value.decode() for value in writers]  # PostgreSQL's text, as bytes

    def leave(self, writer: str) -> None:
        self.db.indexed_column("DELETE FROM sb_claimers WHERE writer = %s", (writer,))
