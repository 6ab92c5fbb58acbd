"""Queue controls: an operator's limits on how fast an endpoint's agents take work from one queue.

Per endpoint and queue (held by the Endpoint aggregate, `QueueControlsSet`): `paused`,
`max_in_flight` (claimed todos at once, 1..10000 or None) and `max_claims_per_minute` (claims in
any 60 s window, 1..100000 or None). A claim is admitted only when the queue is not paused, fewer
than `max_in_flight` of its todos are claimed, and fewer than `max_claims_per_minute` claims fall in
the 60 s before it. `admission` is the one rule; the write side applies it to every claim and the
store holds every process to it (docs/adr/0025-queue-admission.md). Pure: counts and `now` are
passed in.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from domain.errors import Conflict, InvalidArgument

MAX_IN_FLIGHT_LIMIT = 10_000
MAX_RATE_LIMIT = 100_000
RATE_WINDOW = timedelta(seconds=60)
MAX_DELAY = timedelta(seconds=86400)
"""The longest snooze a release may ask for (`delay_seconds`)."""

PAUSED, MAX_IN_FLIGHT, RATE_LIMITED = "paused", "max_in_flight", "rate_limited"
REFUSAL_REASONS = (PAUSED, MAX_IN_FLIGHT, RATE_LIMITED)

UNSET: Any = object()
"""A setting the operator leaves as it is (distinct from None: no limit)."""


def _check_limit(name: str, value: object, high: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
        raise InvalidArgument(f"{name} must be within 1..{high} (or none: no limit)")
    return value


def check_max_in_flight(value: object, *, name: str = "max_in_flight") -> int | None:
    """A queue's limit on its claimed todos at once: 1..10000, or None for none. A refusal names the
    field `name` (the board's form calls it by its label)."""
    return _check_limit(name, value, MAX_IN_FLIGHT_LIMIT)


def check_max_claims_per_minute(value: object, *, name: str = "max_claims_per_minute") -> int | None:
    """A queue's limit on its claims in any 60 s: 1..100000, or None for none. A refusal names the
    field `name` (the board's form calls it by its label)."""
    return _check_limit(name, value, MAX_RATE_LIMIT)


@dataclass(frozen=True)
class QueueControls:
    """The controls of one queue; the default (nothing set) admits every claim."""

    paused: bool = False
    max_in_flight: int | None = None
    max_claims_per_minute: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.paused, bool):
            raise InvalidArgument("paused must be true or false")
        check_max_in_flight(self.max_in_flight)
        check_max_claims_per_minute(self.max_claims_per_minute)

    @property
    def controlled(self) -> bool:
        """Something is set: claims in this queue go through admission."""
        return self.paused or self.max_in_flight is not None or self.max_claims_per_minute is not None

    def changed(self, *, paused: Any = UNSET, max_in_flight: Any = UNSET,
                max_claims_per_minute: Any = UNSET) -> QueueControls:
        """These controls with the given settings replaced (validated)."""
        return QueueControls(
            paused=self.paused if paused is UNSET else paused,
            max_in_flight=self.max_in_flight if max_in_flight is UNSET else max_in_flight,
            max_claims_per_minute=(
                self.max_claims_per_minute if max_claims_per_minute is UNSET else max_claims_per_minute
            ),
        )

    def as_dict(self) -> dict[str, Any]:
        return {"paused": self.paused, "max_in_flight": self.max_in_flight,
                "max_claims_per_minute": self.max_claims_per_minute}


NO_CONTROLS = QueueControls()


@dataclass(frozen=True)
class Refusal:
    """Why a queue admits no claim now, and (when known) how long until it may again."""

    reason: str
    retry_after: timedelta | None = None
    limit: int | None = field(default=None, compare=False)
    """The limit that refused (max_in_flight or max_claims_per_minute) and the load that met it
    (claimed todos, claims in the window), for the message; None when not known or paused."""
    load: int | None = field(default=None, compare=False)

    @property
    def retry_after_seconds(self) -> int | None:
        """Whole seconds, rounded up (at least 1), so coming back then is never too early."""
        if self.retry_after is None:
            return None
        return max(1, math.ceil(self.retry_after.total_seconds()))

    @property
    def words(self) -> str:
        """What holds the queue, after its name: `has 3 todos claimed (max_in_flight 2)`, `has 1 todo
        claimed (max_in_flight 1)`."""
        known = self.limit is not None and self.load is not None
        s = "" if self.load == 1 else "s"
        return {
            PAUSED: "is paused",
            MAX_IN_FLIGHT: (f"has {self.load} todo{s} claimed (max_in_flight {self.limit})" if known
                            else "is at its max_in_flight"),
            RATE_LIMITED: (f"had {self.load} claim{s} in the last 60 s (max_claims_per_minute {self.limit})"
                           if known else "reached its max_claims_per_minute"),
        }[self.reason]

    def conflict(self, todo_id: str, queue: str) -> Conflict:
        """The `conflict` a `claim` of one todo of this queue answers."""
        after = f"; retry after {self.retry_after_seconds} s" if self.retry_after is not None else ""
        return QueueRefused(f"{self.reason}: queue {queue} {self.words}, todo {todo_id} not claimable now{after}",
                            queue, self)


ENDS_SOONEST_FIRST = (RATE_LIMITED, MAX_IN_FLIGHT, PAUSED)
"""How soon a refusal of each reason ends: a rate's when its window frees a place (a known time),
a max_in_flight when one of its claims ends (no time known), a pause only when an operator
resumes the queue."""


def soonest(refusals: Iterable[Refusal]) -> Refusal:
    """The refusal that ends soonest: the known time that is soonest, else by its reason
    (`ENDS_SOONEST_FIRST`); the first of equals. Its reason and its `retry_after` go together."""
    return min(refusals, key=lambda r: (r.retry_after is None, r.retry_after or timedelta(0),
                                        ENDS_SOONEST_FIRST.index(r.reason)))


class QueueRefused(Conflict):
    """Raised when a claim is refused by the queue's controls; carries the queue and the refusal."""

    def __init__(self, message: str, queue: str, refusal: Refusal) -> None:
        super().__init__(message)
        self.queue = queue
        self.refusal = refusal


def admission(controls: QueueControls, *, in_flight: int, recent_claims: list[datetime] | tuple[datetime, ...],
              now: datetime) -> Refusal | None:
    """None when one more claim may be taken now; else why not. `in_flight` counts the queue's
    claimed todos; `recent_claims` are the times of its claims in the window before `now`
    (older ones are ignored)."""
    if controls.paused:
        return Refusal(PAUSED)
    if controls.max_in_flight is not None and in_flight >= controls.max_in_flight:
        return Refusal(MAX_IN_FLIGHT, limit=controls.max_in_flight, load=in_flight)
    rate = controls.max_claims_per_minute
    if rate is not None:
        since = now - RATE_WINDOW
        window = sorted(t for t in recent_claims if t > since)
        if len(window) >= rate:
            # the window frees a place when its (len - rate + 1)-th oldest claim leaves it
            leaves = window[len(window) - rate] + RATE_WINDOW
            return Refusal(RATE_LIMITED, max(leaves - now, timedelta(microseconds=1)), limit=rate, load=len(window))
    return None


_DELAY = re.compile(r"(\d{1,9})\s*(s|m|h|d)")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_delay(text: str) -> timedelta:
    """A delay `<n>s|m|h|d` (the CLI's `--delay 10m`)."""
    match = _DELAY.fullmatch(text.strip()) if isinstance(text, str) else None
    if not match:
        raise InvalidArgument(f"delay {text!r} must be <n>s, <n>m, <n>h or <n>d")
    return timedelta(seconds=int(match.group(1)) * _UNITS[match.group(2)])


def check_delay_seconds(seconds: object, *, name: str = "delay_seconds") -> timedelta | None:
    """A release's snooze: 0..86400 seconds (0 or None: none). A refusal names the field `name`
    (the board's form calls it by its label)."""
    if seconds is None:
        return None
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds):
        raise InvalidArgument(f"{name} must be a number of seconds within 0..86400")
    if not 0 <= seconds <= MAX_DELAY.total_seconds():
        raise InvalidArgument(f"{name} must be within 0..86400")
    return timedelta(seconds=seconds) if seconds > 0 else None
