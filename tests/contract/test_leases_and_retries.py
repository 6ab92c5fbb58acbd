"""Leases, backoff, dead letters and fences (CONTRACT §6), under a manual clock."""

from __future__ import annotations

import pytest

from domain.errors import Conflict, InvalidArgument

from .harness import CLI, agent, when

DAY = 86400


def lease_of(sb, todo) -> float:
    """Seconds from now to the todo's lease expiry."""
    return (when(todo["lease_expires_at"]) - sb.clock.now()).total_seconds()


# --- lease length ---------------------------------------------------------------------------


def test_an_absent_or_non_positive_lease_is_300_seconds(sb):
    vended = sb.vend("worker")
    for ttl in (None, 0, -5, 0.0):
        todo = sb.push(vended)
        sb.tick(7)

        claimed = sb.app.claim(todo["id"], caller=agent(vended), lease_ttl_seconds=ttl)

        assert when(claimed["lease_expires_at"]) == sb.later(300), ttl


def test_the_default_lease_is_the_one_set_at_vend(sb):
    vended = sb.vend("worker", default_lease_seconds=120)
    sb.push(vended)
    sb.tick(7)

    claimed = sb.app.claim_next(caller=agent(vended))["todo"]
    assert when(claimed["lease_expires_at"]) == sb.later(120)

    sb.tick(60)
    beat = sb.app.heartbeat(claimed["id"], caller=agent(vended))
    assert when(beat["lease_expires_at"]) == sb.later(120)

    for ttl in (0, -1):
        todo = sb.push(vended)
        assert when(sb.app.claim(todo["id"], caller=agent(vended), lease_ttl_seconds=ttl)["lease_expires_at"]) \
            == sb.later(120)


def test_set_default_lease_applies_to_later_claims_and_refuses_out_of_range(sb):
    vended = sb.vend("worker")
    first, second = sb.push(vended), sb.push(vended)

    view = sb.app.set_default_lease(vended["slug"], 900, caller=CLI)
    assert view == {"default_lease_ttl_seconds": 900, "effective_lease_ttl_seconds": 900}
    assert when(sb.app.claim(first["id"], caller=agent(vended))["lease_expires_at"]) == sb.later(900)

    for bad in (59, 86401, 0):
        with pytest.raises(InvalidArgument):
            sb.app.set_default_lease(vended["slug"], bad, caller=CLI)
    assert sb.app.set_default_lease(vended["slug"], None, caller=CLI)["effective_lease_ttl_seconds"] == 300
    assert when(sb.app.claim(second["id"], caller=agent(vended))["lease_expires_at"]) == sb.later(300)


def test_a_requested_lease_is_taken_up_to_a_day_and_clamped_above(sb):
    vended = sb.vend("worker", default_lease_seconds=120)
    for ttl, expected in [(45, 45), (3600, 3600), (DAY, DAY), (DAY + 1, DAY), (10**9, DAY)]:
        todo = sb.push(vended)

        claimed = sb.app.claim(todo["id"], caller=agent(vended), lease_ttl_seconds=ttl)
        assert lease_of(sb, claimed) == expected, ttl

        sb.tick(5)
        beat = sb.app.heartbeat(todo["id"], caller=agent(vended), lease_ttl_seconds=ttl)
        assert lease_of(sb, beat) == expected, ttl


# --- lapsed leases --------------------------------------------------------------------------


def test_a_lapsed_lease_is_expired_by_the_timers_and_the_todo_is_pending_again(sb):
    vended = sb.vend("worker")
    todo = sb.push(vended)
    sb.app.claim(todo["id"], caller=agent(vended), lease_ttl_seconds=60)

    sb.tick(59)
    assert sb.fire_due() == 0
    assert sb.todo(todo["id"])["state"] == "claimed"

    sb.tick(1)
    assert sb.container.views.due_timers(sb.clock.now(), 10) == [todo["id"]]
    assert sb.app.fire_timers([todo["id"]]) == 1

    row = sb.todo(todo["id"])
    assert (row["state"], row["owner"], row["lease_expires_at"], row["attempt"]) == ("pending", None, None, 1)
    assert row["prior_attempts"][0]["outcome"] == "lease_expired"
    assert sb.app.fire_timers([todo["id"]]) == 0
    assert sb.app.claim_next(caller=agent(vended))["todo"]["attempt"] == 2


def test_the_holder_cannot_act_once_its_lease_has_lapsed(sb):
    vended = sb.vend("worker")
    todo = sb.push(vended)
    sb.app.claim(todo["id"], caller=agent(vended), lease_ttl_seconds=60)
    sb.tick(60)

    for verb in (sb.app.heartbeat, sb.app.complete, sb.app.fail, sb.app.release):
        with pytest.raises(Conflict):
            verb(todo["id"], caller=agent(vended))


def test_a_lapsed_lease_on_the_fifth_attempt_dead_letters(sb):
    vended = sb.vend("worker")
    todo = sb.push(vended)
    for attempt in range(1, 6):
        claimed = sb.app.claim(todo["id"], caller=agent(vended), lease_ttl_seconds=60)
        assert claimed["attempt"] == attempt
        sb.tick(60)
        assert sb.fire_due() == 1

    row = sb.todo(todo["id"])
    assert (row["state"], row["dead_letter"], row["next_retry_at"]) == ("failed", True, None)
    assert sb.app.claim_next(caller=agent(vended)) == {"empty": True}


# --- failures, backoff, dead letters --------------------------------------------------------


def test_fail_schedules_the_retry_after_30_60_120_240_seconds(sb):
    vended = sb.vend("worker")
    todo = sb.push(vended)

    for delay in (30, 60, 120, 240):
        sb.app.claim_next(caller=agent(vended))
        sb.tick(3)
        row = sb.app.fail(todo["id"], caller=agent(vended), summary="flaky")
        assert (row["state"], row["dead_letter"]) == ("failed", False)
        assert when(row["next_retry_at"]) == sb.later(delay)

        sb.tick(delay - 1)
        assert sb.fire_due() == 0
        assert sb.app.claim_next(caller=agent(vended)) == {"empty": True}
        sb.tick(1)
        assert sb.fire_due() == 1
        requeued = sb.todo(todo["id"])
        assert (requeued["state"], requeued["next_retry_at"]) == ("pending", None)


def test_a_due_retry_is_claimable_before_the_timers_requeue_it_and_keeps_its_age(sb):
    vended = sb.vend("worker")
    todo = sb.push(vended)
    sb.app.claim(todo["id"], caller=agent(vended))
    sb.app.fail(todo["id"], caller=agent(vended))
    sb.tick()
    newer = sb.push(vended)

    with pytest.raises(Conflict):
        sb.app.claim(todo["id"], caller=agent(vended))
    sb.tick(29)

    claimed = sb.app.claim_next(caller=agent(vended))["todo"]
    assert (claimed["id"], claimed["attempt"], claimed["next_retry_at"]) == (todo["id"], 2, None)
    assert sb.app.claim_next(caller=agent(vended))["todo"]["id"] == newer["id"]


def test_the_fifth_failed_attempt_dead_letters(sb):
    vended = sb.vend("worker")
    todo = sb.push(vended)

    sb.fail_until_dead(vended, todo["id"])

    row = sb.todo(todo["id"])
    assert (row["state"], row["dead_letter"], row["next_retry_at"], row["attempt"]) == ("failed", True, None, 5)
    assert [a["outcome"] for a in row["prior_attempts"]] == ["failed"] * 5
    assert [a["seq"] for a in row["prior_attempts"]] == [5, 4, 3, 2, 1]


def test_a_dead_letter_is_never_claimed(sb):
    vended = sb.vend("worker")
    dead = sb.push(vended)
    sb.fail_until_dead(vended, dead["id"])

    sb.tick(86400)
    assert sb.fire_due() == 0
    assert sb.app.fire_timers([dead["id"]]) == 0
    assert sb.app.claim_next(caller=agent(vended)) == {"empty": True}
    with pytest.raises(Conflict):
        sb.app.claim(dead["id"], caller=agent(vended))

    fresh = sb.push(vended)
    assert sb.app.claim_next(caller=agent(vended))["todo"]["id"] == fresh["id"]
    assert sb.app.claim_next(caller=agent(vended)) == {"empty": True}


def test_operator_retry_revives_a_dead_letter_with_a_fresh_budget(sb):
    vended = sb.vend("worker")
    todo = sb.push(vended)
    sb.fail_until_dead(vended, todo["id"])

    row = sb.app.retry(todo["id"], caller=CLI)

    assert (row["state"], row["attempt"], row["dead_letter"], row["next_retry_at"]) == ("pending", 0, False, None)
    claimed = sb.app.claim_next(caller=agent(vended))["todo"]
    assert (claimed["id"], claimed["attempt"], claimed["attempt_seq"]) == (todo["id"], 1, 6)
    sb.app.fail(todo["id"], caller=agent(vended))
    assert sb.todo(todo["id"])["dead_letter"] is False


def test_operator_retry_makes_a_todo_awaiting_its_retry_pending_at_once(sb):
    vended = sb.vend("worker")
    todo = sb.push(vended)
    sb.app.claim(todo["id"], caller=agent(vended))
    sb.app.fail(todo["id"], caller=agent(vended))

    row = sb.app.retry(todo["id"], caller=CLI)

    assert (row["state"], row["attempt"], row["next_retry_at"]) == ("pending", 0, None)
    assert sb.fire_due() == 0
    assert sb.app.claim_next(caller=agent(vended))["todo"]["id"] == todo["id"]


def test_operator_retry_of_a_todo_that_has_not_failed_is_a_conflict(sb):
    vended = sb.vend("worker")
    todo = sb.push(vended)

    with pytest.raises(Conflict):
        sb.app.retry(todo["id"], caller=CLI)
    sb.app.claim(todo["id"], caller=agent(vended))
    with pytest.raises(Conflict):
        sb.app.retry(todo["id"], caller=CLI)


# --- fences ---------------------------------------------------------------------------------


def test_a_fenced_claim_returns_a_lease_token(sb):
    vended = sb.vend("worker")
    sb.push(vended)
    sb.tick()
    second = sb.push(vended)

    fenced = sb.app.claim_next(caller=agent(vended), require_fence=True)["todo"]
    by_id = sb.app.claim(second["id"], caller=agent(vended), require_fence=True)

    assert isinstance(fenced["lease_token"], str) and len(fenced["lease_token"]) >= 16
    assert by_id["lease_token"] != fenced["lease_token"]
    assert "lease_token" not in sb.todo(second["id"])


def test_a_fenced_lease_refuses_calls_without_its_token(sb):
    vended = sb.vend("worker")
    todo = sb.app.claim(sb.push(vended)["id"], caller=agent(vended), require_fence=True)

    for verb in (sb.app.heartbeat, sb.app.complete, sb.app.fail, sb.app.release):
        with pytest.raises(Conflict):
            verb(todo["id"], caller=agent(vended))
        with pytest.raises(Conflict):
            verb(todo["id"], caller=agent(vended), lease_token=todo["lease_token"] + "x")
    assert sb.todo(todo["id"])["state"] == "claimed"


def test_a_fenced_lease_accepts_its_token(sb):
    vended = sb.vend("worker")
    todo = sb.app.claim(sb.push(vended)["id"], caller=agent(vended), require_fence=True)
    token = todo["lease_token"]

    sb.app.heartbeat(todo["id"], caller=agent(vended), lease_token=token)
    done = sb.app.complete(todo["id"], caller=agent(vended), lease_token=token)

    assert done["state"] == "done"


def test_a_new_claim_gets_a_new_token_and_the_old_one_stops_working(sb):
    vended = sb.vend("worker")
    todo = sb.app.claim(sb.push(vended)["id"], caller=agent(vended), require_fence=True, lease_ttl_seconds=60)
    sb.tick(60)
    sb.fire_due()
    again = sb.app.claim(todo["id"], caller=agent(vended), require_fence=True)

    with pytest.raises(Conflict):
        sb.app.complete(todo["id"], caller=agent(vended), lease_token=todo["lease_token"])
    assert sb.app.complete(todo["id"], caller=agent(vended), lease_token=again["lease_token"])["state"] == "done"
