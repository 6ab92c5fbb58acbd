"""Queue controls hold under concurrency on PostgreSQL (CONTRACT §13): many claimers in two
containers (two writer threads, two caches, two pools: as two server processes) never take a
queue past `max_in_flight`, nor past `max_claims_per_minute` in any 60 s window.

The rate runs under one ManualClock shared by both containers, advanced while 16 threads claim
(a real minute per window would be too long); the in-flight bound is checked on the event log
itself: replayed in commit order, the queue's claimed todos never exceed the limit.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta, timezone

import pytest

from tests.doubles import ManualClock
from tests.integration._support import CLI, push_many, vend_worker

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


def test_max_in_flight_holds_across_two_containers_and_16_claimers(pg_url, make_container):
    apps = [make_container(pg_url).app for _ in range(2)]
    worker = vend_worker(apps[0])
    apps[0].set_queue_controls(worker.name, "work", caller=CLI, max_in_flight=3)
    todos = set(push_many(apps, worker.name, 120))
    holding, peak, lock, stop = [0], [0], threading.Lock(), threading.Event()
    errors: list[BaseException] = []

    def claimer(i: int) -> None:
        app = apps[i % 2]
        try:
            while not stop.is_set():
                answer = app.claim_next(caller=worker)
                if answer["empty"]:
                    if answer.get("reason") is None:  # nothing left to claim
                        return
                    assert answer["reason"] == "max_in_flight", answer
                    time.sleep(0.005)
                    continue
                with lock:
                    holding[0] += 1
                    peak[0] = max(peak[0], holding[0])
                time.sleep(0.002)
                with lock:
                    holding[0] -= 1
                app.complete(answer["todo"]["id"], caller=worker)
        except BaseException as error:  # noqa: BLE001 - reported by the test
            errors.append(error)
            stop.set()

    threads = [threading.Thread(target=claimer, args=(i,)) for i in range(CLAIMERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    assert peak[0] <= 3

    claimed, most = set(), 0
    for kind, todo, _ in claims_in_log_order(apps[0], todos):
        if kind == "TodoClaimed":
            claimed.add(todo)
        else:
            claimed.discard(todo)
        most = max(most, len(claimed))
    assert most == 3  # the limit was reached, never passed
    assert {r["state"] for r in apps[0].list_todos(caller=CLI, limit=1000)} == {"done"}


def test_the_rate_holds_in_every_60_second_window_across_two_containers(pg_url, make_container):
    clock = LockedClock(datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc))
    apps = [make_container(pg_url, clock=clock).app for _ in range(2)]
    worker = vend_worker(apps[0])
    apps[0].set_queue_controls(worker.name, "work", caller=CLI, max_claims_per_minute=30)
    todos = set(push_many(apps, worker.name, 100))
    stop = threading.Event()
    errors: list[BaseException] = []
    refused = [0]

    def claimer(i: int) -> None:
        app = apps[i % 2]
        try:
            while not stop.is_set():
                answer = app.claim_next(caller=worker)
                if answer["empty"]:
                    if answer.get("reason") is None:
                        return
                    assert answer["reason"] == "rate_limited" and 1 <= answer["retry_after_seconds"] <= 60
                    refused[0] += 1
                    time.sleep(0.002)
                    continue
                app.complete(answer["todo"]["id"], caller=worker)
        except BaseException as error:  # noqa: BLE001
            errors.append(error)
            stop.set()

    threads = [threading.Thread(target=claimer, args=(i,)) for i in range(CLAIMERS)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 300
    while any(t.is_alive() for t in threads) and time.monotonic() < deadline:
        time.sleep(0.1)
        clock.advance(seconds=1)  # ten times faster than real time: over three minutes of claims
    stop.set()
    for t in threads:
        t.join(30)
    assert not errors, errors

    times = sorted(at for kind, _, at in claims_in_log_order(apps[0], todos) if kind == "TodoClaimed")
    assert len(times) == 100 and refused[0] > 0
    window = timedelta(seconds=60)
    worst = max(sum(1 for t in times if start <= t < start + window) for start in times)
    assert worst <= 30
    assert worst == 30  # and the budget was used
