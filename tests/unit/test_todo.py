"""The Todo aggregate: given events, when a command, then events or an error."""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timedelta, timezone
from functools import partial
from uuid import UUID

import pytest

from domain.errors import Conflict, InvalidArgument
from domain.payloads import ref_of
from domain.todo import (
    CLAIMED,
    DONE,
    FAILED,
    MAX_ATTEMPTS,
    PENDING,
    DelayElapsed,
    LeaseExpired,
    LeaseRenewed,
    Todo,
    TodoClaimed,
    TodoCompleted,
    TodoDiscarded,
    TodoFailed,
    TodoMoved,
    TodoOpened,
    TodoReleased,
    TodoRequeued,
    retry_delay,
)
from domain.attempts import Attempt
from domain.leases import effective_lease
from domain.todo_fields import check_result, cut_utf8, one_line_title
from domain.traces import span_id_for

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
TODO_UUID = UUID("00000000-0000-4000-8000-000000000001")
HOLDER = "endpoint:worker-ab12"
OTHER_HOLDER = "endpoint:rival-cd34"
OPERATOR = "operator:admin"
LEASE = timedelta(seconds=300)
TOKEN = "fence-token-1"


# --- given: events of a todo's stream -------------------------------------------------------


def opened(at: datetime = T0, title: str = "Fix the build"):
    return partial(
        TodoOpened, timestamp=at, actor=OPERATOR, cause="push", endpoint_id="ep_1",
        queue="builds", source="operator", kind=None, title=title, trust_mode="operator",
        payload={"n": 1}, payload_size=7,
    )


def claimed(
    attempt: int, at: datetime, *, seq: int | None = None, holder: str = HOLDER,
    lease: timedelta = LEASE, fence: str | None = None, claimant: str | None = "bot",
):
    return partial(
        TodoClaimed, timestamp=at, actor=holder, cause="claim", attempt=attempt,
        attempt_seq=seq if seq is not None else attempt, holder=holder, claimant=claimant,
        lease_expires_at=at + lease,
        fence_hash=hashlib.sha256(fence.encode()).hexdigest() if fence is not None else None,
    )


def failed(at: datetime, *, retry_at: datetime | None, holder: str = HOLDER, summary: str | None = None):
    return partial(
        TodoFailed, timestamp=at, actor=holder, cause="fail", summary=summary,
        next_retry_at=retry_at, dead_letter=retry_at is None,
    )


def completed(at: datetime, *, holder: str = HOLDER, summary: str | None = None):
    return partial(TodoCompleted, timestamp=at, actor=holder, cause="complete", result={"ok": True}, summary=summary)


def released(at: datetime, *, holder: str = HOLDER, summary: str | None = None, outcome: str = "released"):
    cause = "release" if outcome == "released" else "endpoint_revoked"
    return partial(TodoReleased, timestamp=at, actor=holder, cause=cause, summary=summary, outcome=outcome)


def lease_expired(at: datetime):
    return partial(LeaseExpired, timestamp=at, actor="system", cause="lease_expired")


def requeued(at: datetime, *, by_operator: bool = False):
    if by_operator:
        return partial(TodoRequeued, timestamp=at, actor=OPERATOR, cause="operator_retry", fresh_budget=True)
    return partial(TodoRequeued, timestamp=at, actor="system", cause="retry_due")


def hour(n: int) -> datetime:
    return T0 + timedelta(hours=n)


def spent_attempts(n: int, *, first_seq: int = 1, start_hour: int = 1) -> list:
    """n attempts that each failed and were requeued: the todo is pending with attempt n."""
    facts = []
    for i in range(1, n + 1):
        at = hour(start_hour + i)
        facts += [
            claimed(i, at, seq=first_seq + i - 1),
            failed(at + timedelta(minutes=1), retry_at=at + timedelta(minutes=2)),
            requeued(at + timedelta(minutes=2)),
        ]
    return facts


def given(*facts) -> Todo:
    events = [fact(originator_id=TODO_UUID, originator_version=v) for v, fact in enumerate(facts, 1)]
    return Todo.replay(events)


def on_last_attempt(*, fence: str | None = None) -> tuple[Todo, datetime]:
    """A todo claimed for its 5th attempt, and the time of that claim."""
    at = hour(10)
    return given(opened(), *spent_attempts(MAX_ATTEMPTS - 1), claimed(MAX_ATTEMPTS, at, fence=fence)), at


def dead_letter() -> Todo:
    todo, at = on_last_attempt()
    todo.fail(now=at + timedelta(minutes=1), holder=HOLDER)
    todo.collect_events()
    return todo


def only_event(todo: Todo):
    events = todo.collect_events()
    assert len(events) == 1, events
    return events[0]


def assert_refused(todo: Todo, command, error=Conflict) -> None:
    version = todo.version
    with pytest.raises(error):
        command()
    assert todo.collect_events() == []
    assert todo.version == version


def same_state(a: Todo, b: Todo) -> bool:
    strip = lambda t: {k: v for k, v in t.__dict__.items() if k != "_pending"}  # noqa: E731
    return strip(a) == strip(b)


# --- policies ---------------------------------------------------------------------------------


@pytest.mark.parametrize("requested", [None, 0, -1, -86400, 0.0])
def test_an_absent_or_non_positive_lease_takes_the_endpoint_default(requested):
    assert effective_lease(requested, timedelta(seconds=900)) == timedelta(seconds=900)


@pytest.mark.parametrize("requested", [None, 0, -30])
def test_without_an_endpoint_default_the_lease_is_300_seconds(requested):
    assert effective_lease(requested, None) == timedelta(seconds=300)


@pytest.mark.parametrize("requested", [1, 59, 60, 300, 3600.5, 86400])
def test_a_requested_lease_within_a_day_is_kept(requested):
    assert effective_lease(requested, timedelta(seconds=900)) == timedelta(seconds=requested)


@pytest.mark.parametrize("requested", [86401, 10**6, 10**15, 10**30, 1e300, float("inf")])
def test_a_requested_lease_above_a_day_is_clamped_to_86400_seconds(requested):
    assert effective_lease(requested, None) == timedelta(seconds=86400)


def test_a_nan_lease_is_treated_as_absent():
    assert effective_lease(float("nan"), timedelta(seconds=120)) == timedelta(seconds=120)


@pytest.mark.parametrize(
    ("attempt", "seconds"),
    [(1, 30), (2, 60), (3, 120), (4, 240), (5, 480), (6, 900), (7, 900), (20, 900)],
)
def test_retry_backoff_doubles_from_30_seconds_and_is_capped_at_15_minutes(attempt, seconds):
    assert retry_delay(attempt) == timedelta(seconds=seconds)


def test_a_text_within_the_byte_limit_is_kept_whole():
    assert cut_utf8("a" * 2048, 2048) == "a" * 2048
    assert cut_utf8("é" * 1024, 2048) == "é" * 1024
    assert cut_utf8(None, 2048) is None


@pytest.mark.parametrize(
    ("char", "kept"),
    [("a", 2048), ("é", 1024), ("€", 682), ("😀", 512)],
)
def test_a_long_text_is_cut_at_2048_bytes_without_splitting_a_character(char, kept):
    cut = cut_utf8(char * 3000, 2048)
    assert cut == char * kept
    assert len(cut.encode()) <= 2048


def test_a_cut_keeps_the_whole_characters_before_a_multibyte_one_that_does_not_fit():
    assert cut_utf8("ab€", 4) == "ab"
    assert cut_utf8("ab€", 5) == "ab€"


def test_a_title_is_one_line():
    assert one_line_title("Deploy\nfailed\r\n on  main\t") == "Deploy failed on main"


def test_a_title_of_200_characters_is_kept():
    assert one_line_title("x" * 200) == "x" * 200


def test_a_title_over_200_characters_is_cut_to_200_with_an_ellipsis():
    title = one_line_title("x" * 500)
    assert len(title) == 200
    assert title == "x" * 199 + "…"


def test_a_result_of_64_kib_is_accepted():
    result = "x" * (64 * 1024 - 2)  # two bytes of JSON quotes
    assert len(json.dumps(result).encode()) == 64 * 1024
    assert check_result(result) == result


def test_a_result_over_64_kib_is_refused():
    with pytest.raises(InvalidArgument):
        check_result("x" * (64 * 1024 - 1))


def test_a_result_is_measured_in_utf8_bytes_of_its_json():
    accepted = "é" * 30000  # 60000 bytes of UTF-8, though 180000 as \\u escapes
    assert check_result(accepted) == accepted
    with pytest.raises(InvalidArgument):
        check_result("é" * 33000)


@pytest.mark.parametrize("result", [{1, 2}, object(), float("nan"), {"x": float("inf")}])
def test_a_result_that_is_not_json_is_refused(result):
    with pytest.raises(InvalidArgument):
        check_result(result)


@pytest.mark.parametrize("result", [None, 0, "done", [1, 2], {"pr": 12, "ok": True}])
def test_any_json_value_is_a_result(result):
    assert check_result(result) == result


# --- open -------------------------------------------------------------------------------------


def test_opening_records_a_pending_todo_with_a_one_line_title():
    todo = Todo.open(
        id=TODO_UUID, now=T0, actor=OPERATOR, endpoint_id="ep_1", queue="builds",
        source="operator", title="Build\nbroken", trust_mode="operator", payload={"a": 1},
        payload_size=7, idempotency_key="k1",
    )
    event = only_event(todo)
    assert isinstance(event, TodoOpened)
    assert (event.title, event.queue, event.idempotency_key, event.cause) == ("Build broken", "builds", "k1", "push")
    assert (event.timestamp, event.actor, event.originator_version) == (T0, OPERATOR, 1)
    assert (todo.state, todo.attempt, todo.attempt_seq, todo.attempts) == (PENDING, 0, 0, ())
    assert todo.todo_id == "td_" + TODO_UUID.hex
    assert todo.is_claimable(T0) and todo.is_live


def test_opening_with_an_unknown_trust_mode_is_refused():
    with pytest.raises(InvalidArgument):
        Todo.open(
            id=TODO_UUID, now=T0, actor=OPERATOR, endpoint_id="ep_1", queue="q", source="s",
            title="t", trust_mode="trusted",
        )


# --- claim ------------------------------------------------------------------------------------


def test_claiming_a_pending_todo_starts_attempt_one_under_a_lease():
    todo = given(opened())
    todo.claim(now=hour(1), holder=HOLDER, lease=timedelta(seconds=120), claimant="bot-7")
    event = only_event(todo)
    assert isinstance(event, TodoClaimed)
    assert (event.attempt, event.attempt_seq, event.holder, event.claimant) == (1, 1, HOLDER, "bot-7")
    assert event.lease_expires_at == hour(1) + timedelta(seconds=120)
    assert event.fence_hash is None
    assert (event.actor, event.cause, event.timestamp, event.originator_version) == (HOLDER, "claim", hour(1), 2)
    assert (todo.state, todo.holder) == (CLAIMED, HOLDER)


def test_claiming_with_a_fence_records_only_the_hash_of_the_token():
    todo = given(opened())
    todo.claim(now=hour(1), holder=HOLDER, lease=LEASE, fence_token=TOKEN)
    event = only_event(todo)
    assert event.fence_hash == hashlib.sha256(TOKEN.encode()).hexdigest()
    assert TOKEN not in repr(event)


def test_a_claimant_label_is_cut_at_128_bytes():
    todo = given(opened())
    todo.claim(now=hour(1), holder=HOLDER, lease=LEASE, claimant="ü" * 100)
    assert only_event(todo).claimant == "ü" * 64


def test_claim_is_refused_while_the_lease_is_live():
    todo = given(opened(), claimed(1, hour(1)))
    assert_refused(todo, lambda: todo.claim(now=hour(1) + timedelta(seconds=10), holder=OTHER_HOLDER, lease=LEASE))
    assert_refused(todo, lambda: todo.claim(now=hour(1) + timedelta(seconds=10), holder=HOLDER, lease=LEASE))


def test_claim_is_refused_on_a_lapsed_lease_until_the_expiry_is_recorded():
    todo = given(opened(), claimed(1, hour(1)))
    assert_refused(todo, lambda: todo.claim(now=hour(2), holder=OTHER_HOLDER, lease=LEASE))


def test_claim_is_refused_on_a_done_todo():
    todo = given(opened(), claimed(1, hour(1)), completed(hour(1) + timedelta(minutes=1)))
    assert_refused(todo, lambda: todo.claim(now=hour(2), holder=HOLDER, lease=LEASE))


def test_claim_is_refused_on_a_failed_todo_before_its_retry_is_due():
    retry_at = hour(1) + timedelta(seconds=90)
    todo = given(opened(), claimed(1, hour(1)), failed(hour(1) + timedelta(seconds=60), retry_at=retry_at))
    assert_refused(todo, lambda: todo.claim(now=retry_at - timedelta(microseconds=1), holder=HOLDER, lease=LEASE))


def test_a_failed_todo_whose_retry_is_due_can_be_claimed_directly():
    retry_at = hour(1) + timedelta(seconds=90)
    todo = given(opened(), claimed(1, hour(1)), failed(hour(1) + timedelta(seconds=60), retry_at=retry_at))
    todo.claim(now=retry_at, holder=OTHER_HOLDER, lease=LEASE)
    event = only_event(todo)
    assert (event.attempt, event.attempt_seq, event.holder) == (2, 2, OTHER_HOLDER)
    assert (todo.state, todo.next_retry_at, todo.dead_letter) == (CLAIMED, None, False)


def test_claim_is_refused_on_a_dead_letter():
    todo = dead_letter()
    assert_refused(todo, lambda: todo.claim(now=hour(100), holder=HOLDER, lease=LEASE))


# --- heartbeat --------------------------------------------------------------------------------


def test_a_heartbeat_moves_the_lease_to_now_plus_the_ttl():
    todo = given(opened(), claimed(1, hour(1)))
    now = hour(1) + timedelta(seconds=200)
    todo.heartbeat(now=now, holder=HOLDER, lease=timedelta(seconds=600))
    event = only_event(todo)
    assert isinstance(event, LeaseRenewed)
    assert (event.lease_expires_at, event.actor, event.cause) == (now + timedelta(seconds=600), HOLDER, "heartbeat")
    assert (todo.lease_expires_at, todo.attempt) == (now + timedelta(seconds=600), 1)


def test_a_heartbeat_is_refused_after_the_lease_has_expired():
    todo = given(opened(), claimed(1, hour(1)))
    assert_refused(todo, lambda: todo.heartbeat(now=hour(1) + LEASE, holder=HOLDER, lease=LEASE))


def test_a_heartbeat_is_refused_on_a_pending_todo():
    todo = given(opened())
    assert_refused(todo, lambda: todo.heartbeat(now=hour(1), holder=HOLDER, lease=LEASE))


# --- holder-only and fence, for every holder command ---------------------------------------

HOLDER_COMMANDS = {
    "heartbeat": lambda todo, **kw: todo.heartbeat(lease=LEASE, **kw),
    "complete": lambda todo, **kw: todo.complete(result={"ok": True}, **kw),
    "fail": lambda todo, **kw: todo.fail(**kw),
    "release": lambda todo, **kw: todo.release(**kw),
}
EXPECTED = {"heartbeat": LeaseRenewed, "complete": TodoCompleted, "fail": TodoFailed, "release": TodoReleased}
DURING_LEASE = hour(1) + timedelta(seconds=100)


@pytest.mark.parametrize("name", HOLDER_COMMANDS)
def test_only_the_lease_holder_may_act_on_the_lease(name):
    todo = given(opened(), claimed(1, hour(1)))
    assert_refused(todo, lambda: HOLDER_COMMANDS[name](todo, now=DURING_LEASE, holder=OTHER_HOLDER))


@pytest.mark.parametrize("name", HOLDER_COMMANDS)
def test_the_holder_can_no_longer_act_once_its_lease_has_expired(name):
    todo = given(opened(), claimed(1, hour(1)))
    assert_refused(todo, lambda: HOLDER_COMMANDS[name](todo, now=hour(1) + LEASE, holder=HOLDER))


@pytest.mark.parametrize("name", HOLDER_COMMANDS)
def test_a_fenced_lease_refuses_a_missing_token(name):
    todo = given(opened(), claimed(1, hour(1), fence=TOKEN))
    assert_refused(todo, lambda: HOLDER_COMMANDS[name](todo, now=DURING_LEASE, holder=HOLDER))


@pytest.mark.parametrize("name", HOLDER_COMMANDS)
def test_a_fenced_lease_refuses_a_wrong_token(name):
    todo = given(opened(), claimed(1, hour(1), fence=TOKEN))
    assert_refused(
        todo, lambda: HOLDER_COMMANDS[name](todo, now=DURING_LEASE, holder=HOLDER, fence_token="stale-token")
    )


@pytest.mark.parametrize("name", HOLDER_COMMANDS)
def test_a_fenced_lease_accepts_the_right_token(name):
    todo = given(opened(), claimed(1, hour(1), fence=TOKEN))
    HOLDER_COMMANDS[name](todo, now=DURING_LEASE, holder=HOLDER, fence_token=TOKEN)
    assert isinstance(only_event(todo), EXPECTED[name])


@pytest.mark.parametrize("name", HOLDER_COMMANDS)
def test_the_right_token_does_not_help_another_holder(name):
    todo = given(opened(), claimed(1, hour(1), fence=TOKEN))
    assert_refused(
        todo, lambda: HOLDER_COMMANDS[name](todo, now=DURING_LEASE, holder=OTHER_HOLDER, fence_token=TOKEN)
    )


@pytest.mark.parametrize("name", HOLDER_COMMANDS)
def test_an_unfenced_lease_ignores_a_token(name):
    todo = given(opened(), claimed(1, hour(1)))
    HOLDER_COMMANDS[name](todo, now=DURING_LEASE, holder=HOLDER, fence_token="anything")
    assert isinstance(only_event(todo), EXPECTED[name])


@pytest.mark.parametrize("name", HOLDER_COMMANDS)
def test_a_fence_does_not_outlive_its_attempt(name):
    todo = given(
        opened(), claimed(1, hour(1), fence=TOKEN), released(hour(1) + timedelta(seconds=5)),
        claimed(2, hour(2), holder=HOLDER),
    )
    HOLDER_COMMANDS[name](todo, now=hour(2) + timedelta(seconds=5), holder=HOLDER)
    assert isinstance(only_event(todo), EXPECTED[name])


# --- complete ---------------------------------------------------------------------------------


def test_completing_makes_the_todo_done_with_its_result():
    todo = given(opened(), claimed(1, hour(1)))
    todo.complete(now=DURING_LEASE, holder=HOLDER, result={"pr": 42}, summary="merged")
    event = only_event(todo)
    assert isinstance(event, TodoCompleted)
    assert (event.summary, event.actor, event.cause) == ("merged", HOLDER, "complete")
    # the result by reference to its bytes (docs/adr/0027), which travel with the event to the store
    assert event.result_bytes == b'{"pr":42}' and event.result_ref == ref_of(b'{"pr":42}')
    assert (todo.state, todo.result_bytes, todo.holder, todo.lease_expires_at) == (DONE, b'{"pr":42}', None, None)
    assert not todo.is_claimable(hour(100)) and not todo.is_live


def test_a_long_summary_is_cut_at_2048_bytes_not_refused():
    todo = given(opened(), claimed(1, hour(1)))
    todo.complete(now=DURING_LEASE, holder=HOLDER, summary="€" * 1000)
    summary = only_event(todo).summary
    assert summary == "€" * 682
    assert todo.attempts[-1].summary == summary


def test_completing_with_a_result_over_64_kib_is_refused():
    todo = given(opened(), claimed(1, hour(1)))
    assert_refused(
        todo, lambda: todo.complete(now=DURING_LEASE, holder=HOLDER, result="x" * 70000), InvalidArgument
    )
    assert todo.state == CLAIMED


def test_failing_with_a_result_over_64_kib_is_refused():
    todo = given(opened(), claimed(1, hour(1)))
    assert_refused(todo, lambda: todo.fail(now=DURING_LEASE, holder=HOLDER, result=["x" * 70000]), InvalidArgument)


# --- fail -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("attempt", "delay"), [(1, 30), (2, 60), (3, 120), (4, 240)])
def test_failing_before_the_last_attempt_schedules_a_retry_with_backoff(attempt, delay):
    at = hour(10)
    todo = given(opened(), *spent_attempts(attempt - 1), claimed(attempt, at))
    todo.fail(now=at + timedelta(seconds=10), holder=HOLDER, summary="flaky")
    event = only_event(todo)
    assert isinstance(event, TodoFailed)
    assert event.next_retry_at == at + timedelta(seconds=10 + delay)
    assert (event.dead_letter, event.summary, event.cause) == (False, "flaky", "fail")
    assert (todo.state, todo.attempt, todo.dead_letter) == (FAILED, attempt, False)
    assert todo.is_live


def test_failing_the_fifth_attempt_dead_letters_the_todo():
    todo, at = on_last_attempt()
    todo.fail(now=at + timedelta(seconds=10), holder=HOLDER)
    event = only_event(todo)
    assert (event.dead_letter, event.next_retry_at) == (True, None)
    assert (todo.state, todo.dead_letter, todo.next_retry_at, todo.attempt) == (FAILED, True, None, MAX_ATTEMPTS)
    assert not todo.is_live


def test_a_dead_letter_is_never_claimable_nor_due():
    todo = dead_letter()
    for later in (hour(10), hour(11), hour(10_000)):
        assert not todo.is_claimable(later)
        assert not todo.retry_due(later)


# --- release ----------------------------------------------------------------------------------


def test_releasing_returns_the_todo_to_pending_and_keeps_the_attempt_counted():
    todo = given(opened(), claimed(1, hour(1)))
    todo.release(now=DURING_LEASE, holder=HOLDER, summary="not mine")
    event = only_event(todo)
    assert isinstance(event, TodoReleased)
    assert (event.outcome, event.summary, event.dead_letter, event.cause) == ("released", "not mine", False, "release")
    assert (todo.state, todo.attempt, todo.holder) == (PENDING, 1, None)
    todo.claim(now=hour(2), holder=OTHER_HOLDER, lease=LEASE)
    assert (only_event(todo).attempt, todo.attempt_seq) == (2, 2)


def test_releasing_the_fifth_attempt_dead_letters_the_todo():
    todo, at = on_last_attempt()
    todo.release(now=at + timedelta(seconds=10), holder=HOLDER)
    event = only_event(todo)
    assert (event.outcome, event.dead_letter) == ("released", True)
    assert (todo.state, todo.dead_letter, todo.next_retry_at) == (FAILED, True, None)


# --- lease expiry -----------------------------------------------------------------------------


def test_a_lease_cannot_be_expired_before_it_lapses():
    todo = given(opened(), claimed(1, hour(1)))
    assert_refused(todo, lambda: todo.expire_lease(now=hour(1) + LEASE - timedelta(microseconds=1)))


def test_a_lapsed_lease_returns_the_todo_to_pending():
    todo = given(opened(), claimed(1, hour(1)))
    todo.expire_lease(now=hour(1) + LEASE)
    event = only_event(todo)
    assert isinstance(event, LeaseExpired)
    assert (event.actor, event.cause, event.dead_letter) == ("system", "lease_expired", False)
    assert (todo.state, todo.attempt, todo.holder, todo.lease_expires_at) == (PENDING, 1, None, None)


def test_a_lapsed_lease_on_the_fifth_attempt_dead_letters_the_todo():
    todo, at = on_last_attempt()
    todo.expire_lease(now=at + LEASE)
    assert only_event(todo).dead_letter is True
    assert (todo.state, todo.dead_letter, todo.next_retry_at) == (FAILED, True, None)


def test_a_heartbeat_postpones_the_expiry():
    todo = given(opened(), claimed(1, hour(1)), partial(
        LeaseRenewed, timestamp=DURING_LEASE, actor=HOLDER, cause="heartbeat",
        lease_expires_at=DURING_LEASE + LEASE,
    ))
    assert_refused(todo, lambda: todo.expire_lease(now=hour(1) + LEASE))
    todo.expire_lease(now=DURING_LEASE + LEASE)
    assert isinstance(only_event(todo), LeaseExpired)


@pytest.mark.parametrize("state", ["pending", "done"])
def test_only_a_claimed_todo_has_a_lease_to_expire(state):
    facts = [opened()] if state == "pending" else [opened(), claimed(1, hour(1)), completed(DURING_LEASE)]
    todo = given(*facts)
    assert_refused(todo, lambda: todo.expire_lease(now=hour(100)))


# --- endpoint revoked -------------------------------------------------------------------------


def test_revoking_the_holder_ends_its_lease_as_revoked():
    todo = given(opened(), claimed(1, hour(1)))
    todo.revoke_lease(now=DURING_LEASE, actor=OPERATOR)
    event = only_event(todo)
    assert (event.outcome, event.cause, event.actor, event.dead_letter) == ("revoked", "endpoint_revoked", OPERATOR, False)
    assert (todo.state, todo.attempt) == (PENDING, 1)


def test_revoking_the_holder_on_the_fifth_attempt_dead_letters_the_todo():
    todo, at = on_last_attempt()
    todo.revoke_lease(now=at, actor=OPERATOR)
    assert only_event(todo).dead_letter is True
    assert (todo.state, todo.dead_letter) == (FAILED, True)


def test_there_is_no_lease_to_revoke_on_a_pending_todo():
    todo = given(opened())
    assert_refused(todo, lambda: todo.revoke_lease(now=hour(1), actor=OPERATOR))


# --- scheduled requeue ------------------------------------------------------------------------


def test_a_failed_todo_is_requeued_once_its_retry_is_due():
    retry_at = hour(1) + timedelta(seconds=90)
    todo = given(opened(), claimed(1, hour(1)), failed(hour(1) + timedelta(seconds=60), retry_at=retry_at))
    assert_refused(todo, lambda: todo.requeue_due(now=retry_at - timedelta(seconds=1)))
    todo.requeue_due(now=retry_at)
    event = only_event(todo)
    assert isinstance(event, TodoRequeued)
    assert (event.actor, event.cause, event.fresh_budget) == ("system", "retry_due", False)
    assert (todo.state, todo.attempt, todo.next_retry_at) == (PENDING, 1, None)


@pytest.mark.parametrize("state", ["pending", "claimed", "dead_letter"])
def test_only_a_failed_todo_with_a_retry_due_is_requeued(state):
    todo = {
        "pending": lambda: given(opened()),
        "claimed": lambda: given(opened(), claimed(1, hour(1))),
        "dead_letter": dead_letter,
    }[state]()
    assert_refused(todo, lambda: todo.requeue_due(now=hour(10_000)))


# --- operator retry ---------------------------------------------------------------------------


def test_an_operator_retry_revives_a_dead_letter_with_a_fresh_budget():
    todo = dead_letter()
    todo.retry_now(now=hour(20), actor=OPERATOR)
    event = only_event(todo)
    assert isinstance(event, TodoRequeued)
    assert (event.actor, event.cause, event.fresh_budget) == (OPERATOR, "operator_retry", True)
    assert (todo.state, todo.attempt, todo.dead_letter, todo.next_retry_at) == (PENDING, 0, False, None)
    assert todo.is_claimable(hour(20))


def test_an_operator_retry_takes_a_todo_awaiting_its_retry_at_once():
    retry_at = hour(3) + timedelta(seconds=240)
    todo = given(opened(), *spent_attempts(2), claimed(3, hour(3)), failed(hour(3), retry_at=retry_at))
    todo.retry_now(now=hour(3) + timedelta(seconds=1), actor=OPERATOR)
    assert only_event(todo).fresh_budget is True
    assert (todo.state, todo.attempt, todo.next_retry_at) == (PENDING, 0, None)


@pytest.mark.parametrize("state", ["pending", "claimed", "done"])
def test_an_operator_retry_is_refused_unless_the_todo_failed(state):
    todo = {
        "pending": lambda: given(opened()),
        "claimed": lambda: given(opened(), claimed(1, hour(1))),
        "done": lambda: given(opened(), claimed(1, hour(1)), completed(DURING_LEASE)),
    }[state]()
    assert_refused(todo, lambda: todo.retry_now(now=hour(5), actor=OPERATOR))


def test_after_an_operator_retry_the_todo_gets_five_more_attempts():
    todo = dead_letter()
    todo.retry_now(now=hour(20), actor=OPERATOR)
    for n in range(1, MAX_ATTEMPTS + 1):
        now = hour(20 + n)
        todo.claim(now=now, holder=HOLDER, lease=LEASE)
        todo.fail(now=now + timedelta(seconds=1), holder=HOLDER)
        if n < MAX_ATTEMPTS:
            todo.requeue_due(now=todo.next_retry_at)
    events = todo.collect_events()
    claims = [e for e in events if isinstance(e, TodoClaimed)]
    assert [c.attempt for c in claims] == [1, 2, 3, 4, 5]
    assert [c.attempt_seq for c in claims] == [6, 7, 8, 9, 10]
    assert todo.dead_letter and todo.attempt == MAX_ATTEMPTS


def test_attempt_seq_is_never_reused_across_operator_retries():
    todo = given(
        opened(), claimed(1, hour(1)), failed(hour(1), retry_at=None),
        requeued(hour(2), by_operator=True),
    )
    todo.claim(now=hour(3), holder=HOLDER, lease=LEASE)
    event = only_event(todo)
    assert (event.attempt, event.attempt_seq) == (1, 2)
    assert [a.seq for a in todo.attempts] == [1, 2]


# --- attempts and replay ----------------------------------------------------------------------


def test_closed_attempts_keep_their_outcome_claimant_times_and_summary():
    t = [hour(n) for n in range(1, 7)]
    todo = given(
        opened(),
        claimed(1, t[0], claimant="a"), released(t[0] + timedelta(seconds=5), summary="busy"),
        claimed(2, t[1], claimant="b"), lease_expired(t[1] + LEASE),
        claimed(3, t[2], claimant="c"), released(t[2] + timedelta(seconds=7), holder=OPERATOR, outcome="revoked"),
        claimed(4, t[3], claimant="d"), failed(t[3] + timedelta(seconds=9), retry_at=t[3] + timedelta(minutes=5), summary="boom"),
        requeued(t[3] + timedelta(minutes=5)),
    )
    todo.claim(now=t[4], holder=HOLDER, lease=LEASE, claimant="e")
    todo.complete(now=t[4] + timedelta(seconds=11), holder=HOLDER, summary="ok")
    assert todo.attempts == (
        Attempt(1, "a", t[0], t[0] + timedelta(seconds=5), "released", "busy"),
        Attempt(2, "b", t[1], t[1] + LEASE, "lease_expired", None),
        Attempt(3, "c", t[2], t[2] + timedelta(seconds=7), "revoked", None),
        Attempt(4, "d", t[3], t[3] + timedelta(seconds=9), "failed", "boom"),
        Attempt(5, "e", t[4], t[4] + timedelta(seconds=11), "completed", "ok", span_id=span_id_for(TODO_UUID, 5)),
    )


def test_an_open_attempt_has_no_outcome_yet():
    todo = given(opened(), claimed(1, hour(1), claimant="a"))
    assert todo.attempts == (Attempt(1, "a", hour(1)),)


def test_replaying_the_recorded_events_rebuilds_the_todo_exactly():
    todo = Todo.open(
        id=TODO_UUID, now=T0, actor=OPERATOR, endpoint_id="ep_1", queue="builds",
        source="github", kind="push", title="t", trust_mode="signed", payload={"x": 1},
        payload_size=7, routing={"rule": "r1"}, delivery_id="dl_1", cause="webhook",
    )
    todo.claim(now=hour(1), holder=HOLDER, lease=LEASE, claimant="bot", fence_token=TOKEN)
    todo.heartbeat(now=DURING_LEASE, holder=HOLDER, lease=LEASE, fence_token=TOKEN)
    todo.fail(now=DURING_LEASE, holder=HOLDER, result={"err": 1}, summary="no", fence_token=TOKEN)
    todo.requeue_due(now=hour(2))
    todo.claim(now=hour(3), holder=OTHER_HOLDER, lease=LEASE)
    history = todo.collect_events()
    assert [e.originator_version for e in history] == list(range(1, 7))
    assert [type(e) for e in history] == [
        TodoOpened, TodoClaimed, LeaseRenewed, TodoFailed, TodoRequeued, TodoClaimed,
    ]
    assert same_state(Todo.replay(history), todo)


def test_replaying_nothing_gives_no_todo():
    assert Todo.replay([]) is None


def test_every_event_carries_time_actor_and_cause():
    todo = given(opened(), claimed(1, hour(1)))
    todo.release(now=DURING_LEASE, holder=HOLDER)
    todo.claim(now=hour(2), holder=HOLDER, lease=LEASE)
    todo.expire_lease(now=hour(2) + LEASE)
    events = todo.collect_events()
    assert [(e.timestamp, e.actor, e.cause) for e in events] == [
        (DURING_LEASE, HOLDER, "release"),
        (hour(2), HOLDER, "claim"),
        (hour(2) + LEASE, "system", "lease_expired"),
    ]
    assert [e.originator_id for e in events] == [TODO_UUID] * 3


# --- quarantine: release to a queue, discard ----------------------------------------------------


def quarantined_opened(at: datetime = T0):
    return partial(
        TodoOpened, timestamp=at, actor="webhook:wh_1", cause="ingest", endpoint_id="ep_1",
        queue="quarantine", source="github", kind="ping", title="ping", trust_mode="signed",
        payload={"zen": "x"}, payload_size=12,
    )


def test_a_pending_quarantined_todo_moves_to_a_queue_with_what_a_ring_needs():
    todo = given(quarantined_opened())

    todo.move_from_quarantine(now=hour(1), actor=OPERATOR, queue="builds")

    event = only_event(todo)
    assert isinstance(event, TodoMoved)
    assert (event.queue, event.from_queue, event.endpoint_id, event.source, event.kind, event.title) == (
        "builds", "quarantine", "ep_1", "github", "ping", "ping")
    assert (todo.queue, todo.state, todo.is_claimable(hour(1))) == ("builds", PENDING, True)


def test_moving_is_refused_outside_quarantine_while_claimed_and_to_quarantine_itself():
    assert_refused(given(opened()), lambda: given(opened()).move_from_quarantine(now=hour(1), actor=OPERATOR, queue="x"))
    held = given(quarantined_opened(), claimed(1, hour(1), holder=OPERATOR))
    assert_refused(held, lambda: held.move_from_quarantine(now=hour(1), actor=OPERATOR, queue="builds"))
    pending = given(quarantined_opened())
    assert_refused(pending, lambda: pending.move_from_quarantine(now=hour(1), actor=OPERATOR, queue="quarantine"),
                   InvalidArgument)


def test_discarding_ends_an_unclaimed_quarantined_todo_as_done_with_no_result():
    for facts in ([quarantined_opened()],
                  [quarantined_opened(), claimed(1, hour(1), holder=OPERATOR),
                   failed(hour(2), retry_at=hour(3), holder=OPERATOR)]):
        todo = given(*facts)
        todo.discard(now=hour(2), actor=OPERATOR, summary="noise")
        event = only_event(todo)
        assert isinstance(event, TodoDiscarded) and event.summary == "noise"
        assert (todo.state, todo.result_ref, todo.next_retry_at, todo.is_claimable(hour(9))) == (DONE, None, None, False)
        assert_refused(todo, lambda: todo.discard(now=hour(3), actor=OPERATOR))


def test_discarding_is_refused_outside_quarantine_and_while_claimed():
    normal = given(opened())
    assert_refused(normal, lambda: normal.discard(now=hour(1), actor=OPERATOR))
    held = given(quarantined_opened(), claimed(1, hour(1), holder=OPERATOR))
    assert_refused(held, lambda: held.discard(now=hour(1), actor=OPERATOR))


def test_nobody_claims_a_quarantined_todo():
    todo = given(quarantined_opened())
    assert_refused(todo, lambda: todo.claim(now=hour(1), holder=OPERATOR, lease=LEASE))


# --- delays and snoozes ---------------------------------------------------------------------------


def test_a_todo_pushed_with_not_before_is_pending_but_not_claimable_until_then():
    todo = given(partial(opened(), not_before=hour(1)))
    assert todo.state == PENDING and todo.available_at == hour(1)
    assert not todo.is_claimable(hour(1) - timedelta(microseconds=1))
    assert_refused(todo, lambda: todo.claim(now=hour(1) - timedelta(seconds=1), holder=HOLDER, lease=LEASE))
    assert todo.is_claimable(hour(1))


def test_the_refusal_of_a_delayed_claim_says_until_when():
    todo = given(partial(opened(), not_before=hour(1)))
    with pytest.raises(Conflict, match="delayed until 2026-01-01T01:00:00Z"):
        todo.claim(now=T0, holder=HOLDER, lease=LEASE)


def test_a_not_before_already_past_delays_nothing():
    todo = Todo.open(id=TODO_UUID, now=hour(2), actor=OPERATOR, endpoint_id="ep_1", queue="builds",
                     source="operator", title="t", trust_mode="operator", not_before=hour(1))
    event = only_event(todo)
    assert event.not_before is None and todo.is_claimable(hour(2)) and not todo.delay_due(hour(3))


def test_the_delay_elapses_once_its_time_has_come():
    todo = given(partial(opened(), not_before=hour(1)))
    assert_refused(todo, lambda: todo.elapse_delay(now=hour(1) - timedelta(seconds=1)))
    todo.elapse_delay(now=hour(1))
    event = only_event(todo)
    assert isinstance(event, DelayElapsed) and (event.actor, event.cause) == ("system", "delay_elapsed")
    assert todo.state == PENDING and todo.is_claimable(hour(1)) and not todo.delay_due(hour(2))


def test_a_delayed_todo_claimed_at_its_time_needs_no_elapse():
    todo = given(partial(opened(), not_before=hour(1)))
    todo.claim(now=hour(1), holder=HOLDER, lease=LEASE)
    assert todo.state == CLAIMED and not todo.delay_due(hour(2))


def test_a_release_with_a_delay_is_a_snooze_that_keeps_the_attempt():
    todo = given(opened(), claimed(1, hour(1)))
    todo.release(now=hour(1) + timedelta(minutes=1), holder=HOLDER, delay=timedelta(minutes=10))
    event = only_event(todo)
    assert isinstance(event, TodoReleased) and event.available_at == hour(1) + timedelta(minutes=11)
    assert todo.state == PENDING and todo.attempt == 1
    assert not todo.is_claimable(hour(1) + timedelta(minutes=10))
    assert todo.delay_due(hour(1) + timedelta(minutes=11))
    todo.claim(now=hour(1) + timedelta(minutes=11), holder=HOLDER, lease=LEASE)
    assert todo.attempt == 2


def test_a_release_without_a_delay_is_claimable_at_once():
    todo = given(opened(), claimed(1, hour(1)))
    todo.release(now=hour(1) + timedelta(minutes=1), holder=HOLDER)
    assert only_event(todo).available_at is None and todo.is_claimable(hour(2)) and not todo.delay_due(hour(3))


def test_a_snooze_on_the_last_attempt_still_dead_letters():
    todo, at = on_last_attempt()
    todo.release(now=at + timedelta(minutes=1), holder=HOLDER, delay=timedelta(minutes=10))
    event = only_event(todo)
    assert event.dead_letter and event.available_at is None and todo.dead_letter


def test_a_claim_records_where_the_todo_is_and_the_controls_it_was_admitted_under():
    todo = given(opened())
    todo.claim(now=hour(1), holder=HOLDER, lease=LEASE, admitted_under={"max_in_flight": 3})
    event = only_event(todo)
    assert (event.endpoint_id, event.queue, event.admitted_under) == ("ep_1", "builds", {"max_in_flight": 3})


def test_a_bulk_retry_carries_its_bulk_action_id_as_cause():
    todo = dead_letter()
    todo.retry_now(now=hour(12), actor=OPERATOR, cause="ba_" + "1" * 32)
    event = only_event(todo)
    assert (event.cause, event.fresh_budget, todo.state, todo.attempt) == ("ba_" + "1" * 32, True, PENDING, 0)


def test_replaying_a_snoozed_todo_rebuilds_it_exactly():
    todo = given(partial(opened(), not_before=hour(1)))
    todo.elapse_delay(now=hour(1))
    todo.claim(now=hour(2), holder=HOLDER, lease=LEASE)
    todo.release(now=hour(2), holder=HOLDER, delay=timedelta(seconds=30))
    facts = [opened()(not_before=hour(1), originator_id=TODO_UUID, originator_version=1), *todo.collect_events()]
    assert same_state(Todo.replay(facts), todo)
