"""End to end: trusted senders and the `quarantine` action (CONTRACT §13), against a real
`switchboard serve` on SQLite, through the CLI, the operator API, MCP (the official client) and
ingest, with payloads from GitHub's documented examples (tests/fixtures):

- a listed login passes, a listed association passes, anyone else is held in the owner's
  quarantine (disposition `held`, trace stage `untrusted` with the actor);
- an agent never sees a held todo (`list_todos`, `claim`, `claim_next`); released by an operator
  (the release names who) it is claimable;
- trust is set by operators only (CLI, API), shown in MCP `list_webhooks`, and every refusal has
  its code on every surface; changes are events rebuilt by `projections rebuild --verify`.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import anyio
import anyio.to_thread
import httpx
import pytest

from tests.e2e._ingest import CLI, Stack
from tests.e2e.test_api import operator
from tests.e2e.test_doorbell import rings_of, streaming
from tests.e2e.test_mcp import call, connect, refused
from tests.e2e.test_mcp_sessions import ChannelListener, InProcess
from tests.e2e.test_mcp_sessions import connect as stream
from tests.fixtures import fixture, sign

SECRET_KEY = "be" * 32
QUEUES = ("inbox", "reviews")
PAYLOADS = {  # kind → (fixture, sender, association)
    "issues": ("github_issues_opened.json", "octocat-alice", "MEMBER"),
    "pull_request": ("github_pull_request_opened.json", "hubot-bob", "MEMBER"),
    "issue_comment": ("github_issue_comment_created.json", "drive-by-dana", "NONE"),
    "pull_request_review": ("github_pull_request_review_submitted.json", "reviewer-riley", "COLLABORATOR"),
}


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[Stack]:
    base = tmp_path_factory.mktemp("trust")
    stack = Stack(f"sqlite:///{base}/switchboard.db", base / "var", secret_key=SECRET_KEY).start()
    yield stack
    stack.close()  # exit 0, and no traceback in the server's stderr


@pytest.fixture(scope="module")
def admin(stack):
    return operator(stack, "admin")


def github_hook(stack: Stack, name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    endpoint = stack.vend(f"{name}-{uuid.uuid4().hex[:6]}", QUEUES)
    return endpoint, stack.webhook(endpoint, "github", "inbox")


def send(stack: Stack, hook: dict[str, Any], kind: str) -> dict[str, Any]:
    response = stack.deliver(hook, fixture(PAYLOADS[kind][0]), event=kind)
    assert response.status_code == 202, response.text
    return response.json()


def event_of(stack: Stack, answer: dict[str, Any]) -> dict[str, Any]:
    return stack.cli.json("events", "show", answer["event_id"])


def assert_held(stack: Stack, endpoint: dict[str, Any], answer: dict[str, Any], kind: str) -> None:
    _, sender, association = PAYLOADS[kind]
    assert answer["held"] is True and answer["created"] == 1, answer
    assert [(t["endpoint_id"], t["queue"]) for t in answer["todos"]] == [(endpoint["endpoint_id"], "quarantine")]
    stored = event_of(stack, answer)
    assert stored["disposition"] == "held"
    assert stored["routing"]["stage"] == "untrusted"
    assert stored["routing"]["actor"] == {"sender": sender, "association": association}
    todo = stack.cli.json("todo", "show", answer["id"])
    assert (todo["queue"], todo["state"]) == ("quarantine", "pending")
    assert todo["routing"] == stored["routing"]


def set_rules(stack: Stack, hook: dict[str, Any], document: dict[str, Any]) -> dict[str, Any]:
    path = stack.data_dir / f"rules-{uuid.uuid4().hex}.json"
    path.write_text(json.dumps(document))
    return stack.cli.json("rules", "set", hook["webhook_id"], "--file", str(path))


def assert_routed(answer: dict[str, Any]) -> None:
    assert "held" not in answer and answer["queue"] == "inbox" and answer["created"] == 1, answer


# -- who passes ---------------------------------------------------------------------------------


def test_a_listed_login_passes_a_listed_association_passes_and_anyone_else_is_held(stack):
    endpoint, hook = github_hook(stack, "trusting")
    shown = stack.cli.json("webhook", "trust", hook["webhook_id"], "--sender", "OctoCat-Alice",
                           "--association", "collaborator")
    assert shown == {"webhook_id": hook["webhook_id"], "trusted_senders": ["octocat-alice"],
                     "trusted_associations": ["COLLABORATOR"]}

    assert_routed(send(stack, hook, "issues"))  # octocat-alice: a listed login
    assert_routed(send(stack, hook, "pull_request_review"))  # reviewer-riley: COLLABORATOR
    for kind in ("issue_comment", "pull_request"):  # drive-by-dana (NONE), hubot-bob (MEMBER, not listed)
        assert_held(stack, endpoint, send(stack, hook, kind), kind)

    listed = stack.cli.json("webhook", "list", "--endpoint", endpoint["slug"])["webhooks"]
    assert [(w["trusted_senders"], w["trusted_associations"]) for w in listed] == [(["octocat-alice"], ["COLLABORATOR"])]

    cleared = stack.cli.json("webhook", "trust", hook["webhook_id"], "--clear")
    assert (cleared["trusted_senders"], cleared["trusted_associations"]) == ([], [])
    assert_routed(send(stack, hook, "issue_comment"))  # no lists: everyone is trusted again


def test_the_envelope_carries_the_actor_for_rules_and_dry_runs(stack):
    endpoint, hook = github_hook(stack, "envelope")
    stack.cli.json("webhook", "trust", hook["webhook_id"], "--sender", "octocat-alice")
    payload = json.loads(fixture(PAYLOADS["issue_comment"][0]))
    tested = stack.cli.json("rules", "test", hook["webhook_id"], "--payload", json.dumps(payload),
                            "--header", "X-GitHub-Event:issue_comment")
    assert tested["envelope"]["actor"] == {"sender": "drive-by-dana", "association": "NONE", "trusted": False}
    # a rule that drops strangers' deliveries: a drop wins over the hold (nothing is created)
    set_rules(stack, hook, {"rules": [{"id": "strangers", "expr": ".actor.trusted | not", "action": {"drop": True}}]})
    dropped = send(stack, hook, "issue_comment")
    assert dropped["dropped"] is True and dropped["todos"] == []
    assert_routed(send(stack, hook, "issues"))
    stored = event_of(stack, send(stack, hook, "issues"))
    assert stored["routing"]["stage"] == "default"


def test_the_quarantine_action_holds_the_delivery_with_trace_stage_rule(stack):
    endpoint, hook = github_hook(stack, "quarantine-rule")
    set_rules(stack, hook, {"rules": [
        {"id": "look-first", "expr": '.kind == "issue_comment"', "action": {"quarantine": True}}]})
    answer = send(stack, hook, "issue_comment")
    assert answer["held"] is True and [t["queue"] for t in answer["todos"]] == ["quarantine"], answer
    stored = event_of(stack, answer)
    assert stored["disposition"] == "held"
    assert stored["routing"] == {"stage": "rule", "rule_index": 0, "rule_id": "look-first",
                                 "action": {"quarantine": True}}
    assert_routed(send(stack, hook, "issues"))


# -- set by operators only, refused with a code on every surface --------------------------------


def test_trust_over_the_api_and_its_refusals(stack, admin):
    endpoint, hook = github_hook(stack, "api-trust")
    path = f"/webhooks/{hook['webhook_id']}/trust"
    answer = admin.put(path, {"trusted_senders": ["Hubot-Bob"], "trusted_associations": ["owner", "MEMBER"]})
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"webhook_id": hook["webhook_id"], "trusted_senders": ["hubot-bob"],
                             "trusted_associations": ["OWNER", "MEMBER"]}
    generic = stack.webhook(endpoint, "generic", "inbox")
    for body, status, code in (
        ({"trusted_associations": ["NONE"]}, 400, "invalid_argument"),
        ({"trusted_senders": ["has space"]}, 400, "invalid_argument"),
        ({"trusted_senders": [f"user{i}" for i in range(257)]}, 400, "invalid_argument"),
        ({"trusted_senders": "alice"}, 422, "validation_failed"),
        ({"trusted_sender": ["alice"]}, 422, "validation_failed"),
    ):
        refusal = admin.put(path, body)
        assert (refusal.status_code, refusal.json()["code"]) == (status, code), (body, refusal.text)
    refusal = admin.put(f"/webhooks/{generic['webhook_id']}/trust", {"trusted_senders": ["a"]})
    assert (refusal.status_code, refusal.json()["code"]) == (400, "invalid_argument"), refusal.text
    refusal = admin.put(f"/webhooks/wh_{'0' * 32}/trust", {"trusted_senders": ["a"]})
    assert (refusal.status_code, refusal.json()["code"]) == (404, "not_found"), refusal.text
    with httpx.Client(base_url=f"{stack.server.base}/api/v1", timeout=30,
                      headers={"authorization": f"Bearer {endpoint['credential']}"}) as agent:
        refusal = agent.put(path, json={"trusted_senders": []})
        assert refusal.status_code == 401 and refusal.json()["code"] == "unauthorized", refusal.text
    listed = admin.get("/webhooks", params={"endpoint": endpoint["slug"]}).json()["webhooks"]
    mine = next(w for w in listed if w["webhook_id"] == hook["webhook_id"])
    assert (mine["trusted_senders"], mine["trusted_associations"]) == (["hubot-bob"], ["OWNER", "MEMBER"])

    for args in (("--association", "NONE"), ("--sender", "has space"), ("--clear", "--sender", "a"), ()):
        result = stack.cli.run("webhook", "trust", hook["webhook_id"], *args)
        assert result.code in (1, 2), result
    assert stack.cli.run("webhook", "trust", hook["webhook_id"], "--association", "NONE").code == 1
    assert "invalid_argument" in stack.cli.run("webhook", "trust", hook["webhook_id"], "--association", "NONE").stderr
    assert "not_found" in stack.cli.run("webhook", "trust", f"wh_{'0' * 32}", "--sender", "a").stderr
    assert stack.cli.json("webhook", "list", "--endpoint", endpoint["slug"])["webhooks"][0]["trusted_senders"] == ["hubot-bob"]


def test_mcp_shows_trust_in_list_webhooks_and_offers_no_way_to_set_it(stack):
    endpoint, hook = github_hook(stack, "mcp-trust")
    stack.cli.json("webhook", "trust", hook["webhook_id"], "--sender", "octocat-alice", "--association", "MEMBER")

    async def scenario() -> None:
        async with connect(endpoint) as client:
            listed = await call(client, "list_webhooks")
            [row] = [w for w in listed["webhooks"] if w["webhook_id"] == hook["webhook_id"]]
            assert (row["trusted_senders"], row["trusted_associations"]) == (["octocat-alice"], ["MEMBER"])
            names = {tool.name for tool in (await client.list_tools()).tools}
            assert not any("trust" in name for name in names), names

    anyio.run(scenario)


# -- an agent never sees a held todo ------------------------------------------------------------


def test_an_agent_never_sees_a_held_todo_until_an_operator_releases_it(stack, admin):
    endpoint, hook = github_hook(stack, "agent-view")
    stack.cli.json("webhook", "trust", hook["webhook_id"], "--association", "OWNER")
    held = send(stack, hook, "issue_comment")
    assert held["held"] is True
    todo_id = held["id"]

    async def before_release() -> None:
        async with connect(endpoint) as client:
            assert todo_id not in [t["id"] for t in (await call(client, "list_todos"))["todos"]]
            assert todo_id not in [t["id"] for t in (await call(client, "list_todos", queue="inbox"))["todos"]]
            assert (await refused(client, "list_todos", queue="quarantine")).split(":")[0] in ("forbidden", "invalid_argument")
            assert (await refused(client, "get_todo", id=todo_id)).startswith("not_found:")
            assert (await refused(client, "claim", id=todo_id)).startswith("not_found:")
            assert await call(client, "claim_next") == {"empty": True}

    anyio.run(before_release)

    moved = admin.post(f"/todos/{todo_id}/move", {"queue": "reviews"})
    assert moved.status_code == 200, moved.text
    history = admin.get(f"/todos/{todo_id}/history").json()["events"]
    released = [e for e in history if e["type"] == "TodoMoved"]
    assert [(e["actor"], e["cause"]) for e in released] == [("operator:admin", "quarantine_release")]

    async def after_release() -> None:
        async with connect(endpoint) as client:
            claimed = await call(client, "claim_next")
            assert claimed["todo"]["id"] == todo_id and claimed["todo"]["queue"] == "reviews", claimed

    anyio.run(after_release)


def test_an_operator_moves_or_discards_a_held_todo_on_the_cli(stack):
    endpoint, hook = github_hook(stack, "cli-release")
    stack.cli.json("webhook", "trust", hook["webhook_id"], "--sender", "octocat-alice")
    held, other = send(stack, hook, "issue_comment"), send(stack, hook, "pull_request")

    refused = stack.cli.run("todo", "move", held["id"], "--queue", "elsewhere")
    assert refused.code == 1 and "forbidden" in refused.stderr, refused
    moved = stack.cli.json("todo", "move", held["id"], "--queue", "inbox")
    assert (moved["queue"], moved["state"]) == ("inbox", "pending")
    again = stack.cli.run("todo", "move", held["id"], "--queue", "inbox")
    assert again.code == 1 and "conflict" in again.stderr and "not in quarantine" in again.stderr, again

    discarded = stack.cli.run("todo", "discard", other["id"], "--summary", "spam").ok()
    assert discarded.stdout.strip() == f"{other['id']} discarded: done"
    history = stack.cli.json("todo", "history", held["id"])["events"] + stack.cli.json("todo", "history", other["id"])["events"]
    assert [(e["type"], e["actor"]) for e in history if e["type"] in ("TodoMoved", "TodoDiscarded")] == [
        ("TodoMoved", "operator:cli"), ("TodoDiscarded", "operator:cli")]


# -- the log ------------------------------------------------------------------------------------


def test_trust_changes_are_events_with_actor_and_cause_and_projections_rebuild_verified(stack, admin):
    _, hook = github_hook(stack, "audit")
    stack.cli.json("webhook", "trust", hook["webhook_id"], "--sender", "octocat-alice")
    admin.put(f"/webhooks/{hook['webhook_id']}/trust", {"trusted_senders": [], "trusted_associations": ["MEMBER"]})
    lines = [json.loads(line) for line in stack.cli.run("audit", "export").ok().stdout.splitlines()]
    changes = [line for line in lines if line["type"] == "WebhookTrustSet" and line["aggregate"] == hook["webhook_id"]]
    assert [(c["actor"], c["cause"], c["data"]) for c in changes] == [
        ("operator:cli", "set_webhook_trust", {"trusted_senders": ["octocat-alice"], "trusted_associations": []}),
        ("operator:admin", "set_webhook_trust", {"trusted_senders": [], "trusted_associations": ["MEMBER"]}),
    ]
    verified = stack.cli.run("projections", "rebuild", "--verify")
    assert verified.code == 0, verified


# -- the doorbell -------------------------------------------------------------------------------


def test_a_held_todo_is_never_rung_and_rings_once_released(tmp_path):
    server = InProcess(tmp_path).start()
    try:
        endpoint = server.container.app.vend("bell", queues=["work"], caller=CLI)
        hook = server.container.webhooks.create(caller=CLI, endpoint=endpoint["slug"], source_type="github",
                                                target_queue="work")
        server.container.webhooks.set_trust(hook["webhook_id"], caller=CLI, senders=["octocat-alice"],
                                            associations=None)
        listener = ChannelListener()

        async def deliver(kind: str) -> dict[str, Any]:
            body = fixture(PAYLOADS[kind][0])
            headers = {"content-type": "application/json", "x-github-event": kind,
                       "x-github-delivery": str(uuid.uuid4()), **sign("github", hook["signing_secret"], body)}
            async with httpx.AsyncClient() as http:
                response = await http.post(hook["ingest_url"], content=body, headers=headers)
            assert response.status_code == 202, response.text
            return response.json()

        async def scenario() -> None:
            async with stream(endpoint, listener):
                await streaming(server, endpoint)
                held = await deliver("issue_comment")
                assert held["held"] is True
                await anyio.sleep(1.0)
                assert listener.received == []  # held: never rung
                trusted = await deliver("issues")
                await rings_of(listener, total=1)
                assert [r.meta["todo_id"] for r in listener.received] == [trusted["id"]]
                await anyio.to_thread.run_sync(lambda: server.container.app.release_quarantined(
                    held["id"], "work", caller=CLI))
                await rings_of(listener, total=2)
                assert [r.meta["todo_id"] for r in listener.received] == [trusted["id"], held["id"]]

        anyio.run(scenario)
    finally:
        server.stop()
