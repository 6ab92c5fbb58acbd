"""Claim lanes on PostgreSQL (interfaces/store/lanes.py, docs/adr/0035): containers on one database
are writers, as `serve` processes are. Each writer that claims from a queue says so in
`sb_claimers` and reads who else does; N writers there take N disjoint lanes of its head (their
rank among them), a writer alone claims oldest first, and a lost race makes the loser read them
again at once. Nothing is ever handed out twice."""

from __future__ import annotations

from collections import Counter

import pytest

from application.access import todo_uuid
from application.service import Caller
from interfaces.store import candidates
from interfaces.store.lanes import ALIVE, FORGET, REFRESH, Lane
from projections.base import micros
from tests.doubles import ManualClock

pytestmark = pytest.mark.postgres

CLI = Caller.cli()


@pytest.fixture
def writers(pg_url, make_container, monkeypatch):
    # a read ahead not finished within PREFETCH_WAIT is read again on the writer: on a loaded
    # machine that may happen, and the stale read ahead is what makes the race here
    monkeypatch.setattr(candidates, "PREFETCH_WAIT", 10.0)
    clock = ManualClock()
    containers = [make_container(pg_url, clock=clock) for _ in range(3)]
    first = containers[0].app
    first.ensure_admin()
    slug = first.vend("lanes", queues=["work"], caller=CLI)["slug"]
    pushed = []
    for n in range(120):
        clock.advance(seconds=1)
        pushed.append(first.push(slug, f"todo {n:03d}", caller=CLI)["todo"]["id"])
    return containers, [c.app.endpoint_caller(slug) for c in containers], clock, pushed


def claim(container, agent) -> str:
    answer = container.app.claim_next(caller=agent)
    assert not answer["empty"]
    return answer["todo"]["id"]


def lane_of(todo_id: str, lanes: int) -> int:
    return todo_uuid(todo_id).int % lanes


def ranks(containers) -> list[int]:
    order = sorted(c.store.lanes.writer for c in containers)
    return [order.index(c.store.lanes.writer) for c in containers]


def claimed_twice(container) -> list[str]:
    holders = Counter(r["aggregate"] for r in container.app.audit() if r["type"] == "TodoClaimed")
    return [todo for todo, times in holders.items() if times > 1]


def test_three_writers_claiming_one_queue_take_three_lanes_of_its_head(writers):
    containers, agents, clock, pushed = writers
    a, b, c = containers
    assert claim(a, agents[0]) == pushed[0]  # alone so far: the oldest
    claim(b, agents[1])
    claim(c, agents[2])
    clock.advance(seconds=REFRESH.total_seconds())  # each reads who claims there again
    for w, agent in zip(containers, agents):  # each has lost a race there (a real one: the test below)
        w.store.lanes.lost([(agent.scope.endpoint_id, ("work",))], clock.now())
    got = {n: [claim(w, agents[n]) for _ in range(4)] for n, w in enumerate(containers)}
    for n, rank in enumerate(ranks(containers)):
        assert containers[n].store.lanes.held(clock.now()) == {(agents[n].scope.endpoint_id, ("work",)): Lane(rank, 3)}
        assert {lane_of(t, 3) for t in got[n]} == {rank}, got  # only its own lane's todos
        assert all(t in pushed[:3 + 4 * 3 + 64] for t in got[n])  # from the head of the queue
    assert claimed_twice(a) == []


def test_a_writer_left_alone_claims_oldest_first_again(writers):
    containers, agents, clock, pushed = writers
    a, b, _ = containers
    key = (agents[0].scope.endpoint_id, ("work",))
    taken = [claim(a, agents[0]), claim(b, agents[1])]
    clock.advance(seconds=REFRESH.total_seconds())
    a.store.lanes.lost([key], clock.now())  # as after a race lost to b
    assert a.store.lanes.current(key, clock.now()) is not None  # two claim there
    clock.advance(seconds=ALIVE.total_seconds() + 1)  # b has not claimed since
    assert claim(a, agents[0]) == next(t for t in pushed if t not in taken)
    assert a.store.lanes.held(clock.now()) == {}


def test_a_lost_race_makes_its_writer_read_the_others_at_once(writers):
    containers, agents, clock, pushed = writers
    a, b, _ = containers
    assert claim(a, agents[0]) == pushed[0]  # alone: no lane, and A reads the next candidates ahead
    for read in list(a.store._prefetch._running):  # that read is done before B claims anything
        read.result(timeout=10)
    assert a.store.lanes.held(clock.now()) == {}
    claim(b, agents[1])  # B begins claiming there (it sees A: a lane)
    if pushed[1] not in [t["id"] for t in b.app.list_todos(caller=agents[1], state="claimed")]:
        b.app.claim(pushed[1], caller=agents[1])  # and takes the todo A is about to offer
    # A still believes it is alone (REFRESH has not passed) and offers the oldest of its read
    # ahead, pushed[1]: that append loses, A reads who claims there at once, and its claim, run
    # again, takes a todo of its lane
    got = claim(a, agents[0])
    key = (agents[0].scope.endpoint_id, ("work",))
    lane = a.store.lanes.held(clock.now()).get(key)
    assert lane is not None and lane.lanes == 2, "no lost race, or no lane after it"
    assert got != pushed[1] and lane_of(got, 2) == lane.lane
    assert claimed_twice(a) == []


def test_the_rows_of_writers_long_gone_are_deleted(writers):
    containers, agents, clock, pushed = writers
    a, b, _ = containers
    claim(b, agents[1])
    rows = a.store.db.query("SELECT writer, seen_at FROM sb_claimers")
    assert [w for w, _ in rows] == [b.store.lanes.writer]
    a.store.db.query("UPDATE sb_claimers SET seen_at = %s", (micros(clock.now() - FORGET) - 1,))
    clock.advance(seconds=FORGET.total_seconds())  # a's first claim sweeps
    claim(a, agents[0])
    assert [w for (w,) in a.store.db.query("SELECT writer FROM sb_claimers")] == [a.store.lanes.writer]
    a.store.lanes.leave()  # as its store closes: the others count one writer less at once
    assert a.store.db.query("SELECT writer FROM sb_claimers") == []
