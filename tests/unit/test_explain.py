"""`explain` is pure: given a todo's events (and its delivery's and endpoint's), the same story and
*because*, whatever store they came from. Literal events and times."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from uuid import UUID

import pytest

from application.explain import explain, ordinal, quoted, who
from application.ports import Recorded
from domain.endpoint import EndpointVended
from domain.events import DomainEvent
from domain.queue import MAX_IN_FLIGHT, RATE_LIMITED, Refusal
from domain.todo import TodoClaimed, TodoCompleted, TodoOpened

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
TODO = UUID("00000000-0000-4000-8000-000000000001")
ENDPOINT = UUID("00000000-0000-4000-8000-000000000002")
SLUG = "worker-ab12"


def opened(**fields) -> TodoOpened:
    return TodoOpened(**{
        "originator_id": TODO, "originator_version": 1, "timestamp": T0, "actor": "operator:cli", "cause": "push",
        "endpoint_id": "ep_" + ENDPOINT.hex, "queue": "inbox", "source": "operator", "kind": None,
        "title": "t", "trust_mode": "operator", "payload": None, "payload_size": 0, **fields,
    })


def vended(**fields) -> Recorded:
    return Recorded(1, EndpointVended(
        originator_id=ENDPOINT, originator_version=1, timestamp=T0 - timedelta(days=1), actor="operator:admin",
        cause="vend", slug=SLUG, agent="worker", owner="admin", credential_sha256="0" * 64, queues=("inbox",),
        verbs=(), webhook_max=0, source_types=(), webhook_queues=(), default_lease_seconds=None,
        **{"expires_at": None, **fields}))


def test_an_untrusted_sender_is_named_with_the_webhook_whose_trust_refused_it():
    webhook = "wh_" + "7" * 32
    trace = {"stage": "untrusted", "actor": {"sender": "mallory", "association": "NONE"}, "webhook_id": webhook,
             "action": {"queue": "quarantine"}, "rules": {"stage": "default", "action": {"queue": "inbox"}}}
    stream = [Recorded(5, opened(queue="quarantine", source="github", kind="issues", routing=trace,
                                 delivery_id="ev_" + "1" * 32, cause="ingest"))]

    explained = explain(stream, now=T0, endpoint_stream=[vended()])

    assert explained["because"] == (
        f"held: sender mallory is not trusted by {webhook} (association NONE); an operator releases or discards it")
    assert explained["story"][0]["text"].endswith(
        f"(source github, kind issues): sender mallory is not trusted by {webhook} (association NONE), "
        "so it is held in quarantine.")


def test_a_rule_that_quarantines_holds_the_todo_and_says_which_rule():
    trace = {"stage": "rule", "rule_index": 2, "rule_id": "suspicious", "action": {"quarantine": True}}
    stream = [Recorded(5, opened(queue="quarantine", routing=trace, delivery_id="ev_" + "1" * 32))]
    explained = explain(stream, now=T0)
    assert explained["because"].startswith("held: rule 3 (suspicious) holds it in quarantine on delivery ev_")
    assert explained["story"][0]["text"].endswith(": rule 3 (suspicious) holds it in quarantine.")


def test_the_story_of_the_same_events_is_the_same_and_times_are_rfc3339_utc():
    stream = [
        Recorded(3, opened()),
        Recorded(9, TodoClaimed(originator_id=TODO, originator_version=2, timestamp=T0 + timedelta(seconds=5),
                                actor=f"endpoint:{SLUG}", cause="claim", attempt=1, attempt_seq=1,
                                holder=f"endpoint:{SLUG}", claimant=None,
                                lease_expires_at=T0 + timedelta(seconds=65))),
        Recorded(12, TodoCompleted(originator_id=TODO, originator_version=3, timestamp=T0 + timedelta(seconds=9),
                                   actor=f"endpoint:{SLUG}", cause="complete")),
    ]
    first = explain(stream, now=T0 + timedelta(days=9), endpoint_stream=[vended()])
    assert first == explain(list(stream), now=T0 + timedelta(days=9), endpoint_stream=[vended()])
    assert [(s["position"], s["time"]) for s in first["story"]] == [
        (3, "2026-01-01T00:00:00Z"), (9, "2026-01-01T00:00:05Z"), (12, "2026-01-01T00:00:09Z")]
    assert first["because"] == f"done: attempt 1 was completed by endpoint {SLUG} at 2026-01-01T00:00:09Z"


def test_a_pending_todo_of_an_expired_endpoint_says_so_by_the_given_now():
    stream = [Recorded(3, opened())]
    endpoint = [vended(expires_at=T0 + timedelta(hours=1))]
    assert explain(stream, now=T0, endpoint_stream=endpoint)["because"] == (
        "pending: claimable since it was pushed at 2026-01-01T00:00:00Z")
    assert explain(stream, now=T0 + timedelta(hours=1), endpoint_stream=endpoint)["because"].endswith(
        f"; but endpoint {SLUG} expired at 2026-01-01T01:00:00Z, so none of its agents can claim it")


def test_what_the_queues_limits_hold_back_now_is_added_to_the_because_only():
    stream = [Recorded(3, opened())]
    rated = Refusal(RATE_LIMITED, timedelta(seconds=20), limit=30, load=30)
    now = T0 + timedelta(minutes=5)
    explained = explain(stream, now=now, endpoint_stream=[vended()], held=rated)
    assert explained["because"] == (
        "pending: claimable since it was pushed at 2026-01-01T00:00:00Z; but queue inbox had 30 claims in the "
        "last 60 s (max_claims_per_minute 30), so no claim is admitted before 2026-01-01T00:05:20Z")
    assert explained["story"] == explain(stream, now=now, endpoint_stream=[vended()])["story"]
    expired = [vended(expires_at=T0 + timedelta(hours=1))]  # no agent can claim it at all: that is said instead
    assert explain(stream, now=T0 + timedelta(hours=1), endpoint_stream=expired, held=rated)["because"].endswith(
        "so none of its agents can claim it")


def test_one_todo_claimed_is_said_in_the_singular():
    """It said "has 1 todos claimed (max_in_flight 1), so no claim is admitted until one of them ends"."""
    full = Refusal(MAX_IN_FLIGHT, limit=1, load=1)
    assert explain([Recorded(3, opened())], now=T0, endpoint_stream=[vended()], held=full)["because"] == (
        "pending: claimable since it was pushed at 2026-01-01T00:00:00Z; but queue inbox has 1 todo claimed "
        "(max_in_flight 1), so no claim is admitted until it ends")


@dataclass(frozen=True, kw_only=True)
class SomethingNew(DomainEvent):
    """An event this module has no words for yet."""


def test_an_event_a_todo_cannot_apply_is_refused_loudly_not_told_vaguely():
    stream = [Recorded(3, opened())]
    new = Recorded(4, SomethingNew(originator_id=TODO, originator_version=2, timestamp=T0,
                                   actor="operator:admin", cause="tinker"))
    with pytest.raises(TypeError):
        explain([*stream, new], now=T0)


def test_an_empty_stream_has_no_story():
    with pytest.raises(ValueError):
        explain([], now=T0)


@pytest.mark.parametrize(("n", "text"), [(1, "1st"), (2, "2nd"), (3, "3rd"), (4, "4th"), (5, "5th"),
                                         (11, "11th"), (12, "12th"), (13, "13th"), (21, "21st"), (112, "112th")])
def test_ordinals_read_as_people_say_them(n, text):
    assert ordinal(n) == text


def test_actors_and_summaries_read_as_people_say_them():
    assert [who(a) for a in ("system", "operator:cli", "operator:admin", f"endpoint:{SLUG}")] == [
        "Switchboard", "the CLI", "admin", f"endpoint {SLUG}"]
    assert quoted("two\nlines") == "“two lines”"
    assert quoted(None) == "" and quoted("") == ""
    assert quoted("x" * 500) == "“" + "x" * 199 + "…”"
