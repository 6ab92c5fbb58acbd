"""Todos (CONTRACT §6): push, claim, heartbeat, complete, release; who may see and touch what."""

from __future__ import annotations

import json
import re
from uuid import uuid4

import pytest

from domain.errors import Conflict, Forbidden, InvalidArgument, NotFound

from .harness import CLI, agent, raised, unique, when


def test_push_claim_next_heartbeat_complete_round_trip(sb):
    vended = sb.vend("worker")
    payload = {"repo": "acme/app", "number": 12}

    pushed = sb.push(vended, "Fix the build", payload=payload)
    assert re.fullmatch(r"td_[0-9a-f]{32}", pushed["id"])
    assert (pushed["state"], pushed["queue"], pushed["source"], pushed["trust_mode"]) == (
        "pending", vended["queues"][0], "operator", "operator")
    assert (pushed["attempt"], pushed["max_attempts"], pushed["dead_letter"]) == (0, 5, False)
    assert pushed["payload_size"] == len(json.dumps(payload, separators=(",", ":")).encode())
    assert "payload" not in pushed

    sb.tick(10)
    answer = sb.app.claim_next(caller=agent(vended), claimant="runner-1")
    assert answer["empty"] is False
    todo = answer["todo"]
    assert todo["id"] == pushed["id"]
    assert (todo["state"], todo["attempt"], todo["attempt_seq"]) == ("claimed", 1, 1)
    assert todo["owner"] == f"endpoint:{vended['slug']}"
    assert todo["claimant"] == "runner-1"
    assert todo["payload"] == payload
    assert todo["prior_attempts"] == []
    assert "lease_token" not in todo
    assert when(todo["lease_expires_at"]) == sb.later(300)

    sb.tick(200)
    beat = sb.app.heartbeat(pushed["id"], caller=agent(vended))
    assert when(beat["lease_expires_at"]) == sb.later(300)

    sb.tick(30)
    done = sb.app.complete(pushed["id"], caller=agent(vended), result={"ok": True}, summary="fixed")
    assert (done["state"], done["owner"], done["lease_expires_at"]) == ("done", None, None)

    final = sb.app.get_todo(pushed["id"], caller=agent(vended))
    assert final["result"] == {"ok": True}
    assert final["prior_attempts"] == [{
        "seq": 1, "claimant": "runner-1", "claimed_at": "2026-01-01T00:00:10Z",
        "ended_at": "2026-01-01T00:04:00Z", "outcome": "completed", "summary": "fixed",
    }]
    assert [r["state"] for r in sb.app.list_todos(caller=agent(vended))] == ["done"]


def test_claim_next_answers_empty_when_nothing_is_claimable(sb):
    vended = sb.vend("worker")
    assert sb.app.claim_next(caller=agent(vended)) == {"empty": True}

    sb.push(vended)
    sb.app.claim_next(caller=agent(vended))

    assert sb.app.claim_next(caller=agent(vended)) == {"empty": True}


def test_claim_next_takes_the_oldest_todo_across_the_endpoints_queues(sb):
    first, second = unique("a"), unique("b")
    vended = sb.vend("worker", queues=[first, second])
    order = []
    for queue in (second, first, second, first):
        order.append(sb.push(vended, queue=queue)["id"])
        sb.tick()

    claimed = [sb.app.claim_next(caller=agent(vended))["todo"]["id"] for _ in order]

    assert claimed == order
    assert sb.app.claim_next(caller=agent(vended)) == {"empty": True}


def test_claim_next_with_a_queue_takes_only_from_that_queue(sb):
    first, second = unique("a"), unique("b")
    vended = sb.vend("worker", queues=[first, second])
    sb.push(vended, queue=second)
    sb.tick()
    wanted = sb.push(vended, queue=first)

    todo = sb.app.claim_next(caller=agent(vended), queue=first)["todo"]

    assert (todo["id"], todo["queue"]) == (wanted["id"], first)
    assert sb.app.claim_next(caller=agent(vended), queue=first) == {"empty": True}


def test_claim_next_on_a_queue_outside_the_scope_is_forbidden(sb):
    vended = sb.vend("worker")
    elsewhere = sb.vend("other")
    sb.push(elsewhere)

    with pytest.raises(Forbidden):
        sb.app.claim_next(caller=agent(vended), queue=elsewhere["queues"][0])


def test_claiming_a_done_todo_is_a_conflict(sb):
    vended = sb.vend("worker")
    todo = sb.push(vended)
    sb.app.claim(todo["id"], caller=agent(vended))
    sb.app.complete(todo["id"], caller=agent(vended))

    with pytest.raises(Conflict):
        sb.app.claim(todo["id"], caller=agent(vended))


def test_claiming_a_claimed_todo_is_a_conflict(sb):
    vended = sb.vend("worker")
    todo = sb.push(vended)
    sb.app.claim(todo["id"], caller=agent(vended))

    with pytest.raises(Conflict):
        sb.app.claim(todo["id"], caller=agent(vended))


def test_only_the_lease_holder_may_heartbeat_complete_fail_or_release(sb):
    vended = sb.vend("worker")
    todo = sb.push(vended)
    sb.app.claim(todo["id"], caller=agent(vended))
    operator = CLI  # sees every todo, but does not hold this lease

    for verb in (sb.app.heartbeat, sb.app.complete, sb.app.fail, sb.app.release):
        with pytest.raises(Conflict):
            verb(todo["id"], caller=operator)
    assert sb.todo(todo["id"])["state"] == "claimed"


def test_acting_on_an_unclaimed_todo_is_a_conflict(sb):
    vended = sb.vend("worker")
    todo = sb.push(vended)

    for verb in (sb.app.heartbeat, sb.app.complete, sb.app.fail, sb.app.release):
        with pytest.raises(Conflict):
            verb(todo["id"], caller=agent(vended))


def test_release_returns_the_todo_to_pending_and_keeps_the_attempt(sb):
    vended = sb.vend("worker")
    todo = sb.push(vended)
    sb.app.claim(todo["id"], caller=agent(vended))

    row = sb.app.release(todo["id"], caller=agent(vended), summary="not now")

    assert (row["state"], row["attempt"], row["owner"]) == ("pending", 1, None)
    again = sb.app.claim_next(caller=agent(vended))["todo"]
    assert (again["id"], again["attempt"], again["attempt_seq"]) == (todo["id"], 2, 2)
    assert again["prior_attempts"][0]["outcome"] == "released"
    assert again["prior_attempts"][0]["summary"] == "not now"


def test_another_endpoints_todo_answers_exactly_like_a_random_id(sb):
    queue = unique("shared")
    owner, other = sb.vend("owner", queues=[queue]), sb.vend("other", queues=[queue])
    caller = agent(other)
    verbs = {
        "get_todo": lambda i: sb.app.get_todo(i, caller=caller),
        "claim": lambda i: sb.app.claim(i, caller=caller),
        "heartbeat": lambda i: sb.app.heartbeat(i, caller=caller),
        "complete": lambda i: sb.app.complete(i, caller=caller),
        "fail": lambda i: sb.app.fail(i, caller=caller),
        "release": lambda i: sb.app.release(i, caller=caller),
        "history": lambda i: sb.app.history(i, caller=caller),
    }
    pending = sb.push(owner)["id"]
    claimed = sb.push(owner)["id"]
    sb.app.claim(claimed, caller=agent(owner))

    for foreign_id in (pending, claimed):
        for name, call in verbs.items():
            random_id = f"td_{uuid4().hex}"
            foreign, unknown = raised(lambda: call(foreign_id)), raised(lambda: call(random_id))
            assert type(foreign) is type(unknown) is NotFound, name
            assert foreign.code == unknown.code == "not_found"
            assert str(foreign).replace(foreign_id, "<id>") == str(unknown).replace(random_id, "<id>"), name
    assert sb.app.list_todos(caller=caller) == []
    assert sb.app.claim_next(caller=caller) == {"empty": True}
    assert sb.todo(claimed)["state"] == "claimed" and sb.todo(pending)["state"] == "pending"


def test_a_malformed_todo_id_is_not_found(sb):
    vended = sb.vend("worker")

    for bad in ("td_xyz", "nope", f"td_{uuid4().hex.upper()}", ""):
        with pytest.raises(NotFound):
            sb.app.get_todo(bad, caller=agent(vended))
        with pytest.raises(NotFound):
            sb.app.claim(bad, caller=agent(vended))


def test_push_to_a_queue_outside_the_endpoint_is_forbidden(sb):
    vended = sb.vend("worker")

    with pytest.raises(Forbidden):
        sb.push(vended, queue=unique("elsewhere"))


def test_push_to_a_revoked_endpoint_is_a_conflict(sb):
    vended = sb.vend("worker")
    sb.app.revoke(vended["slug"], caller=CLI)

    with pytest.raises(Conflict):
        sb.push(vended)


def test_summary_and_claimant_are_cut_and_an_oversized_result_is_refused(sb):
    vended = sb.vend("worker")
    todo = sb.push(vended, "line one\nline two " + "é" * 300)
    assert "\n" not in todo["title"] and len(todo["title"]) <= 200

    claimed = sb.app.claim(todo["id"], caller=agent(vended), claimant="c" * 500)
    assert claimed["claimant"] == "c" * 128
    with pytest.raises(InvalidArgument):
        sb.app.complete(todo["id"], caller=agent(vended), result={"blob": "x" * 70000})
    sb.app.complete(todo["id"], caller=agent(vended), summary="ü" * 2000, result={"blob": "y" * 60000})

    final = sb.todo(todo["id"])
    assert final["state"] == "done" and final["result"] == {"blob": "y" * 60000}
    summary = final["prior_attempts"][0]["summary"]
    assert len(summary.encode()) <= 2048 and summary == "ü" * 1024
    assert final["prior_attempts"][0]["claimant"] == "c" * 128


def test_unicode_titles_and_payloads_survive_the_store(sb):
    vended = sb.vend("worker")
    payload = {"emoji": "🚀", "nested": [1, 2.5, None, True, {"ключ": "値"}], "nul": "a\u0000b"}

    todo = sb.push(vended, "Déploiement 🚀 — 値", payload=payload)

    assert sb.app.claim_next(caller=agent(vended))["todo"]["payload"] == payload
    (row,) = sb.app.list_todos(caller=CLI)
    assert row["title"] == "Déploiement 🚀 — 値" == sb.todo(todo["id"])["title"]
