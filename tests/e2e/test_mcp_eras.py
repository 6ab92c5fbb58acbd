"""End to end: both MCP eras on one URL (CONTRACT §16, docs/adr/0038-both-mcp-eras-on-one-url.md).

The official `mcp` client in its default mode (it probes `server/discover` and lands in the
stateless era), forced into the handshake era (`mode="legacy"`) and forced into the stateless era
(`mode="2026-07-28"`) lists the full tool set of a full-scope endpoint and calls every verb: the
transcripts (results with their varying ids and times replaced, error texts) are identical. Then
the refusals each era shares, and a stateless client whose calls alternate between two `serve`
processes on one SQLite store.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.to_thread
import httpx
import httpx2
import pytest
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from domain.endpoint import ALL_VERBS
from interfaces.version import VERSION
from tests.e2e._support import Server
from tests.e2e.test_mcp import AUTH_401, WWW_AUTHENTICATE, McpStack, agent, bearer, serving
from tests.fixtures import sign

MODERN = "2026-07-28"
HANDSHAKE = "2025-11-25"
SUPPORTED = ["2025-06-18", "2025-11-25", "2026-07-28"]
MODES = ("auto", "legacy", MODERN)
ACCEPT = {"accept": "application/json, text/event-stream", "content-type": "application/json"}


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[McpStack]:
    root = tmp_path_factory.mktemp("eras")
    with serving(McpStack(root / "var", root)) as stack:
        yield stack


class Recorded:
    """Every HTTP response header set the client saw."""

    def __init__(self) -> None:
        self.headers: list[dict[str, str]] = []

    async def __call__(self, response: httpx2.Response) -> None:
        self.headers.append({k.lower(): v for k, v in response.headers.items()})


@asynccontextmanager
async def connect(vend: dict[str, Any], mode: str, url: str | None = None,
                  recorded: Recorded | None = None) -> AsyncIterator[Client]:
    server = vend["mcp_json"]["mcpServers"]["switchboard"]
    hooks = {"response": [recorded]} if recorded is not None else {}
    async with httpx2.AsyncClient(headers=server["headers"], timeout=httpx2.Timeout(30, read=300),
                                  event_hooks=hooks) as http:
        async with Client(streamable_http_client(url or server["url"], http_client=http), mode=mode) as client:
            yield client


_VARYING = re.compile(
    r"\b00-[0-9a-f]{32}-[0-9a-f]{16}-0[01]\b"  # W3C traceparents (a new span per attempt)
    r"|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:\d\d)?"  # times
    r"|[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"  # uuids
    r"|\b[a-z]{2,6}_[A-Za-z0-9_-]{12,}"  # prefixed ids, tokens and secrets
    r"|/webhooks/w/[A-Za-z0-9_-]+"  # ingest URLs
)

_TOKENS = frozenset({"lease_token", "signing_secret"})


class Transcript:
    """What one era answered, verb by verb, with what varies between two runs replaced by names
    given in order of first appearance (so equal structure gives equal names)."""

    def __init__(self, client: Client, known: dict[str, str]) -> None:
        self.client = client
        self.known = known
        self.names: dict[str, str] = {}
        self.lines: list[tuple[str, Any]] = []
        self.verbs: set[str] = set()

    def _name(self, match: re.Match[str]) -> str:
        text = match.group(0)
        if text[0].isdigit() and "T" in text and ":" in text:
            return "<time>"
        return self.names.setdefault(text, f"<v{len(self.names)}>")

    def _plain(self, value: Any) -> Any:
        if isinstance(value, dict):
            return {k: self.names.setdefault(v, f"<v{len(self.names)}>") if k in _TOKENS and isinstance(v, str)
                    else self._plain(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self._plain(v) for v in value]
        if isinstance(value, str):
            for raw, name in self.known.items():
                value = value.replace(raw, name)
            return _VARYING.sub(self._name, value)
        return value

    async def __call__(self, verb: str, **arguments: Any) -> dict[str, Any] | None:
        result = await self.client.call_tool(verb, arguments)
        text = result.content[0].text
        self.verbs.add(verb)
        if result.is_error:
            assert result.structured_content is None
            self.lines.append((verb, ("error", self._plain(text))))
            return None
        assert json.loads(text) == result.structured_content
        self.lines.append((verb, ("ok", self._plain(result.structured_content))))
        return result.structured_content


async def deliver(http: httpx.AsyncClient, hook: dict[str, Any], number: int) -> dict[str, Any]:
    body = json.dumps({"action": "opened", "issue": {"number": number, "title": f"issue {number}"},
                       "repository": {"full_name": "octo-org/octo-repo"}}).encode()
    headers = {"content-type": "application/json", "x-github-event": "issues", "x-github-delivery": str(uuid.uuid4()),
               **sign("github", hook["signing_secret"], body)}
    response = await http.post(hook["ingest_url"], content=body, headers=headers)
    assert response.status_code == 202, response.text
    return response.json()


async def every_verb(call: Transcript, peer: dict[str, Any]) -> None:
    """Every verb once or more, with its successes and its error codes."""
    await call("get_default_lease")
    await call("set_default_lease", default_lease_ttl_seconds=600)
    await call("set_default_lease", default_lease_ttl_seconds=5)
    await call("create_webhook", source_type="github")
    await call("create_webhook", source_type="github", target_queue="elsewhere")
    await call("create_webhook", source_type="gitea", target_queue="work")
    hook = await call("create_webhook", source_type="github", target_queue="work")
    assert hook is not None
    await call("create_webhook", source_type="github", target_queue="work")
    await call("list_webhooks")
    async with httpx.AsyncClient(timeout=10) as http:
        first, second = await deliver(http, hook, 1), await deliver(http, hook, 2)
    await call("list_webhook_events", webhook_id=hook["webhook_id"])
    await call("get_webhook_event", id=first["event_id"])
    await call("list_todos")
    await call("list_todos", queue="nope")
    await call("get_todo", id=first["id"])
    await call("get_todo", id=str(uuid.uuid4()))
    claimed = await call("claim", id=first["id"], lease_ttl_seconds=120, claimant="eras", require_fence=True)
    assert claimed is not None
    await call("claim", id=first["id"])
    await call("heartbeat", id=first["id"], lease_ttl_seconds=300, lease_token=claimed["lease_token"])
    await call("complete", id=first["id"], result={"ok": True}, summary="done", lease_token=claimed["lease_token"])
    await call("complete", id=first["id"])
    await call("claim_next", queue="work")
    await call("release", id=second["id"], summary="not now")
    await call("claim_next")
    await call("fail", id=second["id"], summary="broken")
    await call("claim_next", max=0)
    await call("set_webhook_rules", webhook_id=hook["webhook_id"],
               rules=[{"id": "opened", "expr": '.payload.action == "opened"', "action": {"queue": "work"}}])
    await call("set_webhook_rules", webhook_id=hook["webhook_id"], rules=[{"expr": "$ENV", "action": {"queue": "work"}}])
    await call("set_webhook_rules", webhook_id=hook["webhook_id"], rules=[], params="nope")
    await call("list_webhook_rules", webhook_id=hook["webhook_id"])
    await call("test_webhook_rules", webhook_id=hook["webhook_id"], payload={"action": "opened"})
    await call("test_webhook_rules", webhook_id=hook["webhook_id"])
    await call("add_webhook_route", webhook_id=hook["webhook_id"], target_endpoint_id=peer["endpoint_id"])
    await call("list_webhook_routes", webhook_id=hook["webhook_id"])
    await call("remove_webhook_route", webhook_id=hook["webhook_id"], target_endpoint_id=peer["endpoint_id"])
    await call("rotate_webhook", webhook_id=hook["webhook_id"])
    await call("delete_webhook", webhook_id=hook["webhook_id"])
    await call("delete_webhook", webhook_id=hook["webhook_id"])
    await call("list_todos", state="done")
    await call("drop_tables")


def test_every_verb_answers_alike_in_the_default_mode_and_both_forced_eras(stack):
    transcripts, tool_lists, versions = {}, {}, {}

    async def run(mode: str) -> None:
        mine = stack.vend(agent("eras"), "--queue", "work", "--source-types", "github", "--webhook-max", "1")
        peer = stack.vend(agent("peer"), "--queue", "work")
        recorded = Recorded()
        known = {mine["slug"]: "<slug>", mine["endpoint_id"]: "<endpoint>", peer["endpoint_id"]: "<peer>"}
        async with connect(mine, mode, recorded=recorded) as client:
            versions[mode] = client.protocol_version
            tool_lists[mode] = [t.model_dump(mode="json") for t in (await client.list_tools()).tools]
            call = Transcript(client, known)
            await every_verb(call, peer)
            assert call.verbs >= set(ALL_VERBS), set(ALL_VERBS) - call.verbs
            transcripts[mode] = call.lines
        sessions = [h.get("mcp-session-id") for h in recorded.headers]
        if mode == "legacy":
            assert all(sessions), "every handshake-era answer names its session"
        else:
            assert sessions and not any(sessions), "the stateless era has no session"

    for mode in MODES:
        anyio.run(run, mode)
    assert versions == {"auto": MODERN, "legacy": HANDSHAKE, MODERN: MODERN}
    assert [t["name"] for t in tool_lists["legacy"]] == list(ALL_VERBS)
    assert tool_lists["auto"] == tool_lists["legacy"] == tool_lists[MODERN]
    for mode in ("auto", MODERN):
        assert len(transcripts[mode]) == len(transcripts["legacy"])
        for line, expected in zip(transcripts[mode], transcripts["legacy"], strict=True):
            assert line == expected, f"{mode}: {line}\nlegacy: {expected}"
    outcomes = dict(transcripts["legacy"])  # spot checks that the transcript says something
    assert outcomes["drop_tables"][0] == "error" and outcomes["drop_tables"][1].startswith("forbidden: ")
    codes = {text.split(":")[0] for verb, (kind, text) in transcripts["legacy"] if kind == "error"}
    assert codes == {"invalid_argument", "forbidden", "not_found", "conflict", "forbidden_source_type",
                     "ceiling_exceeded", "forbidden_function", "invalid_params"}, codes


def test_the_stateless_era_names_its_server_and_keeps_the_scope(stack):
    narrow = stack.vend(agent("narrow"), "--queue", "work", "--verbs", "claim_next,complete")

    async def scenario() -> None:
        async with connect(narrow, "auto") as client:
            assert client.protocol_version == MODERN
            assert client.server_info.name == "switchboard" and client.server_info.version == VERSION
            assert client.server_capabilities.tools is not None
            # no channel capability: nothing would be delivered in this era (yet)
            assert "claude/channel" not in (client.server_capabilities.experimental or {})
            assert "claim_next" in (client.instructions or "")
            assert [t.name for t in (await client.list_tools()).tools] == ["claim_next", "complete"]
            result = await client.call_tool("list_todos", {})
            assert result.is_error
            assert result.content[0].text == f"forbidden: tool list_todos is not granted to endpoint {narrow['slug']}"

    anyio.run(scenario)


def modern_request(method: str, params: dict[str, Any] | None = None, *, version: str = MODERN,
                   request_id: int = 7) -> tuple[dict[str, str], dict[str, Any]]:
    """A hand-made 2026-07-28 request (headers, body) as the SDK client sends it."""
    meta = {"io.modelcontextprotocol/protocolVersion": version, "io.modelcontextprotocol/clientCapabilities": {},
            "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "0"}}
    headers = {**ACCEPT, "mcp-protocol-version": version, "mcp-method": method}
    if method == "tools/call" and params:
        headers["mcp-name"] = params["name"]
    return headers, {"jsonrpc": "2.0", "id": request_id, "method": method, "params": {**(params or {}), "_meta": meta}}


def handshake_session(http: httpx.Client, url: str, vend: dict[str, Any]) -> dict[str, str]:
    init = http.post(url, headers={**ACCEPT, **bearer(vend)}, json={
        "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": HANDSHAKE, "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}})
    assert init.status_code == 200, init.text
    headers = {**ACCEPT, **bearer(vend), "mcp-session-id": init.headers["mcp-session-id"],
               "mcp-protocol-version": HANDSHAKE}
    assert http.post(url, headers=headers, json={"jsonrpc": "2.0", "method": "notifications/initialized"}).status_code == 202
    return headers


def test_the_refusals_are_the_same_in_both_eras(stack):
    mine = stack.vend(agent("door"), "--queue", "work")
    other = stack.vend(agent("other"), "--queue", "work")
    url = mine["mcp_url"]
    with httpx.Client(timeout=10) as http:
        headers, body = modern_request("tools/call", {"name": "claim_next", "arguments": {}})
        for auth in ({}, {"Authorization": "Bearer sbk_" + "A" * 43}, {"Authorization": "Basic eDp5"}):
            response = http.post(url, headers={**headers, **auth}, json=body)
            assert response.status_code == 401, response.text
            assert response.headers["www-authenticate"] == WWW_AUTHENTICATE and response.json() == AUTH_401
        response = http.post(other["mcp_url"], headers={**headers, **bearer(mine)}, json=body)
        assert response.status_code == 403, response.text
        assert response.json() == {"error": "this credential does not open this endpoint", "code": "forbidden"}
        big = json.dumps({**body, "params": {**body["params"], "arguments": {"x": "x" * (1024 * 1024)}}})
        response = http.post(url, headers={**headers, **bearer(mine)}, content=big)
        assert response.status_code == 413 and response.json()["code"] == "payload_too_large"

        # an unknown method: -32601 in both eras
        headers, body = modern_request("tools/drop")
        modern = http.post(url, headers={**headers, **bearer(mine)}, json=body)
        assert modern.json()["error"]["code"] == -32601, modern.text
        assert "mcp-session-id" not in modern.headers
        legacy = http.post(url, headers=handshake_session(http, url, mine),
                           json={"jsonrpc": "2.0", "id": 7, "method": "tools/drop"})
        assert legacy.json()["error"]["code"] == -32601, legacy.text

        # DNS-rebinding protection, as in the handshake era
        headers, body = modern_request("tools/list")
        assert http.post(url, headers={**headers, **bearer(mine), "host": "evil.example"}, json=body).status_code == 421

        # the stateless era has no GET stream and no session to end
        for method in ("GET", "DELETE"):
            response = http.request(method, url, headers={**ACCEPT, **bearer(mine), "mcp-protocol-version": MODERN})
            assert response.status_code == 405 and "mcp-session-id" not in response.headers


def test_a_request_in_neither_era_or_at_a_version_not_served_changes_nothing(stack):
    mine = stack.vend(agent("wrong"), "--queue", "work")
    url = mine["mcp_url"]
    pushed = stack.cli.json("todo", "push", mine["slug"], "still here")
    call = {"name": "claim_next", "arguments": {}}
    with httpx.Client(timeout=10) as http:
        refused = []
        # a _meta naming a version not served (with a header that agrees, or none)
        headers, body = modern_request("tools/call", call, version="2099-01-01", request_id=11)
        refused.append((11, "2099-01-01", http.post(url, headers={**headers, **bearer(mine)}, json=body)))
        del headers["mcp-protocol-version"]
        refused.append((11, "2099-01-01", http.post(url, headers={**headers, **bearer(mine)}, json=body)))
        # a version header not served, without a _meta
        refused.append((12, "2024-01-01", http.post(url, headers={**ACCEPT, **bearer(mine), "mcp-protocol-version": "2024-01-01"},
                                                     json={"jsonrpc": "2.0", "id": 12, "method": "tools/call", "params": call})))
        # neither era: no version anywhere, no session, not an initialize
        refused.append((13, None, http.post(url, headers={**ACCEPT, **bearer(mine)},
                                             json={"jsonrpc": "2.0", "id": 13, "method": "tools/call", "params": call})))
        for request_id, requested, response in refused:
            assert response.status_code == 400, response.text
            answer = response.json()
            assert answer["id"] == request_id and answer["error"]["code"] == -32022, answer
            assert answer["error"]["data"]["supported"] == SUPPORTED
            assert answer["error"]["data"].get("requested") == requested
            assert "Traceback" not in response.text and "mcp-session-id" not in response.headers
        # a header that disagrees with the _meta is the SDK's header mismatch (-32020)
        headers, body = modern_request("tools/call", call)
        response = http.post(url, headers={**headers, **bearer(mine), "mcp-protocol-version": HANDSHAKE}, json=body)
        assert response.status_code == 400 and response.json()["error"]["code"] == -32020, response.text
    todo = stack.cli.json("todo", "show", pushed["todo"]["id"])
    assert todo["state"] == "pending", todo  # nothing was claimed


def test_a_revoked_credential_is_refused_in_the_stateless_era(stack):
    doomed = stack.vend(agent("doomed"), "--queue", "work")

    async def scenario() -> None:
        async with connect(doomed, MODERN) as client:
            assert (await client.call_tool("claim_next", {})).structured_content == {"empty": True}
            await anyio.to_thread.run_sync(stack.revoke, doomed["slug"])
            with pytest.raises(MCPError):
                await client.call_tool("claim_next", {})

    anyio.run(scenario)


def test_a_stateless_client_alternates_between_two_serves_on_one_store(stack, tmp_path):
    second = Server(stack.server.data_dir, tmp_path, name="second")
    second.env["SWITCHBOARD_BASE_URL"] = stack.base
    second.start()
    try:
        second.wait_healthy()
        mine = stack.vend(agent("two"), "--queue", "work")
        pushed = [stack.cli.json("todo", "push", mine["slug"], f"todo {n}")["todo"]["id"] for n in range(3)]
        urls = [mine["mcp_url"], f"{second.base}/mcp/{mine['slug']}"]

        async def scenario() -> None:
            async with connect(mine, MODERN, url=urls[0]) as one, connect(mine, MODERN, url=urls[1]) as two:
                for n, todo_id in enumerate(pushed):
                    claimer, completer = (one, two) if n % 2 == 0 else (two, one)
                    claimed = (await claimer.call_tool("claim_next", {"require_fence": True})).structured_content
                    assert claimed["todo"]["id"] == todo_id
                    done = await completer.call_tool("complete", {"id": todo_id,
                                                                  "lease_token": claimed["todo"]["lease_token"]})
                    assert done.structured_content["state"] == "done", done.content[0].text
                assert (await two.call_tool("claim_next", {})).structured_content == {"empty": True}
                assert (await one.call_tool("claim_next", {})).structured_content == {"empty": True}

        anyio.run(scenario)
    finally:
        code = second.stop()
    assert code == 0, second.output()
    assert "Traceback" not in second.stderr(), second.output()
