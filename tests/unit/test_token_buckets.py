"""Per-client token buckets (ingest rate limit, failed sign-ins) on a clock the test moves."""

from __future__ import annotations

import pytest

from interfaces.http.ratelimit import TokenBuckets


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_burst_is_admitted_then_one_token_per_interval():
    clock = Clock()
    buckets = TokenBuckets(2.0, 3, clock=clock)
    assert [buckets.take("a") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert buckets.take("a") == pytest.approx(0.5)
    assert buckets.take("b") == 0.0  # per client
    clock.now += 0.5
    assert buckets.take("a") == 0.0
    assert buckets.take("a") == pytest.approx(0.5)


def test_wait_tells_without_taking():
    clock = Clock()
    buckets = TokenBuckets(0.2, 2, clock=clock)
    assert buckets.wait("a") == 0.0
    assert buckets.wait("a") == 0.0  # still two tokens: waiting took none
    buckets.take("a")
    buckets.take("a")
    assert buckets.wait("a") == pytest.approx(5.0)
    clock.now += 5
    assert buckets.wait("a") == 0.0


def test_a_zero_rate_disables_the_limit():
    buckets = TokenBuckets(0, 1, clock=Clock())
    assert all(buckets.take("a") == 0.0 for _ in range(100))
    assert buckets.wait("a") == 0.0
