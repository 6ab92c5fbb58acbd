"""`GET /metrics` on a real `switchboard serve` (CONTRACT §3, §10): a bearer token or 401 with an
empty body; with it, every series, matching what the CLI and other processes wrote to the store.
"""

from __future__ import annotations

import json
import secrets
import time
from datetime import datetime

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from application.service import Caller
from interfaces.version import VERSION
from projections import all_projections
from tests.e2e._ingest import CLI, Stack
from tests.e2e._support import Server
from tests.fixtures import fixture

TOKEN = secrets.token_urlsafe(32)  # 43 characters, over the 32 required
SERIES = {
    "switchboard_queue_todos", "switchboard_queue_dead_letters", "switchboard_queue_oldest_pending_seconds", "switchboard_todos_created_total",
    "switchboard_todos_claimed_total", "switchboard_todos_completed_total", "switchboard_leases_expired_total",
    "switchboard_webhook_deliveries_total", "switchboard_projection_lag_events", "switchboard_build_info",
    "switchboard_audit_sealed_position", "switchboard_audit_unsealed_events",
    "switchboard_queue_in_flight",  # CONTRACT §13 (switchboard_claims_refused_total shows once a claim is refused)
}
LABELS = {"queue", "state", "source", "outcome", "verdict", "projection", "version", "reason"}
STATES = ("pending", "claimed", "done", "failed")


@pytest.fixture
def stack(store_url, tmp_path):
    stack = Stack(store_url, tmp_path / "stack", SWITCHBOARD_METRICS_TOKEN=TOKEN).start()
    yield stack
    stack.close()


def scrape(base: str, authorization: str | None = f"Bearer {TOKEN}") -> httpx.Response:
    headers = {"Authorization": authorization} if authorization is not None else {}
    return httpx.get(f"{base}/metrics", headers=headers, timeout=30)


def samples(response: httpx.Response) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """name -> labels -> value, from a 200 in the Prometheus text format."""
    assert response.status_code == 200, (response.status_code, response.text)
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4"), response.headers
    out: dict[str, dict] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def assert_refused(response: httpx.Response) -> None:
    assert response.status_code == 401, (response.status_code, response.text)
    assert response.content == b"" and response.headers["content-length"] == "0", response.headers


def test_metrics_without_the_right_bearer_is_401_with_an_empty_body(stack):
    base = stack.server.base
    for authorization in (None, "", "Bearer", f"Bearer {TOKEN[:-1]}", f"Bearer {TOKEN}x", f"Basic {TOKEN}",
                          TOKEN, f"Bearer {secrets.token_urlsafe(32)}", f"Bearer sbk_{TOKEN}"):
        assert_refused(scrape(base, authorization))

    assert "switchboard_build_info" in samples(scrape(base))
    assert "switchboard_build_info" in samples(scrape(base, f"bearer {TOKEN}"))  # the scheme is case-insensitive


def test_metrics_without_a_configured_token_is_401_to_everyone(sqlite_url, tmp_path):
    with Server(tmp_path, tmp_path, url=sqlite_url) as server:
        server.wait_healthy()
        for authorization in (None, "", "Bearer", f"Bearer {TOKEN}", "Bearer None"):
            assert_refused(scrape(server.base, authorization))


def test_every_series_matches_the_store_after_a_workload(stack):
    endpoint = stack.vend("metrics", ["inbox", "reviews"])
    slug = endpoint["slug"]
    agent = Caller("endpoint", slug)  # as its MCP session would call
    # another process writes: four operator pushes through the CLI
    pushed = [stack.cli.json("todo", "push", slug, title, "--queue", queue)["todo"]
              for title, queue in (("oldest", "inbox"), ("done", "inbox"), ("failed", "inbox"), ("lapsed", "reviews"))]
    oldest, done, failed, lapsed = (todo["id"] for todo in pushed)
    app = stack.app  # the application layer in this test process: one more process
    app.claim(done, caller=agent)
    app.complete(done, caller=agent, summary="ok")
    app.claim(failed, caller=agent)
    app.fail(failed, caller=agent, summary="broken")
    app.claim(lapsed, caller=agent, lease_ttl_seconds=0.2)
    _wait_for(lambda: app.get_todo(lapsed, caller=CLI)["state"] == "pending")  # the server's reaper
    # deliveries over HTTP: routed, repeated, dropped by a rule, faulted by a rule
    github = stack.webhook(endpoint, "github", "inbox")
    body = fixture("github_issues_opened.json")
    assert stack.deliver(github, body, event="issues", delivery="gh-1").json()["created"] == 1
    assert stack.deliver(github, body, event="issues", delivery="gh-1").json()["created"] == 0
    generic = stack.webhook(endpoint, "generic", "inbox")
    stack.set_rules(generic, {"rules": [
        {"id": "boom", "expr": 'if .payload.boom then error("boom") else false end', "action": {"drop": True}},
        {"id": "quiet", "expr": ".payload.quiet", "action": {"drop": True}},
    ]})
    assert stack.deliver(generic, json.dumps({"quiet": True}).encode(), delivery="g-1").json()["dropped"] is True
    held = stack.deliver(generic, json.dumps({"boom": True}).encode(), delivery="g-2").json()
    assert held["faulted"] is True and held["queue"] == "quarantine"
    app.release_quarantined(held["id"], "reviews", caller=CLI)
    app.claim(held["id"], caller=agent)

    before = time.time()
    metrics = samples(scrape(stack.server.base))
    after = time.time()

    assert set(metrics) == SERIES
    (sealed,), (unsealed,) = metrics["switchboard_audit_sealed_position"].values(), \
        metrics["switchboard_audit_unsealed_events"].values()
    assert sealed > 0 and unsealed >= 0  # the chain's head (docs/audit.md); exact figures: test_audit_sealing.py
    assert all(set(dict(labels)) <= LABELS for series in metrics.values() for labels in series), metrics
    rows = stack.todos_of(endpoint)
    assert len(rows) == 6
    assert metrics["switchboard_queue_todos"] == {
        (("queue", q), ("state", s)): sum(1 for r in rows if r["queue"] == q and r["state"] == s)
        for q in ("inbox", "reviews") for s in STATES
    }
    assert metrics["switchboard_queue_dead_letters"] == {
        (("queue", q),): sum(1 for r in rows if r["queue"] == q and r["dead_letter"]) for q in ("inbox", "reviews")
    }
    assert metrics["switchboard_queue_todos"] == {
        (("queue", q), ("state", s)): n for (q, s), n in {
            ("inbox", "pending"): 2, ("inbox", "claimed"): 0, ("inbox", "done"): 1, ("inbox", "failed"): 1,
            ("reviews", "pending"): 1, ("reviews", "claimed"): 1, ("reviews", "done"): 0, ("reviews", "failed"): 0,
        }.items()
    }
    ages = metrics["switchboard_queue_oldest_pending_seconds"]
    for queue, todo_id in (("inbox", oldest), ("reviews", lapsed)):
        created = _epoch(app.get_todo(todo_id, caller=CLI)["created_at"])
        assert before - created - 0.01 <= ages[(("queue", queue),)] <= after - created + 0.01, (queue, ages)
    assert metrics["switchboard_todos_created_total"] == {
        (("queue", "inbox"), ("source", "operator")): 3, (("queue", "reviews"), ("source", "operator")): 1,
        (("queue", "inbox"), ("source", "github")): 1, (("queue", "quarantine"), ("source", "generic")): 1,
    }
    assert metrics["switchboard_todos_claimed_total"] == {(("queue", "inbox"),): 2, (("queue", "reviews"),): 2}
    assert metrics["switchboard_todos_completed_total"] == {
        (("outcome", "complete"), ("queue", "inbox")): 1, (("outcome", "fail"), ("queue", "inbox")): 1,
    }
    assert metrics["switchboard_leases_expired_total"] == {(("queue", "reviews"),): 1}
    assert metrics["switchboard_webhook_deliveries_total"] == {
        (("source", "github"), ("verdict", "routed")): 1, (("source", "github"), ("verdict", "duplicate")): 1,
        (("source", "generic"), ("verdict", "dropped")): 1, (("source", "generic"), ("verdict", "faulted")): 1,
    }
    counts = stack.counts()
    assert (counts["deliveries"], counts["todos"]) == (4, 6)
    assert metrics["switchboard_build_info"] == {(("version", VERSION),): 1}
    names = {p.name for p in all_projections()}
    lag = metrics["switchboard_projection_lag_events"]
    assert set(lag) == {(("projection", name),) for name in names}
    assert all(0 <= value <= counts["events"] for value in lag.values()), lag
    assert all(lag[(("projection", p.name),)] == 0 for p in all_projections() if p.inline), lag
    # the scrape caught every projection up, and nothing was appended since
    assert set(samples(scrape(stack.server.base))["switchboard_projection_lag_events"].values()) == {0}


def _epoch(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def _wait_for(condition, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)
