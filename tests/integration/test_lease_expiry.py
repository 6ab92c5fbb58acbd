"""Timers under the real background scheduler: a lapsed lease and a due retry are back to
pending within 1 s of their time (CONTRACT §6), on SQLite and on PostgreSQL.

The clock is real wall-clock time. For the retry, whose first delay is 30 s, the clock is
wall-clock time plus an offset the test moves forward; the scheduler, which sleeps at most
MAX_SLEEP (1 s) when nothing is due sooner, must notice the retry on its own.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta, timezone

import pytest

from application.background import MAX_SLEEP
from interfaces.bootstrap import Background
from tests.integration._support import CLI, vend_worker

POLL = 0.05
WITHIN = timedelta(seconds=1)


class OffsetClock:
    """Wall-clock UTC time plus an offset that only moves forward."""

    def __init__(self) -> None:
        self._offset = timedelta()
        self._lock = threading.Lock()

    def now(self) -> datetime:
        with self._lock:
            return datetime.now(timezone.utc) + self._offset

    def advance(self, delta: timedelta) -> None:
        with self._lock:
            self._offset += delta


def _at(iso: str) -> datetime:
    return datetime.fromisoformat(iso)


def _wait_for_state(app, todo_id: str, state: str, clock, deadline: datetime) -> datetime:
    """Polls get_todo every 50 ms until the todo is in `state`; returns when it was seen so."""
    while True:
        seen = app.get_todo(todo_id, caller=CLI)["state"]
        at = clock.now()
        if seen == state:
            return at
        assert at <= deadline, f"todo {todo_id} still {seen} at {at.isoformat()}, expected {state}"
        time.sleep(POLL)


def _last_event(app, todo_id: str) -> dict:
    return app.history(todo_id, caller=CLI)["events"][-1]


@pytest.mark.parametrize("claimed_by", ["same-process", "other-process"])
def test_a_lapsed_lease_is_pending_again_within_a_second_of_expiry(store_url, make_container, claimed_by):
    container = make_container(store_url)
    app = container.app
    worker = vend_worker(app)
    todo_id = app.push(worker.name, "lease me", caller=CLI)["todo"]["id"]
    # "other-process": a second application on the same store claims, so no local commit wakes
    # the scheduler: it must find the new timer on its own (it never sleeps over MAX_SLEEP).
    claimer = app if claimed_by == "same-process" else make_container(store_url).app
    background = Background(container).start()
    try:
        time.sleep(0.2)  # the scheduler is asleep with nothing due
        claimed = claimer.claim(todo_id, caller=worker, lease_ttl_seconds=1)
        assert claimed["state"] == "claimed"
        expires = _at(claimed["lease_expires_at"])
        claim_event = _last_event(app, todo_id)
        assert claim_event["type"] == "TodoClaimed"
        assert expires - _at(claim_event["time"]) == timedelta(seconds=1)  # not clamped

        # Not early: still claimed shortly before the lease ends.
        time.sleep(max((expires - container.clock.now()).total_seconds() - 0.3, 0))
        assert app.get_todo(todo_id, caller=CLI)["state"] == "claimed"

        seen = _wait_for_state(app, todo_id, "pending", container.clock, expires + WITHIN + timedelta(seconds=2))
    finally:
        background.close()

    event = _last_event(app, todo_id)
    assert (event["type"], event["actor"], event["cause"]) == ("LeaseExpired", "system", "lease_expired")
    observed = (seen - expires).total_seconds()
    exact = (_at(event["time"]) - expires).total_seconds()
    print(f"\n[{store_url.split(':')[0]}, claimed by {claimed_by}] lease expiry: LeaseExpired "
          f"{exact:.3f} s after lease_expires_at, observed pending by polling after {observed:.3f} s")
    assert 0 <= exact <= observed
    assert observed <= WITHIN.total_seconds()
    todo = app.get_todo(todo_id, caller=CLI)
    assert todo["lease_expires_at"] is None and todo["owner"] is None
    assert todo["prior_attempts"][0]["outcome"] == "lease_expired"


def test_a_due_retry_is_pending_again_within_a_second(store_url, make_container):
    clock = OffsetClock()
    container = make_container(store_url, clock=clock)
    app = container.app
    worker = vend_worker(app)
    todo_id = app.push(worker.name, "fail me", caller=CLI)["todo"]["id"]
    background = Background(container).start()
    try:
        app.claim(todo_id, caller=worker, lease_ttl_seconds=60)
        failed = app.fail(todo_id, caller=worker, summary="try again later")
        due = _at(failed["next_retry_at"])
        assert failed["state"] == "failed" and not failed["dead_letter"]
        assert due - clock.now() > timedelta(seconds=29)  # 30 s · 2^0

        time.sleep(1.5 * MAX_SLEEP)  # the scheduler has slept and ticked with nothing due
        assert app.get_todo(todo_id, caller=CLI)["state"] == "failed"

        # Move time on so the retry falls due half a second from now. The scheduler last
        # computed its sleep when the retry was 30 s away, so it is asleep for up to MAX_SLEEP
        # and is not woken by any commit: it must pick the retry up on its own.
        lead = timedelta(seconds=0.5)
        clock.advance(due - clock.now() - lead)
        assert app.get_todo(todo_id, caller=CLI)["state"] == "failed"

        seen = _wait_for_state(app, todo_id, "pending", clock, due + WITHIN + timedelta(seconds=2))
    finally:
        background.close()

    event = _last_event(app, todo_id)
    assert (event["type"], event["actor"], event["cause"]) == ("TodoRequeued", "system", "retry_due")
    observed = (seen - due).total_seconds()
    exact = (_at(event["time"]) - due).total_seconds()
    print(f"\n[{store_url.split(':')[0]}] due retry: TodoRequeued {exact:.3f} s after next_retry_at, "
          f"observed pending by polling after {observed:.3f} s")
    assert 0 <= exact <= observed
    assert observed <= WITHIN.total_seconds()
    todo = app.get_todo(todo_id, caller=CLI)
    assert todo["next_retry_at"] is None and todo["attempt"] == 1  # a due retry keeps the count
