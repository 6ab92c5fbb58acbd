"""Claim lanes (interfaces/store/lanes.py, docs/adr/0035): after a lost claim race, a writer offers
the todos of its lane first among the oldest candidates, for HOLD by the store's clock."""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone
from uuid import UUID

from interfaces.store.candidates import CANDIDATES_PER_BATCH
from interfaces.store.lanes import HOLD, LANES, ClaimLanes, Lane

T0 = datetime(2026, 12, 6, tzinfo=timezone.utc)
KEY = ("ep_1", ("work",))


def ids(count: int) -> list[UUID]:
    """Oldest first; lanes alternate (UUID(int=n) is in lane n % 2)."""
    return [UUID(int=n) for n in range(count)]


def test_no_lane_until_a_race_is_lost():
    lanes = ClaimLanes()
    assert lanes.current(KEY, T0) is None
    assert lanes.held(T0) == {}


def test_a_lane_offers_its_todos_of_the_window_first_then_the_rest_oldest_first():
    candidates = ids(100)
    lane = Lane(1, T0, T0 + HOLD)
    window = Lane.window(8)
    assert window == min(8 * 8, CANDIDATES_PER_BATCH)
    ordered = lane.order(candidates, 8)
    ours = [c for c in candidates[:window] if c.int % LANES == 1]
    others = [c for c in candidates[:window] if c.int % LANES != 1]
    assert ordered == ours + others + candidates[window:]
    assert sorted(ordered, key=lambda c: c.int) == candidates  # nothing lost, nothing added


def test_the_window_is_at_least_what_the_claim_asks_for():
    assert Lane.window(100) == 100
    assert Lane.window(1) == 8


def test_a_window_all_of_one_lane_keeps_its_order():
    same_lane = [UUID(int=n) for n in range(0, 40, 2)]
    assert Lane(1, T0, T0 + HOLD).order(same_lane, 8) == same_lane  # none of ours: oldest first
    assert Lane(0, T0, T0 + HOLD).order(same_lane, 8) == same_lane


def test_a_lost_race_takes_a_lane_for_hold_and_each_loss_picks_it_again():
    lanes = ClaimLanes(random.Random(7))
    lanes.lost([KEY], T0)
    first = lanes.current(KEY, T0)
    assert first is not None and first.until == T0 + HOLD
    picks = set()
    for n in range(1, 30):
        lanes.lost([KEY], T0 + timedelta(seconds=n / 10))
        picks.add(lanes.current(KEY, T0 + timedelta(seconds=n / 10)).lane)
    assert picks == set(range(LANES))  # picked at random each time: writers that met part
    last = T0 + timedelta(seconds=29 / 10)
    assert lanes.current(KEY, last + HOLD - timedelta(microseconds=1)) is not None
    assert lanes.current(KEY, last + HOLD) is None  # no lost race for HOLD: oldest first again
    assert lanes.held(last + HOLD) == {}


def test_a_clock_that_went_back_ends_the_lane():
    lanes = ClaimLanes()
    lanes.lost([KEY], T0)
    assert lanes.current(KEY, T0 - timedelta(seconds=1)) is None


def test_lanes_are_per_queue():
    lanes = ClaimLanes()
    lanes.lost([KEY], T0)
    assert lanes.current(("ep_1", ("other",)), T0) is None
    assert list(lanes.held(T0)) == [KEY]
