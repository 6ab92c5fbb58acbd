"""The doorbell policy: what a ring says, and when an unclaimed pending todo is rung.

A todo is rung when it becomes claimable (opened, released, lease lapsed, retry due, operator
retry) and, while it stays pending and unclaimed, again 5 min later, then 20 min, 1 h and 6 h
after the previous ring: at most 5 rings per pending spell. Ring `n` is due at a fixed offset
from the moment the todo became pending, so every process computes the same schedule. A ring
that nobody could send within `RING_GRACE` of its time (no session was connected) is skipped,
so a session that connects late is not flooded with old rings (docs/adr/0011-doorbell.md).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from domain.endpoint import QueueControlsSet
from domain.events import DomainEvent
from domain.todo import BECOMES_CLAIMABLE, ENDS_A_CLAIM

FIRST_RERING = timedelta(minutes=5)
RERING_GAPS = (timedelta(minutes=20), timedelta(hours=1), timedelta(hours=6))
MAX_RINGS = 1 + 1 + len(RERING_GAPS)
RING_GRACE = timedelta(seconds=60)


def _offsets() -> tuple[timedelta, ...]:
    offsets = [timedelta(0), FIRST_RERING]
    for gap in RERING_GAPS:
        offsets.append(offsets[-1] + gap)
    return tuple(offsets)


RING_OFFSETS = _offsets()
"""When each ring is due, measured from the moment the todo became pending: 0, 5 min, 25 min,
1 h 25 min, 7 h 25 min."""


def ring_due(pending_for: timedelta, grace: timedelta = RING_GRACE) -> int | None:
    """The ring (0-based) due after a todo has been pending for `pending_for`, if one's time has
    come less than `grace` ago."""
    for number, offset in enumerate(RING_OFFSETS):
        if offset <= pending_for < offset + grace:
            return number
    return None


_LINE_BREAKS = re.compile(r"[\r\n\x00\x0b\x0c\x1c-\x1e\x85\u2028\u2029]+")
_CHANNEL_CLOSE = re.compile(r"</(\s*channel)", re.IGNORECASE)


def channel_safe(text: str) -> str:
    """One line that cannot close the `<channel>` element an agent host wraps the ring in."""
    return _CHANNEL_CLOSE.sub(r"<\\/\1", _LINE_BREAKS.sub(" ", text)).strip()


def ring_message(todo_id: str, queue: str, title: str | None, kind: str | None, source: str | None) -> dict[str, Any]:
    """The `notifications/claude/channel` params of one ring: text and string meta, never the payload
    (a title unknown, as after docs/adr/0036's upgrade for a todo older than the doorbell: the id alone)."""
    meta = {"todo_id": todo_id, "queue": queue}
    if kind:
        meta["kind"] = channel_safe(kind)
    if source:
        meta["source"] = channel_safe(source)
    content = f'switchboard: todo {todo_id} ready on queue "{queue}"'
    if title:
        content += f" — {channel_safe(title)}"
    return {"content": content, "meta": meta}


RING = "ring"
"""A commit after which a ring may be due at once: a todo became claimable or a queue's controls changed."""
FREED = "freed"
"""A commit that ended a claim: a queue held at its max_in_flight may admit again."""


def doorbell_news(events: Sequence[DomainEvent]) -> str | None:
    """What a commit of these events tells the doorbell (RING, FREED), or None when no scan can
    find anything new because of it (a claim, a heartbeat, a delivery that opened no todo…)."""
    news = None
    for event in events:
        if isinstance(event, (*BECOMES_CLAIMABLE, QueueControlsSet)):
            return RING
        if isinstance(event, ENDS_A_CLAIM):
            news = FREED
    return news
