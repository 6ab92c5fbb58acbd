"""`todo explain` (CONTRACT §14 Explain): the story and the *because* of a todo, from its events
alone, for each way a todo can end or wait, on both stores and with `todo show`'s access rules."""

from __future__ import annotations

from application.service import Caller

from .harness import CLI, agent, when
from .test_webhooks import code_of, create, github, me, quarantined

ADMIN = Caller.operator("admin")


def texts(explained) -> list[str]:
    return [line["text"] for line in explained["story"]]


def test_a_completed_todo_tells_its_push_its_attempt_and_who_completed_it(sb):
    vended = sb.vend("worker")
    todo_id = sb.push(vended, "Write the notes", key="notes-1")["id"]
    sb.tick(5)
    sb.app.claim_next(caller=agent(vended), claimant="bot-7")
    for _ in range(3):
        sb.tick(10)
        sb.app.heartbeat(todo_id, caller=agent(vended))
    sb.tick(10)
    done_at = sb.clock.now()
    sb.app.complete(todo_id, caller=agent(vended), summary="notes written", result={"ok": True})

    explained = sb.app.explain(todo_id, caller=ADMIN)

    slug = vended["slug"]
    assert explained["state"] == "done"
    assert explained["because"] == (
        f"done: attempt 1 was completed by endpoint {slug} at {done_at.isoformat().replace('+00:00', 'Z')}"
        ": “notes written”")
    story = texts(explained)
    assert story[0] == (f"Pushed by the CLI to endpoint {slug}, queue {vended['queues'][0]} "
                        "(source operator, idempotency key “notes-1”).")
    assert story[1].startswith(f"Attempt 1 of 5 was claimed by endpoint {slug} as “bot-7”, lease until ")
    assert story[2].startswith(f"The lease was extended 3 times, last by endpoint {slug} to ")
    assert story[3] == f"Attempt 1 was completed by endpoint {slug} with a result: “notes written”."
    assert len(story) == 4


def test_the_story_is_in_log_order_with_the_positions_and_times_of_the_events(sb):
    vended = sb.vend("worker")
    todo_id = sb.push(vended)["id"]
    sb.tick(3)
    sb.app.claim(todo_id, caller=agent(vended))
    sb.tick(3)
    sb.app.release(todo_id, caller=agent(vended), summary="not now")

    explained = sb.app.explain(todo_id, caller=CLI)
    events = sb.app.history(todo_id, caller=CLI)["events"]

    assert [(s["position"], s["time"]) for s in explained["story"]] == [(e["position"], e["time"]) for e in events]
    assert texts(explained)[-1] == f"Attempt 1 was released by endpoint {vended['slug']}: “not now”. Pending again."
    assert explained["because"] == (f"pending: claimable since endpoint {vended['slug']} released attempt 1 at "
                                    f"{events[-1]['time']}")


def test_a_dead_letter_by_failures_names_the_fifth_failed_attempt(sb):
    vended = sb.vend("worker")
    todo_id = sb.push(vended)["id"]
    for _ in range(5):
        sb.app.claim(todo_id, caller=agent(vended))
        row = sb.app.fail(todo_id, caller=agent(vended), summary="broken")
        if row["next_retry_at"]:
            sb.clock.set(when(row["next_retry_at"]))
            assert sb.fire_due() == 1
    last = sb.app.history(todo_id, caller=CLI)["events"][-1]

    explained = sb.app.explain(todo_id, caller=CLI)

    assert (explained["state"], explained["because"]) == ("failed", (
        f"dead letter: the 5th attempt failed at {last['time']}: “broken”; only an operator's retry revives it"))
    story = texts(explained)
    assert story[2].startswith(f"Attempt 1 failed (endpoint {vended['slug']}): “broken”. Retry at ")
    assert story[3] == "Its retry fell due: pending again, for attempt 2 of 5."
    assert story[-1] == (f"Attempt 5 failed (endpoint {vended['slug']}): “broken”. "
                         "That was the 5th attempt of 5: dead letter.")


def test_a_dead_letter_by_lapses_says_the_fifth_attempts_lease_lapsed_and_when(sb):
    vended = sb.vend("worker")
    todo_id = sb.push(vended)["id"]
    for _ in range(5):
        sb.app.claim(todo_id, caller=agent(vended), lease_ttl_seconds=60)
        sb.tick(61)
        assert sb.fire_due() == 1
    lapsed_at = sb.app.history(todo_id, caller=CLI)["events"][-1]["time"]

    explained = sb.app.explain(todo_id, caller=CLI)

    assert explained["because"] == (
        f"dead letter: the 5th attempt's lease lapsed at {lapsed_at}; only an operator's retry revives it")
    story = texts(explained)
    assert story[2].startswith(f"The lease of attempt 1 held by endpoint {vended['slug']} lapsed (it ran to ")
    assert story[2].endswith("). Pending again.")
    assert story[-1].endswith("That was the 5th attempt of 5: dead letter.")


def test_an_operator_retry_tells_who_revived_the_dead_letter_with_a_fresh_budget(sb):
    vended = sb.vend("worker")
    todo_id = sb.push(vended)["id"]
    sb.fail_until_dead(vended, todo_id)
    sb.tick(60)
    sb.app.retry(todo_id, caller=ADMIN)
    retried_at = sb.clock.now().isoformat().replace("+00:00", "Z")

    explained = sb.app.explain(todo_id, caller=ADMIN)

    assert explained["state"] == "pending"
    assert explained["because"] == f"pending: claimable since admin retried it with a fresh budget at {retried_at}"
    assert texts(explained)[-1] == "Retried by admin with a fresh budget of 5 attempts: pending again."

    sb.app.claim(todo_id, caller=agent(vended))
    assert texts(sb.app.explain(todo_id, caller=ADMIN))[-1].startswith("Attempt 1 of 5 (claim 6 overall) was claimed")


def test_a_todo_awaiting_its_retry_says_when_and_then_that_it_is_due(sb):
    vended = sb.vend("worker")
    todo_id = sb.push(vended)["id"]
    sb.app.claim(todo_id, caller=agent(vended))
    row = sb.app.fail(todo_id, caller=agent(vended), summary="flaky")
    failed_at = sb.clock.now().isoformat().replace("+00:00", "Z")

    assert sb.app.explain(todo_id, caller=CLI)["because"] == (
        f"failed, awaiting its retry at {row['next_retry_at']}: attempt 1 failed at {failed_at}: “flaky”")
    sb.clock.set(when(row["next_retry_at"]))
    assert sb.app.explain(todo_id, caller=CLI)["because"].startswith(
        f"failed, retry due since {row['next_retry_at']} (Switchboard makes it pending within a second)")


def test_a_claimed_todo_names_its_holder_and_lease_and_says_when_the_lease_has_lapsed(sb):
    vended = sb.vend("worker")
    todo_id = sb.push(vended)["id"]
    claimed = sb.app.claim(todo_id, caller=agent(vended), claimant="c1", lease_ttl_seconds=60)
    claimed_at = sb.clock.now().isoformat().replace("+00:00", "Z")
    slug = vended["slug"]

    assert sb.app.explain(todo_id, caller=CLI)["because"] == (
        f"claimed by endpoint {slug} (“c1”) since {claimed_at}, attempt 1 of 5; "
        f"lease until {claimed['lease_expires_at']}")
    sb.tick(61)  # the reaper has not run: the clock says the lease is over, the log not yet
    assert sb.app.explain(todo_id, caller=CLI)["because"].endswith(
        f"its lease lapsed at {claimed['lease_expires_at']} and Switchboard ends it within a second")


def test_a_todo_held_for_a_faulted_delivery_tells_the_delivery_and_the_rule_that_faulted(sb):
    todo_id, owner = quarantined(sb)
    delivery_id = sb.app.history(todo_id, caller=CLI)["events"][0]["data"]["delivery_id"]

    explained = sb.app.explain(todo_id, caller=ADMIN)

    assert explained["state"] == "pending"
    assert explained["because"].startswith("held: rule 1 (boom) faulted (error: ")
    assert explained["because"].endswith(f") on delivery {delivery_id}; an operator releases or discards it")
    [opened] = texts(explained)
    assert opened.startswith(f"Opened on endpoint {owner['slug']}, queue quarantine, from delivery {delivery_id} "
                             "to webhook wh_")
    assert "(source github, kind ping, the sender's delivery id gh-" in opened
    assert ", signed and verified): rule 1 (boom) faulted (error: " in opened
    assert opened.endswith(", so it is held in quarantine.")


def test_a_routed_delivery_names_the_rule_that_routed_it_and_a_quarantine_release_tells_who(sb):
    todo_id, owner = quarantined(sb)
    sb.app.release_quarantined(todo_id, owner["queues"][0], caller=ADMIN)
    explained = sb.app.explain(todo_id, caller=ADMIN)
    assert texts(explained)[-1] == f"Released from quarantine to queue {owner['queues'][0]} by admin."
    assert explained["because"].startswith(
        f"pending: claimable since admin released it from quarantine to queue {owner['queues'][0]} at ")

    vended = sb.vend("owner")
    hook = create(sb, vended, "github")
    sb.container.webhooks.set_rules(hook["webhook_id"], {"rules": [
        {"id": "triage", "expr": '.kind == "issues"', "action": {"queue": vended["queues"][0]}},
    ]}, caller=me(vended))
    routed = github(sb, hook, "issues")["id"]
    opened = texts(sb.app.explain(routed, caller=CLI))[0]
    assert opened.startswith(f"Opened on endpoint {vended['slug']}, queue {vended['queues'][0]}, from delivery ev_")
    assert opened.endswith(", signed and verified): routed by rule 1 (triage).")


def test_a_discarded_quarantined_todo_is_done_without_work(sb):
    todo_id, owner = quarantined(sb)
    sb.app.discard_quarantined(todo_id, caller=ADMIN, summary="junk")
    explained = sb.app.explain(todo_id, caller=ADMIN)
    assert explained["state"] == "done"
    assert explained["because"].startswith("done: discarded from quarantine by admin at ")
    assert explained["because"].endswith(": “junk”")


def test_a_pending_todo_of_a_revoked_endpoint_says_nobody_can_claim_it(sb):
    vended = sb.vend("worker")
    todo_id = sb.push(vended)["id"]
    sb.app.claim(todo_id, caller=agent(vended))
    sb.tick(5)
    sb.app.revoke(vended["slug"], caller=ADMIN)

    explained = sb.app.explain(todo_id, caller=ADMIN)

    assert explained["because"].endswith(
        f"; but endpoint {vended['slug']} was revoked by admin at "
        f"{sb.clock.now().isoformat().replace('+00:00', 'Z')}, so none of its agents can claim it")
    story = texts(explained)
    assert f"Attempt 1 ended when endpoint {vended['slug']} was revoked (admin). Pending again." in story
    assert f"Endpoint {vended['slug']} was revoked by admin." in story


def test_explain_follows_todo_shows_access_rules_foreign_is_unknown(sb):
    vended, other = sb.vend("worker"), sb.vend("other")
    todo_id = sb.push(vended)["id"]
    sb.app.create_operator("bob", "a long enough password", caller=CLI)

    assert sb.app.explain(todo_id, caller=agent(vended))["state"] == "pending"
    unknown = "td_" + "0" * 32
    for caller in (agent(other), Caller.operator("bob")):
        assert code_of(lambda: sb.app.explain(todo_id, caller=caller)) == "not_found"
        assert code_of(lambda: sb.app.get_todo(todo_id, caller=caller)) == "not_found"
    assert code_of(lambda: sb.app.explain(unknown, caller=CLI)) == "not_found"
    assert code_of(lambda: sb.app.explain("nonsense", caller=CLI)) == code_of(lambda: sb.app.get_todo("nonsense", caller=CLI))

    held, owner = quarantined(sb)  # agents never see quarantine
    assert code_of(lambda: sb.app.explain(held, caller=agent(owner))) == "not_found"


# -- queue controls and delays (CONTRACT §13) ---------------------------------------------------


def test_a_release_with_a_delay_says_until_when_and_by_whom_then_that_the_delay_ended(sb):
    vended = sb.vend("worker")
    todo_id = sb.push(vended)["id"]
    sb.app.claim(todo_id, caller=agent(vended))
    released_at = sb.clock.now().isoformat().replace("+00:00", "Z")
    sb.app.release(todo_id, caller=agent(vended), summary="after lunch", delay_seconds=600)
    until = sb.later(600).isoformat().replace("+00:00", "Z")

    explained = sb.app.explain(todo_id, caller=CLI)

    assert explained["state"] == "pending"
    assert explained["because"] == (
        f"not claimable until {until}: released with a delay by endpoint {vended['slug']} at {released_at}")
    assert texts(explained)[-1] == (f"Attempt 1 was released by endpoint {vended['slug']}: “after lunch”. "
                                    f"Pending, but not claimable until {until} (a delay).")
    sb.tick(601)
    assert sb.fire_due() == 1
    explained = sb.app.explain(todo_id, caller=CLI)
    assert texts(explained)[-1] == "Its delay ended: claimable again."
    assert explained["because"].startswith("pending: claimable since its delay ended at ")


def test_a_push_with_not_before_is_not_claimable_until_then(sb):
    vended = sb.vend("worker")
    not_before = sb.later(3600)
    todo_id = sb.push(vended, not_before=not_before.isoformat().replace("+00:00", "Z"))["id"]
    explained = sb.app.explain(todo_id, caller=CLI)
    shown = not_before.isoformat().replace("+00:00", "Z")
    assert explained["because"] == f"not claimable until {shown}: pushed by the CLI with not_before"
    assert texts(explained)[0].endswith(f" Not claimable before {shown}.")


def test_a_pending_todo_in_a_paused_queue_says_who_paused_it_and_when(sb):
    vended = sb.vend("worker")
    queue = vended["queues"][0]
    todo_id = sb.push(vended)["id"]
    sb.tick(5)
    sb.app.set_queue_controls(vended["slug"], queue, caller=ADMIN, paused=True)
    paused_at = sb.clock.now().isoformat().replace("+00:00", "Z")

    explained = sb.app.explain(todo_id, caller=ADMIN)

    assert explained["because"] == (
        f"pending, but queue {queue} paused by admin at {paused_at}: no claim is admitted until it is resumed")
    assert texts(explained)[-1] == f"Queue {queue} was set by admin: paused, no limits."
    sb.app.set_queue_controls(vended["slug"], queue, caller=ADMIN, paused=False, max_in_flight=3)
    explained = sb.app.explain(todo_id, caller=ADMIN)
    assert explained["because"].startswith("pending: claimable since it was pushed at ")
    assert texts(explained)[-1] == f"Queue {queue} was set by admin: running, at most 3 in flight."
    sb.app.claim(todo_id, caller=agent(vended))
    assert texts(sb.app.explain(todo_id, caller=ADMIN))[-1].endswith(
        ", admitted under the queue's limits (max_in_flight 3).")


def test_a_pending_todo_its_queues_limits_hold_back_says_which_limit_holds_it_and_until_when(sb):
    """The one fact of the because not in the events: its queue's load now, read as admission reads
    it (ADR 26). The story stays the events'."""
    vended = sb.vend("worker")
    queue = vended["queues"][0]
    sb.app.set_queue_controls(vended["slug"], queue, caller=ADMIN, max_in_flight=2)
    todos, pushed_at = [], []
    for _ in range(5):
        todos.append(sb.push(vended)["id"])
        pushed_at.append(sb.clock.now().isoformat().replace("+00:00", "Z"))
        sb.tick()
    first = sb.app.claim_next(caller=agent(vended))["todo"]["id"]
    sb.app.claim_next(caller=agent(vended))

    explained = sb.app.explain(todos[2], caller=ADMIN)
    assert explained["because"] == (
        f"pending: claimable since it was pushed at {pushed_at[2]}; but queue {queue} has 2 todos claimed "
        "(max_in_flight 2), so no claim is admitted until one of them ends")
    assert texts(explained) == [f"Pushed by the CLI to endpoint {vended['slug']}, queue {queue} (source operator)."]

    sb.app.complete(first, caller=agent(vended))
    assert sb.app.explain(todos[2], caller=ADMIN)["because"] == f"pending: claimable since it was pushed at {pushed_at[2]}"

    sb.app.set_queue_controls(vended["slug"], queue, caller=ADMIN, max_in_flight=None, max_claims_per_minute=2)
    sb.app.claim_next(caller=agent(vended))
    window_frees = sb.later(60).isoformat().replace("+00:00", "Z")
    sb.tick(10)
    sb.app.claim_next(caller=agent(vended))
    assert sb.app.explain(todos[4], caller=ADMIN)["because"] == (
        f"pending: claimable since it was pushed at {pushed_at[4]}; but queue {queue} had 2 claims in the last "
        f"60 s (max_claims_per_minute 2), so no claim is admitted before {window_frees}")


def test_a_bulk_retry_names_its_bulk_action(sb):
    vended = sb.vend("worker")
    todo_id = sb.push(vended)["id"]
    sb.fail_until_dead(vended, todo_id)
    bulk = sb.app.bulk_retry(vended["slug"], caller=ADMIN, dead_letters=True)
    assert bulk["retried"] == 1
    assert texts(sb.app.explain(todo_id, caller=ADMIN))[-1] == (
        f"Retried by admin (bulk retry {bulk['bulk_action_id']}) with a fresh budget of 5 attempts: pending again.")


# -- trusted senders (CONTRACT §13) -------------------------------------------------------------


def test_a_delivery_from_an_untrusted_sender_is_held_and_the_because_names_the_sender_and_webhook(sb):
    vended = sb.vend("owner")
    hook = create(sb, vended, "github")
    sb.container.webhooks.set_trust(hook["webhook_id"], caller=CLI, senders=["someone-else"], associations=None)
    held = github(sb, hook, "issues")["id"]
    sender = sb.app.get_todo(held, caller=CLI)["routing"]["actor"]["sender"]
    assert sender

    explained = sb.app.explain(held, caller=ADMIN)

    assert explained["because"].startswith(f"held: sender {sender} is not trusted by {hook['webhook_id']}")
    assert explained["because"].endswith("; an operator releases or discards it")
    opened = texts(explained)[0]
    assert f": sender {sender} is not trusted by {hook['webhook_id']}" in opened
    assert opened.endswith(", so it is held in quarantine.")


def test_the_story_names_each_attempt_its_checkpoints_and_the_one_a_claim_resumes_from(sb):
    vended = sb.vend("worker")
    todo_id = sb.push(vended)["id"]
    sb.app.claim(todo_id, caller=agent(vended), lease_ttl_seconds=60, claimant="first")
    sb.tick(10)
    saved_at = sb.clock.now().isoformat().replace("+00:00", "Z")
    sb.app.heartbeat(todo_id, caller=agent(vended), lease_ttl_seconds=60, checkpoint={"step": 2})
    sb.tick(61)
    sb.fire_due()
    sb.app.claim_next(caller=agent(vended), claimant="second")

    explained = sb.app.explain(todo_id, caller=CLI)
    story = texts(explained)
    assert story[2].endswith(", saving a checkpoint.")
    assert story[3].startswith("The lease of attempt 1 held by endpoint ") and "lapsed" in story[3]
    assert story[4].endswith(f"; it resumes from the checkpoint attempt 1 saved at {saved_at}.")
    assert [(a["n"], a["claimant"], a["outcome"]) for a in explained["attempts"]] == [
        (1, "first", "lapsed"), (2, "second", "claimed")]
    assert explained["attempts"] == sb.todo(todo_id)["attempts"]
