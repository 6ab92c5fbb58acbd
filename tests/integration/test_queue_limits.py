"""Queue controls hold under concurrency on PostgreSQL (CONTRACT §13): many claimers in two
containers (two writer threads, two caches, two pools: as two server processes) never take a
queue past `max_in_flight`, nor past `max_claims_per_minute` in any 60 s window.

The rate runs under one ManualClock shared by both containers, advanced while 16 threads claim
(a real minute per window would be too long); the in-flight bound is checked on the event log
itself: replayed in commit order, the queue's claimed todos never exceed the limit. The same
bounds with two real `serve` processes and MCP clients, on a clock stepped across processes:
tests/e2e/test_queue_limits_two_serves.py.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta, timezone

import pytest

from tests.doubles import ManualClock
from tests.integration._support import CLI, most_claimed_at_once, most_in_any_window, push_many, vend_worker

pytestmark = pytest.mark.postgres

CLAIMERS = 16


class LockedClock(ManualClock):
    """A ManualClock that many threads read while one advances it."""

    def __init__(self, start: datetime) -> None:
        super().__init__(start)
        self._lock = threading.Lock()

    def now(self) -> datetime:
        with self._lock:
            return super().now()

    def advance(self, **delta: float) -> datetime:
        with self._lock:
            return super().advance(**delta)


def claims_in_log_order(app, queue_of: set[str]) -> list[tuple[str, str, datetime]]:
    """(event type, todo id, time) of every claim and claim end of these todos, in commit order."""
    ends = {"TodoCompleted", "TodoFailed", "TodoReleased", "LeaseExpired"}
    return [(r["type"], r["aggregate"], datetime.fromisoformat(r["time"])) for r in app.audit()
            if r["aggregate"] in queue_of and (r["type"] == "TodoClaimed" or r["type"] in ends)]


class Claimers:
    """16 threads over the apps looping claim_next (+ `hold`) + complete until nothing is left."""

    def __init__(self) -> None:
        self.threads: list[threading.Thread] = []
        self.errors: list[BaseException] = []
        self.refused = 0
        self.stop = threading.Event()


def start_claimers(apps, worker, reason: str, hold=lambda app, todo: None) -> Claimers:
    claimers = Claimers()

    def claimer(i: int) -> None:
        app = apps[i % len(apps)]
        try:
            while not claimers.stop.is_set():
                answer = app.claim_next(caller=worker)
                if answer["empty"]:
                    if answer.get("reason") is None:  # nothing left to claim
                        return
                    assert answer["reason"] == reason, answer
                    if reason == "rate_limited":
                        assert 1 <= answer["retry_after_seconds"] <= 60, answer
                    claimers.refused += 1
                    time.sleep(0.005)
                    continue
                hold(app, answer["todo"])
                app.complete(answer["todo"]["id"], caller=worker)
        except BaseException as error:  # noqa: BLE001 - reported by the test
            claimers.errors.append(error)
            claimers.stop.set()

    claimers.threads = [threading.Thread(target=claimer, args=(i,)) for i in range(CLAIMERS)]
    for t in claimers.threads:
        t.start()
    return claimers


def test_max_in_flight_holds_across_two_containers_and_16_claimers(pg_url, make_container):
    apps = [make_container(pg_url).app for _ in range(2)]
    worker = vend_worker(apps[0])
    apps[0].set_queue_controls(worker.name, "work", caller=CLI, max_in_flight=3)
    todos = set(push_many(apps, worker.name, 120))
    holding, peak, lock = [0], [0], threading.Lock()

    def hold(app, todo: dict) -> None:
        with lock:
            holding[0] += 1
            peak[0] = max(peak[0], holding[0])
        time.sleep(0.002)
        with lock:
            holding[0] -= 1

    claimers = start_claimers(apps, worker, "max_in_flight", hold)
    for t in claimers.threads:
        t.join(300)
    assert not claimers.errors, claimers.errors
    assert peak[0] <= 3

    assert most_claimed_at_once(claims_in_log_order(apps[0], todos)) == 3  # the limit was reached, never passed
    assert {r["state"] for r in apps[0].list_todos(caller=CLI, limit=1000)} == {"done"}


def test_the_rate_holds_in_every_60_second_window_across_two_containers(pg_url, make_container):
    clock = LockedClock(datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc))
    apps = [make_container(pg_url, clock=clock).app for _ in range(2)]
    worker = vend_worker(apps[0])
    apps[0].set_queue_controls(worker.name, "work", caller=CLI, max_claims_per_minute=30)
    todos = set(push_many(apps, worker.name, 100))
    claimers = start_claimers(apps, worker, "rate_limited")
    deadline = time.monotonic() + 300
    while any(t.is_alive() for t in claimers.threads) and time.monotonic() < deadline:
        time.sleep(0.1)
        clock.advance(seconds=1)  # ten times faster than real time: over three minutes of claims
    claimers.stop.set()
    for t in claimers.threads:
        t.join(30)
    assert not claimers.errors, claimers.errors

    times = sorted(at for kind, _, at in claims_in_log_order(apps[0], todos) if kind == "TodoClaimed")
    assert len(times) == 100 and claimers.refused > 0
    worst = most_in_any_window(times, timedelta(seconds=60))
    assert worst <= 30
    assert worst == 30  # and the budget was used
