"""Read models (CONTRACT §2 `projections rebuild [--verify]`): rebuilt from the log, they agree."""

from __future__ import annotations

from .harness import CLI, agent, mixed_workload


def snapshot(sb):
    return (
        sb.app.list_todos(caller=CLI, limit=1000),
        sb.app.list_endpoints(caller=CLI),
        sb.container.views.queue_counts(),
        sb.container.views.due_timers(sb.later(10**7), 1000),
    )


def test_verify_finds_no_difference_after_a_mixed_workload(sb):
    mixed_workload(sb)
    sb.container.projector.catch_up()

    assert sb.container.projector.verify() == []
    assert set(sb.container.projector.lag().values()) == {0}


def test_rebuild_reproduces_the_same_read_models(sb):
    mixed_workload(sb)
    before = snapshot(sb)
    assert len(before[0]) == 12

    counts = sb.container.projector.rebuild()

    assert set(counts.values()) == {max(counts.values())} and max(counts.values()) > 0
    assert sb.container.projector.verify() == []
    assert snapshot(sb) == before


def test_a_rebuild_over_many_pages_reproduces_the_same_read_models(sb, monkeypatch):
    """A page's ops are coalesced across events (PostgreSQL): a todo's events split over pages,
    and rows named again in the next page, must come out as a rebuild in one page would."""
    from interfaces.store import projector as module

    mixed_workload(sb)
    sb.container.projector.catch_up()
    before = snapshot(sb)
    monkeypatch.setattr(module, "PAGE", 7)

    counts = sb.container.projector.rebuild()

    assert max(counts.values()) > 7 * 3
    assert sb.container.projector.verify() == []
    assert snapshot(sb) == before


def test_claims_work_on_rebuilt_read_models(sb):
    vended = sb.vend("worker")
    first = sb.push(vended)["id"]
    sb.tick()
    second = sb.push(vended)["id"]
    sb.app.claim(first, caller=agent(vended), lease_ttl_seconds=60)

    sb.container.projector.rebuild()

    assert sb.app.claim_next(caller=agent(vended))["todo"]["id"] == second
    sb.tick(60)
    assert sb.fire_due() == 1
    assert sb.app.claim_next(caller=agent(vended))["todo"]["id"] == first
    assert sb.app.authenticate_endpoint(vended["credential"]).slug == vended["slug"]


def test_a_projection_behind_the_others_catches_up_without_moving_them_back(sb, monkeypatch):
    """As when a new projection joins a database with a long log: it starts at 0, the others at
    the head, and pages of the log are read from the lowest position."""
    from interfaces.store import projector as module

    mixed_workload(sb)
    projector = sb.container.projector
    projector.catch_up()
    head = max(projector.positions().values())
    before = snapshot(sb)
    with sb.container.store.db.transaction() as tx:
        tx.execute("DELETE FROM sb_todo_rows")
        tx.execute("UPDATE sb_tracking SET position = 0 WHERE name = 'todo_rows'")
    assert projector.positions()["todo_rows"] == 0
    monkeypatch.setattr(module, "PAGE", 5)  # several pages, each below the others' position

    projector.catch_up()

    assert set(projector.positions().values()) == {head}
    assert projector.verify() == []  # nothing applied twice (counters), nothing missed (todo rows)
    assert snapshot(sb) == before


def test_verify_names_each_read_model_that_differs_from_the_log_at_its_own_position(sb):
    mixed_workload(sb)
    projector = sb.container.projector
    projector.catch_up()
    with sb.container.store.db.transaction() as tx:
        tx.execute("UPDATE sb_todo_rows SET title = 'tampered' WHERE todo_id = "
                   "(SELECT min(todo_id) FROM sb_todo_rows)")
        # the claimable read model left at an earlier position, with its rows as they were there:
        # nothing differs for it (it is compared with the log up to its own position)
        tx.execute("DELETE FROM sb_claimable")
        tx.execute("UPDATE sb_tracking SET position = 0 WHERE name = 'claimable'")
    todo_id, title = sb.container.store.db.query(
        "SELECT todo_id, title FROM sb_todo_rows WHERE title = 'tampered'")[0]

    differences = projector.verify()

    assert [(d.projection, d.table) for d in differences] == [("todo_rows", "sb_todo_rows")]
    (found,) = differences
    assert [row for row in found.unexpected if todo_id in row and title in row]
    assert len(found.missing) == len(found.unexpected) == 1 and todo_id in found.missing[0]
    assert projector.positions()["claimable"] == 0
    projector.catch_up()  # the tampered row stays until a rebuild
    assert [d.table for d in projector.verify()] == ["sb_todo_rows"]
    projector.rebuild()
    assert projector.verify() == [] and sb.container.store.db.query("SELECT count(*) FROM sb_claimable")[0][0] > 0
