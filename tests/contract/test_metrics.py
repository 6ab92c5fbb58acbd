"""Metrics (CONTRACT §10) as the collector renders them: every series agrees with the log and the
todo rows read through the application, on every store, including what another process wrote."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from domain.todo import LeaseExpired, TodoClaimed, TodoCompleted, TodoFailed, TodoMoved, TodoOpened
from interfaces.http.metrics import SwitchboardCollector
from interfaces.store.metrics import QUEUE_STATES, SqlMetrics
from interfaces.version import VERSION
from projections import all_projections

from .harness import CLI, agent, mixed_workload, when

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(sb) -> Samples:
    """One scrape of a fresh registry over this process's container, parsed back."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SwitchboardCollector(SqlMetrics(sb.container.store.db, sb.container.projector), sb.clock))
    text = generate_latest(registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def series(samples: Samples, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {labels: value for (n, labels), value in samples.items() if n == name}


def counted_from_the_log(sb) -> Samples:
    """The counters recounted from the stored events, in memory (the oracle)."""
    queue_of: dict = {}
    counts: Counter = Counter()
    for recorded in sb.container.store.read_log(0, 10**6):
        event = recorded.event
        queue = queue_of.get(event.originator_id)
        match event:
            case TodoOpened():
                queue_of[event.originator_id] = event.queue
                counts["switchboard_todos_created_total", (("queue", event.queue), ("source", event.source))] += 1
            case TodoMoved():
                queue_of[event.originator_id] = event.queue
            case TodoClaimed():
                counts["switchboard_todos_claimed_total", (("queue", queue),)] += 1
            case TodoCompleted() | TodoFailed():
                outcome = "complete" if isinstance(event, TodoCompleted) else "fail"
                counts["switchboard_todos_completed_total", (("outcome", outcome), ("queue", queue))] += 1
            case LeaseExpired():
                counts["switchboard_leases_expired_total", (("queue", queue),)] += 1
    return dict(counts)


def test_every_series_agrees_with_the_store_after_a_mixed_workload(sb):
    mixed_workload(sb)
    vended = sb.vend("elsewhere", queues=["metrics-other"])
    other = sb.another_process()  # what another process writes is in the next scrape
    pushed = other.app.push(vended["slug"], "from another process", caller=CLI)["todo"]
    sb.tick(90)

    samples = scrape(sb)

    rows = sb.app.list_todos(caller=CLI, limit=1000)
    assert pushed["id"] in {r["id"] for r in rows}
    states = Counter((r["queue"], r["state"]) for r in rows)
    dead = Counter(r["queue"] for r in rows if r["dead_letter"])
    queues = {r["queue"] for r in rows}
    assert series(samples, "switchboard_queue_todos") == {
        (("queue", q), ("state", s)): states[q, s] for q in queues for s in QUEUE_STATES
    }
    assert {s for (_, s), n in states.items() if n} == {"pending", "claimed", "done", "failed"}
    assert series(samples, "switchboard_queue_dead_letters") == {(("queue", q),): dead[q] for q in queues}
    assert sum(dead.values()) > 0
    oldest = series(samples, "switchboard_queue_oldest_pending_seconds")
    assert set(oldest) == {(("queue", q),) for q in queues}
    for queue in queues:
        pending = [when(r["created_at"]) for r in rows if r["queue"] == queue and r["state"] == "pending"]
        age = (sb.clock.now() - min(pending)).total_seconds() if pending else 0.0
        assert oldest[(("queue", queue),)] == pytest.approx(age, abs=1e-6), queue
    assert oldest[(("queue", "metrics-other"),)] == pytest.approx(90.0, abs=1e-6)
    counters = {key: value for key, value in samples.items() if key[0].endswith("_total")}
    assert counters == counted_from_the_log(sb)
    assert counters["switchboard_todos_created_total", (("queue", "metrics-other"), ("source", "operator"))] == 1
    assert series(samples, "switchboard_build_info") == {(("version", VERSION),): 1.0}


def test_deliveries_count_per_verdict_and_a_released_todo_counts_under_its_new_queue(sb):
    vended = sb.vend("hooked", queues=["triage"])
    webhooks = sb.container.webhooks
    hook = webhooks.create(caller=agent(vended), endpoint=vended["slug"], source_type="generic", target_queue="triage")
    webhooks.set_rules(hook["webhook_id"], {"rules": [
        {"id": "boom", "expr": 'if .payload.boom then error("boom") else false end', "action": {"drop": True}},
        {"id": "quiet", "expr": ".payload.quiet", "action": {"drop": True}},
    ]}, caller=agent(vended))
    token = hook["ingest_url"].rsplit("/", 1)[1]

    def deliver(payload: dict, key: str) -> dict:
        headers = {"Content-Type": "application/json", "X-Delivery-Id": key}
        return webhooks.ingest(token, headers, json.dumps(payload).encode(), remote_addr="198.51.100.2")

    assert deliver({"n": 1}, "first")["created"] == 1
    assert deliver({"n": 1}, "first")["created"] == 0
    assert deliver({"quiet": True}, "second")["dropped"] is True
    held = deliver({"boom": True}, "third")
    assert held["faulted"] is True and held["queue"] == "quarantine"
    sb.app.release_quarantined(held["id"], "triage", caller=CLI)
    sb.app.claim(held["id"], caller=agent(vended))
    sb.app.complete(held["id"], caller=agent(vended))

    samples = scrape(sb)

    assert series(samples, "switchboard_webhook_deliveries_total") == {
        (("source", "generic"), ("verdict", verdict)): 1 for verdict in ("routed", "duplicate", "dropped", "faulted")
    }
    assert series(samples, "switchboard_todos_created_total") == {
        (("queue", "triage"), ("source", "generic")): 1, (("queue", "quarantine"), ("source", "generic")): 1,
    }
    assert series(samples, "switchboard_todos_claimed_total") == {(("queue", "triage"),): 1}
    assert series(samples, "switchboard_todos_completed_total") == {(("outcome", "complete"), ("queue", "triage")): 1}
    assert series(samples, "switchboard_queue_todos") == {
        (("queue", "triage"), ("state", state)): {"pending": 1, "done": 1}.get(state, 0) for state in QUEUE_STATES
    }


def test_lag_counts_the_events_a_projection_had_not_applied_when_scraped(sb):
    vended = sb.vend("lagging")
    sb.container.projector.catch_up()
    head = sb.container.store.max_position()
    other = sb.another_process()
    for n in range(3):
        other.app.push(vended["slug"], f"todo {n}", caller=CLI)
    appended = sb.container.store.max_position() - head
    assert appended >= 3
    projections = all_projections()

    first, second = scrape(sb), scrape(sb)

    assert series(first, "switchboard_projection_lag_events") == {
        (("projection", p.name),): 0 if p.inline else appended for p in projections
    }
    assert series(second, "switchboard_projection_lag_events") == {
        (("projection", p.name),): 0 for p in projections
    }
    assert series(first, "switchboard_queue_todos")[(("queue", vended["queues"][0]), ("state", "pending"))] == 3
