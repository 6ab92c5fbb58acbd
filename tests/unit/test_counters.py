"""The counters projection behind /metrics: events in, totals out (on an in-memory SQLite)."""

from __future__ import annotations

import sqlite3
from datetime import datetime, timedelta, timezone
from typing import Any
from uuid import UUID, uuid4

import pytest

from domain.delivery import DeliveryAccepted
from domain.events import DomainEvent
from domain.todo import MAX_ATTEMPTS, Todo
from interfaces.store.ops import run_ops
from projections.counters import Counters, verdict

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
HOLDER = "endpoint:worker-ab12"
LEASE = timedelta(seconds=60)


def project(events: list[DomainEvent]) -> dict[tuple[str, str, str], int]:
    """Applies the projection's ops for the events, in order; returns every counter row."""
    projection = Counters()
    db = sqlite3.connect(":memory:")
    for statement in projection.ddl:
        db.execute(statement)
    run_ops(db.cursor(), [op for n, e in enumerate(events, 1) for op in projection.ops(e, n)], "?")
    return {(m, a, b): total for m, a, b, total in db.execute("SELECT metric, a, b, total FROM sb_counters")}


def opened(queue: str = "inbox", source: str = "operator", todo_id: UUID | None = None) -> Todo:
    return Todo.open(id=todo_id or uuid4(), now=T0, actor="cli", endpoint_id="ep_1", queue=queue, source=source,
                     title="t", trust_mode="token" if source == "generic" else "operator")


def delivery(disposition: str, todos: list[dict[str, Any]], source: str = "github",
             routing: dict[str, Any] | None = None) -> DeliveryAccepted:
    return DeliveryAccepted(
        originator_id=uuid4(), originator_version=1, timestamp=T0, actor="webhook:wh_1", cause="ingest",
        webhook_id="wh_1", endpoint_id="ep_1", source=source, kind="push", trust_mode="signed", verified=True,
        remote_addr=None, content_type="application/json", size=2, headers={}, body="{}", body_encoding="utf-8",
        delivery_key="wh_1:d", disposition=disposition, routing=routing or {"stage": "default"}, todos=todos,
    )


def test_each_transition_counts_under_the_todos_queue():
    done, failed, lapsed = opened(), opened(source="github"), opened("reviews")
    now = T0
    for todo in (done, failed, lapsed):
        todo.claim(now=now, holder=HOLDER, lease=LEASE)
    done.complete(now=now, holder=HOLDER)
    failed.fail(now=now, holder=HOLDER)
    lapsed.expire_lease(now=now + LEASE)
    lapsed.claim(now=now + LEASE, holder=HOLDER, lease=LEASE)
    lapsed.release(now=now + LEASE, holder=HOLDER)

    counted = project([e for t in (done, failed, lapsed) for e in t.collect_events()])

    assert counted == {
        ("todos_created", "inbox", "operator"): 1, ("todos_created", "inbox", "github"): 1,
        ("todos_created", "reviews", "operator"): 1,
        ("todos_claimed", "inbox", ""): 2, ("todos_claimed", "reviews", ""): 2,
        ("todos_completed", "inbox", "complete"): 1, ("todos_completed", "inbox", "fail"): 1,
        ("leases_expired", "reviews", ""): 1,
    }


def test_a_dead_lettering_fail_and_expiry_still_count():
    by_fail, by_expiry = opened(), opened()
    now = T0
    for _ in range(MAX_ATTEMPTS):
        for todo in (by_fail, by_expiry):
            todo.claim(now=now, holder=HOLDER, lease=LEASE)
        by_fail.fail(now=now, holder=HOLDER)
        now += LEASE
        by_expiry.expire_lease(now=now)
        now += timedelta(hours=1)  # past any retry delay
        if not by_fail.dead_letter:
            by_fail.requeue_due(now=now)
    assert by_fail.dead_letter and by_expiry.dead_letter

    counted = project([e for t in (by_fail, by_expiry) for e in t.collect_events()])

    assert counted[("todos_completed", "inbox", "fail")] == MAX_ATTEMPTS
    assert counted[("leases_expired", "inbox", "")] == MAX_ATTEMPTS
    assert counted[("todos_claimed", "inbox", "")] == 2 * MAX_ATTEMPTS


def test_a_todo_released_from_quarantine_counts_in_its_new_queue():
    todo = opened("quarantine", "generic")
    todo.move_from_quarantine(now=T0, actor="operator:admin", queue="inbox")
    todo.claim(now=T0, holder=HOLDER, lease=LEASE)
    todo.complete(now=T0, holder=HOLDER)

    counted = project(todo.collect_events())

    assert counted == {
        ("todos_created", "quarantine", "generic"): 1,
        ("todos_claimed", "inbox", ""): 1, ("todos_completed", "inbox", "complete"): 1,
    }


def test_events_of_a_todo_it_never_saw_opened_count_nothing():
    todo = opened()
    todo.claim(now=T0, holder=HOLDER, lease=LEASE)
    todo.complete(now=T0, holder=HOLDER)

    assert project(todo.collect_events()[1:]) == {}


@pytest.mark.parametrize(("disposition", "created", "expected"), [
    ("routed", [True], "routed"),
    ("routed", [False, True], "routed"),  # fan-out: one target's todo was new
    ("routed", [False, False], "duplicate"),
    ("routed", [], "routed"),  # no active target: nothing named, nothing repeated
    ("dropped", [], "dropped"),
    ("faulted", [True], "faulted"),
    ("faulted", [False], "faulted"),
])
def test_a_delivery_verdict_is_its_disposition_or_duplicate(disposition, created, expected):
    event = delivery(disposition, [{"id": f"td_{n}", "created": c} for n, c in enumerate(created)])

    assert verdict(event) == expected
    assert project([event]) == {("webhook_deliveries", "github", expected): 1}


def test_a_held_delivery_counts_as_held_and_a_once_repeat_as_repeat():
    held = delivery("held", [{"id": "td_1", "created": True}], routing={"stage": "untrusted"})
    repeat = delivery("routed", [{"id": "td_1", "created": False}],
                      routing={"stage": "default", "subject": "github:o/r#1", "once": "repeat"})
    assert (verdict(held), verdict(repeat)) == ("held", "repeat")
    assert project([held, repeat, repeat]) == {("webhook_deliveries", "github", "held"): 1,
                                               ("webhook_deliveries", "github", "repeat"): 2}


def test_deliveries_add_up_per_source_and_verdict():
    events = [delivery("routed", [{"created": True}]), delivery("routed", [{"created": False}]),
              delivery("routed", [{"created": True}]), delivery("dropped", [], source="generic")]

    assert project(events) == {
        ("webhook_deliveries", "github", "routed"): 2, ("webhook_deliveries", "github", "duplicate"): 1,
        ("webhook_deliveries", "generic", "dropped"): 1,
    }
