"""Races on PostgreSQL: many claimers, one winner per todo; one todo per idempotency key;
projections that match a from-zero rebuild after a concurrent mixed workload.

"Two containers" are two independently built applications on one database: two writer
threads, two aggregate caches, two connection pools, so every race between them is decided
by the event store's optimistic concurrency (the unique (stream, version) key), as between
two server processes.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.integration._support import CLI, count_rows, push_many, vend_worker

pytestmark = pytest.mark.postgres

TODOS = 2000
CLAIMERS = 16


def _events_by_type(app) -> dict[str, Counter]:
    """For each event type, how many events each aggregate (hex id) has in the log."""
    counts: dict[str, Counter] = {}
    for record in app.audit():
        counts.setdefault(record["type"], Counter())[record["aggregate"]] += 1
    return counts


@pytest.mark.parametrize("containers", [1, 2], ids=["one-container", "two-containers"])
def test_concurrent_claimers_take_every_todo_exactly_once(pg_url, make_container, containers):
    built = [make_container(pg_url) for _ in range(containers)]
    apps = [c.app for c in built]
    worker = vend_worker(apps[0])
    pushed = push_many(apps, worker.name, TODOS, threads=8)
    assert len(set(pushed)) == TODOS

    claims: list[tuple[str, float, float]] = []  # (todo id, call started, call ended)
    empties: list[tuple[float, float]] = []
    lock = threading.Lock()

    def claimer(i: int) -> None:
        app = apps[i % len(apps)]
        while True:
            started = time.monotonic()
            answer = app.claim_next(caller=worker)
            ended = time.monotonic()
            with lock:
                if answer["empty"]:
                    empties.append((started, ended))
                    return
                todo = answer["todo"]
                assert todo["state"] == "claimed" and todo["owner"] == worker.label
                claims.append((todo["id"], started, ended))

    with ThreadPoolExecutor(max_workers=CLAIMERS) as pool:
        list(pool.map(claimer, range(CLAIMERS)))  # re-raises any claimer's exception

    claimed_ids = [todo_id for todo_id, _, _ in claims]
    duplicates = [todo_id for todo_id, n in Counter(claimed_ids).items() if n > 1]
    assert duplicates == [], f"{len(duplicates)} todos handed to two claimers"
    assert len(claimed_ids) == TODOS
    assert set(claimed_ids) == set(pushed)
    assert len(empties) == CLAIMERS

    # Nothing ever returns to pending here, so an "empty" answer that ended before another
    # claim even started was wrong: todos were still available when it was given.
    last_claim_start = max(started for _, started, _ in claims)
    premature = [e for e in empties if e[1] < last_claim_start]
    assert premature == [], (
        f"{len(premature)} claim_next calls answered empty while todos were still claimable"
    )

    # The log agrees: one TodoClaimed per todo, no more.
    claimed_events = _events_by_type(apps[0]).get("TodoClaimed", Counter())
    assert len(claimed_events) == TODOS
    assert set(claimed_events.values()) == {1}

    for app in apps:
        assert count_rows(app, state="claimed") == TODOS
        assert count_rows(app, state="pending") == 0
        assert app.claim_next(caller=worker) == {"empty": True}


def test_concurrent_pushes_with_one_key_open_exactly_one_todo(pg_url, make_container):
    apps = [make_container(pg_url).app, make_container(pg_url).app]
    worker = vend_worker(apps[0])
    pushers = 20

    for round_ in range(5):  # a few rounds: each is a fresh key, raced from a standing start
        key = f"delivery-{round_}"
        gate = threading.Barrier(pushers)

        def push(i: int) -> dict:
            gate.wait()
            return apps[i % 2].push(worker.name, f"dedup {i}", caller=CLI, key=key)

        with ThreadPoolExecutor(max_workers=pushers) as pool:
            answers = list(pool.map(push, range(pushers)))

        created = [a for a in answers if a["created"]]
        assert len(created) == 1, f"round {round_}: {len(created)} pushes created a todo"
        assert {a["todo"]["id"] for a in answers} == {created[0]["todo"]["id"]}

    events = _events_by_type(apps[0])
    assert sum(events["TodoOpened"].values()) == 5
    assert sum(events["KeyBound"].values()) == 5
    assert count_rows(apps[1]) == 5


def test_projections_match_a_rebuild_after_a_concurrent_mixed_workload(pg_url, make_container):
    containers = [make_container(pg_url), make_container(pg_url)]
    apps = [c.app for c in containers]
    worker = vend_worker(apps[0])
    threads, rounds = 8, 40
    counts: Counter = Counter()
    lock = threading.Lock()

    def note(what: str) -> None:
        with lock:
            counts[what] += 1

    def fire(container) -> None:
        due = container.views.due_timers(container.clock.now(), 200)
        if due:
            with lock:
                counts["fired"] += container.app.fire_timers(due)

    def workload(i: int) -> None:
        rng = random.Random(i)
        container = containers[i % 2]
        app = container.app
        for r in range(rounds):
            key = f"k-{rng.randrange(20)}" if rng.random() < 0.3 else None
            app.push(worker.name, f"mixed {i}/{r}", caller=CLI, payload={"i": i, "r": r}, key=key)
            note("push")
            short = rng.random() < 0.15
            answer = app.claim_next(caller=worker, lease_ttl_seconds=0.05 if short else 60,
                                    claimant=f"thread-{i}")
            if answer["empty"]:
                continue
            todo_id = answer["todo"]["id"]
            if short:  # let the lease lapse; the reaper (any container's) expires it
                note("lapse")
                continue
            roll = rng.random()
            if roll < 0.4:
                app.complete(todo_id, caller=worker, result={"ok": r}, summary="done")
                note("complete")
            elif roll < 0.75:
                app.fail(todo_id, caller=worker, summary="broke")
                note("fail")
                if rng.random() < 0.5:
                    assert app.retry(todo_id, caller=CLI)["state"] == "pending"
                    note("retry")
            else:
                app.heartbeat(todo_id, caller=worker, lease_ttl_seconds=120)
                app.release(todo_id, caller=worker, summary="later")
                note("release")
            if r % 5 == 0:
                fire(container)

    with ThreadPoolExecutor(max_workers=threads) as pool:
        list(pool.map(workload, range(threads)))
    time.sleep(0.1)  # every short lease has lapsed by now
    for container in containers:
        fire(container)

    assert counts["push"] == threads * rounds
    for what in ("complete", "fail", "retry", "release", "lapse"):
        assert counts[what] > 0, f"the workload never exercised {what}: {dict(counts)}"
    assert counts["fired"] == counts["lapse"], dict(counts)

    for container in containers:
        assert container.projector.verify() == []  # before any catch-up: compared at its position
    containers[0].projector.catch_up()
    containers[1].projector.catch_up()
    for container in containers:
        assert container.projector.verify() == []
        assert set(container.projector.lag().values()) == {0}

    opened = sum(_events_by_type(apps[0])["TodoOpened"].values())
    rows_before = {row["id"]: row for row in apps[0].list_todos(caller=CLI, limit=10_000, max_limit=10_000)}
    assert len(rows_before) == opened
    for todo_id, row in rows_before.items():  # the read model says what the event log says
        full = apps[1].get_todo(todo_id, caller=CLI)
        assert {k: full[k] for k in row} == row

    containers[0].projector.rebuild()
    for container in containers:
        assert container.projector.verify() == []
    rows_after = {row["id"]: row for row in apps[1].list_todos(caller=CLI, limit=10_000, max_limit=10_000)}
    assert rows_after == rows_before


def test_concurrent_reads_from_many_threads_share_the_event_store_pool(pg_url, make_container):
    # Regression: with eventsourcing's pool_open_timeout set, every checkout called
    # psycopg_pool's non-reentrant wait(); concurrent readers died with a bare AssertionError.
    app = make_container(pg_url).app
    worker = vend_worker(app)
    todo_id = app.push(worker.name, "read me", caller=CLI)["todo"]["id"]
    gate = threading.Barrier(12)

    def read(_: int) -> int:
        gate.wait()
        for _ in range(40):
            assert app.get_todo(todo_id, caller=CLI)["state"] == "pending"
            assert len(app.history(todo_id, caller=CLI)["events"]) == 1
        return 40

    with ThreadPoolExecutor(max_workers=12) as pool:
        assert sum(pool.map(read, range(12))) == 480
