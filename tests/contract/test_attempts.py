"""Attempts, checkpoints and traces (CONTRACT §18) on every store, under a manual clock."""

from __future__ import annotations

import re

import pytest

from domain.errors import Conflict, InvalidArgument

from .harness import CLI, agent, raised, when
from .test_webhooks import create, github

TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-01")
CHECKPOINT = {"step": 3, "done": ["a", "b"], "note": "ünïcode ✓", "at": "2026-01-01T00:00:00Z", "n": 1.5}


def test_a_lapsed_attempt_hands_its_checkpoint_to_the_next_claim(sb):
    vended = sb.vend("worker")
    todo = sb.push(vended)
    first = sb.app.claim(todo["id"], caller=agent(vended), lease_ttl_seconds=60, claimant="one")
    assert first["resume_from"] is None
    assert [a["outcome"] for a in first["attempts"]] == ["claimed"]
    assert first["traceparent"] == first["attempts"][0]["traceparent"]

    sb.tick(10)
    sb.app.heartbeat(todo["id"], caller=agent(vended), lease_ttl_seconds=60, checkpoint=CHECKPOINT)
    sb.tick(61)
    assert sb.fire_due() == 1

    second = sb.app.claim_next(caller=agent(vended), claimant="two")["todo"]
    assert second["resume_from"] == CHECKPOINT
    lapsed, current = second["attempts"]
    assert (lapsed["n"], lapsed["claimant"], lapsed["outcome"], lapsed["checkpoint"]) == (1, "one", "lapsed", CHECKPOINT)
    assert when(lapsed["ended_at"]) == sb.clock.now()  # when the reaper found it lapsed
    assert (current["n"], current["outcome"], current["ended_at"]) == (2, "claimed", None)
    assert "checkpoint" not in current and "summary" not in current
    assert second["prior_attempts"][0]["outcome"] == "lease_expired"  # §6's words, kept

    sb.app.complete(todo["id"], caller=agent(vended), summary="resumed and done")
    final = sb.todo(todo["id"])
    assert [(a["n"], a["outcome"]) for a in final["attempts"]] == [(1, "lapsed"), (2, "completed")]
    assert final["attempts"][1]["summary"] == "resumed and done"
    assert final["traceparent"] is None


def test_attempts_read_the_same_from_another_process(sb):
    vended = sb.vend("worker")
    todo = sb.push(vended)
    sb.app.claim(todo["id"], caller=agent(vended))
    sb.app.heartbeat(todo["id"], caller=agent(vended), checkpoint=CHECKPOINT)
    sb.app.release(todo["id"], caller=agent(vended), summary="later")
    here = sb.todo(todo["id"])
    there = sb.another_process().app.get_todo(todo["id"], caller=CLI)
    assert here["attempts"] == there["attempts"]
    assert there["resume_from"] == CHECKPOINT and there["attempts"][0]["outcome"] == "released"


def test_an_oversized_checkpoint_is_invalid_and_leaves_the_lease_as_it_was(sb):
    vended = sb.vend("worker")
    todo = sb.push(vended)
    claimed = sb.app.claim(todo["id"], caller=agent(vended), lease_ttl_seconds=60)
    before = len(sb.app.history(todo["id"], caller=CLI)["events"])
    sb.tick(5)
    error = raised(lambda: sb.app.heartbeat(todo["id"], caller=agent(vended), lease_ttl_seconds=600,
                                            checkpoint={"blob": "x" * (64 * 1024)}))
    assert isinstance(error, InvalidArgument) and "checkpoint" in str(error)
    after = sb.todo(todo["id"])
    assert after["lease_expires_at"] == claimed["lease_expires_at"] and after["resume_from"] is None
    assert len(sb.app.history(todo["id"], caller=CLI)["events"]) == before


def test_a_stale_fence_or_an_expired_lease_cannot_save_a_checkpoint(sb):
    vended = sb.vend("worker")
    todo = sb.push(vended)
    sb.app.claim(todo["id"], caller=agent(vended), lease_ttl_seconds=60, require_fence=True)
    assert isinstance(raised(lambda: sb.app.heartbeat(todo["id"], caller=agent(vended), lease_token="stale",
                                                      checkpoint={"a": 1})), Conflict)
    sb.tick(61)
    # the lease has lapsed and is not reaped yet
    assert isinstance(raised(lambda: sb.app.heartbeat(todo["id"], caller=agent(vended), checkpoint={"a": 1})),
                      Conflict)
    assert sb.todo(todo["id"])["resume_from"] is None


def test_a_checkpoint_is_an_event_in_the_history_and_sealed_in_the_audit_chain(sb):
    vended = sb.vend("worker")
    todo = sb.push(vended)
    sb.app.claim(todo["id"], caller=agent(vended))
    sb.app.heartbeat(todo["id"], caller=agent(vended), checkpoint=CHECKPOINT)
    events = sb.app.history(todo["id"], caller=CLI)["events"]
    assert events[-1]["type"] == "LeaseRenewed" and events[-1]["data"]["checkpoint"] == CHECKPOINT

    audit = sb.container.app.audit_log
    audit.seal()
    lines = [line for line in sb.app.audit() if line["type"] == "LeaseRenewed" and line["aggregate"] == todo["id"]]
    assert lines[-1]["data"]["checkpoint"] == CHECKPOINT and lines[-1]["hash"]
    assert audit.verify().count >= len(events)


def test_one_trace_per_todo_and_one_span_per_attempt(sb):
    vended = sb.vend("worker")
    todo = sb.push(vended)
    sb.app.claim(todo["id"], caller=agent(vended))
    sb.app.release(todo["id"], caller=agent(vended))
    second = sb.app.claim(todo["id"], caller=agent(vended))
    (t1, s1), (t2, s2) = (TRACEPARENT.fullmatch(a["traceparent"]).groups() for a in second["attempts"])
    assert t1 == t2 == todo["id"].removeprefix("td_") and s1 != s2
    assert second["traceparent"] == second["attempts"][1]["traceparent"]


def test_a_delivery_traceparent_is_the_parent_of_its_todo_trace(sb):
    vended = sb.vend("worker")
    hook = create(sb, vended, "github")
    parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    answer = github(sb, hook, extra={"traceparent": parent})
    claimed = sb.app.claim(answer["id"], caller=agent(vended))
    trace_id, span_id = TRACEPARENT.fullmatch(claimed["traceparent"]).groups()
    assert trace_id == "4bf92f3577b34da6a3ce929d0e0e4736" and span_id != "00f067aa0ba902b7"
    opened = sb.app.history(answer["id"], caller=CLI)["events"][0]
    assert opened["data"]["trace_parent"] == parent

    unparented = github(sb, hook, extra={"traceparent": "not-a-traceparent"})
    other = sb.app.claim(unparented["id"], caller=agent(vended))
    assert TRACEPARENT.fullmatch(other["traceparent"]).group(1) == unparented["id"].removeprefix("td_")


@pytest.mark.parametrize("checkpoint", [0, "text", [1, [2, {}]], {"deep": {"er": None}}, True])
def test_any_json_value_is_a_checkpoint(sb, checkpoint):
    vended = sb.vend("worker")
    todo = sb.push(vended)
    sb.app.claim(todo["id"], caller=agent(vended))
    sb.app.heartbeat(todo["id"], caller=agent(vended), checkpoint=checkpoint)
    sb.app.release(todo["id"], caller=agent(vended))
    again = sb.another_process().app.claim(todo["id"], caller=agent(vended))
    assert again["resume_from"] == checkpoint
