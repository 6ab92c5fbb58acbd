"""Queue controls, delays and bulk retry on every surface (CONTRACT §13): the CLI in its own
process, the operator API and MCP over real HTTP against one `switchboard serve` on SQLite."""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import anyio
import httpx
import pytest

from tests.e2e._ingest import Stack
from tests.e2e.test_mcp import call, connect, refused


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[Stack]:
    base = tmp_path_factory.mktemp("queues")
    running = Stack(f"sqlite:///{base}/switchboard.db", base / "var", secret_key=secrets.token_hex(32)).start()
    yield running
    running.close()


@pytest.fixture(scope="module")
def api(stack) -> httpx.Client:
    token = stack.cli.json("operator", "token", "admin")["token"]
    with httpx.Client(base_url=f"{stack.server.base}/api/v1", headers={"authorization": f"Bearer {token}"},
                      timeout=30) as client:
        yield client


def vend(stack: Stack, *queues: str) -> dict:
    args = [a for q in (queues or ("work",)) for a in ("--queue", q)]
    return stack.cli.json("endpoint", "vend", f"agent-{uuid.uuid4().hex[:6]}", *args)


def dead_letter(stack: Stack, endpoint: dict) -> str:
    """A dead letter of the endpoint, made by a second container on the store whose clock jumps
    to each retry (the server's own clock is the real one)."""
    from application.service import Caller
    from interfaces.bootstrap import build
    from interfaces.settings import Settings
    from tests.doubles import ManualClock

    clock = ManualClock(datetime.now(timezone.utc))
    container = build(Settings(database_url=stack.url, data_dir=str(stack.data_dir), base_url=stack.server.base,
                               secret_key=stack.secret_key), clock=clock)
    try:
        agent, cli = Caller("endpoint", endpoint["slug"]), Caller.cli()
        todo = container.app.push(endpoint["slug"], "doomed", caller=cli)["todo"]["id"]
        while True:
            container.app.claim(todo, caller=agent)
            if container.app.fail(todo, caller=agent)["dead_letter"]:
                return todo
            clock.advance(hours=1)  # past the retry's time: claimable again
    finally:
        container.close()


# --- CLI ---------------------------------------------------------------------------------------------


def test_the_cli_sets_and_lists_queue_controls(stack):
    endpoint = vend(stack, "builds", "deploys")
    shown = stack.cli.json("queue", "set", endpoint["slug"], "builds", "--pause", "--max-in-flight", "3")
    assert shown == {"queue": "builds", "paused": True, "max_in_flight": 3, "max_claims_per_minute": None,
                     "in_flight": 0, "claims_last_minute": None}
    stack.cli.json("queue", "set", endpoint["slug"], "builds", "--resume", "--rate", "30")
    listed = stack.cli.json("queue", "list", endpoint["slug"])
    assert [(q["queue"], q["paused"], q["max_in_flight"], q["max_claims_per_minute"]) for q in listed["queues"]] == [
        ("builds", False, 3, 30), ("deploys", False, None, None)]
    stack.cli.json("queue", "set", endpoint["slug"], "builds", "--max-in-flight", "none")
    text = stack.cli.run("queue", "list", endpoint["slug"]).ok().stdout
    assert "MAX_IN_FLIGHT" in text and "builds" in text


def test_the_cli_refuses_bad_controls_with_their_codes(stack):
    endpoint = vend(stack)
    assert "1..10000" in stack.cli.run("queue", "set", endpoint["slug"], "work", "--max-in-flight", "0").refused(
        "invalid_argument")
    stack.cli.run("queue", "set", endpoint["slug"], "work", "--rate", "lots").usage()
    stack.cli.run("queue", "set", endpoint["slug"], "work").usage()
    stack.cli.run("queue", "set", endpoint["slug"], "work", "--pause", "--resume").usage()
    stack.cli.run("queue", "set", endpoint["slug"], "elsewhere", "--pause").refused("invalid_argument")
    stack.cli.run("queue", "list", "no-such-endpoint").refused("not_found")


def test_the_cli_pushes_later(stack):
    endpoint = vend(stack)
    before = datetime.now(timezone.utc)
    pushed = stack.cli.json("todo", "push", endpoint["slug"], "in ten minutes", "--delay", "10m")["todo"]
    available = datetime.fromisoformat(pushed["available_at"])
    assert before + timedelta(minutes=10) <= available <= datetime.now(timezone.utc) + timedelta(minutes=10)
    at = "2030-01-02T03:04:05Z"
    assert stack.cli.json("todo", "push", endpoint["slug"], "then", "--not-before", at)["todo"]["available_at"] == at
    assert "claimable from" in stack.cli.run("todo", "push", endpoint["slug"], "t", "--delay", "1h").ok().stdout
    stack.cli.run("todo", "push", endpoint["slug"], "t", "--not-before", "soon").refused("invalid_argument")
    stack.cli.run("todo", "push", endpoint["slug"], "t", "--delay", "10 minutes").usage()
    stack.cli.run("todo", "push", endpoint["slug"], "t", "--delay", "1m", "--not-before", at).usage()


def test_the_cli_retries_dead_letters_in_bulk(stack):
    endpoint = vend(stack)
    dead = [dead_letter(stack, endpoint) for _ in range(2)]
    assert stack.cli.json("todo", "retry", "--endpoint", endpoint["slug"], "--dead-letters", "--dry-run") == {
        "would_retry": 2}
    answer = stack.cli.json("todo", "retry", "--endpoint", endpoint["slug"], "--dead-letters")
    assert answer["retried"] == 2
    for todo in dead:
        last = stack.cli.json("todo", "history", todo)["events"][-1]
        assert (last["type"], last["cause"]) == ("TodoRequeued", answer["bulk_action_id"])
    assert "retried 0 dead letter(s)" in stack.cli.run(
        "todo", "retry", "--endpoint", endpoint["slug"], "--dead-letters").ok().stdout
    stack.cli.run("todo", "retry", "--endpoint", endpoint["slug"]).usage()
    stack.cli.run("todo", "retry", dead[0], "--dead-letters", "--endpoint", endpoint["slug"]).usage()
    stack.cli.run("todo", "retry").usage()


# --- API ---------------------------------------------------------------------------------------------


def test_the_api_sets_and_lists_queue_controls(stack, api):
    endpoint = vend(stack, "builds")
    path = f"/endpoints/{endpoint['slug']}/queues"
    answer = api.put(f"{path}/builds", json={"max_claims_per_minute": 30})
    assert answer.status_code == 200, answer.text
    assert answer.json()["max_claims_per_minute"] == 30
    assert api.put(f"{path}/builds", json={"paused": True}).json()["paused"] is True
    listed = api.get(path).json()
    assert listed["endpoint_id"] == endpoint["endpoint_id"]
    assert listed["queues"][0] == {"queue": "builds", "paused": True, "max_in_flight": None,
                                        "max_claims_per_minute": 30, "in_flight": 0, "claims_last_minute": 0}
    assert api.put(f"{path}/builds", json={"max_claims_per_minute": None}).json()["max_claims_per_minute"] is None

    bad = api.put(f"{path}/builds", json={"max_in_flight": 10001})
    assert (bad.status_code, bad.json()["code"]) == (400, "invalid_argument")
    assert api.put(f"{path}/builds", json={"max_in_flight": [3]}).status_code == 422
    assert api.put(f"{path}/builds", json={"pause": True}).status_code == 422
    assert api.put("/endpoints/nobody-xyz1/queues/builds", json={"paused": True}).status_code == 404


def test_the_api_pushes_later_snoozes_and_retries_in_bulk(stack, api):
    endpoint = vend(stack)
    at = (datetime.now(timezone.utc) + timedelta(hours=1)).replace(microsecond=0)
    pushed = api.post(f"/endpoints/{endpoint['slug']}/todos", json={"title": "later", "not_before": at.isoformat()})
    assert pushed.status_code == 201, pushed.text
    assert datetime.fromisoformat(pushed.json()["todo"]["available_at"]) == at
    bad = api.post(f"/endpoints/{endpoint['slug']}/todos", json={"title": "later", "not_before": "noon"})
    assert (bad.status_code, bad.json()["code"]) == (400, "invalid_argument")

    now = api.post(f"/endpoints/{endpoint['slug']}/todos", json={"title": "now"}).json()["todo"]["id"]
    assert api.post(f"/todos/{now}/claim").status_code == 200
    too_long = api.post(f"/todos/{now}/release", json={"delay_seconds": 86401})
    assert (too_long.status_code, too_long.json()["code"]) == (400, "invalid_argument")
    snoozed = api.post(f"/todos/{now}/release", json={"delay_seconds": 600}).json()
    assert snoozed["state"] == "pending" and snoozed["available_at"] > snoozed["created_at"]

    dead_letter(stack, endpoint)
    dry = api.post("/todos/retry", json={"endpoint": endpoint["slug"], "dead_letters": True, "dry_run": True})
    assert dry.json() == {"would_retry": 1}
    done = api.post("/todos/retry", json={"endpoint": endpoint["slug"], "dead_letters": True})
    assert done.status_code == 200 and done.json()["retried"] == 1
    refused_ = api.post("/todos/retry", json={"endpoint": endpoint["slug"], "dead_letters": False})
    assert (refused_.status_code, refused_.json()["code"]) == (400, "invalid_argument")
    assert api.post("/todos/retry", json={"endpoint": "nobody-xyz1", "dead_letters": True}).status_code == 404


# --- MCP ---------------------------------------------------------------------------------------------


def test_an_agent_hears_why_claim_next_is_empty_and_snoozes_over_mcp(stack, api):
    endpoint = vend(stack)
    api.put(f"/endpoints/{endpoint['slug']}/queues/work", json={"max_in_flight": 1})
    for title in ("one", "two"):
        api.post(f"/endpoints/{endpoint['slug']}/todos", json={"title": title})

    async def scenario() -> None:
        async with connect(endpoint) as client:
            first = await call(client, "claim_next")
            assert first["empty"] is False
            assert await call(client, "claim_next") == {"empty": True, "reason": "max_in_flight"}
            assert await call(client, "claim_next", max=5) == {"empty": True, "todos": [], "reason": "max_in_flight"}
            second = (await call(client, "list_todos", state="pending"))["todos"][0]["id"]
            assert (await refused(client, "claim", id=second)).startswith("conflict: max_in_flight:")
            assert (await refused(client, "release", id=first["todo"]["id"], delay_seconds=-1)).startswith(
                "invalid_argument:")
            snoozed = await call(client, "release", id=first["todo"]["id"], delay_seconds=3600)
            assert snoozed["state"] == "pending"
            assert (await call(client, "claim_next"))["todo"]["id"] == second  # the snoozed one waits

    anyio.run(scenario)
