"""One line when the store goes and one when it is back, per loop and outage (CONTRACT §12,
application/background.py `OutageLog`, docs/adr/0014): "back" waits until the loop has succeeded
for SETTLE s and no loop of the process has failed for want of the store in that time."""

from __future__ import annotations

import logging

import pytest

from application.background import SETTLE, OutageLog
from application.errors import StoreUnavailable

DOWN = StoreUnavailable("store unavailable: too many connections")


class Ticks:
    """A monotonic clock moved by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def ticks(monkeypatch):
    monkeypatch.setattr(OutageLog, "last_failure", float("-inf"))  # no other test's failures
    return Ticks()


def lines(caplog) -> list[str]:
    return [r.getMessage().split(" (")[0] for r in caplog.records]


def test_one_line_each_way_however_the_store_flaps(ticks, caplog):
    caplog.set_level(logging.WARNING, logger="t")
    loop = OutageLog(logging.getLogger("t"), "scheduler", "retrying", monotonic=ticks)
    loop.failed(DOWN)
    for _ in range(5):  # some ticks get through, then fail again
        ticks.now += 0.5
        loop.succeeded()
        ticks.now += 0.5
        loop.failed(DOWN)
    ticks.now += 0.5
    loop.succeeded()
    ticks.now += SETTLE - 0.1
    loop.succeeded()
    assert lines(caplog) == ["scheduler: store unavailable"]
    ticks.now += 0.1
    loop.succeeded()
    assert lines(caplog) == ["scheduler: store unavailable", "scheduler: store is back"]


def test_back_waits_for_every_loop_of_the_process(ticks, caplog):
    """A loop holding a pooled connection succeeds while the others cannot connect: it says the
    store is back only once none of them has failed for SETTLE s (it said so 2 s into a shortage,
    then its next connection failed: two outages in the log of one, in the fault suite)."""
    caplog.set_level(logging.WARNING, logger="t")
    holder = OutageLog(logging.getLogger("t"), "sealer", "retrying", monotonic=ticks)
    other = OutageLog(logging.getLogger("t"), "writer", "retrying", monotonic=ticks)
    holder.failed(DOWN)
    other.failed(DOWN)
    holder.succeeded()
    for _ in range(6):  # the holder keeps succeeding for 3 s while the writer keeps failing
        ticks.now += 0.5
        holder.succeeded()
        other.failed(DOWN)
    assert "sealer: store is back" not in lines(caplog)
    for _ in range(6):  # then every loop gets through
        ticks.now += 0.5
        holder.succeeded()
        other.succeeded()
    assert lines(caplog).count("sealer: store is back") == 1
    assert lines(caplog).count("writer: store is back") == 1
    assert lines(caplog).count("sealer: store unavailable") == 1


def test_a_failure_elsewhere_after_the_outage_does_not_take_back_a_line(ticks, caplog):
    """Only a loop that said the store was unavailable says it is back, once."""
    caplog.set_level(logging.WARNING, logger="t")
    quiet = OutageLog(logging.getLogger("t"), "doorbell", "retrying", monotonic=ticks)
    loud = OutageLog(logging.getLogger("t"), "projections", "retrying", monotonic=ticks)
    quiet.succeeded()
    loud.failed(DOWN)
    ticks.now += 0.5
    quiet.succeeded()
    assert lines(caplog) == ["projections: store unavailable"]
