"""Todo history (CONTRACT §6 last point, §11 History): every transition, once, in order."""

from __future__ import annotations

from .harness import CLI, agent


def test_history_shows_every_transition_once_in_order_with_time_actor_and_cause(sb):
    vended = sb.vend("worker")
    me = agent(vended)
    who = f"endpoint:{vended['slug']}"
    expected = []  # (type, actor, cause, time)

    def step(kind, actor, cause, seconds=10):
        expected.append((kind, actor, cause, sb.clock.now().isoformat().replace("+00:00", "Z")))
        sb.tick(seconds)

    todo_id = sb.push(vended, "History", payload={"n": 1})["id"]
    step("TodoOpened", "operator:cli", "push")
    sb.app.claim_next(caller=me, claimant="c1")
    step("TodoClaimed", who, "claim")
    sb.app.heartbeat(todo_id, caller=me)
    step("LeaseRenewed", who, "heartbeat")
    sb.app.fail(todo_id, caller=me, summary="first try", result={"err": 1})
    step("TodoFailed", who, "fail", seconds=30)
    assert sb.fire_due() == 1
    step("TodoRequeued", "system", "retry_due")
    sb.app.claim(todo_id, caller=me)
    step("TodoClaimed", who, "claim")
    sb.app.release(todo_id, caller=me, summary="later")
    step("TodoReleased", who, "release")
    sb.app.claim(todo_id, caller=me, require_fence=True, lease_ttl_seconds=60)
    step("TodoClaimed", who, "claim", seconds=60)
    assert sb.fire_due() == 1
    step("LeaseExpired", "system", "lease_expired")
    sb.app.claim(todo_id, caller=CLI)
    step("TodoClaimed", "operator:cli", "claim")
    sb.app.fail(todo_id, caller=CLI)
    step("TodoFailed", "operator:cli", "fail")
    sb.app.retry(todo_id, caller=CLI)
    step("TodoRequeued", "operator:cli", "operator_retry")
    sb.app.claim_next(caller=me)
    step("TodoClaimed", who, "claim")
    sb.app.complete(todo_id, caller=me, result={"ok": True}, summary="done")
    step("TodoCompleted", who, "complete")

    history = sb.app.history(todo_id, caller=me)

    assert history["todo_id"] == todo_id
    events = history["events"]
    assert [(e["type"], e["actor"], e["cause"], e["time"]) for e in events] == expected
    assert [e["version"] for e in events] == list(range(1, len(expected) + 1))
    positions = [e["position"] for e in events]
    assert all(isinstance(p, int) and p > 0 for p in positions)
    assert positions == sorted(set(positions))
    data = [e["data"] for e in events]
    assert data[0]["title"] == "History" and data[0]["payload"] == {"n": 1}
    assert (data[1]["attempt"], data[1]["attempt_seq"], data[1]["claimant"]) == (1, 1, "c1")
    assert data[3]["summary"] == "first try" and data[3]["result"] == {"err": 1}
    assert data[3]["next_retry_at"] == expected[4][3]
    assert data[3]["dead_letter"] is False
    assert data[6]["outcome"] == "released"
    assert data[7]["fence_hash"] is not None
    assert (data[11]["fresh_budget"], data[12]["attempt"], data[12]["attempt_seq"]) == (True, 1, 5)
    assert data[13] == {"result": {"ok": True}, "summary": "done"}
    assert all("timestamp" not in d and "actor" not in d and "cause" not in d for d in data)

    outcomes = [a["outcome"] for a in sb.todo(todo_id)["prior_attempts"]]
    assert outcomes == ["completed", "failed", "lease_expired", "released", "failed"]


def test_history_agrees_with_the_audit_log(sb):
    vended = sb.vend("worker")
    first = sb.push(vended)["id"]
    other = sb.push(vended)["id"]
    sb.app.claim(first, caller=agent(vended))
    sb.app.claim(other, caller=agent(vended))
    sb.tick(5)
    sb.app.complete(first, caller=agent(vended))

    history = sb.app.history(first, caller=CLI)["events"]
    audit = [r for r in sb.app.audit() if r["aggregate"] == first]

    assert [(e["position"], e["version"], e["type"], e["time"]) for e in history] == [
        (r["position"], r["version"], r["type"], r["time"]) for r in audit
    ]
    assert len(history) == 3
    everything = [r["position"] for r in sb.app.audit()]
    assert everything == sorted(set(everything))
