"""The doorbell policy (domain/doorbell.py) and the pending spells the live todos hold (projections/claimable.py)."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone

import pytest

from domain.doorbell import MAX_RINGS, RING_GRACE, RING_OFFSETS, channel_safe, ring_due, ring_message
from domain.todo import LeaseExpired, TodoClaimed, TodoCompleted, TodoOpened, TodoRequeued
from projections.claimable import ClaimableQueue

TODO = uuid.UUID(int=7)
AT = datetime(2026, 3, 1, tzinfo=timezone.utc)


def test_rings_are_due_on_becoming_pending_then_5_min_then_20_min_1_h_and_6_h_after_the_previous():
    assert MAX_RINGS == 5
    gaps = [b - a for a, b in zip(RING_OFFSETS, RING_OFFSETS[1:])]
    assert RING_OFFSETS[0] == timedelta(0)
    assert gaps == [timedelta(minutes=5), timedelta(minutes=20), timedelta(hours=1), timedelta(hours=6)]


@pytest.mark.parametrize(("after", "expected"), [
    (timedelta(0), 0), (timedelta(seconds=59), 0), (timedelta(seconds=60), None),
    (timedelta(minutes=4, seconds=59), None), (timedelta(minutes=5), 1), (timedelta(minutes=25), 2),
    (timedelta(hours=1, minutes=25), 3), (timedelta(hours=7, minutes=25, seconds=30), 4),
    (timedelta(hours=13, minutes=25), None), (timedelta(seconds=-1), None),
])
def test_a_ring_is_due_only_within_its_grace_window(after, expected):
    assert RING_GRACE == timedelta(seconds=60)
    assert ring_due(after) == expected


def test_ring_text_is_one_line_that_cannot_close_the_channel_element():
    assert channel_safe("a\r\nb\x00c\u2028d") == "a b c d"
    assert channel_safe("x </channel> y </ CHANNEL>") == "x <\\/channel> y <\\/ CHANNEL>"


def test_a_ring_names_the_todo_queue_and_title_with_string_meta_and_no_payload():
    message = ring_message("td_1", "work", "issues opened: o/r#1 </channel>", "issues", "github")
    assert message == {
        "content": 'switchboard: todo td_1 ready on queue "work" — issues opened: o/r#1 <\\/channel>',
        "meta": {"todo_id": "td_1", "queue": "work", "kind": "issues", "source": "github"},
    }
    assert ring_message("td_2", "q", "t", None, "operator")["meta"] == {
        "todo_id": "td_2", "queue": "q", "source": "operator"}


def _opened(queue: str = "work", version: int = 1):
    return TodoOpened(originator_id=TODO, originator_version=version, timestamp=AT, actor="operator:cli",
                      cause="push", endpoint_id="ep_1", queue=queue, source="operator", kind=None, title="t",
                      trust_mode="operator", payload=None, payload_size=0)


def test_the_live_todos_track_each_pending_spell_and_never_quarantine():
    projection, base = ClaimableQueue(), dict(originator_id=TODO, timestamp=AT, actor="system", cause="x")
    at = int(AT.timestamp() * 1_000_000)

    def spell(event) -> tuple:
        """(spell, pending_since) as the event's op sets them."""
        (sql, params), = projection.ops(event, None)
        columns = [c.split(" = ")[0].strip() for c in sql.split(" SET ")[1].split(" WHERE ")[0].split(",")]
        return params[columns.index("spell")], params[columns.index("pending_since")]

    (sql, params), = projection.ops(_opened(), None)
    assert sql.startswith("INSERT INTO sb_claimable") and params[8:10] == (1, at)
    (sql, params), = projection.ops(_opened(queue="quarantine"), None)
    assert params[8:10] == (None, None)  # held: never rung
    claimed = TodoClaimed(originator_version=2, attempt=1, attempt_seq=1, holder="h", claimant=None,
                          lease_expires_at=AT, **base)
    assert spell(claimed) == (None, None)
    assert spell(LeaseExpired(originator_version=3, **base)) == (3, at)  # a new spell
    assert spell(LeaseExpired(originator_version=3, dead_letter=True, **base)) == (None, None)
    assert spell(TodoRequeued(originator_version=4, **base)) == (4, at)
    assert projection.ops(TodoCompleted(originator_version=5, **base), None)[0][0].startswith("DELETE")


def test_a_ring_without_a_title_says_the_todo_and_its_queue():
    """A live row the upgrade of docs/adr/0036 found no ring text for rings all the same."""
    assert ring_message("td_1", "work", None, None, None) == {
        "content": 'switchboard: todo td_1 ready on queue "work"', "meta": {"todo_id": "td_1", "queue": "work"}}
