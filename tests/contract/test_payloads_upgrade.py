"""A store written before payloads were stored once (events with their payloads inline, no payload
store, the old deliveries table) reads, lists, replays and rebuilds the same after the upgrade."""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any

from domain.bodies import read_payload
from domain.payloads import canonical_json
from interfaces.store.blobs import unpack
from tests.contract.harness import CLI, agent, mixed_workload, unique
from tests.contract.test_payloads_once import BODY, fan_out, github

OLD_DELIVERIES_DDL = (
    "CREATE TABLE sb_deliveries (event_id TEXT PRIMARY KEY, webhook_id TEXT NOT NULL,"
    " endpoint_id TEXT NOT NULL, source TEXT NOT NULL, kind TEXT, trust_mode TEXT NOT NULL,"
    " verified INTEGER NOT NULL, disposition TEXT NOT NULL, size BIGINT NOT NULL,"
    " todo_count INTEGER NOT NULL, remote_addr TEXT, received_at BIGINT NOT NULL,"
    " position BIGINT NOT NULL, routing TEXT NOT NULL, todos TEXT NOT NULL, envelope TEXT NOT NULL)"
)


def to_the_format_before(tx) -> int:
    """Rewrites the store as the code before the payload store wrote it: each event's payload
    inline (a body as UTF-8 text or base64 with `body_encoding`), no payload tables, the old
    deliveries read model. Returns how many events it rewrote."""
    blobs = {d: unpack(codec, data) for d, codec, data in tx.execute("SELECT sha256, codec, data FROM sb_blobs")}
    rows = tx.execute("SELECT originator_id, originator_version, topic, state FROM stored_events"
                      " WHERE topic IN ('DeliveryAccepted', 'TodoOpened', 'TodoCompleted', 'TodoFailed')")
    for originator, version, topic, state in rows:
        data = json.loads(bytes(state))
        if topic == "DeliveryAccepted":
            raw = blobs[data.pop("body_ref")["sha256"]]
            del data["payload_form"]
            try:
                data["body"], data["body_encoding"] = raw.decode("utf-8"), "utf-8"
            except UnicodeDecodeError:
                data["body"], data["body_encoding"] = base64.b64encode(raw).decode(), "base64"
        elif topic == "TodoOpened":
            ref, form = data.pop("payload_ref"), data.pop("payload_form")
            data["payload"] = None if ref is None else read_payload(blobs[ref["sha256"]], form)
        else:
            ref = data.pop("result_ref")
            data["result"] = None if ref is None else json.loads(blobs[ref["sha256"]])
        tx.execute("UPDATE stored_events SET state = %s WHERE originator_id = %s AND originator_version = %s",
                   (json.dumps(data).encode(), originator, version))
    for statement in ("DROP TABLE sb_blobs", "DROP TABLE sb_payloads_upgraded", "DROP TABLE sb_stored_deliveries",
                      "DROP TABLE sb_payload_refs", "DROP TABLE sb_payload_holders", "DROP TABLE sb_inline_payloads",
                      "DELETE FROM sb_tracking WHERE name IN ('stored_deliveries', 'payload_holders')", OLD_DELIVERIES_DDL,
                      "INSERT INTO sb_tracking (name, position) VALUES ('deliveries', 0)"):
        tx.execute(statement)
    return len(rows)


def everything_shown(container, todo_ids, event_ids, hook) -> dict[str, Any]:
    app, webhooks = container.app, container.webhooks
    rules = {"rules": [{"id": "r", "expr": '.payload.action == "opened"', "action": {"drop": True}}]}
    return {
        "todos": {t: app.get_todo(t, caller=CLI) for t in todo_ids},
        # without `digests`: an old event names the bytes it holds (test below), not a body it never had
        "histories": {t: [{k: v for k, v in e.items() if k != "digests"} for e in app.history(t, caller=CLI)["events"]]
                      for t in todo_ids},
        "events": {e: webhooks.get_event(e, caller=CLI) for e in event_ids},
        "bodies": {e: webhooks.event_body(e, caller=CLI) for e in event_ids},
        "listed": webhooks.list_events(caller=CLI)["events"],
        "replay": webhooks.replay(hook["webhook_id"], rules, caller=CLI),
    }


def test_a_store_from_before_reads_and_rebuilds_the_same_after_the_upgrade(sb):
    todos = mixed_workload(sb)
    hook, endpoints = fan_out(sb, 2)
    routed = [github(sb, hook), github(sb, hook, BODY.replace(b'"number": 12', b'"number": 13'))]
    generic = sb.container.webhooks.create(caller=CLI, endpoint=endpoints[0]["slug"], source_type="generic",
                                           target_queue="work")
    binary = sb.container.webhooks.ingest(generic["ingest_url"].rsplit("/", 1)[1],
                                          {"Content-Type": "application/octet-stream", "X-Delivery-Id": unique("d")},
                                          b"\xff\xfe\x00 binary", remote_addr="192.0.2.1")
    me = agent(endpoints[1])
    done = sb.app.claim_next(caller=me)["todo"]
    sb.app.complete(done["id"], caller=me, result={"merged": True, "by": "bot"})
    todo_ids = [*todos.values(), *(t["id"] for a in routed for t in a["todos"]), binary["id"]]
    event_ids = [a["event_id"] for a in routed] + [binary["event_id"]]
    sb.container.projector.catch_up()
    before = everything_shown(sb.container, todo_ids, event_ids, hook)

    with sb.container.store.db.transaction() as tx:
        assert to_the_format_before(tx) > len(todo_ids)
    upgraded = sb.another_process()  # opening the store upgrades it
    upgraded.projector.catch_up()

    assert everything_shown(upgraded, todo_ids, event_ids, hook) == before
    assert upgraded.projector.verify() == []
    upgraded.projector.rebuild()
    assert upgraded.projector.verify() == []
    assert everything_shown(upgraded, todo_ids, event_ids, hook) == before
    # an old event's history names the digest the audit chain seals its inline value by: its canonical JSON
    for t in todo_ids:
        for e in upgraded.app.history(t, caller=CLI)["events"]:
            for name, ref in e.get("digests", {}).items():
                if e["data"].get(name) is not None:
                    value = canonical_json(e["data"][name])
                    assert ref == {"sha256": hashlib.sha256(value).hexdigest(), "size": len(value)}, (t, e["type"])
    # the old read model is gone; the payloads of the old events were copied into the payload store
    assert "deliveries" not in upgraded.projector.positions()
    assert upgraded.store.db.query("SELECT count(*) FROM sb_blobs")[0][0] >= 4


def test_a_prune_rewrites_old_inline_events_by_reference_and_keeps_their_digests(sb):
    endpoint = sb.app.vend(unique("old"), queues=["work"], caller=CLI)
    todo = sb.app.push(endpoint["slug"], "old and done", caller=CLI, payload={"b": 2, "a": [1, "é"]})["todo"]
    me = agent(endpoint)
    sb.app.claim(todo["id"], caller=me)
    sb.app.complete(todo["id"], caller=me, result={"ok": True})
    with sb.container.store.db.transaction() as tx:
        to_the_format_before(tx)
    upgraded = sb.another_process()
    stream = upgraded.app.history(todo["id"], caller=CLI)["events"]
    assert stream[0]["data"]["payload"] == {"b": 2, "a": [1, "é"]}
    sb.clock.advance(days=2)

    pruned = upgraded.retention.prune("1d", caller=CLI)

    assert (pruned["todos"], pruned["payloads"]) == (1, 2)
    rows = upgraded.store.db.query("SELECT topic, state FROM stored_events WHERE topic IN ('TodoOpened', 'TodoCompleted')")
    states = {topic: json.loads(bytes(state)) for topic, state in rows}
    assert states["TodoOpened"]["payload"] is None and states["TodoCompleted"]["result"] is None
    assert states["TodoOpened"]["payload_ref"] == {  # the digest the audit chain gave the inline value
        "sha256": hashlib.sha256('{"a":[1,"é"],"b":2}'.encode()).hexdigest(), "size": len('{"a":[1,"é"],"b":2}'.encode())}
    assert "payload_form" not in states["TodoOpened"]  # nothing else of the stored event changes
    shown = upgraded.app.get_todo(todo["id"], caller=CLI)
    assert shown["payload"] is None and shown["payload_pruned"]["sha256"] == states["TodoOpened"]["payload_ref"]["sha256"]
    assert upgraded.projector.verify() == []
