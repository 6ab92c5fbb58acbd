"""Every projection accounts for every todo event: it projects it, or lists it in `ignores`.

A new todo event type fails here until each projection says what it does with it, instead of
falling silently through a default branch. The lifecycle facts of domain/todo.py are checked
against the projections that embody them.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from uuid import UUID

import pytest

from domain.names import QUARANTINE
from domain.todo import (
    BECOMES_CLAIMABLE, CLAIMED, DONE, FAILED, MAY_BECOME_CLAIMABLE, MOVES_TIMER, PENDING, TODO_EVENTS, moves_timer,
    DelayElapsed, LeaseExpired, LeaseRenewed, TodoClaimed, TodoCompleted, TodoDiscarded, TodoFailed, TodoMoved,
    TodoOpened, TodoReleased, TodoRequeued, state_after,
)
from projections import all_projections
from projections.claimable import ClaimableQueue

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
TODO = UUID("00000000-0000-4000-8000-000000000001")


def _base(version: int = 2) -> dict:
    return {"originator_id": TODO, "originator_version": version, "timestamp": T0, "actor": "test", "cause": "test"}


def samples() -> list:
    """Each todo event type in each of its variants (dead letter or not, quarantine or not)."""
    opened = {"endpoint_id": "ep_1", "source": "github", "kind": "issues", "title": "t", "trust_mode": "signed",
              "payload": {"a": 1}, "payload_size": 7}
    later = T0 + timedelta(minutes=5)
    return [
        TodoOpened(**_base(1), queue="reviews", **opened, idempotency_key="k"),
        TodoOpened(**_base(1), queue=QUARANTINE, **opened),
        TodoClaimed(**_base(), attempt=1, attempt_seq=1, holder="ep_1", claimant=None, lease_expires_at=later),
        LeaseRenewed(**_base(), lease_expires_at=later),
        TodoCompleted(**_base(), result={"ok": True}, summary="done"),
        TodoFailed(**_base(), next_retry_at=later),
        TodoFailed(**_base(), dead_letter=True),
        LeaseExpired(**_base()),
        LeaseExpired(**_base(), dead_letter=True),
        TodoReleased(**_base()),
        TodoReleased(**_base(), dead_letter=True),
        TodoRequeued(**_base()),
        TodoRequeued(**_base(), fresh_budget=True),
        TodoMoved(**_base(), queue="reviews", from_queue=QUARANTINE, endpoint_id="ep_1", source="github",
                  kind="issues", title="t"),
        TodoDiscarded(**_base(), summary="spam"),
        TodoOpened(**_base(1), queue=QUARANTINE, **opened, routing={  # held by a rule fault
            "stage": "fault", "rule_index": 0, "rule_id": "r", "reason": "error", "detail": "boom",
            "action": {"queue": QUARANTINE}}),
        TodoOpened(**_base(1), queue="reviews", **opened, not_before=later),  # 16: delayed
        TodoReleased(**_base(), available_at=later),  # 17: snoozed
        DelayElapsed(**_base()),  # 18
        TodoClaimed(**_base(), attempt=1, attempt_seq=1, holder="ep_1", claimant=None, lease_expires_at=later,
                    endpoint_id="ep_1", queue="reviews", admitted_under={"max_in_flight": 3}),  # 19
    ]


def test_the_samples_cover_every_todo_event_type():
    assert {type(e) for e in samples()} == set(TODO_EVENTS)


@pytest.mark.parametrize("projection", all_projections(), ids=lambda p: p.name)
def test_each_projection_projects_or_explicitly_ignores_every_todo_event(projection):
    projected = {type(e) for e in samples() if projection.ops(e, 7)}
    ignored = set(projection.ignores)
    assert not projected & ignored, f"{projection.name} ignores events it projects: {projected & ignored}"
    missing = set(TODO_EVENTS) - projected - ignored
    assert not missing, f"{projection.name} neither projects nor ignores {sorted(c.__name__ for c in missing)}"


_UNSET = object()


def _assigned(sql: str, params: tuple, column: str):
    """The value an INSERT or UPDATE of the live todos gives `column` (`_UNSET`: it leaves it)."""
    if sql.startswith("INSERT"):
        columns = sql.split("(", 1)[1].split(")", 1)[0].split(", ")
    elif sql.startswith("UPDATE"):
        columns = [c.split(" = ")[0].strip() for c in sql.split(" SET ")[1].split(" WHERE ")[0].split(",")]
    else:
        return _UNSET
    return params[columns.index(column)] if column in columns else _UNSET


def _writes_due_timer(event) -> bool:
    """Whether the live todos' op for this event sets, clears or deletes a todo's `due_at`."""
    (sql, params), = ClaimableQueue().ops(event, 7)
    due = _assigned(sql, params, "due_at")
    return sql.startswith("DELETE") or (due is not _UNSET and (due is not None or not sql.startswith("INSERT")))


def test_the_timer_events_are_exactly_those_whose_op_writes_a_due_timer():
    assert {type(e) for e in samples() if _writes_due_timer(e)} == set(MOVES_TIMER)


def test_an_event_wakes_the_timer_scheduler_exactly_when_its_op_writes_a_due_timer():
    for event in samples():
        assert moves_timer(event) == _writes_due_timer(event), event


def test_events_that_make_a_todo_claimable_are_those_that_give_it_an_available_time():
    becomes = set()
    for event in samples():
        for sql, params in ClaimableQueue().ops(event, 7):
            if _assigned(sql, params, "available_at") not in (None, _UNSET):
                becomes.add(type(event))
    # DelayElapsed marks the moment a delayed todo's available time (set when it was pushed or
    # snoozed) comes: it writes no new one
    assert becomes | {DelayElapsed} == set(MAY_BECOME_CLAIMABLE)
    assert set(BECOMES_CLAIMABLE) == set(MAY_BECOME_CLAIMABLE) - {TodoFailed}  # a retry is claimable later


@pytest.mark.parametrize(("event", "state"), [
    (0, (PENDING, False)), (2, (CLAIMED, False)), (3, (CLAIMED, False)), (4, (DONE, False)),
    (5, (FAILED, False)), (6, (FAILED, True)), (7, (PENDING, False)), (8, (FAILED, True)),
    (9, (PENDING, False)), (10, (FAILED, True)), (11, (PENDING, False)), (13, (PENDING, False)),
    (14, (DONE, False)), (16, (PENDING, False)), (17, (PENDING, False)), (18, (PENDING, False)),
])
def test_state_after_each_event(event, state):
    assert state_after(samples()[event]) == state


def test_state_after_refuses_an_event_that_is_no_todo_transition():
    with pytest.raises(TypeError):
        state_after(object())
