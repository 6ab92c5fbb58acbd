"""A store written before the live todos held their doorbell spells and due timers
(docs/adr/0036: `sb_doorbell` and `sb_timers` beside `sb_claimable`) opens with every row moved
into `sb_claimable`, the old tables and their tracking rows gone, and goes on as it was."""

from __future__ import annotations

from domain.names import TODO_PREFIX, parse_id
from tests.integration._support import CLI

OLD_DDL = (
    "CREATE TABLE sb_doorbell (todo_id TEXT PRIMARY KEY, endpoint_id TEXT NOT NULL, queue TEXT NOT NULL,"
    " source TEXT, kind TEXT, title TEXT NOT NULL, spell BIGINT, pending_since BIGINT)",
    "CREATE INDEX sb_doorbell_pending ON sb_doorbell (endpoint_id, pending_since) WHERE pending_since IS NOT NULL",
    "CREATE TABLE sb_timers (todo_id TEXT PRIMARY KEY, kind TEXT NOT NULL, due_at BIGINT NOT NULL)",
    "CREATE INDEX sb_timers_due ON sb_timers (due_at)",
)
MOVED = ("source", "kind", "title", "spell", "pending_since", "due_at")


def live_rows(store) -> list[tuple]:
    return sorted(store.db.query("SELECT * FROM sb_claimable"), key=repr)


def to_the_layout_before(store) -> None:
    """The tables as the build before wrote them: the doorbell's rows (none for a quarantined todo)
    and the due timers in tables of their own, `sb_claimable` with its five columns, and the two
    projections' tracking rows."""
    with store.db.transaction() as tx:
        for statement in OLD_DDL:
            tx.execute(statement)
        tx.execute("INSERT INTO sb_doorbell SELECT todo_id, endpoint_id, queue, source, kind, title, spell,"
                   " pending_since FROM sb_claimable WHERE queue <> 'quarantine'")
        tx.execute("INSERT INTO sb_timers SELECT todo_id, 'lease', due_at FROM sb_claimable WHERE due_at IS NOT NULL")
        tx.execute("DROP INDEX sb_claimable_pending")
        tx.execute("DROP INDEX sb_claimable_due")
        for column in MOVED:
            tx.execute(f"ALTER TABLE sb_claimable DROP COLUMN {column}")
        (position,), = tx.execute("SELECT position FROM sb_tracking WHERE name = 'claimable'")
        tx.execute("INSERT INTO sb_tracking (name, position) VALUES ('doorbell', %s), ('timers', %s)",
                   (position, position))


def test_an_older_store_moves_its_spells_and_timers_into_the_live_todos_and_goes_on(store_url, make_container):
    container = make_container(store_url)
    app, store = container.app, container.store
    app.ensure_admin()
    slug = app.vend("upgrade", queues=["work"], caller=CLI)["slug"]
    agent = app.endpoint_caller(slug)
    for n in range(6):
        app.push(slug, f"todo {n}", caller=CLI, payload={"n": n})
    app.push(slug, "later", caller=CLI, delay_seconds=600)  # a delay timer, no spell yet
    claimed = app.claim_next(caller=agent)["todo"]["id"]  # a lease timer
    failed = app.claim_next(caller=agent)["todo"]["id"]
    app.fail(failed, caller=agent, summary="flaky")  # a retry timer
    snoozed = app.claim_next(caller=agent)["todo"]["id"]
    app.release(snoozed, caller=agent, delay_seconds=600)  # a snooze timer
    done = app.claim_next(caller=agent)["todo"]["id"]
    app.complete(done, caller=agent)  # no row
    before = live_rows(store)
    assert len(before) == 6 and sum(1 for row in before if row[-1] is not None) == 4  # four clocks running
    due, pending = store.db.query("SELECT min(due_at) FROM sb_claimable")[0][0], \
        store.db.query("SELECT count(*) FROM sb_claimable WHERE pending_since IS NOT NULL")[0][0]
    assert pending == 2  # the two never claimed
    to_the_layout_before(store)
    container.close()

    reopened = make_container(store_url)
    store = reopened.store
    assert live_rows(store) == before
    tables = ("SELECT name FROM sqlite_master WHERE type = 'table'" if store_url.startswith("sqlite")
              else "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")
    assert not {"sb_doorbell", "sb_timers"} & {row[0] for row in store.db.query(tables)}
    assert not store.db.query("SELECT name FROM sb_tracking WHERE name IN ('doorbell', 'timers')")
    assert reopened.projector.verify() == []  # a rebuild from the log agrees with what was moved
    assert reopened.views.next_due() is not None and int(reopened.views.next_due().timestamp() * 1e6) == due

    app = reopened.app
    agent = app.endpoint_caller(slug)
    app.complete(claimed, caller=agent)
    taken = app.claim_next(caller=agent)["todo"]["id"]
    assert taken not in (claimed, failed, snoozed, done)
    assert store.db.query("SELECT due_at IS NOT NULL, pending_since FROM sb_claimable WHERE todo_id = %s",
                          (taken,)) == [(True, None)]
    assert not store.db.query("SELECT 1 FROM sb_claimable WHERE todo_id = %s", (claimed,))
    assert parse_id(TODO_PREFIX, taken)
    make_container(store_url).close()  # a second open finds nothing to move
    assert reopened.projector.verify() == []
