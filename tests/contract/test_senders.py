"""The senders of CONTRACT §17 through the application, on both stores and on the injected clock:
a delivery of each named and titled, its freshness judged by the clock ingest is given (not the
wall clock), and Slack's `url_verification` answered on both ingest paths without a trace."""

from __future__ import annotations

import json

import pytest

from domain.signatures import SignatureRefused
from tests.fixtures import sign

from .harness import CLI, raised, unique
from .test_webhooks import hooks, on_a_loop, token_of

SENDERS = ("standard", "stripe", "slack")


def _made(sb):
    vended = sb.vend("senders", source_types=list(SENDERS), webhook_max=3)
    made = {source: hooks(sb).create(caller=CLI, endpoint=vended["slug"], source_type=source,
                                     target_queue=vended["queues"][0]) for source in SENDERS}
    return vended, made


def _stored(sb) -> int:
    return len(sb.container.store.read_log(0, 100_000))


def _body(source: str) -> bytes:
    return json.dumps({
        "standard": {"type": "user.created", "data": {"id": "u_7"}},
        "stripe": {"id": unique("evt"), "type": "invoice.paid", "data": {"object": {"id": "in_9"}}},
        "slack": {"type": "event_callback", "event_id": unique("Ev"),
                  "event": {"type": "app_mention", "channel": "C7", "text": "look"}},
    }[source]).encode()


@pytest.mark.parametrize("source", SENDERS)
def test_a_delivery_is_judged_fresh_by_the_clock_ingest_is_given(sb, source):
    _, made = _made(sb)
    hook = made[source]
    body = _body(source)
    signed = {"content-type": "application/json", **sign(source, hook["signing_secret"], body, now=sb.clock.now())}
    answer = hooks(sb).ingest(token_of(hook), signed, body)
    todo = sb.todo(answer["id"])
    assert (todo["source"], todo["kind"], todo["title"]) == {
        "standard": ("standard", "user.created", "user.created: u_7"),
        "stripe": ("stripe", "invoice.paid", "invoice.paid: in_9"),
        "slack": ("slack", "app_mention", "app_mention in C7: look"),
    }[source]

    sb.tick(301)  # the same signed delivery, 301 s later by the clock: stale, refused, nothing stored
    before = _stored(sb)
    assert isinstance(raised(lambda: hooks(sb).ingest(token_of(hook), signed, body)), SignatureRefused)
    assert isinstance(raised(lambda: on_a_loop(hooks(sb), token_of(hook), signed, body, remote_addr="192.0.2.1")),
                      SignatureRefused)
    assert _stored(sb) == before


def test_a_slack_url_verification_is_answered_on_both_paths_and_leaves_no_event(sb):
    _, made = _made(sb)
    hook = made["slack"]
    warm = _body("slack")  # a delivery first: ingest now keeps copies of the webhook
    hooks(sb).ingest(token_of(hook), sign("slack", hook["signing_secret"], warm, now=sb.clock.now()), warm)
    body = json.dumps({"token": "t", "challenge": "c-123", "type": "url_verification"}).encode()
    headers = {"content-type": "application/json", **sign("slack", hook["signing_secret"], body, now=sb.clock.now())}
    before = _stored(sb)
    assert hooks(sb).ingest(token_of(hook), headers, body) == {"challenge": "c-123"}
    assert on_a_loop(hooks(sb), token_of(hook), headers, body, remote_addr="192.0.2.1") == {"challenge": "c-123"}
    assert _stored(sb) == before

    hooks(sb).delete(hook["webhook_id"], caller=CLI)  # a deleted webhook no longer answers, copies or not
    assert raised(lambda: on_a_loop(hooks(sb), token_of(hook), headers, body, remote_addr="192.0.2.1")).code == "not_found"
