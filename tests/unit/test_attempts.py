"""Attempts, checkpoints and traces (CONTRACT §18): given events, when a command, then events or an error."""

from __future__ import annotations

from datetime import timedelta
from uuid import UUID

import pytest

from domain.errors import Conflict, InvalidArgument
from domain.todo import LeaseRenewed, Todo, TodoOpened
from domain.todo_fields import CHECKPOINT_MAX_BYTES, check_checkpoint
from domain.traces import parse_traceparent, span_id_for, trace_id_for, traceparent
from tests.unit.test_todo import (
    HOLDER, LEASE, OPERATOR, OTHER_HOLDER, T0, TODO_UUID, TOKEN, claimed, completed, failed, given, hour,
    lease_expired, opened, released, requeued,
)

PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def renewed(at, *, checkpoint=None):
    from functools import partial
    return partial(LeaseRenewed, timestamp=at, actor=HOLDER, cause="heartbeat", lease_expires_at=at + LEASE,
                   checkpoint=checkpoint)


def only_event(todo: Todo):
    (event,) = todo.collect_events()
    return event


# --- checkpoints ------------------------------------------------------------------------------


def test_a_heartbeat_with_a_checkpoint_records_it_on_the_lease_renewal():
    todo = given(opened(), claimed(1, hour(1)))
    todo.heartbeat(now=hour(1) + timedelta(seconds=10), holder=HOLDER, lease=LEASE, checkpoint={"step": 3})
    event = only_event(todo)
    assert isinstance(event, LeaseRenewed) and event.checkpoint == {"step": 3}
    assert todo.resume_from == {"step": 3}
    assert todo.attempts[-1].checkpoint == {"step": 3}


def test_a_heartbeat_without_a_checkpoint_keeps_the_last_one():
    todo = given(opened(), claimed(1, hour(1)), renewed(hour(1), checkpoint=[1, 2]), renewed(hour(1) + timedelta(seconds=5)))
    assert todo.resume_from == [1, 2]
    assert todo.attempts[-1].checkpoint == [1, 2]


def test_a_checkpoint_over_64_kib_is_refused_and_the_lease_is_unchanged():
    todo = given(opened(), claimed(1, hour(1)))
    before = todo.lease_expires_at
    with pytest.raises(InvalidArgument, match="checkpoint"):
        todo.heartbeat(now=hour(1) + timedelta(seconds=1), holder=HOLDER, lease=LEASE,
                       checkpoint="x" * CHECKPOINT_MAX_BYTES)  # 2 quote bytes over
    assert todo.collect_events() == [] and todo.lease_expires_at == before


def test_a_checkpoint_of_exactly_64_kib_encoded_is_accepted():
    assert check_checkpoint("x" * (CHECKPOINT_MAX_BYTES - 2)) is not None
    with pytest.raises(InvalidArgument):
        check_checkpoint(float("nan"))


def test_a_stale_lease_or_a_wrong_fence_refuses_the_checkpoint_as_a_heartbeat_is_refused():
    todo = given(opened(), claimed(1, hour(1), fence=TOKEN))
    with pytest.raises(Conflict):
        todo.heartbeat(now=hour(1), holder=HOLDER, lease=LEASE, fence_token="wrong", checkpoint={"a": 1})
    with pytest.raises(Conflict):
        todo.heartbeat(now=hour(1) + LEASE, holder=HOLDER, lease=LEASE, fence_token=TOKEN, checkpoint={"a": 1})
    with pytest.raises(Conflict):
        todo.heartbeat(now=hour(1), holder=OTHER_HOLDER, lease=LEASE, checkpoint={"a": 1})
    assert todo.collect_events() == [] and todo.resume_from is None


def test_the_latest_checkpoint_survives_the_attempt_that_saved_it():
    todo = given(opened(), claimed(1, hour(1)), renewed(hour(1), checkpoint={"page": 7}), lease_expired(hour(1) + LEASE),
                 claimed(2, hour(2)))
    assert todo.resume_from == {"page": 7}
    assert todo.attempts[0].checkpoint == {"page": 7} and todo.attempts[1].checkpoint is None


def test_old_events_without_checkpoints_or_traces_still_replay():
    todo = given(opened(), claimed(1, hour(1)), renewed(hour(1)))
    assert todo.resume_from is None
    assert todo.trace_id == TODO_UUID.hex
    assert todo.traceparent_of(todo.attempts[0]) == f"00-{TODO_UUID.hex}-{span_id_for(TODO_UUID, 1)}-01"


# --- outcomes ---------------------------------------------------------------------------------


def test_attempts_tell_a_lapsed_lease_from_a_failure_and_a_release():
    t = [hour(n) for n in range(1, 6)]
    todo = given(
        opened(),
        claimed(1, t[0]), lease_expired(t[0] + LEASE),
        claimed(2, t[1]), failed(t[1] + timedelta(seconds=1), retry_at=t[1] + timedelta(minutes=1)),
        requeued(t[1] + timedelta(minutes=1)),
        claimed(3, t[2]), released(t[2] + timedelta(seconds=1)),
        claimed(4, t[3]), released(t[3] + timedelta(seconds=1), holder=OPERATOR, outcome="revoked"),
        claimed(5, t[4]),
    )
    assert [a.told for a in todo.attempts] == ["lapsed", "failed", "released", "released", "claimed"]
    assert [a.outcome for a in todo.attempts] == ["lease_expired", "failed", "released", "revoked", None]


def test_a_completed_attempt_reads_completed():
    todo = given(opened(), claimed(1, hour(1)), completed(hour(1) + timedelta(seconds=1)))
    assert todo.attempts[0].told == "completed"


# --- traces -----------------------------------------------------------------------------------


def test_a_todo_without_a_parent_mints_its_trace_id_from_its_id():
    todo = Todo.open(id=TODO_UUID, now=T0, actor=OPERATOR, endpoint_id="ep_1", queue="q", source="operator",
                     title="t", trust_mode="operator")
    event = only_event(todo)
    assert isinstance(event, TodoOpened) and event.trace_id == TODO_UUID.hex and event.trace_parent is None


def test_a_delivery_traceparent_is_the_parent_of_the_todo_trace():
    todo = Todo.open(id=TODO_UUID, now=T0, actor=OPERATOR, endpoint_id="ep_1", queue="q", source="github",
                     title="t", trust_mode="signed", trace_parent=PARENT.upper())
    assert todo.trace_id == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert only_event(todo).trace_parent == PARENT
    todo.claim(now=T0, holder=HOLDER, lease=LEASE)
    claim = only_event(todo)
    assert claim.span_id == span_id_for(TODO_UUID, 1)
    assert todo.traceparent_of(todo.attempts[0]) == f"00-4bf92f3577b34da6a3ce929d0e0e4736-{claim.span_id}-01"


def test_each_attempt_gets_its_own_span_of_one_trace():
    todo = given(opened(), claimed(1, hour(1)), lease_expired(hour(1) + LEASE))
    todo.claim(now=hour(2), holder=HOLDER, lease=LEASE)
    spans = {span_id_for(TODO_UUID, n) for n in range(1, 50)}
    assert len(spans) == 49
    parents = [todo.traceparent_of(a) for a in todo.attempts]
    assert len(set(parents)) == 2 and len({p.split("-")[1] for p in parents}) == 1


@pytest.mark.parametrize("header", [
    None, "", "garbage", "00-" + "0" * 32 + "-00f067aa0ba902b7-01", "00-4bf92f3577b34da6a3ce929d0e0e4736-" + "0" * 16 + "-01",
    "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", PARENT + "-extra", "00-4bf92f35-00f067aa0ba902b7-01",
])
def test_an_invalid_traceparent_is_ignored(header):
    assert parse_traceparent(header) is None
    assert trace_id_for(TODO_UUID, header) == TODO_UUID.hex


def test_a_future_version_traceparent_may_carry_more_fields():
    assert parse_traceparent("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-more") == (
        "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7")


def test_a_traceparent_is_w3c_shaped():
    assert traceparent("a" * 32, "b" * 16) == f"00-{'a' * 32}-{'b' * 16}-01"
    assert parse_traceparent(traceparent(UUID(int=5).hex, span_id_for(UUID(int=5), 1))) is not None
