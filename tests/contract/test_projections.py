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
        tx.execute("DELETE FROM sb_stored_deliveries")
        tx.execute("UPDATE sb_tracking SET position = 0 WHERE name = 'deliveries'")
    monkeypatch.setattr(module, "PAGE", 5)  # several pages, each below the others' position

    projector.catch_up()

    assert set(projector.positions().values()) == {head}
    assert projector.verify() == []  # nothing applied twice (counters), nothing missed (deliveries)
    assert snapshot(sb) == before
