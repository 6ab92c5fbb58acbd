"""Queue controls, delays and bulk retry from the CLI (CONTRACT §13): `queue set` and `queue list`,
`todo push --delay`/`--not-before` and `todo retry --dead-letters`, each command in its own process
on the store of one `switchboard serve` on SQLite; and a bulk retry of 500 dead letters by the CLI
on each store. The limits across two `serve` processes on PostgreSQL:
tests/e2e/test_queue_limits_two_serves.py."""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import pytest

from tests.e2e._ingest import Stack
from tests.e2e._support import Cli
from tests.integration._support import dead_letters


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[Stack]:
    base = tmp_path_factory.mktemp("queues")
    running = Stack(f"sqlite:///{base}/switchboard.db", base / "var", secret_key=secrets.token_hex(32)).start()
    yield running
    running.close()


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
