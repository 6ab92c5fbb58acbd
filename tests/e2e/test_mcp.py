"""End to end: the MCP interface (CONTRACT §7) with the official `mcp` client in its default mode.

One real `switchboard serve` (SQLite) for the module; every test vends its own endpoints with the
CLI, so tests do not see each other's todos. The client is `mcp.client.Client` with `mode="auto"`,
which now lands in the stateless era (docs/adr/0038-both-mcp-eras-on-one-url.md); a test that
needs a session (the channel doorbell, the initialize identity) forces `mode="legacy"`, the
handshake era of docs/adr/0010-mcp-transport.md; the default mode's doorbell, over
`subscriptions/listen`, is tests/e2e/test_doorbell_listen.py's. tests/e2e/test_mcp_eras.py compares the eras verb by verb.
"""

from __future__ import annotations

import json
import secrets
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import httpx
import httpx2
import pytest
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

from domain.endpoint import ALL_VERBS
from domain.names import SOURCE_TYPES
from interfaces.version import VERSION
from tests.e2e._support import Cli, Server
from tests.e2e.test_mcp_sessions import ChannelListener
from tests.fixtures import fixture, sign

AUTH_401 = {"error": "missing, unknown, revoked or expired credential", "code": "unauthorized"}
WWW_AUTHENTICATE = 'Bearer realm="switchboard"'
HANDSHAKE = "2025-11-25"


class McpStack:
    """The server subprocess and the CLI on its store, both minting URLs with the server's base."""

    def __init__(self, data_dir: Path, logs: Path) -> None:
        self.server = Server(data_dir, logs, name="mcp")
        self.server.env["SWITCHBOARD_BASE_URL"] = self.server.base
        self.cli = Cli(None, data_dir)
        self.base = self.server.base

    def vend(self, agent: str, *args: str) -> dict[str, Any]:
        return self.cli.json("endpoint", "vend", agent, *args, env={"SWITCHBOARD_BASE_URL": self.base})

    def revoke(self, slug: str) -> None:
        self.cli.run("endpoint", "revoke", slug).ok()


@contextmanager
def serving(stack: McpStack) -> Iterator[McpStack]:
    """The stack's server started and healthy; once stopped, it exited cleanly with no traceback."""
    stack.server.start()
    try:
        stack.server.wait_healthy()
        yield stack
    finally:
        code = stack.server.stop()
    assert code == 0, stack.server.output()
    assert "Traceback" not in stack.server.stderr(), stack.server.output()
    assert "ASGI callable returned without completing response" not in stack.server.stderr(), stack.server.output()


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[McpStack]:
    root = tmp_path_factory.mktemp("mcp")
    with serving(McpStack(root / "var", root)) as stack:
        yield stack


def agent(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def bearer(vend: dict[str, Any]) -> dict[str, str]:
    return {"Authorization": f"Bearer {vend['credential']}"}


@asynccontextmanager
async def connect(vend: dict[str, Any], *extensions: Any, mode: str = "auto") -> AsyncIterator[Client]:
    """The official client (in its default mode unless told), configured exactly as the vended mcp_json says."""
    server = vend["mcp_json"]["mcpServers"]["switchboard"]
    async with httpx2.AsyncClient(headers=server["headers"], timeout=httpx2.Timeout(30, read=300)) as http:
        async with Client(streamable_http_client(server["url"], http_client=http),
                          extensions=list(extensions), mode=mode) as client:
            yield client


async def call(client: Client, verb: str, **arguments: Any) -> dict[str, Any]:
    """A successful call's JSON object, checked to be both the structured content and the text."""
    result = await client.call_tool(verb, arguments)
    text = result.content[0].text if result.content else ""
    assert not result.is_error, f"{verb}: {text}"
    assert len(result.content) == 1 and result.content[0].type == "text"
    assert json.loads(text) == result.structured_content
    return result.structured_content


async def refused(client: Client, verb: str, **arguments: Any) -> str:
    """A tool error's text, `<code>: <message>`."""
    result = await client.call_tool(verb, arguments)
    assert result.is_error, f"{verb} succeeded: {result.structured_content}"
    assert result.structured_content is None
    assert len(result.content) == 1 and result.content[0].type == "text"
    return result.content[0].text


async def deliver(http: httpx.AsyncClient, ingest_url: str, body: bytes, headers: dict[str, str]) -> dict[str, Any]:
    response = await http.post(ingest_url, content=body, headers={"content-type": "application/json", **headers})
    assert response.status_code == 202, response.text
    return response.json()


def test_initialize_identifies_switchboard_and_its_channel(stack):
    vend = stack.vend(agent("init"), "--queue", "work")

    async def scenario() -> None:
        async with connect(vend, mode="legacy") as client:
            assert client.protocol_version in HANDSHAKE_PROTOCOL_VERSIONS
            assert client.server_info.name == "switchboard"
            assert client.server_info.version == VERSION
            assert client.server_capabilities.experimental == {"claude/channel": {}}
            assert client.server_capabilities.tools is not None
            instructions = client.instructions or ""
            assert "claim_next" in instructions and "hint" in instructions and "queue is the record" in instructions

    anyio.run(scenario)


def test_tools_list_is_exactly_the_endpoint_verbs(stack):
    everything = stack.vend(agent("all"), "--queue", "work")
    narrow = stack.vend(agent("narrow"), "--queue", "work", "--verbs", "claim_next,complete")

    async def scenario() -> None:
        async with connect(everything) as client:
            tools = (await client.list_tools()).tools
            assert [t.name for t in tools] == list(ALL_VERBS)
            assert len(tools) == 22
            for tool in tools:
                assert tool.input_schema["type"] == "object", tool.name
                assert tool.input_schema["additionalProperties"] is False, tool.name
                assert tool.description, tool.name
            schemas = {t.name: t.input_schema for t in tools}
            assert schemas["get_todo"]["required"] == ["id"]
            assert set(schemas["claim_next"]["properties"]) == {"queue", "lease_ttl_seconds", "claimant", "require_fence", "max"}
            assert schemas["list_todos"]["properties"]["limit"]["maximum"] == 200
            assert schemas["create_webhook"]["required"] == ["source_type", "target_queue"]
            assert schemas["create_webhook"]["properties"]["source_type"]["enum"] == list(SOURCE_TYPES)
            assert schemas["set_default_lease"]["required"] == ["default_lease_ttl_seconds"]
            assert schemas["list_webhooks"]["properties"] == {}
        async with connect(narrow) as client:
            assert [t.name for t in (await client.list_tools()).tools] == ["claim_next", "complete"]
            assert await call(client, "claim_next") == {"empty": True}
            # a verb outside the endpoint's verbs, and a name that is no verb at all, answer alike
            denied = await refused(client, "list_todos")
            assert denied == f"forbidden: tool list_todos is not granted to endpoint {narrow['slug']}"
            assert await refused(client, "drop_tables") == (
                f"forbidden: tool drop_tables is not granted to endpoint {narrow['slug']}")

    anyio.run(scenario)


def test_http_refusals_before_the_sdk(stack):
    mine = stack.vend(agent("door"), "--queue", "work")
    other = stack.vend(agent("other"), "--queue", "work")
    url = mine["mcp_url"]
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": HANDSHAKE, "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}
    accept = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
    with httpx.Client(timeout=10) as http:
        for headers in ({}, {"Authorization": "Bearer sbk_" + "A" * 43}, {"Authorization": "Basic eDp5"},
                        {"Authorization": "Bearer"}):
            for method in ("POST", "GET", "DELETE"):
                response = http.request(method, url, headers={**accept, **headers}, json=init)
                assert response.status_code == 401, (method, headers, response.text)
                assert response.headers["www-authenticate"] == WWW_AUTHENTICATE
                assert response.json() == AUTH_401

        # a valid credential on another endpoint's slug
        response = http.post(other["mcp_url"], headers={**accept, **bearer(mine)}, json=init)
        assert response.status_code == 403, response.text
        assert response.json() == {"error": "this credential does not open this endpoint", "code": "forbidden"}

        # a body over 1 MiB, declared or not
        big = b'{"jsonrpc":"2.0","id":1,"method":"ping","params":{"x":"' + b"x" * (1024 * 1024) + b'"}}'
        response = http.post(url, headers={**accept, **bearer(mine)}, content=big)
        assert response.status_code == 413, response.text
        assert response.json()["code"] == "payload_too_large"

        def chunks():
            for _ in range(17):
                yield b"x" * 65536

        response = http.post(url, headers={**accept, **bearer(mine)}, content=chunks())
        assert response.status_code == 413, response.text
        assert response.json()["code"] == "payload_too_large"

        # a version neither era serves is refused with -32022 naming the versions served
        # (tests/e2e/test_mcp_eras.py has the other era refusals)
        response = http.post(url, headers={**accept, **bearer(mine), "mcp-protocol-version": "2099-01-01"},
                             json={"jsonrpc": "2.0", "id": 9, "method": "server/discover", "params": {}})
        assert response.status_code == 400
        assert response.json()["id"] == 9
        assert response.json()["error"]["code"] == -32022
        assert response.json()["error"]["data"]["supported"] == ["2025-06-18", "2025-11-25", "2026-07-28"]

        # DNS-rebinding protection: only the base URL's host and loopback names
        response = http.post(url, headers={**accept, **bearer(mine), "host": "evil.example"}, json=init)
        assert response.status_code == 421
        response = http.post(url, headers={**accept, **bearer(mine), "host": "localhost"}, json=init)
        assert response.status_code == 200 and response.headers["mcp-session-id"]

        # everything else under /mcp
        assert http.post(f"{stack.base}/mcp/", headers=bearer(mine)).status_code == 404
        assert http.post(f"{stack.base}/mcp/{mine['slug']}/extra", headers=bearer(mine)).status_code == 404
        assert http.put(url, headers=bearer(mine)).status_code == 405


def test_requests_are_answered_with_one_json_body_and_the_get_stream_stays_sse(stack):
    """Each POST is answered with its JSON-RPC response as application/json (no SSE stream per
    POST); the notification stream opened by GET is still text/event-stream (ADR 18)."""
    mine = stack.vend(agent("json"), "--queue", "work")
    url = mine["mcp_url"]
    accept = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
    with httpx.Client(timeout=10) as http:
        init = http.post(url, headers={**accept, **bearer(mine)}, json={
            "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": HANDSHAKE, "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}})
        assert init.status_code == 200 and init.headers["content-type"] == "application/json", init.headers
        assert init.json()["result"]["serverInfo"]["name"] == "switchboard"
        session = {**bearer(mine), "mcp-session-id": init.headers["mcp-session-id"], "mcp-protocol-version": HANDSHAKE}
        assert http.post(url, headers={**accept, **session},
                         json={"jsonrpc": "2.0", "method": "notifications/initialized"}).status_code == 202
        called = http.post(url, headers={**accept, **session}, json={
            "jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "claim_next", "arguments": {}}})
        assert called.status_code == 200 and called.headers["content-type"] == "application/json"
        assert called.json()["id"] == 2
        assert called.json()["result"]["structuredContent"] == {"empty": True}
        with http.stream("GET", url, headers={"accept": "text/event-stream", **session}) as stream:
            assert stream.status_code == 200
            assert stream.headers["content-type"].startswith("text/event-stream")

        # a plain tools/call is answered beside the SDK (ADR 18), one with _meta by the SDK: the same answers
        def tool(request_id: int, name: str, arguments: dict[str, Any], **params: Any) -> dict[str, Any]:
            response = http.post(url, headers={**accept, **session}, json={
                "jsonrpc": "2.0", "id": request_id, "method": "tools/call",
                "params": {"name": name, "arguments": arguments, **params}})
            assert response.status_code == 200 and response.headers["content-type"] == "application/json"
            assert response.headers["mcp-session-id"] == session["mcp-session-id"]
            return response.json()

        pushed = stack.cli.json("todo", "push", mine["slug"], "équipe «json»", "--queue", "work",
                                "--payload", '{"n": 1}')
        todo_id = pushed["id"] if "id" in pushed else pushed["todo"]["id"]
        for name, arguments in (("get_todo", {"id": todo_id}), ("get_todo", {"id": "td_" + "0" * 32}),
                                ("get_todo", {"id": todo_id, "bogus": 1}), ("create_webhook", {}),
                                ("no_such_verb", {}), ("list_todos", {"limit": 5})):
            plain, via_sdk = tool(7, name, arguments), tool(7, name, arguments, _meta={})
            assert plain == via_sdk, (name, plain, via_sdk)
        assert tool(8, "get_todo", {"id": todo_id})["result"]["structuredContent"]["title"] == "équipe «json»"

        # another endpoint naming this session, and the session once deleted: 404, as from the SDK
        stranger = stack.vend(agent("stranger"), "--queue", "work")
        call = {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "list_todos", "arguments": {}}}
        foreign = http.post(stranger["mcp_url"], headers={**accept, **session, **bearer(stranger)}, json=call)
        assert foreign.status_code == 404, foreign.text
        assert http.delete(url, headers=session).status_code == 200
        assert http.post(url, headers={**accept, **session}, json=call).status_code == 404


def test_a_tools_call_on_its_own_session_at_another_endpoints_url_is_refused_and_runs_nothing(stack):
    """The plain tools/call path authenticates and runs the tool in one hop (ADR 18): the tool
    runs only once the credential is known to open this URL's endpoint and own the session."""
    mine = stack.vend(agent("own"), "--queue", "work")
    other = stack.vend(agent("elsewhere"), "--queue", "work")
    accept = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
    with httpx.Client(timeout=10) as http:
        init = http.post(mine["mcp_url"], headers={**accept, **bearer(mine)}, json={
            "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": HANDSHAKE, "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}})
        session = {**bearer(mine), "mcp-session-id": init.headers["mcp-session-id"], "mcp-protocol-version": HANDSHAKE}
        assert http.post(mine["mcp_url"], headers={**accept, **session},
                         json={"jsonrpc": "2.0", "method": "notifications/initialized"}).status_code == 202

        def claim_next(url: str) -> httpx.Response:
            return http.post(url, headers={**accept, **session}, json={
                "jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "claim_next", "arguments": {}}})

        assert claim_next(mine["mcp_url"]).json()["result"]["structuredContent"] == {"empty": True}
        pushed = stack.cli.json("todo", "push", mine["slug"], "stay pending", "--queue", "work")
        todo_id = pushed["id"] if "id" in pushed else pushed["todo"]["id"]
        refused = claim_next(other["mcp_url"])
        assert refused.status_code == 403, refused.text
        assert refused.json() == {"error": "this credential does not open this endpoint", "code": "forbidden"}
        got = http.post(mine["mcp_url"], headers={**accept, **session}, json={
            "jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "get_todo", "arguments": {"id": todo_id}}})
        assert got.json()["result"]["structuredContent"]["state"] == "pending"
        claimed = claim_next(mine["mcp_url"]).json()["result"]["structuredContent"]
        assert claimed["todo"]["id"] == todo_id


def test_round_trip_from_a_signed_delivery_to_a_completed_todo(stack):
    vend = stack.vend(agent("builder"), "--queue", "builds", "--source-types", "github")

    doorbell = ChannelListener()

    async def scenario() -> None:
        async with connect(vend, doorbell, mode="legacy") as client, httpx.AsyncClient(timeout=10) as http:
            hook = await call(client, "create_webhook", source_type="github", target_queue="builds")
            assert hook["source_type"] == "github" and hook["trust_mode"] == "signed"
            assert hook["ingest_url"].startswith(f"{stack.base}/webhooks/w/")
            assert hook["signing_secret"].startswith("whsec_")
            listed = await call(client, "list_webhooks")
            assert [w["webhook_id"] for w in listed["webhooks"]] == [hook["webhook_id"]]
            assert listed["ceiling"] == {"max": 5, "used": 1, "allowed_source_types": ["github"],
                                         "allowed_queues": ["builds"]}
            assert "signing_secret" not in json.dumps(listed)

            body = fixture("github_issues_opened.json")
            headers = {"x-github-event": "issues", "x-github-delivery": str(uuid.uuid4()),
                       **sign("github", hook["signing_secret"], body)}
            accepted = await deliver(http, hook["ingest_url"], body, headers)
            assert accepted["created"] == 1 and accepted["verified"] is True
            with anyio.fail_after(3):  # the doorbell: a hint that work is ready, with the right meta
                while not doorbell.received:
                    await anyio.sleep(0.02)
            [ring] = doorbell.received
            assert ring.meta == {"todo_id": accepted["id"], "queue": "builds", "kind": "issues", "source": "github"}
            assert ring.content.startswith(f'switchboard: todo {accepted["id"]} ready on queue "builds"')

            claimed = await call(client, "claim_next", claimant="e2e", lease_ttl_seconds=120)
            assert claimed["empty"] is False
            todo = claimed["todo"]
            assert todo["id"] == accepted["id"]
            assert todo["queue"] == "builds" and todo["state"] == "claimed" and todo["attempt"] == 1
            assert todo["owner"] == f"endpoint:{vend['slug']}" and todo["claimant"] == "e2e"
            assert todo["source"] == "github" and todo["kind"] == "issues" and todo["trust_mode"] == "signed"
            assert todo["title"].startswith("issues opened: octo-org/octo-repo#12")
            assert todo["payload"]["issue"]["number"] == 12
            assert todo["prior_attempts"] == []

            beat = await call(client, "heartbeat", id=todo["id"], lease_ttl_seconds=600)
            assert beat["state"] == "claimed" and beat["lease_expires_at"] > todo["lease_expires_at"]
            done = await call(client, "complete", id=todo["id"], result={"ok": True}, summary="triaged")
            assert done["state"] == "done" and done["lease_expires_at"] is None
            assert await call(client, "claim_next") == {"empty": True}

            final = await call(client, "get_todo", id=todo["id"])
            assert final["state"] == "done" and final["attempt"] == 1 and final["attempt_seq"] == 1
            assert final["result"] == {"ok": True}
            [attempt] = final["prior_attempts"]
            assert attempt["seq"] == 1 and attempt["outcome"] == "completed"
            assert attempt["claimant"] == "e2e" and attempt["summary"] == "triaged"

            rows = await call(client, "list_todos", state="done")
            assert [r["id"] for r in rows["todos"]] == [todo["id"]]
            assert "payload" not in rows["todos"][0]
            assert "next_cursor" not in rows  # every row is on this page
            events = await call(client, "list_webhook_events", webhook_id=hook["webhook_id"])
            assert [e["id"] for e in events["events"]] == [accepted["event_id"]]
            assert events["events"][0]["delivery_id"] == headers["x-github-delivery"]  # GitHub's own id
            event = await call(client, "get_webhook_event", id=accepted["event_id"])
            assert event["headers"]["x-hub-signature-256"] == "«redacted»"
            assert event["delivery_id"] == headers["x-github-delivery"]

    anyio.run(scenario)


def test_twelve_sessions_claim_twelve_distinct_todos(stack):
    vend = stack.vend(agent("swarm"), "--queue", "work")

    async def scenario() -> None:
        async with connect(vend) as client, httpx.AsyncClient(timeout=10) as http:
            hook = await call(client, "create_webhook", source_type="generic", target_queue="work")
            created = set()
            for n in range(12):
                accepted = await deliver(http, hook["ingest_url"], json.dumps({"n": n}).encode(),
                                         {"x-delivery-id": f"d-{n}"})
                created.add(accepted["id"])
        assert len(created) == 12

        claimed: list[dict[str, Any]] = []
        ready = anyio.Event()
        connected = 0

        async def worker() -> None:
            nonlocal connected
            async with connect(vend) as client:
                connected += 1
                if connected == 12:
                    ready.set()
                await ready.wait()  # every session claims at the same moment
                claimed.append(await call(client, "claim_next", claimant="swarm"))

        async with anyio.create_task_group() as tasks:
            for _ in range(12):
                tasks.start_soon(worker)
        assert all(c["empty"] is False for c in claimed)
        assert {c["todo"]["id"] for c in claimed} == created

    anyio.run(scenario)


def test_scope_limits_verbs_queues_and_leases(stack):
    vend = stack.vend(agent("scoped"), "--queue", "alpha", "--queue", "beta")

    async def scenario() -> None:
        async with connect(vend) as client:
            for verb in ("list_todos", "claim_next"):
                text = await refused(client, verb, queue="gamma")
                assert text == "forbidden: queue gamma is not in this endpoint's scope", text
            assert await call(client, "list_todos", queue="beta") == {"todos": []}
            assert await call(client, "claim_next", queue="alpha") == {"empty": True}
            assert await refused(client, "list_todos", limit=0) == "invalid_argument: limit must be within 1..200"
            assert await refused(client, "list_todos", limit=201) == "invalid_argument: limit must be within 1..200"
            assert (await refused(client, "list_todos", limit="5")).startswith("invalid_argument: Expected `int")
            assert await refused(client, "list_todos", colour="red") == (
                "invalid_argument: Object contains unknown field `colour`")
            assert await refused(client, "get_todo") == "invalid_argument: Object missing required field `id`"
            assert await refused(client, "create_webhook", source_type="github") == (
                "invalid_argument: Object missing required field `target_queue`")
            assert (await refused(client, "create_webhook", source_type="github", target_queue="gamma")
                    ).startswith("forbidden: ")

            lease = {"default_lease_ttl_seconds": None, "effective_lease_ttl_seconds": 300}
            assert await call(client, "get_default_lease") == lease
            assert await call(client, "set_default_lease", default_lease_ttl_seconds=120) == {
                "default_lease_ttl_seconds": 120, "effective_lease_ttl_seconds": 120}
            assert await call(client, "get_default_lease") == {
                "default_lease_ttl_seconds": 120, "effective_lease_ttl_seconds": 120}
            for bad in (59, 86401):
                text = await refused(client, "set_default_lease", default_lease_ttl_seconds=bad)
                assert text == "invalid_argument: default lease must be within 60..86400 seconds", text
            assert await call(client, "set_default_lease", default_lease_ttl_seconds=None) == lease

    anyio.run(scenario)


def test_another_endpoints_todo_answers_like_a_random_id(stack):
    owner = stack.vend(agent("owner"), "--queue", "work")
    stranger = stack.vend(agent("stranger"), "--queue", "work")

    async def scenario() -> None:
        async with connect(owner) as a, httpx.AsyncClient(timeout=10) as http:
            hook = await call(a, "create_webhook", source_type="generic", target_queue="work")
            theirs = (await deliver(http, hook["ingest_url"], b'{"secret": 1}', {"x-delivery-id": "iso"}))["id"]
            event_id = (await call(a, "list_webhook_events"))["events"][0]["id"]
        random_id = "td_" + secrets.token_hex(16)
        random_event = "ev_" + secrets.token_hex(16)
        random_hook = "wh_" + secrets.token_hex(16)

        async with connect(stranger) as b:
            for verb, extra in (("get_todo", {}), ("claim", {}), ("heartbeat", {}), ("complete", {}),
                                ("fail", {}), ("release", {})):
                texts = [await refused(b, verb, id=todo_id, **extra) for todo_id in (theirs, random_id)]
                assert texts == [f"not_found: todo {theirs} not found", f"not_found: todo {random_id} not found"]
                # byte-identical once the caller's own id is taken out
                assert texts[0].replace(theirs, "ID").encode() == texts[1].replace(random_id, "ID").encode()
            for verb in ("rotate_webhook", "delete_webhook", "list_webhook_rules", "list_webhook_routes"):
                texts = [await refused(b, verb, webhook_id=w) for w in (hook["webhook_id"], random_hook)]
                assert texts == [f"not_found: webhook {hook['webhook_id']} not found",
                                 f"not_found: webhook {random_hook} not found"]
            texts = [await refused(b, "get_webhook_event", id=e) for e in (event_id, random_event)]
            assert texts == [f"not_found: event {event_id} not found", f"not_found: event {random_event} not found"]
            assert await call(b, "claim_next") == {"empty": True}
            assert await call(b, "list_todos") == {"todos": []}
            assert await call(b, "list_webhook_events") == {"events": []}

        async with connect(owner) as a:  # untouched by the stranger
            assert (await call(a, "get_todo", id=theirs))["state"] == "pending"

    anyio.run(scenario)


def test_revoke_mid_session(stack):
    doomed = stack.vend(agent("doomed"), "--queue", "work")
    bystander = stack.vend(agent("bystander"), "--queue", "work")
    url = doomed["mcp_url"]
    accept = {"accept": "application/json, text/event-stream", "content-type": "application/json"}

    async def open_stream(http: httpx.AsyncClient) -> str:
        """A raw handshake-era session of the doomed endpoint; returns its id."""
        init = await http.post(url, headers={**accept, **bearer(doomed)}, json={
            "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": HANDSHAKE, "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}})
        assert init.status_code == 200, init.text
        session = init.headers["mcp-session-id"]
        notified = await http.post(url, headers={**accept, **bearer(doomed), "mcp-session-id": session,
                                                 "mcp-protocol-version": HANDSHAKE},
                                   json={"jsonrpc": "2.0", "method": "notifications/initialized"})
        assert notified.status_code == 202, notified.text
        return session

    async def scenario() -> None:
        async with connect(doomed) as client, connect(bystander) as other, httpx.AsyncClient(timeout=10) as http:
            assert await call(client, "claim_next") == {"empty": True}
            session = await open_stream(http)
            get = {"accept": "text/event-stream", "mcp-session-id": session, "mcp-protocol-version": HANDSHAKE}
            async with http.stream("GET", url, headers={**get, **bearer(doomed)}) as stream:
                assert stream.status_code == 200

                await anyio.to_thread.run_sync(stack.revoke, doomed["slug"])

                # the very next call is refused at the HTTP level (401), which the client raises as MCPError
                with pytest.raises(MCPError):
                    await client.call_tool("claim_next", {})
                response = await http.post(url, headers={**accept, **bearer(doomed), "mcp-session-id": session,
                                                         "mcp-protocol-version": HANDSHAKE},
                                           json={"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
                assert response.status_code == 401
                assert response.headers["www-authenticate"] == WWW_AUTHENTICATE
                assert response.json() == AUTH_401

                # and the live session ends: its open GET stream is closed by the server
                with anyio.fail_after(8):
                    async for _ in stream.aiter_bytes():
                        pass

            # other endpoints are unaffected
            assert await call(other, "claim_next") == {"empty": True}
            assert [t.name for t in (await other.list_tools()).tools] == list(ALL_VERBS)

    anyio.run(scenario)


def test_an_agent_creates_webhooks_for_the_new_senders(stack):
    owner = stack.vend(agent("senders"), "--queue", "work", "--source-types", "standard,stripe,slack")

    async def scenario() -> None:
        async with connect(owner) as client, httpx.AsyncClient(timeout=10) as http:
            made = {s: await call(client, "create_webhook", source_type=s, target_queue="work")
                    for s in ("standard", "stripe", "slack")}
            assert {h["trust_mode"] for h in made.values()} == {"signed"}
            assert all(h["signing_secret"].startswith("whsec_") for h in made.values())
            body = b'{"type":"build.finished","data":{"name":"nightly"}}'
            delivered = await http.post(made["standard"]["ingest_url"], content=body, headers={
                "content-type": "application/json", **sign("standard", made["standard"]["signing_secret"], body)})
            assert delivered.status_code == 202, delivered.text
            claimed = await call(client, "claim_next", queue="work")
            assert (claimed["todo"]["kind"], claimed["todo"]["title"]) == ("build.finished", "build.finished: nightly")
            assert (await refused(client, "create_webhook", source_type="github", target_queue="work")
                    ).startswith("forbidden_source_type")

    anyio.run(scenario)


def test_webhook_verbs(stack):
    owner = stack.vend(agent("hooks"), "--queue", "work", "--queue", "triage")
    peer = stack.vend(agent("peer"), "--queue", "work")

    async def scenario() -> None:
        async with connect(owner) as client, httpx.AsyncClient(timeout=10) as http:
            hook = await call(client, "create_webhook", source_type="gitea", target_queue="work")
            wid = hook["webhook_id"]

            rules = [{"id": "labelled", "expr": '.payload.action == "opened"', "action": {"queue": "triage"}}]
            saved = await call(client, "set_webhook_rules", webhook_id=wid, rules=rules)
            assert saved["webhook_id"] == wid and saved["default_action"] is None and saved["params"] == {}
            assert [(r["id"], r["action"]) for r in saved["rules"]] == [("labelled", {"queue": "triage"})]
            assert await call(client, "list_webhook_rules", webhook_id=wid) == saved
            dry = await call(client, "test_webhook_rules", webhook_id=wid, payload={"action": "opened"})
            assert dry["decision"]["queue"] == "triage" and dry["trace"]["rule_id"] == "labelled"
            dry = await call(client, "test_webhook_rules", webhook_id=wid, payload={"action": "closed"},
                             rules=[{"id": "x", "expr": "true", "action": {"drop": True}}])
            assert dry["decision"]["drop"] is True
            text = await refused(client, "test_webhook_rules", webhook_id=wid)
            assert text == "invalid_argument: give exactly one of payload or event_id"
            # $params that is not a JSON object, or over 16 KiB, is invalid_params (as on the CLI and API)
            for params in ("nope", [1, 2], 3, {"blob": "x" * (16 * 1024)}):
                text = await refused(client, "set_webhook_rules", webhook_id=wid, rules=[], params=params)
                assert text.startswith("invalid_params: params "), (params, text)
                text = await refused(client, "test_webhook_rules", webhook_id=wid, payload={}, rules=[],
                                     params=params)
                assert text.startswith("invalid_params: params "), (params, text)
            assert (await call(client, "list_webhook_rules", webhook_id=wid)) == saved
            text = await refused(client, "set_webhook_rules", webhook_id=wid,
                                 rules=[{"expr": "$ENV", "action": {"queue": "work"}}])
            assert text.startswith("forbidden_function: "), text
            text = await refused(client, "set_webhook_rules", webhook_id=wid,
                                 rules=[{"expr": "true", "action": {"queue": "elsewhere"}}])
            assert text.startswith("forbidden: "), text

            routed = await call(client, "add_webhook_route", webhook_id=wid, target_endpoint_id=peer["endpoint_id"])
            assert routed == {"webhook_id": wid, "target_endpoint_id": peer["endpoint_id"], "routed": True}
            routes = await call(client, "list_webhook_routes", webhook_id=wid)
            assert [r["target_endpoint_id"] for r in routes["routes"]] == [peer["endpoint_id"]]
            assert (await refused(client, "add_webhook_route", webhook_id=wid,
                                  target_endpoint_id="ep_" + "0" * 32)).startswith("forbidden: ")
            removed = await call(client, "remove_webhook_route", webhook_id=wid, target_endpoint_id=peer["endpoint_id"])
            assert removed["removed"] is True

            rotated = await call(client, "rotate_webhook", webhook_id=wid)
            assert rotated["ingest_url"] != hook["ingest_url"] and rotated["signing_secret"] != hook["signing_secret"]
            assert (await http.post(hook["ingest_url"], content=b"{}")).status_code == 404
            assert await call(client, "delete_webhook", webhook_id=wid) == {"webhook_id": wid, "deleted": True}
            assert (await http.post(rotated["ingest_url"], content=b"{}")).status_code == 404
            assert (await call(client, "list_webhooks"))["webhooks"] == []

    anyio.run(scenario)


def test_claim_next_with_max_claims_a_batch_over_mcp(stack):
    mine = stack.vend(agent("batch"), "--queue", "work")
    pushed = [stack.cli.json("todo", "push", mine["slug"], f"todo {n}", "--queue", "work") for n in range(3)]
    ids = [p["id"] if "id" in p else p["todo"]["id"] for p in pushed]

    async def scenario() -> None:
        async with connect(mine) as client:
            schema = next(t for t in (await client.list_tools()).tools if t.name == "claim_next").input_schema
            assert schema["properties"]["max"]["maximum"] == 100
            batch = await call(client, "claim_next", max=2, require_fence=True)
            assert batch["empty"] is False and [t["id"] for t in batch["todos"]] == ids[:2]
            assert all(t["state"] == "claimed" and t["lease_token"] for t in batch["todos"])
            for todo in batch["todos"]:
                done = await call(client, "complete", id=todo["id"], lease_token=todo["lease_token"])
                assert done["state"] == "done"
            assert (await call(client, "claim_next"))["todo"]["id"] == ids[2]  # without max: as before
            assert await call(client, "claim_next", max=5) == {"empty": True, "todos": []}
            assert (await refused(client, "claim_next", max=0)).startswith("invalid_argument: ")
            assert (await refused(client, "claim_next", max=101)).startswith("invalid_argument: ")

    anyio.run(scenario)
