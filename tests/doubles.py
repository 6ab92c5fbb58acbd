"""Test doubles that implement the application's ports (never mocks of our own classes)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone


class ManualClock:
    """A `Clock` that only moves when told to."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2026, 1, 1, tzinfo=timezone.utc)

    def now(self) -> datetime:
        return self._now

    def advance(self, **delta: float) -> datetime:
        self._now += timedelta(**delta)
        return self._now

    def set(self, moment: datetime) -> None:
        self._now = moment
