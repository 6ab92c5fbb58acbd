"""End to end: `once` and `exclusive` on queue actions (CONTRACT §13), against real `switchboard
serve` processes, with GitHub's documented payloads (tests/fixtures):

- `once`: a repeat for a subject whose todo is live answers 202 `"repeat": true` with no new
  todo and the stored delivery's trace says `once: "repeat"`; once the todo is done, the next
  delivery opens a new one; 20 concurrent deliveries for one issue open one todo — on SQLite, and
  on PostgreSQL with two serve processes;
- `exclusive` with a fan-out of 3: only the first target, in target order, whose scope has the
  queue gets the todo;
- both flags are checked at save like every rule.
"""

from __future__ import annotations

import json
import secrets
import uuid
from collections.abc import Iterator
from typing import Any

import anyio
import pytest

from tests.e2e._ingest import CLI, Stack
from tests.e2e.test_api import operator
from tests.e2e.test_ingest_postgres import _parallel as parallel  # n requests released together
from tests.e2e.test_mcp import call, connect, refused
from tests.fixtures import fixture

SECRET_KEY = secrets.token_hex(32)
QUEUES = ("inbox", "reviews")
ONCE = {"rules": [], "default_action": {"queue": "inbox", "once": True}}
ISSUE = ("issues", "github_issues_opened.json")  # octo-org/octo-repo#12
COMMENT = ("issue_comment", "github_issue_comment_created.json")  # a comment on #12
PULL = ("pull_request", "github_pull_request_opened.json")  # octo-org/octo-repo#7


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[Stack]:
    base = tmp_path_factory.mktemp("once")
    stack = Stack(f"sqlite:///{base}/switchboard.db", base / "var", secret_key=SECRET_KEY).start()
    yield stack
    stack.close()


def once_hook(stack: Stack, name: str, document: dict[str, Any] = ONCE) -> tuple[dict[str, Any], dict[str, Any]]:
    endpoint = stack.vend(f"{name}-{uuid.uuid4().hex[:6]}", QUEUES)
    hook = stack.webhook(endpoint, "github", "inbox")
    set_rules(stack, hook, document)
    return endpoint, hook


def set_rules(stack: Stack, hook: dict[str, Any], document: dict[str, Any]):
    path = stack.data_dir / f"rules-{uuid.uuid4().hex}.json"
    path.write_text(json.dumps(document))
    return stack.cli.run("rules", "set", hook["webhook_id"], "--file", str(path))


def send(stack: Stack, hook: dict[str, Any], event: tuple[str, str], **kw: Any) -> dict[str, Any]:
    response = stack.deliver(hook, fixture(event[1]), event=event[0], **kw)
    assert response.status_code == 202, response.text
    return response.json()


def finish(endpoint: dict[str, Any], todo_id: str) -> None:
    """The agent claims and completes the todo over MCP."""
    async def scenario() -> None:
        async with connect(endpoint) as client:
            await call(client, "claim", id=todo_id)
            await call(client, "complete", id=todo_id, summary="handled")

    anyio.run(scenario)


def assert_one_todo_for_the_subject(stack: Stack, endpoint, hook, responses) -> str:
    answers = [r.json() for r in responses]
    assert all(r.status_code == 202 for r in responses), [r.text for r in responses if r.status_code != 202]
    assert sorted(a["created"] for a in answers) == [0] * (len(answers) - 1) + [1], answers
    assert len({a["id"] for a in answers}) == 1
    assert sum(a.get("repeat", False) for a in answers) == len(answers) - 1
    assert len({a["event_id"] for a in answers}) == len(answers)  # every delivery is stored
    todos = stack.todos_of(endpoint)
    assert [t["id"] for t in todos] == [answers[0]["id"]]
    stored = stack.events_of(hook)
    assert sum(e["todos_created"] for e in stored) == 1
    repeats = [stack.cli.json("events", "show", a["event_id"])["routing"] for a in answers if a.get("repeat")]
    assert all(r["once"] == "repeat" and r["subject"] == "github:octo-org/octo-repo#12" for r in repeats)
    return answers[0]["id"]


# -- once ---------------------------------------------------------------------------------------


def test_a_repeat_while_the_todo_is_live_opens_nothing_and_after_done_a_new_one_opens(stack):
    endpoint, hook = once_hook(stack, "once")
    first = send(stack, hook, ISSUE)
    assert first["created"] == 1 and "repeat" not in first
    assert stack.cli.json("events", "show", first["event_id"])["routing"]["subject"] == "github:octo-org/octo-repo#12"

    repeat = send(stack, hook, COMMENT)  # another delivery id, the same issue
    assert (repeat["created"], repeat["repeat"], repeat["id"]) == (0, True, first["id"])
    assert repeat["todos"] == [{"id": first["id"], "endpoint_id": endpoint["endpoint_id"], "queue": "inbox",
                                "created": False}]
    stored = stack.cli.json("events", "show", repeat["event_id"])
    assert stored["routing"]["once"] == "repeat" and stored["disposition"] == "routed"
    assert "once" not in stack.cli.json("events", "show", first["event_id"])["routing"]

    other = send(stack, hook, PULL)  # another subject
    assert other["created"] == 1 and other["id"] != first["id"]

    finish(endpoint, first["id"])
    after = send(stack, hook, COMMENT)
    assert after["created"] == 1 and after["id"] != first["id"] and "repeat" not in after
    assert send(stack, hook, ISSUE)["id"] == after["id"]


def test_without_a_subject_once_is_ignored(stack):
    endpoint, hook = once_hook(stack, "no-subject")
    pushes = [send(stack, hook, ("push", "github_push.json")) for _ in range(2)]
    assert [p["created"] for p in pushes] == [1, 1] and pushes[0]["id"] != pushes[1]["id"]


def test_twenty_concurrent_deliveries_for_one_issue_open_one_todo(stack):
    endpoint, hook = once_hook(stack, "once-burst")
    events = [ISSUE, COMMENT]
    responses = parallel(lambda i, client: stack.deliver(hook, fixture(events[i % 2][1]), event=events[i % 2][0],
                                                         client=client), 20)
    assert_one_todo_for_the_subject(stack, endpoint, hook, responses)


@pytest.mark.parametrize(("action", "says"), [
    ({"queue": "inbox", "once": "yes"}, "once must be true or false"),
    ({"queue": "inbox", "exclusive": 1}, "exclusive must be true or false"),
    ({"drop": True, "once": True}, "action must be one of"),
])
def test_bad_flags_are_refused_at_save_with_invalid_rule(stack, action, says):
    _, hook = once_hook(stack, "bad-flags", {"rules": []})
    refused = set_rules(stack, hook, {"rules": [{"id": "r", "expr": "true", "action": action}]})
    assert refused.code == 1 and "invalid_rule" in refused.stderr and says in refused.stderr, refused
    assert stack.cli.json("rules", "get", hook["webhook_id"])["rules"] == []


def test_bad_flags_are_refused_with_invalid_rule_over_the_api_and_mcp_too(stack):
    endpoint, hook = once_hook(stack, "bad-flags-surfaces", {"rules": []})
    bad = {"rules": [{"id": "r", "expr": "true", "action": {"queue": "inbox", "exclusive": "sure"}}]}
    answer = operator(stack, "admin").put(f"/webhooks/{hook['webhook_id']}/rules", bad)
    assert (answer.status_code, answer.json()["code"]) == (400, "invalid_rule"), answer.text

    async def scenario() -> None:
        async with connect(endpoint) as client:
            text = await refused(client, "set_webhook_rules", webhook_id=hook["webhook_id"], **bad)
            assert text.startswith("invalid_rule: rule #1 (r): exclusive must be true or false"), text
            saved = await call(client, "set_webhook_rules", webhook_id=hook["webhook_id"], rules=[
                {"id": "r", "expr": "true", "action": {"queue": "inbox", "once": True, "exclusive": True}}])
            assert saved["rules"][0]["action"] == {"queue": "inbox", "once": True, "exclusive": True}

    anyio.run(scenario)


# -- exclusive ----------------------------------------------------------------------------------


def test_exclusive_gives_the_todo_to_the_first_target_in_order_whose_scope_has_the_queue(stack):
    owner = stack.vend(f"ex-owner-{uuid.uuid4().hex[:6]}", ["inbox"], webhook_queues=["inbox", "builds"])
    first = stack.vend(f"ex-first-{uuid.uuid4().hex[:6]}", ["builds"])
    second = stack.vend(f"ex-second-{uuid.uuid4().hex[:6]}", ["builds", "inbox"])
    hook = stack.webhook(owner, "github", "inbox")
    for target in (first, second):
        stack.webhooks.add_route(hook["webhook_id"], target["endpoint_id"], caller=CLI)
    assert set_rules(stack, hook, {"rules": [
        {"id": "builds", "expr": '.kind == "pull_request"', "action": {"queue": "builds", "exclusive": True}},
        {"id": "inbox", "expr": '.kind == "issues"', "action": {"queue": "inbox", "exclusive": True}},
    ]}).code == 0

    builds = send(stack, hook, PULL)  # the owner's scope lacks builds: the first route takes it
    assert [(t["endpoint_id"], t["queue"]) for t in builds["todos"]] == [(first["endpoint_id"], "builds")]
    inbox = send(stack, hook, ISSUE)  # the owner's scope has inbox: the owner alone
    assert [(t["endpoint_id"], t["queue"]) for t in inbox["todos"]] == [(owner["endpoint_id"], "inbox")]
    set_rules(stack, hook, {"rules": [], "default_action": {"queue": "builds"}})
    fanned = send(stack, hook, ("issue_comment", "github_issue_comment_created.json"))  # without exclusive: all 3
    assert [t["endpoint_id"] for t in fanned["todos"]] == [owner["endpoint_id"], first["endpoint_id"],
                                                            second["endpoint_id"]]


# -- once on PostgreSQL with two serve processes ------------------------------------------------


@pytest.fixture(scope="module")
def pg_stack(module_pg_url, tmp_path_factory) -> Iterator[Stack]:
    stack = Stack(module_pg_url, tmp_path_factory.mktemp("once-pg"), secret_key=SECRET_KEY).start()
    yield stack
    stack.close()


@pytest.mark.postgres
def test_twenty_concurrent_deliveries_across_two_servers_open_one_todo_then_a_new_one_after_done(pg_stack):
    stack = pg_stack
    endpoint, hook = once_hook(stack, "once-two-servers")
    other = stack.another_server("second")
    try:
        urls = [hook["ingest_url"], hook["ingest_url"].replace(stack.server.base, other.base)]
        events = [ISSUE, COMMENT]
        responses = parallel(lambda i, client: stack.deliver(
            hook, fixture(events[i % 2][1]), event=events[i % 2][0], url=urls[i % 2], client=client), 20)
        todo_id = assert_one_todo_for_the_subject(stack, endpoint, hook, responses)
        finish(endpoint, todo_id)
        again = parallel(lambda i, client: stack.deliver(hook, fixture(COMMENT[1]), event=COMMENT[0],
                                                         url=urls[i % 2], client=client), 6)
        created = [r.json() for r in again if r.json()["created"]]
        assert len(created) == 1 and created[0]["id"] != todo_id, [r.json() for r in again]
    finally:
        assert other.stop() == 0, other.output()
    assert "Traceback" not in other.stderr(), other.output()
