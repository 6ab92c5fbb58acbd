"""Claim lanes (interfaces/store/lanes.py, docs/adr/0035): a writer that claims from a queue says so
and reads who else does, once per REFRESH by the store's clock; with N writers there, the one of
rank r offers the todos of lane r first among the oldest candidates."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from uuid import UUID

import pytest

from application.errors import StoreUnavailable
from interfaces.store.candidates import CANDIDATES_PER_BATCH
from interfaces.store.lanes import ALIVE, HOLD, REFRESH, WINDOW, ClaimLanes, Lane

T0 = datetime(2026, 12, 6, tzinfo=timezone.utc)
KEY = ("ep_1", ("work",))


class Registry:
    """`Claimers` in memory, as `sb_claimers` keeps them (the SQL one: tests/integration)."""

    def __init__(self) -> None:
        self.rows: dict[tuple, datetime] = {}
        self.calls = 0

    def seen(self, key, writer, now):
        self.calls += 1
        alive = [w for (k, w), at in self.rows.items() if k == key and now - ALIVE <= at <= now + ALIVE]
        self.rows[(key, writer)] = now
        return alive

    def leave(self, writer):
        self.rows = {(k, w): at for (k, w), at in self.rows.items() if w != writer}


class Down(Registry):
    def seen(self, key, writer, now):
        self.calls += 1
        raise StoreUnavailable("store unavailable: no connection")


def contended(registry, writer: str) -> ClaimLanes:
    """A writer that has just lost a claim race on KEY (its lane holds for HOLD)."""
    lanes = ClaimLanes(registry, writer)
    lanes.lost([KEY], T0)
    return lanes


def ids(count: int) -> list[UUID]:
    """Oldest first; UUID(int=n) is in lane n % lanes."""
    return [UUID(int=n) for n in range(count)]


@pytest.mark.parametrize("lanes", [2, 3, 4])
def test_a_lane_offers_its_todos_of_the_window_first_then_the_rest_oldest_first(lanes):
    candidates = ids(100)
    lane = Lane(1, lanes)
    window = lane.window(2)
    assert window == min(WINDOW * lanes * 2, CANDIDATES_PER_BATCH)
    ordered = lane.order(candidates, 2)
    ours = [c for c in candidates[:window] if c.int % lanes == 1]
    others = [c for c in candidates[:window] if c.int % lanes != 1]
    assert ordered == ours + others + candidates[window:]
    assert sorted(ordered, key=lambda c: c.int) == candidates  # nothing lost, nothing added


def test_the_window_is_at_least_what_the_claim_asks_for_and_at_most_a_read():
    assert Lane(0, 2).window(100) == 100
    assert Lane(0, 2).window(1) == 2 * WINDOW
    assert Lane(0, 8).window(10) == CANDIDATES_PER_BATCH


def test_a_window_all_of_one_lane_keeps_its_order():
    same_lane = [UUID(int=n) for n in range(0, 40, 2)]
    assert Lane(1, 2).order(same_lane, 8) == same_lane  # none of ours: oldest first
    assert Lane(0, 2).order(same_lane, 8) == same_lane


def test_without_a_registry_no_writer_has_a_lane():
    lanes = ClaimLanes()
    assert lanes.current(KEY, T0) is None
    assert lanes.held(T0) == {}


def test_a_writer_alone_has_no_lane_and_asks_once_per_refresh():
    registry = Registry()
    lanes = ClaimLanes(registry, "a")
    assert lanes.current(KEY, T0) is None
    assert lanes.current(KEY, T0 + REFRESH - timedelta(microseconds=1)) is None
    assert registry.calls == 1
    assert lanes.current(KEY, T0 + REFRESH) is None
    assert registry.calls == 2


def test_writers_claiming_one_queue_take_their_rank_among_them_as_their_lane():
    registry = Registry()
    c, a, b = contended(registry, "c"), contended(registry, "a"), contended(registry, "b")
    assert a.current(KEY, T0) is None  # the first: alone so far
    assert b.current(KEY, T0) == Lane(1, 2)
    assert c.current(KEY, T0) == Lane(2, 3)
    assert a.current(KEY, T0 + REFRESH / 2) is None  # it reads again only after REFRESH
    later = T0 + REFRESH
    assert [w.current(KEY, later) for w in (a, b, c)] == [Lane(0, 3), Lane(1, 3), Lane(2, 3)]
    assert a.held(later) == {KEY: Lane(0, 3)}
    assert a.current(("ep_1", ("other",)), later) is None  # per queue


def test_a_writer_not_heard_of_for_alive_no_longer_counts():
    registry = Registry()
    a, b = contended(registry, "a"), contended(registry, "b")
    a.current(KEY, T0)
    assert b.current(KEY, T0) == Lane(1, 2)
    gone = T0 + ALIVE + timedelta(microseconds=1)  # `a` stopped claiming at T0
    assert b.current(KEY, gone) is None


def test_a_lost_race_reads_the_writers_again_at_the_next_claim():
    registry = Registry()
    a, b = ClaimLanes(registry, "a"), ClaimLanes(registry, "b")
    assert a.current(KEY, T0) is None
    b.current(KEY, T0)  # b begins claiming there, and its claims race a's
    a.lost([KEY], T0)
    assert a.current(KEY, T0) == Lane(0, 2)
    assert a.current(KEY, T0 + HOLD) is None  # no race lost for HOLD: oldest first again


def test_writers_that_lost_no_race_claim_oldest_first_though_others_claim_there():
    registry = Registry()
    a, b = ClaimLanes(registry, "a"), ClaimLanes(registry, "b")
    a.current(KEY, T0)
    assert b.current(KEY, T0) is None  # processes taking turns each take the oldest (CONTRACT §6)


def test_a_writer_whose_store_closes_no_longer_counts_at_once():
    registry = Registry()
    a, b = contended(registry, "a"), contended(registry, "b")
    a.current(KEY, T0)
    assert b.current(KEY, T0) == Lane(1, 2)
    a.leave()
    assert b.current(KEY, T0 + REFRESH) is None


def test_a_writer_dated_ahead_by_its_clock_counts_only_within_alive_of_now():
    registry = Registry()
    ahead, b = contended(registry, "ahead"), contended(registry, "b")
    ahead.current(KEY, T0 + ALIVE * 10)  # its clock ran ahead, then it died
    assert b.current(KEY, T0) is None


def test_when_the_writers_cannot_be_read_claims_go_on_in_the_lane_they_had(caplog):
    registry = Registry()
    a, b = contended(registry, "a"), contended(registry, "b")
    a.current(KEY, T0)
    assert b.current(KEY, T0) == Lane(1, 2)
    down = Down()
    b._claimers = down  # the table cannot be reached from now on
    later = T0 + REFRESH
    assert b.current(KEY, later) == Lane(1, 2)
    assert b.current(KEY, later + REFRESH / 2) == Lane(1, 2) and down.calls == 1  # not again before REFRESH
    assert b.current(KEY, later + REFRESH) == Lane(1, 2) and down.calls == 2
    warnings = [r for r in caplog.records if "claim lanes" in r.getMessage()]
    assert len(warnings) == 1  # said once, not at every try
    assert ClaimLanes(down, "c").current(KEY, T0) is None  # none had: none (oldest first)


def test_a_clock_that_went_back_reads_the_writers_again():
    registry = Registry()
    lanes = ClaimLanes(registry, "a")
    lanes.current(KEY, T0)
    lanes.current(KEY, T0 - timedelta(seconds=1))
    assert registry.calls == 2
