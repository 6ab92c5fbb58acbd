"""Claim lanes: writers of several processes that claim from one queue stop taking the same todos.

Every writer offers a claim the oldest claimable todos. Two `serve` processes claiming from one
queue at once both take its head: whichever appends second loses the version check, and its
whole batch (the completions in it too) runs again on fresh state. Measured on 2 cores with
4 + 4 claimers: a fifth of each process's batches lost, and two processes drained at ~0.55 of
one (docs/adr/0035).

So after a batch that read a queue's claim candidates loses a race, its writer prefers, for
`HOLD`, one of two lanes of that queue: among the oldest candidates (`Lane.window`: 8 × what the
claim asks for, at most `CANDIDATES_PER_BATCH`), the todos whose id falls in its lane
(`todo_id.int % LANES == lane`) come first, then the others of that window, then the rest, oldest
first each. The lane is picked at random at every lost race, so two writers that picked the same
one part at their next loss. Once `HOLD` passes without a lost race, the queue is offered oldest
first again. A todo is passed by for at most the window; correctness never rests on lanes (the
append's version check decides who claims). One process alone never loses a claim race, so its
claims stay oldest first; three or more claiming at once share two lanes and keep some races.

Used on the writer thread only (claims read the store, which an event loop's batch may not).
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from uuid import UUID

from interfaces.store.candidates import CANDIDATES_PER_BATCH, QueueKey

HOLD = timedelta(seconds=5)
"""How long a queue's lane holds after this writer's last lost race there."""
LANES = 2
WINDOW = 8
"""A lane's todos are offered first among the oldest `WINDOW × limit` candidates, at most
`CANDIDATES_PER_BATCH` (measured: with 4 × limit, a fallback to the other lane's todos still lost
a race in one batch of 40; with 8 ×, one in 100; docs/adr/0035)."""


@dataclass
class Lane:
    lane: int
    since: datetime
    until: datetime

    @staticmethod
    def window(limit: int) -> int:
        """The oldest candidates within which this lane's todos are offered first."""
        return max(limit, min(WINDOW * limit, CANDIDATES_PER_BATCH))

    def order(self, ids: Sequence[UUID], limit: int) -> list[UUID]:
        head = ids[:self.window(limit)]
        ours = [i for i in head if i.int % LANES == self.lane]
        if not ours or len(ours) == len(head):
            return list(ids)
        return ours + [i for i in head if i.int % LANES != self.lane] + list(ids[len(head):])


class ClaimLanes:
    """One writer's lanes, per (endpoint, queues) as claims name them."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng or random.Random()
        self._lanes: dict[QueueKey, Lane] = {}

    def current(self, key: QueueKey, now: datetime) -> Lane | None:
        """The lane this writer holds in `key` now, if any (a clock that went back ends it)."""
        lane = self._lanes.get(key)
        if lane is not None and not lane.since <= now < lane.until:
            del self._lanes[key]
            return None
        return lane

    def lost(self, keys: Iterable[QueueKey], now: datetime) -> None:
        """A batch that read these queues' candidates lost its append to another writer: a lane,
        picked again at random (writers that met in one part at their next loss)."""
        for key in keys:
            lane = self.current(key, now)
            since = lane.since if lane is not None else now
            self._lanes[key] = Lane(self._rng.randrange(LANES), since, now + HOLD)

    def held(self, now: datetime) -> dict[QueueKey, Lane]:
        """The lanes this writer holds now."""
        return {key: lane for key in list(self._lanes) if (lane := self.current(key, now)) is not None}
