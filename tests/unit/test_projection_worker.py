"""The projection worker lets a burst of commits gather into one catch-up (application/background.py)."""

from __future__ import annotations

import threading
import time

from application.background import ProjectionWorker


def test_a_burst_of_wakes_costs_a_catch_up_per_gather_window_not_one_per_wake():
    calls: list[float] = []
    worker = ProjectionWorker(lambda: calls.append(time.monotonic()))
    stop = threading.Event()
    thread = threading.Thread(target=worker.run, args=(stop,), daemon=True)
    thread.start()
    try:
        time.sleep(0.1)  # the first (start-up) catch-up
        calls.clear()
        burst = 0.2
        wakes, started = 0, time.monotonic()
        while time.monotonic() - started < burst:  # a commit every 2 ms, as under ingest load
            worker.wake.set()
            last_wake = time.monotonic()
            wakes += 1
            time.sleep(0.002)
        deadline = time.monotonic() + 5  # a loaded machine may be slow to schedule the worker
        while not (calls and calls[-1] >= last_wake) and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        stop.set()
        worker.wake.set()
        thread.join(timeout=5)
    assert calls, "woken, it caught up"
    assert calls[-1] >= last_wake, "the last commits were caught up too"
    assert len(calls) <= burst / worker.GATHER + 2, (len(calls), wakes)
