"""Several processes on one store (CONTRACT §11 'Other processes', §6 concurrent claimers)."""

from __future__ import annotations

import threading

import pytest

from domain.errors import Conflict, Forbidden

from .harness import CLI, agent, unique


def test_a_second_process_sees_todos_pushed_by_the_first(sb):
    other = sb.another_process().app
    vended = sb.vend("worker")
    assert other.list_todos(caller=CLI) == []

    pushed = []
    for _ in range(3):
        pushed.append(sb.push(vended)["id"])
        sb.tick()

    assert [r["id"] for r in other.list_todos(caller=CLI)] == pushed[::-1]
    assert [r["id"] for r in other.list_todos(caller=agent(vended))] == pushed[::-1]
    assert other.authenticate_endpoint(vended["credential"]).slug == vended["slug"]
    claimed = other.claim_next(caller=agent(vended))["todo"]
    assert claimed["id"] == pushed[0]
    assert [r["state"] for r in sb.app.list_todos(caller=CLI)] == ["pending", "pending", "claimed"]


def test_a_lease_taken_in_one_process_is_honoured_by_the_other(sb):
    other = sb.another_process().app
    vended = sb.vend("worker")
    todo = sb.push(vended)["id"]
    sb.app.get_todo(todo, caller=CLI)

    claimed = other.claim(todo, caller=agent(vended), lease_ttl_seconds=60, require_fence=True)
    sb.tick(30)
    sb.app.heartbeat(todo, caller=agent(vended), lease_token=claimed["lease_token"])
    sb.tick(45)
    assert other.fire_timers([todo]) == 0
    sb.app.complete(todo, caller=agent(vended), lease_token=claimed["lease_token"])

    assert other.get_todo(todo, caller=CLI)["state"] == "done"


def test_two_processes_taking_turns_never_claim_the_same_todo(sb):
    other = sb.another_process().app
    vended = sb.vend("worker")
    pushed = []
    for n in range(6):
        pushed.append((sb.app if n % 2 else other).push(vended["slug"], "t", caller=CLI)["todo"]["id"])
        sb.tick()

    claimed = []
    for app in [sb.app, other] * 4:
        answer = app.claim_next(caller=agent(vended))
        if not answer["empty"]:
            claimed.append(answer["todo"]["id"])

    assert claimed == pushed


def test_concurrent_claimers_in_two_processes_never_get_the_same_todo(sb):
    other = sb.another_process().app
    vended = sb.vend("worker", queues=[unique("a"), unique("b")])
    pushed = {sb.push(vended, queue=vended["queues"][n % 2])["id"] for n in range(24)}
    claims: list[str] = []
    errors: list[Exception] = []
    start = threading.Barrier(8)

    def drain(app):
        start.wait()
        try:
            while not (answer := app.claim_next(caller=agent(vended)))["empty"]:
                claims.append(answer["todo"]["id"])
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=drain, args=(app,)) for app in [sb.app, other] * 4]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    assert errors == []
    assert len(claims) == len(set(claims)) == len(pushed)
    assert set(claims) == pushed


def test_a_key_pushed_in_one_process_is_honoured_in_the_other(sb):
    other = sb.another_process().app
    vended = sb.vend("worker")
    key = unique("key")
    first = sb.app.push(vended["slug"], "keyed", caller=CLI, key=key)["todo"]["id"]

    again = other.push(vended["slug"], "keyed", caller=CLI, key=key)
    assert (again["created"], again["todo"]["id"]) == (False, first)

    other.claim(first, caller=agent(vended))
    other.complete(first, caller=agent(vended))
    renewed = sb.app.push(vended["slug"], "keyed", caller=CLI, key=key)
    assert renewed["created"] is True and renewed["todo"]["id"] != first
    assert other.push(vended["slug"], "keyed", caller=CLI, key=key)["todo"]["id"] == renewed["todo"]["id"]


def test_projections_verify_clean_after_both_processes_wrote(sb):
    second = sb.another_process()
    vended = sb.vend("worker")
    for n in range(6):
        app = sb.app if n % 2 else second.app
        todo = app.push(vended["slug"], "t", caller=CLI)["todo"]["id"]
        (second.app if n % 2 else sb.app).claim(todo, caller=agent(vended))
        if n % 3 == 0:
            app.complete(todo, caller=agent(vended))
        sb.tick()
    sb.app.list_todos(caller=CLI)

    assert sb.container.projector.verify() == []
    assert second.projector.verify() == []


def test_a_stale_copy_in_one_process_never_overrides_the_other(sb):
    second = sb.another_process().app
    vended = sb.vend("worker")
    todo = sb.push(vended)["id"]
    sb.app.claim(todo, caller=agent(vended), lease_ttl_seconds=60)  # this process now holds a copy
    second.complete(todo, caller=agent(vended), summary="finished over there")

    with pytest.raises(Conflict):
        sb.app.heartbeat(todo, caller=agent(vended))
    with pytest.raises(Conflict):
        sb.app.release(todo, caller=agent(vended))
    sb.tick(60)
    assert sb.app.fire_timers([todo]) == 0
    assert sb.app.claim_next(caller=agent(vended)) == {"empty": True}
    final = sb.todo(todo)
    assert (final["state"], final["prior_attempts"][0]["summary"]) == ("done", "finished over there")


def test_a_revoke_in_one_process_takes_effect_in_the_other_at_once(sb):
    second = sb.another_process().app
    vended = sb.vend("worker")
    sb.push(vended)
    assert sb.app.authenticate_endpoint(vended["credential"]) is not None

    second.revoke(vended["slug"], caller=CLI)

    assert sb.app.authenticate_endpoint(vended["credential"]) is None
    with pytest.raises(Forbidden):
        sb.app.claim_next(caller=agent(vended))
    with pytest.raises(Conflict):
        sb.push(vended)


def test_a_known_credential_is_not_resolved_again_while_its_endpoint_is_unchanged(sb):
    vended = sb.vend("worker")
    assert sb.app.authenticate_endpoint(vended["credential"]) is not None
    store = sb.container.store
    loads = []
    real_load = store.load
    store.load = lambda cls, aggregate_id: loads.append(aggregate_id) or real_load(cls, aggregate_id)
    try:
        for _ in range(3):
            assert sb.app.authenticate_endpoint(vended["credential"]).slug == vended["slug"]
    finally:
        del store.load
    assert loads == []  # one version look-up per call, no replay of the endpoint's stream


def test_an_endpoint_changed_by_another_process_is_seen_at_the_next_authentication(sb):
    second = sb.another_process().app
    vended = sb.vend("worker")
    for _ in range(2):
        assert sb.app.authenticate_endpoint(vended["credential"]).default_lease_seconds is None

    second.set_default_lease(vended["slug"], 600, caller=CLI)
    assert sb.app.authenticate_endpoint(vended["credential"]).default_lease_seconds == 600

    second.revoke(vended["slug"], caller=CLI)
    assert sb.app.authenticate_endpoint(vended["credential"]) is None
    assert sb.app.authenticate_endpoint(vended["credential"]) is None  # and stays refused


def test_an_endpoint_expiring_is_refused_though_its_credential_is_known(sb):
    vended = sb.vend("worker", ttl_seconds=60)
    assert sb.app.authenticate_endpoint(vended["credential"]) is not None
    sb.tick(60)
    assert sb.app.authenticate_endpoint(vended["credential"]) is None
