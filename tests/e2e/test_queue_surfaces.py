"""Queue controls, delays, snoozes and bulk retry on every surface (CONTRACT §13; docs/reference.md
"Delays and snoozes", "Queue controls", "Bulk retry"), against one `switchboard serve` on SQLite:

- the CLI, each command in its own process: `queue set`/`queue list`, `todo push --delay`/
  `--not-before`, `todo retry --dead-letters`;
- the operator API over real HTTP with an `sbo_` token: the queues routes, a push's `not_before`,
  a release's `delay_seconds`, `available_at` (delayed, snoozed, claimed, held, dead-lettered),
  `POST /todos/retry`; each refusal with its status and code, bodies of the wrong JSON type 422;
- an agent with the official `mcp` client: why `claim_next` is empty (one queue at
  `max_in_flight`; several refusing queues answer for the one that admits soonest), the claim's
  conflict, and a snooze.

And a bulk retry of 500 dead letters by the CLI, without a server, on each store. The limits
across two `serve` processes on PostgreSQL: tests/e2e/test_queue_limits_two_serves.py."""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import anyio
import httpx
import pytest

from tests.e2e._ingest import Stack
from tests.e2e._support import Cli
from tests.e2e.test_mcp import call, connect, refused
from tests.fixtures import fixture
from tests.integration._support import dead_letters


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[Stack]:
    base = tmp_path_factory.mktemp("queues")
    running = Stack(f"sqlite:///{base}/switchboard.db", base / "var", secret_key=secrets.token_hex(32)).start()
    yield running
    running.close()


@pytest.fixture(scope="module")
def api(stack) -> Iterator[httpx.Client]:
    """The operator API of the stack's server, as its admin (an `sbo_` token from the CLI)."""
    token = stack.cli.json("operator", "token", "admin")["token"]
    with httpx.Client(base_url=f"{stack.server.base}/api/v1", headers={"authorization": f"Bearer {token}"},
                      timeout=30) as client:
        yield client


def refusal(response: httpx.Response, status: int, code: str) -> str:
    """A refused API call's message, checked to be the `{"error", "code"}` body with that status."""
    assert response.status_code == status, (response.status_code, response.text)
    body = response.json()
    assert set(body) == {"error", "code"} and body["code"] == code, body
    return body["error"]


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
    assert "is not one of endpoint" in stack.cli.run(  # a mistyped queue is refused, not "retried 0"
        "todo", "retry", "--endpoint", endpoint["slug"], "--dead-letters", "--queue", "typo").refused("invalid_argument")


def test_the_cli_retries_500_dead_letters_in_one_command_with_one_cause(store_url, tmp_path, make_container):
    """On each store, without a server: the dead letters made in-process, retried by the CLI's process."""
    from application.service import Caller

    app, cli = make_container(store_url).app, Cli(store_url, tmp_path)
    app.ensure_admin()
    endpoint = app.vend("bulk", queues=["work"], caller=Caller.cli())
    dead = dead_letters(app, endpoint["slug"], 500)
    before = max(int(r["position"]) for r in app.audit(after=0))
    for _ in range(2):  # the first also catches the read models up with the 5,500 events
        dry = cli.run("todo", "retry", "--endpoint", endpoint["slug"], "--dead-letters", "--dry-run", "--json")
        assert dry.json() == {"would_retry": 500}
    retry = cli.run("todo", "retry", "--endpoint", endpoint["slug"], "--dead-letters", "--json")
    answer = retry.json()
    print(f"{store_url.split(':')[0]}: todo retry --dead-letters of 500: {retry.seconds:.2f} s (its dry run, the"
          f" same process without the retries: {dry.seconds:.2f} s)")
    assert answer["retried"] == 500
    requeued = [r for r in app.audit(after=before) if r["type"] == "TodoRequeued"]
    assert {r["aggregate"] for r in requeued} == dead and len(requeued) == 500  # one event per todo
    assert {(r["cause"], r["actor"]) for r in requeued} == {(answer["bulk_action_id"], "operator:cli")}
    pending = cli.json("todo", "list", "--endpoint", endpoint["slug"], "--state", "pending", "--limit", "1000")
    assert {t["id"] for t in pending["todos"]} == dead and {t["attempt"] for t in pending["todos"]} == {0}
    assert cli.json("todo", "retry", "--endpoint", endpoint["slug"], "--dead-letters")["retried"] == 0


# --- API ---------------------------------------------------------------------------------------------


def test_the_api_sets_and_lists_queue_controls(stack, api):
    endpoint = vend(stack, "builds", "deploys")
    path = f"/endpoints/{endpoint['slug']}/queues"
    answer = api.put(f"{path}/builds", json={"max_claims_per_minute": 30})
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"queue": "builds", "paused": False, "max_in_flight": None, "max_claims_per_minute": 30,
                             "in_flight": 0, "claims_last_minute": 0}
    paused = api.put(f"{path}/builds", json={"paused": True}).json()  # a field left out stays
    assert (paused["paused"], paused["max_claims_per_minute"]) == (True, 30)
    listed = api.get(path).json()
    assert (listed["endpoint_id"], listed["slug"]) == (endpoint["endpoint_id"], endpoint["slug"])
    assert listed["queues"] == [
        {"queue": "builds", "paused": True, "max_in_flight": None, "max_claims_per_minute": 30, "in_flight": 0,
         "claims_last_minute": 0},
        {"queue": "deploys", "paused": False, "max_in_flight": None, "max_claims_per_minute": None, "in_flight": 0,
         "claims_last_minute": None}]
    assert api.put(f"{path}/builds", json={"max_claims_per_minute": None}).json()["max_claims_per_minute"] is None
    assert api.put(f"{path}/builds", json={"paused": False, "max_in_flight": 3}).json() == {
        "queue": "builds", "paused": False, "max_in_flight": 3, "max_claims_per_minute": None, "in_flight": 0,
        "claims_last_minute": None}

    # refusals, each changing nothing: out of range (named as the API names it), a queue that is not
    # the endpoint's, a body of the wrong shape or of JSON's wrong types (decoded strictly), another's
    assert refusal(api.put(f"{path}/builds", json={"max_in_flight": 10001}), 400, "invalid_argument") == (
        "max_in_flight must be within 1..10000 (or none: no limit)")
    assert "max_claims_per_minute" in refusal(api.put(f"{path}/builds", json={"max_claims_per_minute": 0}), 400,
                                              "invalid_argument")
    refusal(api.put(f"{path}/elsewhere", json={"paused": True}), 400, "invalid_argument")
    for body in ({"max_in_flight": [3]}, {"pause": True}, {"paused": "true"}, {"paused": 1},
                 {"max_in_flight": "null"}, {"max_in_flight": "5"}, {"max_in_flight": 5.0}):
        refusal(api.put(f"{path}/builds", json=body), 422, "validation_failed")
    refusal(api.put("/endpoints/nobody-xyz1/queues/builds", json={"paused": True}), 404, "not_found")
    refusal(api.get("/endpoints/nobody-xyz1/queues"), 404, "not_found")
    assert [(q["queue"], q["paused"], q["max_in_flight"], q["max_claims_per_minute"])
            for q in api.get(path).json()["queues"]] == [("builds", False, 3, None), ("deploys", False, None, None)]


def test_the_api_pushes_later_snoozes_and_retries_in_bulk(stack, api):
    endpoint = vend(stack)
    todos = f"/endpoints/{endpoint['slug']}/todos"
    at = (datetime.now(timezone.utc) + timedelta(hours=1)).replace(microsecond=0)
    pushed = api.post(todos, json={"title": "later", "not_before": at.isoformat()})
    assert pushed.status_code == 201, pushed.text
    later = pushed.json()["todo"]
    assert later["state"] == "pending" and datetime.fromisoformat(later["available_at"]) == at
    delayed = refusal(api.post(f"/todos/{later['id']}/claim"), 409, "conflict")  # pending, not claimable yet
    assert f"is delayed until {at.isoformat().replace('+00:00', 'Z')}" in delayed
    for not_before in ("noon", "2030-01-02T03:04:05"):  # no time, or a time without its offset
        assert "not_before" in refusal(api.post(todos, json={"title": "later", "not_before": not_before}), 400,
                                       "invalid_argument")
    refusal(api.post(todos, json={"title": "later", "delay_seconds": 60}), 422, "validation_failed")  # a time only
    refusal(api.post(todos, json={"title": "later", "not_before": 1893456000}), 422, "validation_failed")

    now = api.post(todos, json={"title": "now"}).json()["todo"]["id"]
    claimed = api.post(f"/todos/{now}/claim")
    assert claimed.status_code == 200 and claimed.json()["available_at"] is None  # null while claimed
    for delay in (86401, -1):
        assert refusal(api.post(f"/todos/{now}/release", json={"delay_seconds": delay}), 400,
                       "invalid_argument") == "delay_seconds must be within 0..86400"
    refusal(api.post(f"/todos/{now}/release", json={"delay_seconds": "600"}), 422, "validation_failed")
    assert api.get(f"/todos/{now}").json()["state"] == "claimed"  # the lease is kept
    before = datetime.now(timezone.utc)
    snoozed = api.post(f"/todos/{now}/release", json={"delay_seconds": 600})
    assert snoozed.status_code == 200, snoozed.text
    assert snoozed.json()["state"] == "pending" and snoozed.json()["owner"] is None
    until = datetime.fromisoformat(snoozed.json()["available_at"])
    assert before + timedelta(seconds=599) <= until <= datetime.now(timezone.utc) + timedelta(seconds=601)
    assert "is delayed until" in refusal(api.post(f"/todos/{now}/claim"), 409, "conflict")

    # held in quarantine (an untrusted sender's), a todo has no available_at; released, the release's time
    hook = stack.webhook(endpoint, "github", "work")
    trust = api.put(f"/webhooks/{hook['webhook_id']}/trust", json={"trusted_senders": ["someone-else"]})
    assert trust.status_code == 200, trust.text
    delivered = stack.deliver(hook, fixture("github_issues_opened.json"), event="issues")  # from octocat-alice
    assert delivered.status_code == 202 and delivered.json()["held"] is True, delivered.text
    held = delivered.json()["id"]
    row = api.get(f"/todos/{held}").json()
    assert (row["queue"], row["state"], row["available_at"]) == ("quarantine", "pending", None)
    listed = api.get("/todos", params={"endpoint": endpoint["slug"], "queue": "quarantine"}).json()["todos"]
    assert [(t["id"], t["available_at"]) for t in listed] == [(held, None)]
    before = datetime.now(timezone.utc).replace(microsecond=0)
    moved = api.post(f"/todos/{held}/move", json={"queue": "work"})
    assert moved.status_code == 200, moved.text
    assert moved.json()["queue"] == "work" and datetime.fromisoformat(moved.json()["available_at"]) >= before

    dead = dead_letter(stack, endpoint)
    row = api.get(f"/todos/{dead}").json()
    assert (row["state"], row["dead_letter"], row["available_at"]) == ("failed", True, None)
    retry = "/todos/retry"
    dry = api.post(retry, json={"endpoint": endpoint["slug"], "dead_letters": True, "dry_run": True})
    assert (dry.status_code, dry.json()) == (200, {"would_retry": 1})
    assert api.get(f"/todos/{dead}").json()["state"] == "failed"  # a dry run changes nothing
    # refused, retrying nothing: not dead letters only, a queue not the endpoint's, wrong JSON types, another's
    refusal(api.post(retry, json={"endpoint": endpoint["slug"], "dead_letters": False}), 400, "invalid_argument")
    assert "is not one of endpoint" in refusal(
        api.post(retry, json={"endpoint": endpoint["slug"], "dead_letters": True, "queue": "typo"}), 400,
        "invalid_argument")
    refusal(api.post(retry, json={"endpoint": endpoint["slug"], "dead_letters": "true"}), 422, "validation_failed")
    refusal(api.post(retry, json={"endpoint": "nobody-xyz1", "dead_letters": True}), 404, "not_found")
    assert api.get(f"/todos/{dead}").json()["state"] == "failed"

    done = api.post(retry, json={"endpoint": endpoint["slug"], "dead_letters": True, "queue": "work"})
    assert done.status_code == 200, done.text
    assert done.json()["retried"] == 1 and done.json()["bulk_action_id"].startswith("ba_")
    row = api.get(f"/todos/{dead}").json()
    assert (row["state"], row["attempt"], row["dead_letter"]) == ("pending", 0, False) and row["available_at"]
    last = api.get(f"/todos/{dead}/history").json()["events"][-1]
    assert (last["type"], last["cause"]) == ("TodoRequeued", done.json()["bulk_action_id"])
    again = api.post(retry, json={"endpoint": endpoint["slug"], "dead_letters": True}).json()
    assert again["retried"] == 0


# --- MCP ---------------------------------------------------------------------------------------------


def test_an_agent_hears_why_claim_next_is_empty_and_snoozes_over_mcp(stack, api):
    endpoint = vend(stack, "work", "held", "rated")
    queues, todos = f"/endpoints/{endpoint['slug']}/queues", f"/endpoints/{endpoint['slug']}/todos"
    assert api.put(f"{queues}/work", json={"max_in_flight": 1}).status_code == 200
    for title in ("one", "two"):
        assert api.post(todos, json={"title": title}).status_code == 201

    async def scenario() -> None:
        async with connect(endpoint) as client:
            first = await call(client, "claim_next")
            assert first["empty"] is False and first["todo"]["title"] == "one"
            # max_in_flight frees when a claim ends: no known time, so no retry_after_seconds
            assert await call(client, "claim_next") == {"empty": True, "reason": "max_in_flight"}
            assert await call(client, "claim_next", max=5) == {"empty": True, "todos": [], "reason": "max_in_flight"}
            second = (await call(client, "list_todos", state="pending"))["todos"][0]
            assert second["title"] == "two"
            assert (await refused(client, "claim", id=second["id"])).startswith(
                "conflict: max_in_flight: queue work has 1 todo claimed (max_in_flight 1)")

            # several refusing queues: the answer is the one that admits again soonest, with its own time
            assert api.put(f"{queues}/held", json={"paused": True}).status_code == 200
            assert api.post(todos, json={"title": "paused", "queue": "held"}).status_code == 201
            assert await call(client, "claim_next", queue="held") == {"empty": True, "reason": "paused"}
            assert await call(client, "claim_next") == {"empty": True, "reason": "max_in_flight"}  # before a pause
            assert api.put(f"{queues}/rated", json={"max_claims_per_minute": 1}).status_code == 200
            for title in ("rated one", "rated two"):
                assert api.post(todos, json={"title": title, "queue": "rated"}).status_code == 201
            taken = await call(client, "claim_next")  # the held-back queues never hold back another
            assert taken["todo"]["title"] == "rated one"
            limited = await call(client, "claim_next")
            assert set(limited) == {"empty", "reason", "retry_after_seconds"}, limited
            assert (limited["empty"], limited["reason"]) == (True, "rate_limited")
            assert 1 <= limited["retry_after_seconds"] <= 60
            assert (await refused(client, "claim", id=second["id"])).startswith("conflict: max_in_flight:")

            # a snooze: out of range keeps the lease; the snoozed todo waits while the next is claimed
            assert (await refused(client, "release", id=first["todo"]["id"], delay_seconds=-1)) == (
                "invalid_argument: delay_seconds must be within 0..86400")
            assert (await refused(client, "release", id=first["todo"]["id"], delay_seconds=86401)).startswith(
                "invalid_argument:")
            assert (await call(client, "get_todo", id=first["todo"]["id"]))["state"] == "claimed"
            snoozed = await call(client, "release", id=first["todo"]["id"], delay_seconds=3600)
            assert snoozed["state"] == "pending"
            assert datetime.fromisoformat(snoozed["available_at"]) > datetime.now(timezone.utc) + timedelta(minutes=59)
            delayed = await refused(client, "claim", id=first["todo"]["id"])
            assert f"is delayed until {snoozed['available_at']}" in delayed
            assert (await call(client, "claim_next"))["todo"]["id"] == second["id"]  # the snoozed one waits

    anyio.run(scenario)
