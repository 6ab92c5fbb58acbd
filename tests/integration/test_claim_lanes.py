"""Claim lanes on PostgreSQL (interfaces/store/lanes.py, docs/adr/0035): two containers on one
database are two writers, as two `serve` processes are. A claim decided on a read that another
writer's claim made stale loses its append; its writer then takes a lane of the queue, and its
claims take that lane's todos first (the re-run spread over them, the next ones oldest first), until HOLD passes
without another lost race. Nothing is ever handed out twice."""

from __future__ import annotations

from collections import Counter
import pytest

from application.access import todo_uuid
from application.service import Caller
from interfaces.store import candidates
from interfaces.store.lanes import HOLD, LANES
from tests.doubles import ManualClock

pytestmark = pytest.mark.postgres

CLI = Caller.cli()


@pytest.fixture
def two_writers(pg_url, make_container, monkeypatch):
    # a read ahead not finished within PREFETCH_WAIT is read again on the writer: on a loaded
    # machine that may happen, and the stale read ahead is what makes the race here
    monkeypatch.setattr(candidates, "PREFETCH_WAIT", 10.0)
    clock = ManualClock()
    a, b = make_container(pg_url, clock=clock), make_container(pg_url, clock=clock)
    a.app.ensure_admin()
    slug = a.app.vend("lanes", queues=["work"], caller=CLI)["slug"]
    pushed = []
    for n in range(80):  # more than one read ahead holds (64), so it is kept
        clock.advance(seconds=1)
        pushed.append(a.app.push(slug, f"todo {n:02d}", caller=CLI)["todo"]["id"])
    return a, b, a.app.endpoint_caller(slug), b.app.endpoint_caller(slug), clock, pushed


def claim(app, agent) -> str:
    answer = app.claim_next(caller=agent)
    assert not answer["empty"]
    return answer["todo"]["id"]


def lane_of(todo_id: str) -> int:
    return todo_uuid(todo_id).int % LANES


def test_a_claim_that_loses_its_race_takes_a_lane_whose_todos_come_first(two_writers):
    a, b, agent_a, agent_b, clock, pushed = two_writers
    assert claim(a.app, agent_a) == pushed[0]  # A reads the next candidates ahead
    assert claim(b.app, agent_b) == pushed[1]  # B claims the oldest meanwhile
    assert a.store.lanes.held(clock.now()) == {}

    # A's read ahead and its cached copy still offer pushed[1]: its append loses to B's, and the
    # claim runs again on fresh state, now in a lane (spread over the lane's part of the head)
    got = claim(a.app, agent_a)
    [(key, lane)] = a.store.lanes.held(clock.now()).items()
    assert key[1] == ("work",)
    assert got != pushed[1] and lane_of(got) == lane.lane and got in pushed[2:2 + 32]

    # the lane holds: A's next claims are its lane's oldest
    rest = [t for t in pushed[2:] if t != got]
    expected = [t for t in rest if lane_of(t) == lane.lane][:3]
    assert [claim(a.app, agent_a) for _ in range(3)] == expected
    # B never lost a race: no lane, oldest first
    assert b.store.lanes.held(clock.now()) == {}
    assert claim(b.app, agent_b) == next(t for t in rest if t not in expected)

    holders = Counter(r["aggregate"] for r in a.app.audit() if r["type"] == "TodoClaimed")
    assert set(holders.values()) == {1}  # nothing handed out twice


def test_once_hold_passes_without_a_lost_race_claims_go_oldest_first_again(two_writers):
    a, b, agent_a, agent_b, clock, pushed = two_writers
    claim(a.app, agent_a)
    claim(b.app, agent_b)
    got = claim(a.app, agent_a)
    assert a.store.lanes.held(clock.now())

    clock.advance(seconds=HOLD.total_seconds() + 1)
    assert a.store.lanes.held(clock.now()) == {}
    oldest = next(t for t in pushed[2:] if t != got)
    assert claim(a.app, agent_a) == oldest

