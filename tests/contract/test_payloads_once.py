"""Payloads stored once (issue 14, docs/adr/0027): content-addressed, named by the events, written
with them, shown as before — and a store from before this change reads and rebuilds the same."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlencode

import msgspec
import pytest

from application.access import todo_uuid
from application.errors import StoreUnavailable
from domain.payloads import canonical_json
from tests.contract.harness import CLI, agent, unique
from tests.fixtures import fixture, sign

BODY = fixture("github_issues_opened.json")


def token_of(hook: dict[str, Any]) -> str:
    return hook["ingest_url"].rsplit("/", 1)[1]


def fan_out(sb, targets: int = 3) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A GitHub webhook on one endpoint, routed to `targets` endpoints in all."""
    endpoints = [sb.app.vend(unique("fan"), queues=["work"], caller=CLI) for _ in range(targets)]
    hook = sb.container.webhooks.create(caller=CLI, endpoint=endpoints[0]["slug"], source_type="github",
                                        target_queue="work")
    for other in endpoints[1:]:
        sb.container.webhooks.add_route(hook["webhook_id"], other["endpoint_id"], caller=CLI)
    return hook, endpoints


def github(sb, hook, body: bytes = BODY) -> dict[str, Any]:
    headers = {"Content-Type": "application/json", "X-GitHub-Event": "issues", "X-GitHub-Delivery": unique("gh"),
               **sign("github", hook["signing_secret"], body)}
    return sb.container.webhooks.ingest(token_of(hook), headers, body, remote_addr="203.0.113.7")


def stored(sb) -> dict[str, int]:
    """sha256 → size of every payload row holding bytes."""
    rows = sb.container.store.db.query("SELECT sha256, size FROM sb_blobs WHERE data IS NOT NULL")
    return {digest: size for digest, size in rows}


def test_a_delivery_and_the_todos_it_opens_share_one_stored_body(sb):
    hook, endpoints = fan_out(sb, 3)
    before = stored(sb)

    answer = github(sb, hook)

    digest = hashlib.sha256(BODY).hexdigest()
    assert {d: s for d, s in stored(sb).items() if d not in before} == {digest: len(BODY)}
    assert answer["created"] == 3
    for todo in answer["todos"]:
        full = sb.app.get_todo(todo["id"], caller=CLI)
        assert full["payload"] == json.loads(BODY) and full["payload_size"] == len(BODY)
    event = sb.container.webhooks.get_event(answer["event_id"], caller=CLI)
    assert event["payload"] == json.loads(BODY) and event["body_sha256"] == digest
    assert sb.container.webhooks.event_body(answer["event_id"], caller=CLI)[0] == BODY
    # the log holds the reference, never the body
    states = [bytes(s) for (s,) in sb.container.store.db.query("SELECT state FROM stored_events")]
    assert not any(b"api.github.com" in s for s in states)


def test_the_same_bytes_delivered_twice_are_stored_once(sb):
    hook, _ = fan_out(sb, 1)
    before = len(stored(sb))
    github(sb, hook)
    github(sb, hook)
    assert len(stored(sb)) == before + 1


def test_a_claim_shows_the_payload_of_a_todo_another_process_opened(sb):
    hook, endpoints = fan_out(sb, 1)
    github(sb, hook)
    other = sb.another_process()  # its cache knows nothing of the todo: the bytes are read
    claimed = other.app.claim_next(caller=agent(endpoints[0]))
    assert claimed["todo"]["payload"] == json.loads(BODY)


def test_pushed_payloads_and_results_are_stored_by_reference_and_shown_as_before(sb):
    endpoint = sb.app.vend(unique("push"), queues=["work"], caller=CLI)
    payload = {"z": 1, "a": ["é", None, 2.5], "nested": {"y": True, "b": "x"}}
    pushed = sb.app.push(endpoint["slug"], "ordered keys", caller=CLI, payload=payload)
    me = agent(endpoint)
    claimed = sb.app.claim_next(caller=me)["todo"]
    assert list(claimed["payload"]) == ["z", "a", "nested"] and claimed["payload"] == payload
    sb.app.complete(claimed["id"], caller=me, result={"k": "v", "n": [1, 2]}, summary="ok")

    full = sb.app.get_todo(pushed["todo"]["id"], caller=CLI)
    assert (full["payload"], full["result"]) == (payload, {"k": "v", "n": [1, 2]})
    history = sb.app.history(pushed["todo"]["id"], caller=CLI)["events"]
    assert history[0]["data"]["payload"] == payload and "payload_ref" not in history[0]["data"]
    assert history[-1]["data"]["result"] == {"k": "v", "n": [1, 2]}
    # digested over the canonical JSON (keys sorted), as the audit chain digests an inline value
    digests = stored(sb)
    assert hashlib.sha256(canonical_json(payload)).hexdigest() in digests
    assert hashlib.sha256(canonical_json({"k": "v", "n": [1, 2]})).hexdigest() in digests


def test_bodies_that_are_not_json_or_are_forms_read_back_as_before(sb):
    endpoint = sb.app.vend(unique("gen"), queues=["work"], caller=CLI)
    hook = sb.container.webhooks.create(caller=CLI, endpoint=endpoint["slug"], source_type="generic",
                                        target_queue="work")
    webhooks = sb.container.webhooks
    raw = b"\xff\xfe not json \x00"
    text = webhooks.ingest(token_of(hook), {"Content-Type": "application/octet-stream", "X-Delivery-Id": unique("d")},
                           raw, remote_addr="198.51.100.2")
    form_body = urlencode({"payload": json.dumps({"action": "opened", "n": 7})}).encode()
    form = webhooks.ingest(token_of(hook), {"Content-Type": "application/x-www-form-urlencoded",
                                            "X-Delivery-Id": unique("d")}, form_body, remote_addr="198.51.100.2")

    assert sb.app.get_todo(text["id"], caller=CLI)["payload"] == raw.decode(errors="replace")
    shown = webhooks.get_event(text["event_id"], caller=CLI)
    assert (shown["payload"], shown["body"]) == (None, raw.decode(errors="replace"))
    assert webhooks.event_body(text["event_id"], caller=CLI)[0] == raw
    assert sb.app.get_todo(form["id"], caller=CLI)["payload"] == {"action": "opened", "n": 7}
    assert webhooks.get_event(form["event_id"], caller=CLI)["payload"] == {"action": "opened", "n": 7}


def test_rules_replay_and_dry_run_read_each_stored_body(sb):
    hook, endpoints = fan_out(sb, 1)
    first = github(sb, hook)
    github(sb, hook)
    rules = {"rules": [{"id": "opened", "expr": '.payload.action == "opened"', "action": {"drop": True}}]}

    replay = sb.container.webhooks.replay(hook["webhook_id"], rules, caller=CLI)
    tested = sb.container.webhooks.test_rules(hook["webhook_id"], caller=CLI, event_id=first["event_id"],
                                              candidate=rules)

    assert replay["evaluated"] == 2 and replay["decisions"] == {"drop": 2}
    assert tested["decision"]["drop"] is True and tested["envelope"]["payload"] == json.loads(BODY)


def test_every_reference_in_the_log_names_stored_bytes(sb):
    hook, endpoints = fan_out(sb, 2)
    github(sb, hook)
    me = agent(endpoints[1])
    todo = sb.app.claim_next(caller=me)["todo"]
    sb.app.fail(todo["id"], caller=me, result={"why": "flaky"})
    held = stored(sb)
    for (state,) in sb.container.store.db.query("SELECT state FROM stored_events"):
        data = msgspec.json.decode(bytes(state))
        for name in ("body_ref", "payload_ref", "result_ref"):
            if data.get(name) is not None:
                assert held.get(data[name]["sha256"]) == data[name]["size"], name


def test_export_lines_hold_the_stored_fields_and_never_the_carried_bytes_fields(sb):
    hook, endpoints = fan_out(sb, 1)
    github(sb, hook)
    me = agent(endpoints[0])
    todo = sb.app.claim_next(caller=me)["todo"]
    sb.app.complete(todo["id"], caller=me, result={"ok": True})
    lines = {line["type"]: line for line in sb.container.audit.export()}
    for kind in ("DeliveryAccepted", "TodoOpened", "TodoCompleted"):
        assert not [name for name in lines[kind]["data"] if name.endswith("_bytes")], kind
        assert lines[kind]["digests"], kind  # the content is sealed by its digest instead


@contextmanager
def unreadable(sb, digest: str) -> Iterator[None]:
    """The payload store's row of `digest` fails every read of it, in the database itself: the table
    is moved aside behind a view of the same name whose `data` of that row is an invalid JSON cast."""
    broken = ("convert_to(CAST(sha256 || '{' AS json)::text, 'UTF8')" if sb.url.startswith("postgresql")
              else "json(sha256 || '{')")  # raises as the row is read: 'malformed JSON' / 'invalid input syntax'
    with sb.container.store.db.transaction() as tx:
        tx.execute("ALTER TABLE sb_blobs RENAME TO sb_blobs_aside")
        tx.execute(f"CREATE VIEW sb_blobs AS SELECT sha256, size, codec,"
                   f" CASE WHEN sha256 = '{digest}' THEN {broken} ELSE data END AS data, named_at, pruned_at"
                   " FROM sb_blobs_aside")
    try:
        yield
    finally:
        with sb.container.store.db.transaction() as tx:
            tx.execute("DROP VIEW sb_blobs")
            tx.execute("ALTER TABLE sb_blobs_aside RENAME TO sb_blobs")


@pytest.mark.parametrize("how", ["claim_next", "claim", "claim_next max"])
def test_a_claim_whose_payload_read_fails_commits_nothing(sb, how):
    endpoint = sb.app.vend(unique("unread"), queues=["work"], caller=CLI)
    payload = {"only": "here"}
    todo_id = sb.app.push(endpoint["slug"], "read me", caller=CLI, payload=payload)["todo"]["id"]
    other = sb.another_process().app  # holds no bytes of the todo: its claim reads them
    me = agent(endpoint)
    claim = {"claim_next": lambda: other.claim_next(caller=me),
             "claim": lambda: {"todo": other.claim(todo_id, caller=me)},
             "claim_next max": lambda: {"todo": other.claim_next(caller=me, max_todos=5)["todos"][0]}}[how]
    before = sb.container.store.version_of(todo_uuid(todo_id))

    with unreadable(sb, hashlib.sha256(canonical_json(payload)).hexdigest()):
        with pytest.raises(StoreUnavailable):
            claim()

    assert sb.container.store.version_of(todo_uuid(todo_id)) == before  # no TodoClaimed was committed
    assert sb.todo(todo_id)["state"] == "pending"
    claimed = claim()["todo"]
    assert (claimed["id"], claimed["payload"], claimed["attempt"]) == (todo_id, payload, 1)
