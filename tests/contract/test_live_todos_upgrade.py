"""A store written before the live todos held their doorbell spells and due timers
(docs/adr/0036: `sb_doorbell` and `sb_timers` beside `sb_claimable`) opens with every row moved
into `sb_claimable` — a quarantined todo and a todo older than the doorbell (neither had a
doorbell row) take what a ring says from their todo rows — the old tables replaced by views a
build before cannot use, and goes on as it was."""

from __future__ import annotations

import pytest

from projections.base import micros
from tests.contract.test_webhooks import quarantined

from .harness import agent, container_on, when

OLD_DDL = (
    "CREATE TABLE sb_doorbell (todo_id TEXT PRIMARY KEY, endpoint_id TEXT NOT NULL, queue TEXT NOT NULL,"
    " source TEXT, kind TEXT, title TEXT NOT NULL, spell BIGINT, pending_since BIGINT)",
    "CREATE INDEX sb_doorbell_pending ON sb_doorbell (endpoint_id, pending_since) WHERE pending_since IS NOT NULL",
    "CREATE TABLE sb_timers (todo_id TEXT PRIMARY KEY, kind TEXT NOT NULL, due_at BIGINT NOT NULL)",
    "CREATE INDEX sb_timers_due ON sb_timers (due_at)",
)
MOVED = ("source", "kind", "title", "spell", "pending_since", "due_at")


def live_rows(container) -> dict[str, tuple]:
    return {row[0]: row for row in container.store.db.query("SELECT * FROM sb_claimable")}


def to_the_layout_before(container, *, older_than_the_doorbell: str) -> None:
    """The tables as the build before wrote them: the doorbell's rows in a table of their own (none
    for a quarantined todo, none for a todo pushed before the doorbell existed), the due timers in
    another, `sb_claimable` with its five columns, and the two projections' tracking rows."""
    with container.store.db.transaction() as tx:
        for view in ("sb_doorbell", "sb_timers"):
            tx.execute(f"DROP VIEW {view}")
        for statement in OLD_DDL:
            tx.execute(statement)
        tx.execute("INSERT INTO sb_doorbell SELECT todo_id, endpoint_id, queue, source, kind, title, spell,"
                   " pending_since FROM sb_claimable WHERE queue <> 'quarantine' AND todo_id <> %s",
                   (older_than_the_doorbell,))
        tx.execute("INSERT INTO sb_timers SELECT todo_id, 'lease', due_at FROM sb_claimable WHERE due_at IS NOT NULL")
        tx.execute("DROP INDEX sb_claimable_pending")
        tx.execute("DROP INDEX sb_claimable_due")
        for column in MOVED:
            tx.execute(f"ALTER TABLE sb_claimable DROP COLUMN {column}")
        (position,), = tx.execute("SELECT position FROM sb_tracking WHERE name = 'claimable'")
        tx.execute("INSERT INTO sb_tracking (name, position) VALUES ('doorbell', %s), ('timers', %s)",
                   (position, position))


def test_an_older_store_moves_its_spells_and_timers_into_the_live_todos_and_goes_on(sb):
    held, _ = quarantined(sb)
    worker = sb.vend()
    caller = agent(worker)
    for n in range(6):
        sb.push(worker, f"todo {n}", payload={"n": n})
    later = sb.push(worker, "later", delay_seconds=600)["id"]  # a delay timer, no spell yet
    claimed, failed, snoozed, ancient, done = (sb.app.claim_next(caller=caller)["todo"]["id"] for _ in range(5))
    sb.app.fail(failed, caller=caller, summary="flaky")  # a retry timer
    sb.app.release(snoozed, caller=caller, delay_seconds=600)  # a snooze timer
    sb.app.complete(done, caller=caller)  # no row
    before = live_rows(sb.container)
    assert done not in before and len(before) == 7  # 5 of the worker's live todos, the held one, `later`
    assert before[held][1:3] == (before[held][1], "quarantine") and before[held][8] is None  # never rung
    to_the_layout_before(sb.container, older_than_the_doorbell=ancient)
    sb.container.close()

    reopened = container_on(sb.make_container, sb.url, sb.clock)
    after = live_rows(reopened)
    assert after == before  # the held and the ancient todo's ring text read from their todo rows
    for todo_id, due in ((claimed, "lease_expires_at"), (ancient, "lease_expires_at"), (failed, "next_retry_at"),
                         (snoozed, "available_at"), (later, "available_at")):
        assert after[todo_id][-1] == micros(when(reopened.app.get_todo(todo_id, caller=caller)[due])), todo_id
    assert reopened.projector.verify() == []  # a rebuild from the log agrees with what was moved
    assert not reopened.store.db.query("SELECT name FROM sb_tracking WHERE name IN ('doorbell', 'timers')")

    with pytest.raises(Exception):  # a build before stops at its first open: it cannot index a view
        with reopened.store.db.transaction() as tx:
            tx.execute(OLD_DDL[0].replace("CREATE TABLE", "CREATE TABLE IF NOT EXISTS"))
            tx.execute(OLD_DDL[1].replace("CREATE INDEX", "CREATE INDEX IF NOT EXISTS"))
    with pytest.raises(Exception):  # nor write one
        with reopened.store.db.transaction() as tx:
            tx.execute("INSERT INTO sb_timers (todo_id, kind, due_at) VALUES ('td_x', 'lease', 1)")

    app = reopened.app
    app.complete(claimed, caller=caller)
    app.release(ancient, caller=caller)  # pending again: a spell, and its ring says its title
    (title, spell, due_at), = reopened.store.db.query(
        "SELECT title, spell, due_at FROM sb_claimable WHERE todo_id = %s", (ancient,))
    assert (title, due_at) == (app.get_todo(ancient, caller=caller)["title"], None) and spell is not None
    assert claimed not in live_rows(reopened)
    container_on(sb.make_container, sb.url, sb.clock).close()  # a second open finds nothing to move
    assert reopened.projector.verify() == []
