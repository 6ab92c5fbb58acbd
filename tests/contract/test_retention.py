"""Retention (CONTRACT §14): only the payloads of finished work older than the cutoff go; the
events stay with their digests, the read models still rebuild the same, the space is given back."""

from __future__ import annotations

import hashlib
import json
import secrets
from datetime import timedelta
import time
from uuid import uuid4

import psycopg
import pytest

from application.audit import verify_lines
from domain.errors import InvalidArgument
from domain.retention import parse_age
from domain.todo import Todo
from interfaces.store.views import RECLAIM_LOCK_WAIT_MS
from tests.contract.harness import CLI, Harness, agent, container_on, raised, unique
from tests.contract.test_payloads_once import BODY, fan_out, github

BATCH = 500
HOLDER = "endpoint:bulk"


def open_many(sb, endpoint_id: str, count: int, tag: str, *, finish: bool, noise: int = 0) -> list[str]:
    """`count` todos with distinct payloads (`noise` more bytes of random hex in each, which does not
    compress), in commands of BATCH todos (each one commit); finished ones are claimed and completed
    with a result (or failed for good, every fourth)."""
    ids: list[str] = []
    for start in range(0, count, BATCH):
        def handler(uow, start=start):
            for n in range(start, min(start + BATCH, count)):
                payload = {"tag": tag, "n": n, "text": f"{tag}-{n}-" + "x" * 300 + secrets.token_hex(noise // 2)}
                todo = Todo.open(id=uuid4(), now=uow.now, actor="operator:cli", endpoint_id=endpoint_id,
                                 queue="work", source="operator", title=f"{tag} {n}", trust_mode="operator",
                                 payload=payload, payload_size=len(json.dumps(payload)))
                if finish and n % 4 == 0:  # a dead letter: five attempts failed
                    at = uow.now
                    while not todo.dead_letter:
                        if todo.state == "failed":
                            at = todo.next_retry_at
                            todo.requeue_due(now=at)
                        todo.claim(now=at, holder=HOLDER, lease=timedelta(seconds=60))
                        todo.fail(now=at, holder=HOLDER, result={"failed": n})
                elif finish:
                    todo.claim(now=uow.now, holder=HOLDER, lease=timedelta(seconds=60))
                    todo.complete(now=uow.now, holder=HOLDER, result={"done": n})
                uow.add(todo)
                ids.append(todo.todo_id)
        sb.container.store.run(handler)
    return ids


def test_age_is_n_seconds_minutes_hours_or_days():
    assert [parse_age(t) for t in ("30d", "12h", "90m", "3600s")] == [
        timedelta(days=30), timedelta(hours=12), timedelta(minutes=90), timedelta(seconds=3600)]
    for bad in ("30", "0d", "-1d", "1w", "d", "1.5h", "99999999999d"):
        with pytest.raises(InvalidArgument):
            parse_age(bad)


def test_only_the_payloads_of_finished_work_older_than_the_cutoff_go(sb):
    endpoint = sb.app.vend(unique("bulk"), queues=["work"], caller=CLI)
    finished = open_many(sb, endpoint["endpoint_id"], 10_000, "old-done", finish=True)
    old_live = open_many(sb, endpoint["endpoint_id"], 500, "old-live", finish=False)
    hook, hooked = fan_out(sb, 1)
    routed = github(sb, hook)  # its todo completes below: the body goes with it
    kept = github(sb, hook, BODY.replace(b'"number": 12', b'"number": 14'))  # its todo stays live
    me = agent(hooked[0])
    sb.app.claim(routed["id"], caller=me)
    sb.app.complete(routed["id"], caller=me, summary="done")
    sb.clock.advance(days=31)
    new_live = open_many(sb, endpoint["endpoint_id"], 500, "new-live", finish=False)
    sb.container.projector.catch_up()
    size_before = sb.container.views.payload_store_size()
    if not sb.url.startswith("sqlite"):
        live_before, free_before = live_bytes(sb), free_bytes(sb)

    dry = sb.container.retention.prune("30d", caller=CLI, dry_run=True)
    assert (dry["todos"], dry["deliveries"], dry["payloads"]) == (10_001, 1, 20_001)
    assert sb.container.store.db.query("SELECT count(*) FROM sb_blobs WHERE data IS NULL")[0][0] == 0
    done = sb.container.retention.prune("30d", caller=CLI)

    assert (done["todos"], done["deliveries"], done["payloads"]) == (10_001, 1, 20_001)
    # the prune is one event with its range and counts
    log = sb.container.store.read_log(done["through_position"], 10)
    event = [r.event for r in log if type(r.event).__name__ == "PayloadsPruned"][-1]
    assert (event.older_than_seconds, event.payloads, event.todos, event.deliveries) == (30 * 86400, 20_001, 10_001, 1)
    assert event.cutoff == sb.clock.now() - timedelta(days=30)
    # finished: shown as pruned, by digest; live: intact, and claimable
    for todo_id in finished[::997]:
        shown = sb.app.get_todo(todo_id, caller=CLI)
        assert shown["payload"] is None and shown["result"] is None
        assert shown["payload_pruned"]["text"].startswith(f"payload pruned at {done['cutoff'][:4]}")
        assert shown["payload_pruned"]["text"].endswith(f"bytes)") and shown["result_pruned"]["size"] > 0
    assert sb.app.get_todo(routed["id"], caller=CLI)["payload_pruned"]["sha256"] == hashlib.sha256(BODY).hexdigest()
    event_shown = sb.container.webhooks.get_event(routed["event_id"], caller=CLI)
    assert event_shown["payload"] is None and event_shown["payload_pruned"]["size"] == len(BODY)
    assert sb.container.webhooks.get_event(kept["event_id"], caller=CLI)["payload"]["issue"]["number"] == 14
    for todo_id in old_live[::97] + new_live[::97]:
        assert sb.app.get_todo(todo_id, caller=CLI)["payload"]["tag"] in ("old-live", "new-live")
    claimed = sb.app.claim_next(caller=agent(endpoint))["todo"]
    assert claimed["payload"]["tag"] == "old-live" and "payload_pruned" not in claimed
    history = sb.app.history(finished[0], caller=CLI)["events"]
    assert history[0]["data"]["payload"] is None and history[0]["data"]["payload_pruned"]["sha256"]
    # the read models rebuild the same; a second prune finds nothing
    assert sb.container.projector.verify() == []
    assert sb.container.retention.prune("30d", caller=CLI)["payloads"] == 0
    # space given back: SQLite's VACUUM shrinks the file; PostgreSQL's VACUUM frees the rows'
    # space for the table to reuse (pgstattuple, in this test's own database, measures it)
    if sb.url.startswith("sqlite"):
        assert done["store_bytes_after"] < size_before - 0.8 * done["bytes"], done
    else:
        assert live_bytes(sb) < live_before - 0.8 * done["bytes"], done
        assert free_bytes(sb) > free_before + 0.8 * done["bytes"], done


def _payload_store(sb) -> dict[str, int]:
    """The payload store's files on PostgreSQL: its table, its TOAST table, its indexes, in bytes."""
    heap, toast, indexes = sb.container.store.db.query(
        "SELECT pg_relation_size(oid), pg_relation_size(reltoastrelid), pg_indexes_size(oid) FROM pg_class"
        " WHERE relname = 'sb_blobs'")[0]
    return {"heap": int(heap), "toast": int(toast), "indexes": int(indexes), "total": int(heap + toast + indexes)}


@pytest.mark.postgres
def test_on_postgresql_a_prune_gives_the_space_back_to_the_store_for_the_same_volume_again(
        pg_url, make_container, clock):
    """After prune + VACUUM the files keep their size, and the same volume ingested again fits in
    the space the prune freed: the payload store does not grow by it (CONTRACT §14)."""
    sb = Harness(container_on(make_container, pg_url, clock), clock, pg_url, make_container)
    sb.app.ensure_admin()
    endpoint = sb.app.vend(unique("bulk"), queues=["work"], caller=CLI)
    empty = _payload_store(sb)
    open_many(sb, endpoint["endpoint_id"], 2000, "old", finish=True, noise=4000)  # ~4.3 KB each, with results
    sb.clock.advance(days=31)
    open_many(sb, endpoint["endpoint_id"], 200, "live", finish=False, noise=4000)  # newer: kept, at the files' end
    before = _payload_store(sb)
    first_growth = before["total"] - empty["total"]

    done = sb.container.retention.prune("30d", caller=CLI)
    pruned = _payload_store(sb)
    open_many(sb, endpoint["endpoint_id"], 2000, "again", finish=True, noise=4000)  # the same volume again
    again = _payload_store(sb)

    growth = again["total"] - pruned["total"]
    print(f"payload store: empty {empty}, after 2000+200 todos {before}, pruned {done['payloads']} payloads"
          f" ({done['bytes']:,} bytes) + VACUUM {pruned}, the same 2000 again {again}: growth {growth:,} bytes"
          f" against {first_growth:,} the first time")
    assert (done["payloads"], done["vacuumed"], done["space"]) == (4000, ["sb_blobs"], "store")
    assert pruned["toast"] >= before["toast"] * 0.9  # PostgreSQL's files keep their size: the live rows sit at the end
    assert growth < 0.1 * first_growth, (growth, first_growth)  # the freed space took the same volume again
    assert again["toast"] <= pruned["toast"] * 1.05  # the payloads' bytes went into the freed pages


def test_reclaim_gives_the_freed_space_back_to_the_system(sb):
    endpoint = sb.app.vend(unique("bulk"), queues=["work"], caller=CLI)
    open_many(sb, endpoint["endpoint_id"], 1000, "old", finish=True, noise=4000)
    sb.clock.advance(days=31)
    open_many(sb, endpoint["endpoint_id"], 100, "live", finish=False, noise=4000)  # kept, at the files' end

    done = sb.container.retention.prune("30d", caller=CLI, reclaim=True)

    full = ["database"] if sb.url.startswith("sqlite") else ["sb_blobs", "sb_blobs (FULL)"]
    assert (done["payloads"], done["vacuumed"], done["space"]) == (2000, full, "system")
    assert done["store_bytes_after"] < done["store_bytes_before"] - 0.8 * done["bytes"], done
    again = sb.container.retention.prune("30d", caller=CLI, reclaim=True)  # nothing new to prune: it still runs
    assert (again["payloads"], again["vacuumed"], again["space"]) == (0, full, "system")


def test_reclaim_gives_up_when_the_payload_store_stays_in_use(sb):
    """VACUUM FULL waits for an exclusive lock, and every later user of the table queues behind it:
    it waits at most RECLAIM_LOCK_WAIT_MS, then leaves the space with the store and says so."""
    if sb.url.startswith("sqlite"):
        pytest.skip("SQLite's VACUUM takes the database, not a table lock")
    endpoint = sb.app.vend(unique("bulk"), queues=["work"], caller=CLI)
    open_many(sb, endpoint["endpoint_id"], 200, "old", finish=True, noise=2000)
    sb.clock.advance(days=31)
    with psycopg.connect(sb.url, autocommit=True) as reader:
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM sb_blobs").fetchall()  # holds ACCESS SHARE until it ends
        started = time.monotonic()
        busy = sb.container.retention.prune("30d", caller=CLI, reclaim=True)
        waited = time.monotonic() - started
        reader.execute("ROLLBACK")
    assert (busy["payloads"], busy["vacuumed"], busy["space"], busy["reclaim"]) == (400, ["sb_blobs"], "store", "busy")
    assert RECLAIM_LOCK_WAIT_MS / 1000 <= waited < RECLAIM_LOCK_WAIT_MS / 1000 + 5, waited
    assert sb.app.push(endpoint["slug"], "after", caller=CLI, payload={"x": 1})["todo"]["id"]  # nothing left locked
    again = sb.container.retention.prune("30d", caller=CLI, reclaim=True)  # the store is quiet now
    assert (again["vacuumed"], again["space"], again["reclaim"]) == (["sb_blobs", "sb_blobs (FULL)"], "system", "done")


def _stattuple(sb, column: str) -> int:
    db = sb.container.store.db
    db.query("CREATE EXTENSION IF NOT EXISTS pgstattuple")
    return int(db.query(
        f"SELECT sum(s.{column}) FROM pg_class c, LATERAL (SELECT c.oid UNION ALL SELECT c.reltoastrelid) r(oid),"
        " LATERAL pgstattuple(r.oid) s WHERE c.relname = 'sb_blobs'")[0][0])


def live_bytes(sb) -> int:
    return _stattuple(sb, "tuple_len")


def free_bytes(sb) -> int:
    return _stattuple(sb, "free_space")


def test_a_payload_named_again_since_the_cutoff_is_kept(sb):
    hook, hooked = fan_out(sb, 1)
    first = github(sb, hook)
    me = agent(hooked[0])
    sb.app.claim(first["id"], caller=me)
    sb.app.complete(first["id"], caller=me)
    sb.clock.advance(days=31)
    again = github(sb, hook)  # the same bytes, delivered anew: a live todo names them

    assert sb.container.retention.prune("30d", caller=CLI)["payloads"] == 0
    assert sb.app.get_todo(again["id"], caller=CLI)["payload"] == json.loads(BODY)
    assert sb.app.get_todo(first["id"], caller=CLI)["payload"] == json.loads(BODY)


def test_a_dead_letter_retried_after_its_prune_says_so(sb):
    endpoint = sb.app.vend(unique("dead"), queues=["work"], caller=CLI)
    todo = sb.app.push(endpoint["slug"], "doomed", caller=CLI, payload={"big": "x" * 1000})["todo"]
    sb.fail_until_dead(endpoint, todo["id"])
    sb.clock.advance(days=2)
    assert sb.container.retention.prune("1d", caller=CLI)["todos"] == 1

    sb.app.retry(todo["id"], caller=CLI)
    claimed = sb.app.claim_next(caller=agent(endpoint))["todo"]

    assert claimed["id"] == todo["id"] and claimed["payload"] is None
    assert claimed["payload_pruned"]["text"].startswith("payload pruned at ")


def test_an_export_with_payloads_leaves_the_pruned_ones_out_and_still_verifies(sb):
    endpoint = sb.app.vend(unique("kept"), queues=["work"], caller=CLI)
    me = agent(endpoint)
    done = sb.app.push(endpoint["slug"], "finished", caller=CLI, payload={"old": "x" * 100})["todo"]
    sb.app.claim(done["id"], caller=me)
    sb.app.complete(done["id"], caller=me, result={"done": True})
    sb.clock.advance(days=2)
    live = sb.app.push(endpoint["slug"], "live", caller=CLI, payload={"new": 1})["todo"]
    assert sb.container.retention.prune("1d", caller=CLI)["payloads"] == 2

    records = list(sb.app.audit(payloads=True))
    mine = {(r["aggregate"], r["type"]): r for r in records}
    for pruned in (mine[(done["id"], "TodoOpened")], mine[(done["id"], "TodoCompleted")]):
        assert "payloads" not in pruned and pruned["digests"]  # its reference stays, its bytes are gone
    assert list(mine[(live["id"], "TodoOpened")]["payloads"].values()) == [{"encoding": "json", "content": {"new": 1}}]
    lines = [json.dumps(r) for r in records]
    verdict = verify_lines(lambda: lines, lambda line: (json.loads(line), True))
    assert (verdict.count, verdict.head) == (len(records), sb.container.audit.head()["hash"])


def test_a_dry_run_on_a_delivery_whose_body_was_pruned_says_so_and_a_foreign_one_stays_not_found(sb):
    hook, hooked = fan_out(sb, 1)
    other_hook, others = fan_out(sb, 1)
    webhooks = sb.container.webhooks
    sibling = webhooks.create(caller=CLI, endpoint=hooked[0]["slug"], source_type="github", target_queue="work")
    pruned = github(sb, hook)
    foreign = github(sb, other_hook, BODY.replace(b'"number": 12', b'"number": 15'))
    for todo, owner in ((pruned, hooked[0]), (foreign, others[0])):
        sb.app.claim(todo["id"], caller=agent(owner))
        sb.app.complete(todo["id"], caller=agent(owner))
    sb.clock.advance(days=31)
    kept = github(sb, hook, BODY.replace(b'"number": 12', b'"number": 14'))
    assert sb.container.retention.prune("30d", caller=CLI)["deliveries"] == 2
    me = agent(hooked[0])

    refusal = raised(lambda: webhooks.test_rules(hook["webhook_id"], caller=me, event_id=pruned["event_id"]))

    note = webhooks.get_event(pruned["event_id"], caller=CLI)["payload_pruned"]
    assert refusal.code == "conflict", refusal
    assert str(refusal) == f"event {pruned['event_id']} has no body to dry-run: {note['text']}"
    assert f"(sha256 {hashlib.sha256(BODY).hexdigest()}, {len(BODY)} bytes)" in str(refusal)
    # another owner's delivery, another webhook's, and an unknown id: not found, alike (foreign ≡ random)
    random_id = "ev_" + uuid4().hex
    for webhook_id, caller, event_id in ((hook["webhook_id"], me, foreign["event_id"]),
                                         (other_hook["webhook_id"], agent(others[0]), pruned["event_id"]),
                                         (sibling["webhook_id"], me, pruned["event_id"]),
                                         (hook["webhook_id"], me, random_id), (hook["webhook_id"], me, "nonsense")):
        missing = raised(lambda: webhooks.test_rules(webhook_id, caller=caller, event_id=event_id))
        assert (missing.code, str(missing)) == ("not_found", f"event {event_id} not found")
    # the body kept still dry-runs; a replay evaluates only the deliveries that have a body
    assert webhooks.test_rules(hook["webhook_id"], caller=me, event_id=kept["event_id"])["envelope"]["payload"]
    candidate = {"rules": [{"id": "all", "expr": "true", "action": {"drop": True}}]}
    assert webhooks.replay(hook["webhook_id"], candidate, caller=me)["evaluated"] == 1
