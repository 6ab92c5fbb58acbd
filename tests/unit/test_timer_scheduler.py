"""The timer scheduler lets a burst of timer-moving commits gather into one tick (application/background.py)."""

from __future__ import annotations

import threading
import time

from application.background import MAX_SLEEP, TimerScheduler


class CountedTicks(TimerScheduler):
    """The real scheduler loop; each tick is recorded instead of reading timers from a store."""

    def __init__(self) -> None:
        super().__init__(app=None, views=None, clock=None)
        self.ticks: list[float] = []

    def tick(self) -> float:
        self.ticks.append(time.monotonic())
        return MAX_SLEEP


def test_a_burst_of_claims_and_completes_costs_a_tick_per_gather_window_not_one_per_commit():
    scheduler = CountedTicks()
    stop = threading.Event()
    thread = threading.Thread(target=scheduler.run, args=(stop,), daemon=True)
    thread.start()
    try:
        time.sleep(0.1)  # the first (start-up) tick
        scheduler.ticks.clear()
        burst = 0.2
        wakes, started = 0, time.monotonic()
        while time.monotonic() - started < burst:  # a claim or a complete every 2 ms, as in an MCP drain
            scheduler.wake.set()
            last_wake = time.monotonic()
            wakes += 1
            time.sleep(0.002)
        deadline = time.monotonic() + 5  # a loaded machine may be slow to schedule the thread
        while not (scheduler.ticks and scheduler.ticks[-1] >= last_wake) and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        stop.set()
        scheduler.wake.set()
        thread.join(timeout=5)
    ticks = scheduler.ticks
    assert ticks, "woken, it ticked"
    assert ticks[-1] >= last_wake, "the last commits' timers were looked at too"
    assert len(ticks) <= burst / scheduler.GATHER + 2, (len(ticks), wakes)
