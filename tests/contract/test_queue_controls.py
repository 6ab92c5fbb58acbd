"""Queue controls, delays and bulk retry (CONTRACT §13) through the application, on every store."""

from __future__ import annotations

from datetime import timedelta

import pytest

from application.errors import RetryLimitExceeded
from domain.errors import Conflict, InvalidArgument, NotFound
from domain.todo import Todo
from domain.names import TODO_PREFIX, parse_id

from .harness import CLI, agent, raised, unique, when


def pushed(sb, vended, n: int, **options) -> list[str]:
    """n todos pushed a second apart (so claim order is push order)."""
    ids = []
    for _ in range(n):
        ids.append(sb.push(vended, **options)["id"])
        sb.tick()
    return ids


def controlled(sb, **controls):
    vended = sb.vend("worker")
    queue = vended["queues"][0]
    sb.app.set_queue_controls(vended["slug"], queue, caller=CLI, **controls)
    return vended, queue


# --- pause -----------------------------------------------------------------------------------------


def test_a_paused_queue_hands_out_nothing_and_says_why(sb):
    vended, queue = controlled(sb, paused=True)
    todo = sb.push(vended)

    assert sb.app.claim_next(caller=agent(vended)) == {"empty": True, "reason": "paused"}
    assert sb.app.claim_next(caller=agent(vended), max_todos=5) == {"empty": True, "todos": [], "reason": "paused"}
    error = raised(lambda: sb.app.claim(todo["id"], caller=agent(vended)))
    assert isinstance(error, Conflict) and error.code == "conflict" and str(error).startswith("paused:")
    assert sb.todo(todo["id"])["state"] == "pending"  # todos keep arriving and waiting

    sb.app.set_queue_controls(vended["slug"], queue, caller=CLI, paused=False)
    assert sb.app.claim_next(caller=agent(vended))["todo"]["id"] == todo["id"]


def test_an_empty_paused_queue_answers_a_plain_empty(sb):
    vended, _ = controlled(sb, paused=True)
    assert sb.app.claim_next(caller=agent(vended)) == {"empty": True}


def test_a_paused_queue_does_not_hold_back_the_endpoints_other_queues(sb):
    vended = sb.vend("worker", queues=[unique("a"), unique("b")])
    held, free = vended["queues"]
    sb.app.set_queue_controls(vended["slug"], held, caller=CLI, paused=True)
    sb.push(vended, queue=held)
    sb.tick()
    other = sb.push(vended, queue=free)

    assert sb.app.claim_next(caller=agent(vended))["todo"]["id"] == other["id"]
    assert sb.app.claim_next(caller=agent(vended)) == {"empty": True, "reason": "paused"}


# --- max in flight ---------------------------------------------------------------------------------


def test_max_in_flight_caps_the_claimed_todos_of_a_queue(sb):
    vended, queue = controlled(sb, max_in_flight=2)
    todos = pushed(sb, vended, 4)

    first = sb.app.claim_next(caller=agent(vended))["todo"]
    sb.app.claim_next(caller=agent(vended))
    assert sb.app.claim_next(caller=agent(vended)) == {"empty": True, "reason": "max_in_flight"}
    assert "max_in_flight" in str(raised(lambda: sb.app.claim(todos[3], caller=agent(vended))))

    sb.app.complete(first["id"], caller=agent(vended))
    assert sb.app.claim_next(caller=agent(vended))["todo"]["id"] == todos[2]


def test_a_batch_claim_counts_every_todo_of_the_batch(sb):
    vended, _ = controlled(sb, max_in_flight=3)
    for _ in range(6):
        sb.push(vended)

    batch = sb.app.claim_next(caller=agent(vended), max_todos=5)
    assert len(batch["todos"]) == 3 and not batch["empty"]
    assert sb.app.claim_next(caller=agent(vended), max_todos=5) == {"empty": True, "todos": [], "reason": "max_in_flight"}


def test_a_limit_set_on_a_busy_queue_counts_what_is_already_claimed(sb):
    vended = sb.vend("worker")
    queue = vended["queues"][0]
    for _ in range(4):
        sb.push(vended)
    for _ in range(3):
        sb.app.claim_next(caller=agent(vended))

    sb.app.set_queue_controls(vended["slug"], queue, caller=CLI, max_in_flight=2)
    assert sb.app.claim_next(caller=agent(vended)) == {"empty": True, "reason": "max_in_flight"}
    assert sb.app.queue_controls(vended["slug"], caller=CLI)["queues"][0]["in_flight"] == 3


def test_a_lapsed_lease_or_a_release_frees_its_place(sb):
    vended, _ = controlled(sb, max_in_flight=1)
    for _ in range(3):
        sb.push(vended)
    sb.app.claim_next(caller=agent(vended), lease_ttl_seconds=60)
    assert sb.app.claim_next(caller=agent(vended))["reason"] == "max_in_flight"
    sb.tick(60)
    assert sb.fire_due() == 1
    again = sb.app.claim_next(caller=agent(vended))["todo"]
    assert sb.app.claim_next(caller=agent(vended))["reason"] == "max_in_flight"
    sb.app.release(again["id"], caller=agent(vended))
    assert not sb.app.claim_next(caller=agent(vended))["empty"]


def test_a_claim_admitted_on_stale_counts_cannot_commit(sb):
    """The store holds the commit itself to the limit: a command that claims past max_in_flight
    without asking (as one deciding on counts another process has since changed would) fails
    every attempt, and nothing of it is written."""
    vended, queue = controlled(sb, max_in_flight=1)
    first, second = sb.push(vended), sb.push(vended)
    sb.app.claim(first["id"], caller=agent(vended))
    store = sb.container.store

    def claim_past_the_limit(uow):
        todo = uow.get(Todo, parse_id(TODO_PREFIX, second["id"]))
        todo.claim(now=uow.now, holder=agent(vended).label, lease=timedelta(seconds=60),
                   admitted_under={"max_in_flight": 1, "max_claims_per_minute": None})

    assert isinstance(raised(lambda: store.run(claim_past_the_limit)), RetryLimitExceeded)
    assert sb.todo(second["id"])["state"] == "pending"


# --- rate ------------------------------------------------------------------------------------------


def test_the_rate_admits_that_many_claims_in_any_60_seconds(sb):
    vended, queue = controlled(sb, max_claims_per_minute=3)
    for _ in range(5):
        sb.push(vended)
    for _ in range(3):
        assert not sb.app.claim_next(caller=agent(vended))["empty"]
        sb.tick(10)

    refused = sb.app.claim_next(caller=agent(vended))
    assert refused == {"empty": True, "reason": "rate_limited", "retry_after_seconds": 30}
    sb.tick(29)
    assert sb.app.claim_next(caller=agent(vended))["reason"] == "rate_limited"
    sb.tick(1)
    assert not sb.app.claim_next(caller=agent(vended))["empty"]
    view = sb.app.queue_controls(vended["slug"], caller=CLI)["queues"][0]
    assert (view["in_flight"], view["claims_last_minute"]) == (4, 3)


def test_over_several_refusing_queues_the_answer_is_the_refusal_that_ends_soonest(sb):
    """One queue's reason with that queue's own time, never a pause with another queue's rate: a
    known time first (the rate), then max_in_flight (frees when a claim ends), then a pause (only
    an operator's resume ends it), whatever the order of the queues."""
    vended = sb.vend("worker", queues=[unique("a"), unique("b"), unique("c")])
    paused, full, rated = vended["queues"]
    sb.app.set_queue_controls(vended["slug"], paused, caller=CLI, paused=True)
    sb.app.set_queue_controls(vended["slug"], full, caller=CLI, max_in_flight=1)
    sb.app.set_queue_controls(vended["slug"], rated, caller=CLI, max_claims_per_minute=1)
    sb.push(vended, queue=paused)
    assert sb.app.claim_next(caller=agent(vended)) == {"empty": True, "reason": "paused"}
    for _ in range(2):
        sb.push(vended, queue=full)
    assert sb.app.claim_next(caller=agent(vended))["todo"]["queue"] == full
    assert sb.app.claim_next(caller=agent(vended)) == {"empty": True, "reason": "max_in_flight"}

    for _ in range(2):
        sb.push(vended, queue=rated)
    assert sb.app.claim_next(caller=agent(vended))["todo"]["queue"] == rated
    sb.tick(20)
    assert sb.app.claim_next(caller=agent(vended)) == {"empty": True, "reason": "rate_limited",
                                                       "retry_after_seconds": 40}
    assert sb.app.claim_next(caller=agent(vended), max_todos=5) == {
        "empty": True, "todos": [], "reason": "rate_limited", "retry_after_seconds": 40}


# --- the controls themselves -------------------------------------------------------------------------


def test_controls_are_listed_and_changed_one_setting_at_a_time(sb):
    vended = sb.vend("worker", queues=[unique("a"), unique("b")])
    a, b = vended["queues"]
    view = sb.app.set_queue_controls(vended["slug"], a, caller=CLI, max_in_flight=5)
    assert view == {"queue": a, "paused": False, "max_in_flight": 5, "max_claims_per_minute": None,
                    "in_flight": 0, "claims_last_minute": None}  # counted only under a rate
    sb.app.set_queue_controls(vended["slug"], a, caller=CLI, max_claims_per_minute=30)
    listed = sb.app.queue_controls(vended["slug"], caller=CLI)
    assert listed["endpoint_id"] == vended["endpoint_id"]
    assert [(q["queue"], q["max_in_flight"], q["max_claims_per_minute"]) for q in listed["queues"]] == [
        (a, 5, 30), (b, None, None)]
    sb.app.set_queue_controls(vended["slug"], a, caller=CLI, max_in_flight=None)
    assert sb.app.queue_controls(vended["slug"], caller=CLI)["queues"][0]["max_in_flight"] is None


def test_every_change_is_an_event_with_actor_and_cause(sb):
    vended, queue = controlled(sb, paused=True)
    sb.app.set_queue_controls(vended["slug"], queue, caller=CLI, paused=False, max_in_flight=3)
    changes = [r for r in sb.app.audit() if r["type"] == "QueueControlsSet" and r["aggregate"] == vended["endpoint_id"]]
    assert [(r["actor"], r["cause"], r["data"]["paused"], r["data"]["max_in_flight"]) for r in changes] == [
        ("operator:cli", "set_queue_controls", True, None), ("operator:cli", "set_queue_controls", False, 3)]


@pytest.mark.parametrize("change", [{"max_in_flight": 0}, {"max_in_flight": 10001}, {"max_claims_per_minute": 0},
                                    {"max_claims_per_minute": 100001}, {"paused": "no"}])
def test_out_of_range_controls_are_invalid_arguments(sb, change):
    vended = sb.vend("worker")
    assert isinstance(raised(lambda: sb.app.set_queue_controls(vended["slug"], vended["queues"][0], caller=CLI,
                                                             **change)), InvalidArgument)


def test_controls_of_another_operators_endpoint_are_not_found(sb):
    from application.service import Caller

    vended = sb.vend("worker")
    mallory = unique("mallory")
    sb.app.create_operator(mallory, "password123", caller=CLI)
    other = Caller.operator(mallory)
    assert isinstance(raised(lambda: sb.app.set_queue_controls(vended["slug"], vended["queues"][0], caller=other,
                                                             paused=True)), NotFound)
    assert isinstance(raised(lambda: sb.app.queue_controls(vended["slug"], caller=other)), NotFound)


def test_a_queue_outside_the_endpoint_is_refused(sb):
    vended = sb.vend("worker")
    assert isinstance(raised(lambda: sb.app.set_queue_controls(vended["slug"], "elsewhere", caller=CLI,
                                                             paused=True)), InvalidArgument)


def test_controls_reach_a_second_process_at_its_next_claim(sb):
    vended, queue = controlled(sb, max_in_flight=1)
    other = sb.another_process()
    try:
        for _ in range(3):
            sb.push(vended)
        assert not other.app.claim_next(caller=agent(vended))["empty"]
        assert sb.app.claim_next(caller=agent(vended)) == {"empty": True, "reason": "max_in_flight"}
        other.app.set_queue_controls(vended["slug"], queue, caller=CLI, max_in_flight=2)
        assert not sb.app.claim_next(caller=agent(vended))["empty"]
    finally:
        other.close()


def test_the_read_models_of_a_controlled_workload_match_a_rebuild(sb):
    vended, queue = controlled(sb, max_in_flight=2, max_claims_per_minute=5)
    for _ in range(6):
        sb.push(vended, not_before=sb.later(5).isoformat())
    sb.tick(5)
    sb.fire_due()
    for _ in range(4):
        answer = sb.app.claim_next(caller=agent(vended))
        if not answer["empty"]:
            sb.app.release(answer["todo"]["id"], caller=agent(vended), delay_seconds=30)
        sb.tick(2)
    assert sb.container.projector.verify() == []


# --- delays ------------------------------------------------------------------------------------------


def test_a_todo_pushed_with_not_before_is_claimable_from_then_only(sb):
    vended = sb.vend("worker")
    at = sb.later(120)
    row = sb.push(vended, not_before=at.isoformat().replace("+00:00", "Z"))
    assert (row["state"], when(row["available_at"])) == ("pending", at)
    assert sb.app.list_todos(caller=CLI, endpoint=vended["slug"])[0]["available_at"] == row["available_at"]
    assert sb.app.claim_next(caller=agent(vended)) == {"empty": True}
    assert "delayed until" in str(raised(lambda: sb.app.claim(row["id"], caller=agent(vended))))

    sb.tick(119.999)
    assert sb.app.claim_next(caller=agent(vended)) == {"empty": True}
    assert sb.fire_due() == 0
    sb.tick(0.001)
    assert sb.fire_due() == 1  # DelayElapsed: the moment it is rung
    history = [e["type"] for e in sb.app.history(row["id"], caller=CLI)["events"]]
    assert history == ["TodoOpened", "DelayElapsed"]
    assert sb.app.claim_next(caller=agent(vended))["todo"]["id"] == row["id"]


def test_a_delay_in_seconds_counts_from_the_push(sb):
    vended = sb.vend("worker")
    row = sb.push(vended, delay_seconds=600)
    assert when(row["available_at"]) == sb.clock.now() + timedelta(seconds=600)


@pytest.mark.parametrize("options", [
    {"not_before": "tomorrow"}, {"not_before": "2026-12-01T12:00:00"}, {"delay_seconds": -1},
    {"not_before": "2026-12-01T12:00:00Z", "delay_seconds": 5},
])
def test_a_bad_not_before_is_an_invalid_argument(sb, options):
    vended = sb.vend("worker")
    assert isinstance(raised(lambda: sb.push(vended, **options)), InvalidArgument)


def test_a_push_delay_over_its_cap_says_the_cap_in_days(sb):
    """`todo push --delay 3651d` said only "delay must be within 0..315360000 seconds"."""
    vended = sb.vend("worker")
    error = raised(lambda: sb.push(vended, delay_seconds=3651 * 86400))
    assert isinstance(error, InvalidArgument)
    assert str(error) == "delay must be within 0..315360000 seconds (3650d)"


def test_a_snooze_keeps_the_attempt_and_holds_the_todo_until_due(sb):
    vended = sb.vend("worker")
    todo = sb.push(vended)
    sb.app.claim(todo["id"], caller=agent(vended))
    row = sb.app.release(todo["id"], caller=agent(vended), delay_seconds=90, summary="waiting for CI")
    assert (row["state"], row["attempt"], when(row["available_at"])) == ("pending", 1, sb.later(90))
    assert sb.app.claim_next(caller=agent(vended)) == {"empty": True}
    sb.tick(90)
    assert sb.fire_due() == 1
    assert sb.app.claim_next(caller=agent(vended))["todo"]["attempt"] == 2


@pytest.mark.parametrize("delay", [-1, 86401, float("nan")])
def test_a_snooze_out_of_range_is_refused_and_the_lease_kept(sb, delay):
    vended = sb.vend("worker")
    todo = sb.push(vended)
    sb.app.claim(todo["id"], caller=agent(vended))
    assert isinstance(raised(lambda: sb.app.release(todo["id"], caller=agent(vended), delay_seconds=delay)),
                      InvalidArgument)
    assert sb.todo(todo["id"])["state"] == "claimed"


# --- bulk retry --------------------------------------------------------------------------------------


def test_bulk_retry_revives_every_dead_letter_with_one_bulk_action_id(sb):
    vended = sb.vend("worker", queues=[unique("a"), unique("b")])
    a, b = vended["queues"]
    dead = []
    for queue in (a, a, b):
        todo = sb.push(vended, queue=queue)
        sb.fail_until_dead(vended, todo["id"])
        dead.append(todo["id"])
    alive = sb.push(vended, queue=a)["id"]

    assert sb.app.bulk_retry(vended["slug"], caller=CLI, dead_letters=True, dry_run=True) == {"would_retry": 3}
    assert sb.app.bulk_retry(vended["slug"], caller=CLI, dead_letters=True, queue=b, dry_run=True) == {"would_retry": 1}
    assert sb.todo(dead[0])["dead_letter"]

    answer = sb.app.bulk_retry(vended["slug"], caller=CLI, dead_letters=True, queue=a)
    assert answer["retried"] == 2 and answer["bulk_action_id"].startswith("ba_")
    causes = [sb.app.history(t, caller=CLI)["events"][-1] for t in dead[:2]]
    assert {(e["type"], e["cause"], e["actor"]) for e in causes} == {
        ("TodoRequeued", answer["bulk_action_id"], "operator:cli")}
    assert [sb.todo(t)["state"] for t in dead] == ["pending", "pending", "failed"]
    assert (sb.todo(dead[0])["attempt"], sb.todo(alive)["state"]) == (0, "pending")
    assert sb.app.bulk_retry(vended["slug"], caller=CLI, dead_letters=True, queue=a)["retried"] == 0


def test_bulk_retry_of_a_queue_outside_the_endpoint_is_refused_not_zero(sb):
    """A mistyped queue is refused as `queue set` refuses it, not answered "0 retried" with a
    bulk-action id that names nothing."""
    vended = sb.vend("worker")
    dead = sb.push(vended)["id"]
    sb.fail_until_dead(vended, dead)
    for dry_run in (True, False):
        error = raised(lambda: sb.app.bulk_retry(vended["slug"], caller=CLI, dead_letters=True,
                                                 queue="elsewhere", dry_run=dry_run))
        assert isinstance(error, InvalidArgument), error
        assert str(error) == f"queue 'elsewhere' is not one of endpoint {vended['slug']}'s queues"
    assert sb.todo(dead)["dead_letter"]
    assert sb.app.bulk_retry(vended["slug"], caller=CLI, dead_letters=True, queue=vended["queues"][0],
                             dry_run=True) == {"would_retry": 1}


def test_two_processes_bulk_retrying_at_once_retry_each_dead_letter_once(sb):
    """Both list the same dead letters and read each chunk before the writer's turn: the loser of
    each race on a todo re-runs on fresh state and leaves it (one TodoRequeued per todo)."""
    import threading

    from tests.integration._support import dead_letters

    vended = sb.vend("worker")
    dead = dead_letters(sb.app, vended["slug"], 150)  # two chunks of a bulk retry
    other = sb.another_process()
    try:
        for container in (sb.container, other):  # both list the dead letters at once, not after a catch-up
            container.views.catch_up()
        answers, start = [], threading.Barrier(2)

        def retry(app) -> None:
            start.wait()
            answers.append(app.bulk_retry(vended["slug"], caller=CLI, dead_letters=True))

        threads = [threading.Thread(target=retry, args=(app,)) for app in (sb.app, other.app)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    finally:
        other.close()
    assert sum(a["retried"] for a in answers) == len(dead) == 150
    requeued = {}
    for todo in dead:
        events = [e for e in sb.app.history(todo, caller=CLI)["events"] if e["type"] == "TodoRequeued"]
        assert len(events) == 1, events
        requeued[todo] = events[0]["cause"]
    assert set(requeued.values()) <= {a["bulk_action_id"] for a in answers}
    assert {sb.todo(t)["state"] for t in dead} == {"pending"}


def test_bulk_retry_needs_dead_letters_true(sb):
    vended = sb.vend("worker")
    for flag in (False, None, "yes"):
        assert isinstance(raised(lambda: sb.app.bulk_retry(vended["slug"], caller=CLI, dead_letters=flag)),
                          InvalidArgument)


# --- what the doorbell reads ---------------------------------------------------------------------------


def test_the_oldest_waiting_todo_is_never_a_held_one(sb):
    from tests.contract.test_webhooks import quarantined

    held, owner = quarantined(sb)
    reads = sb.container.store.queue_reads
    queues = [*owner["queues"], "quarantine"]
    assert reads.oldest_waiting(owner["endpoint_id"], queues, sb.later(60), 0) is None
    pending = sb.push(owner)
    assert reads.oldest_waiting(owner["endpoint_id"], queues, sb.later(60), 0).todo_id == pending["id"]


def test_the_doorbell_reads_which_queues_cannot_admit(sb):
    vended = sb.vend("worker", queues=[unique("a"), unique("b"), unique("c")])
    a, b, c = vended["queues"]
    sb.app.set_queue_controls(vended["slug"], a, caller=CLI, paused=True)
    sb.app.set_queue_controls(vended["slug"], b, caller=CLI, max_in_flight=1)
    sb.app.set_queue_controls(vended["slug"], c, caller=CLI, max_claims_per_minute=1)
    reads = sb.container.store.queue_reads
    assert {q: r.reason for (_, q), r in reads.refusals([vended["endpoint_id"]], sb.clock.now()).items()} == {a: "paused"}
    for queue in (b, c):
        sb.push(vended, queue=queue)
        sb.app.claim_next(caller=agent(vended), queue=queue)
    refused = reads.refusals([vended["endpoint_id"]], sb.clock.now())
    assert {q: r.reason for (_, q), r in refused.items()} == {a: "paused", b: "max_in_flight", c: "rate_limited"}
    assert refused[(vended["endpoint_id"], c)].retry_after_seconds == 60


# --- metrics -------------------------------------------------------------------------------------------


def test_the_metrics_count_claims_in_flight_and_refusals_by_reason(sb):
    from tests.contract.test_metrics import scrape, series

    vended, queue = controlled(sb, max_in_flight=1)
    other = sb.another_process()  # a refusal counted by another process shows in this one's scrape
    try:
        pushed(sb, vended, 3)
        sb.app.claim_next(caller=agent(vended))
        for app in (sb.app, other.app, other.app):
            assert app.claim_next(caller=agent(vended))["reason"] == "max_in_flight"
        sb.app.set_queue_controls(vended["slug"], queue, caller=CLI, paused=True)
        raised(lambda: other.app.claim(sb.app.list_todos(caller=CLI, endpoint=vended["slug"], state="pending")[0]["id"],
                                       caller=agent(vended)))
    finally:
        other.close()
    samples = scrape(sb)
    assert series(samples, "switchboard_queue_in_flight")[(("queue", queue),)] == 1
    refused = series(samples, "switchboard_claims_refused_total")
    assert refused[(("queue", queue), ("reason", "max_in_flight"))] == 3
    assert refused[(("queue", queue), ("reason", "paused"))] == 1
