"""Queue controls and admission: given controls and a queue's load, when a claim, then admitted or why not."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from uuid import UUID

import pytest

from domain.endpoint import Endpoint, QueueControlsSet, credential_hash
from domain.errors import Conflict, InvalidArgument
from domain.queue import (
    MAX_IN_FLIGHT, NO_CONTROLS, PAUSED, RATE_LIMITED, QueueControls, QueueRefused, Refusal, admission,
    check_delay_seconds, check_max_claims_per_minute, check_max_in_flight, parse_delay, soonest,
)

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
OPERATOR = "operator:admin"


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def vended() -> Endpoint:
    endpoint = Endpoint.vend(
        id=UUID("00000000-0000-4000-8000-0000000000e1"), now=T0, actor=OPERATOR, slug="worker-ab12",
        agent="Worker", owner="admin", credential_sha256=credential_hash("sbk_x"), queues=["builds", "deploys"],
    )
    return Endpoint.replay(endpoint.collect_events())


# --- the controls themselves ------------------------------------------------------------------


def test_a_queue_without_controls_admits_every_claim():
    assert not NO_CONTROLS.controlled
    assert admission(NO_CONTROLS, in_flight=10**6, recent_claims=[T0] * 1000, now=T0) is None


@pytest.mark.parametrize("limits", [
    {"max_in_flight": 0}, {"max_in_flight": 10_001}, {"max_in_flight": True}, {"max_in_flight": 2.5},
    {"max_claims_per_minute": 0}, {"max_claims_per_minute": 100_001}, {"max_claims_per_minute": "30"},
    {"paused": "yes"},
])
def test_limits_out_of_range_are_invalid_arguments(limits):
    with pytest.raises(InvalidArgument):
        QueueControls(**limits)


def test_the_extreme_limits_are_accepted():
    assert QueueControls(max_in_flight=1, max_claims_per_minute=1).controlled
    assert QueueControls(max_in_flight=10_000, max_claims_per_minute=100_000).controlled


def test_a_limit_out_of_range_is_refused_under_the_name_its_caller_gives_it():
    """The API's name by default; the board's form its label."""
    with pytest.raises(InvalidArgument, match=r"^max_in_flight must be within 1\.\.10000 \(or none: no limit\)$"):
        QueueControls(max_in_flight=0)
    with pytest.raises(InvalidArgument, match=r"^max_claims_per_minute must be within 1\.\.100000 "):
        QueueControls(max_claims_per_minute=100_001)
    with pytest.raises(InvalidArgument, match=r"^max in flight must be within 1\.\.10000 "):
        check_max_in_flight(10_001, name="max in flight")
    with pytest.raises(InvalidArgument, match=r"^claims per minute must be within 1\.\.100000 "):
        check_max_claims_per_minute(0, name="claims per minute")
    assert check_max_in_flight(None) is None and check_max_claims_per_minute(30) == 30


# --- admission --------------------------------------------------------------------------------


def test_a_paused_queue_admits_nothing_and_says_so_without_a_time():
    refusal = admission(QueueControls(paused=True), in_flight=0, recent_claims=[], now=T0)
    assert refusal == Refusal(PAUSED)
    assert refusal.retry_after_seconds is None


def test_a_queue_at_max_in_flight_refuses_until_a_claim_ends():
    controls = QueueControls(max_in_flight=3)
    assert admission(controls, in_flight=2, recent_claims=[], now=T0) is None
    assert admission(controls, in_flight=3, recent_claims=[], now=T0) == Refusal(MAX_IN_FLIGHT)
    assert admission(controls, in_flight=7, recent_claims=[], now=T0).reason == MAX_IN_FLIGHT  # lowered below


def test_the_rate_counts_the_claims_of_the_last_60_seconds_only():
    controls = QueueControls(max_claims_per_minute=3)
    claims = [at(0), at(10), at(20)]
    refusal = admission(controls, in_flight=0, recent_claims=claims, now=at(30))
    assert refusal.reason == RATE_LIMITED
    assert refusal.retry_after == timedelta(seconds=30)  # the claim at 0 leaves the window at 60
    assert refusal.retry_after_seconds == 30
    assert admission(controls, in_flight=0, recent_claims=claims, now=at(59.999)).reason == RATE_LIMITED
    assert admission(controls, in_flight=0, recent_claims=claims, now=at(60)) is None


def test_the_rate_window_never_holds_more_than_the_rate():
    """Claims admitted one after another, as fast as admission allows, over ten minutes."""
    controls, claims, now = QueueControls(max_claims_per_minute=30), [], T0
    while now < at(600):
        refusal = admission(controls, in_flight=0, recent_claims=claims, now=now)
        if refusal is None:
            claims.append(now)
            now += timedelta(milliseconds=250)
        else:
            now += refusal.retry_after
    for start in claims:
        assert sum(1 for c in claims if start <= c < start + timedelta(seconds=60)) <= 30
    assert len(claims) >= 30 * 10  # and the budget is used: 30 a minute


def test_retry_after_rounds_up_to_whole_seconds():
    refusal = admission(QueueControls(max_claims_per_minute=1), in_flight=0, recent_claims=[at(0)], now=at(59.2))
    assert refusal.retry_after_seconds == 1


def test_paused_wins_over_the_other_reasons():
    controls = QueueControls(paused=True, max_in_flight=1, max_claims_per_minute=1)
    assert admission(controls, in_flight=5, recent_claims=[T0], now=T0).reason == PAUSED


def test_the_refusal_that_ends_soonest_is_a_known_time_then_max_in_flight_then_a_pause():
    paused, full = Refusal(PAUSED), Refusal(MAX_IN_FLIGHT, limit=2, load=2)
    later, sooner = Refusal(RATE_LIMITED, timedelta(seconds=50)), Refusal(RATE_LIMITED, timedelta(seconds=5))
    assert soonest([paused, later, full, sooner]) is sooner
    assert soonest([paused, full]) is full
    assert soonest([paused]) is paused


def test_a_refused_claim_is_a_conflict_naming_its_reason():
    error = Refusal(MAX_IN_FLIGHT).conflict("td_1", "builds")
    assert isinstance(error, Conflict) and isinstance(error, QueueRefused)
    assert error.code == "conflict"
    assert str(error).startswith("max_in_flight: queue builds")
    assert "retry after 30 s" in str(Refusal(RATE_LIMITED, timedelta(seconds=29.5)).conflict("td_1", "builds"))


def test_a_refused_claim_names_the_limit_that_refused_it():
    """It said "queue builds has max_in_flight todos claimed", a placeholder's words, not a count."""
    over = admission(QueueControls(max_in_flight=3), in_flight=5, recent_claims=[], now=T0)  # lowered on a busy queue
    assert str(over.conflict("td_1", "builds")) == (
        "max_in_flight: queue builds has 5 todos claimed (max_in_flight 3), todo td_1 not claimable now")
    rated = admission(QueueControls(max_claims_per_minute=2), in_flight=0, recent_claims=[T0, T0], now=T0)
    assert str(rated.conflict("td_1", "builds")) == (
        "rate_limited: queue builds had 2 claims in the last 60 s (max_claims_per_minute 2), todo td_1 not"
        " claimable now; retry after 60 s")


def test_a_refusal_counts_one_todo_or_claim_in_the_singular():
    """It said "has 1 todos claimed" and "had 1 claims"."""
    one = admission(QueueControls(max_in_flight=1), in_flight=1, recent_claims=[], now=T0)
    assert one.words == "has 1 todo claimed (max_in_flight 1)"
    assert str(one.conflict("td_1", "builds")) == (
        "max_in_flight: queue builds has 1 todo claimed (max_in_flight 1), todo td_1 not claimable now")
    rated = admission(QueueControls(max_claims_per_minute=1), in_flight=0, recent_claims=[T0], now=at(10))
    assert rated.words == "had 1 claim in the last 60 s (max_claims_per_minute 1)"
    assert Refusal(MAX_IN_FLIGHT, limit=1, load=2).words == "has 2 todos claimed (max_in_flight 1)"


# --- the endpoint holds its queues' controls ----------------------------------------------------


def test_setting_controls_records_all_three_as_they_now_are():
    endpoint = vended()
    endpoint.set_queue_controls(now=at(1), actor=OPERATOR, queue="builds", max_in_flight=3)
    endpoint.set_queue_controls(now=at(2), actor=OPERATOR, queue="builds", paused=True)
    first, second = endpoint.collect_events()
    assert isinstance(second, QueueControlsSet)
    assert (second.queue, second.paused, second.max_in_flight, second.max_claims_per_minute) == ("builds", True, 3, None)
    assert (second.actor, second.cause) == (OPERATOR, "set_queue_controls")
    assert endpoint.controls_of("builds") == QueueControls(paused=True, max_in_flight=3)
    assert endpoint.controls_of("deploys") == NO_CONTROLS


def test_controls_survive_replay():
    endpoint = vended()
    endpoint.set_queue_controls(now=at(1), actor=OPERATOR, queue="deploys", max_claims_per_minute=30)
    replayed = Endpoint.replay(
        [e for e in Endpoint.vend(
            id=UUID("00000000-0000-4000-8000-0000000000e1"), now=T0, actor=OPERATOR, slug="worker-ab12",
            agent="Worker", owner="admin", credential_sha256=credential_hash("sbk_x"), queues=["builds", "deploys"],
        ).collect_events()] + endpoint.collect_events()
    )
    assert replayed.controls_of("deploys") == QueueControls(max_claims_per_minute=30)


def test_none_removes_a_limit_and_resume_unpauses():
    endpoint = vended()
    endpoint.set_queue_controls(now=at(1), actor=OPERATOR, queue="builds", paused=True, max_in_flight=2)
    endpoint.set_queue_controls(now=at(2), actor=OPERATOR, queue="builds", paused=False, max_in_flight=None)
    assert endpoint.controls_of("builds") == NO_CONTROLS


def test_a_change_that_changes_nothing_records_nothing():
    endpoint = vended()
    endpoint.set_queue_controls(now=at(1), actor=OPERATOR, queue="builds", paused=False)
    assert endpoint.collect_events() == []


def test_controls_are_only_for_the_endpoints_own_queues():
    with pytest.raises(InvalidArgument):
        vended().set_queue_controls(now=at(1), actor=OPERATOR, queue="other", paused=True)


def test_a_revoked_endpoints_queues_take_no_controls():
    endpoint = vended()
    endpoint.revoke(now=at(1), actor=OPERATOR)
    with pytest.raises(Conflict):
        endpoint.set_queue_controls(now=at(2), actor=OPERATOR, queue="builds", paused=True)


def test_invalid_limits_record_nothing():
    endpoint = vended()
    with pytest.raises(InvalidArgument):
        endpoint.set_queue_controls(now=at(1), actor=OPERATOR, queue="builds", max_in_flight=0)
    assert endpoint.collect_events() == []


# --- delays ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "seconds"), [("10m", 600), ("30s", 30), ("2h", 7200), ("1d", 86400), (" 5 m ", 300)])
def test_a_delay_reads_as_a_number_and_a_unit(text, seconds):
    assert parse_delay(text) == timedelta(seconds=seconds)


@pytest.mark.parametrize("text", ["", "10", "m", "-5m", "1w", "1.5h"])
def test_a_delay_without_a_unit_or_number_is_refused(text):
    with pytest.raises(InvalidArgument):
        parse_delay(text)


@pytest.mark.parametrize("seconds", [-1, 86401, True, "60", float("nan"), float("inf")])
def test_a_snooze_is_0_to_86400_seconds(seconds):
    with pytest.raises(InvalidArgument):
        check_delay_seconds(seconds)


def test_a_snooze_of_zero_is_none():
    assert check_delay_seconds(0) is None and check_delay_seconds(None) is None
    assert check_delay_seconds(86400) == timedelta(days=1)
