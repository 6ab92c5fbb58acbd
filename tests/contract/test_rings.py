"""The doorbell's ring table on every store: a scan reads only the rings nobody has taken."""

from __future__ import annotations

from interfaces.store.rings import SqlRings

from .harness import Harness


def test_a_scan_skips_rings_taken_by_any_process_and_takes_each_once(sb: Harness):
    vended = sb.vend("worker")
    pushed = [sb.push(vended, f"todo {n}")["id"] for n in range(3) if sb.tick(1)]
    rings = SqlRings(sb.container.store.db)
    other = SqlRings(sb.another_process().store.db)
    now = sb.clock.now()

    due = rings.due([vended["endpoint_id"]], now)
    assert [r.todo_id for r in due] == pushed
    assert other.take_all(due[:2], now) == {r.key for r in due[:2]}

    left = rings.due([vended["endpoint_id"]], now)
    assert [r.todo_id for r in left] == pushed[2:]
    assert rings.take_all(due, now) == {due[2].key}  # the two the other process took are not got again
    assert rings.due([vended["endpoint_id"]], now) == []
    assert rings.take_all([], now) == set()


def test_a_scan_reads_at_most_its_limit_oldest_first(sb: Harness):
    vended = sb.vend("worker")
    pushed = [sb.push(vended, f"todo {n}")["id"] for n in range(4) if sb.tick(1)]
    rings = SqlRings(sb.container.store.db)
    assert [r.todo_id for r in rings.due([vended["endpoint_id"]], sb.clock.now(), limit=3)] == pushed[:3]
