"""The doorbell for stateless clients (CONTRACT §16, docs/adr/0041-the-doorbell-over-listen.md):
queues as resources, and `subscriptions/listen` streams rung with `notifications/resources/updated`
under the §7 rules, by the one doorbell that rings handshake sessions.

One real `switchboard serve` (SQLite) for the module, driven by the official `mcp` client in its
default mode (which lands in the 2026-07-28 era, ADR 38), forced into 2026-07-28, and forced into
the handshake era (`mode="legacy"`) beside a listener; the re-ring schedule runs in-process under
a ManualClock, as in tests/e2e/test_doorbell.py.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from datetime import datetime, timezone
from typing import Any

import anyio
import anyio.to_thread
import httpx
import httpx2
import pytest
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from application.service import Caller
from tests.doubles import ManualClock
from tests.e2e._ingest import Stack
from tests.e2e.test_doorbell import streaming
from tests.e2e.test_mcp import McpStack, agent, call, connect, serving
from tests.e2e.test_mcp_sessions import ChannelListener, InProcess
from tests.e2e.test_mcp_sessions import connect as connect_inproc

MODERN = "2026-07-28"
INVALID_PARAMS = -32602
RING_WAIT = 3.0
QUIET = 0.7
"""How long a test waits to see that no further ring comes (the doorbell scans every 0.5 s at most)."""


def uri(queue: str) -> str:
    return f"switchboard://queues/{queue}"


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[McpStack]:
    root = tmp_path_factory.mktemp("listen")
    with serving(McpStack(root / "var", root)) as stack:
        yield stack


@asynccontextmanager
async def connect_url(vend: dict[str, Any], url: str) -> AsyncIterator[Client]:
    """The default-mode client on another server's URL of the same endpoint."""
    headers = {"Authorization": f"Bearer {vend['credential']}"}
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=300)) as http:
        async with Client(streamable_http_client(url, http_client=http)) as client:
            yield client


@asynccontextmanager
async def listening(client: Client, *queues: str) -> AsyncIterator[list[str]]:
    """A listen stream for these queues' resources: the URIs of the rings it receives, in order."""
    received: list[str] = []
    async with client.listen(resource_subscriptions=[uri(q) for q in queues]) as subscription:
        assert subscription.honored.resource_subscriptions == [uri(q) for q in queues]
        assert not subscription.honored.tools_list_changed and not subscription.honored.resources_list_changed

        async def drain() -> None:
            async for event in subscription:
                received.append(event.uri)

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(drain)
            yield received
            tasks.cancel_scope.cancel()


async def rings(*lists: list, total: int, timeout: float = RING_WAIT) -> None:
    with anyio.fail_after(timeout):
        while sum(len(r) for r in lists) < total:
            await anyio.sleep(0.02)


async def read(client: Client, queue: str) -> dict[str, Any]:
    result = await client.read_resource(uri(queue))
    assert len(result.contents) == 1 and result.contents[0].mime_type == "application/json"
    assert result.contents[0].uri == uri(queue)
    return json.loads(result.contents[0].text)


def push(stack: McpStack, vend: dict[str, Any], title: str, queue: str = "work") -> str:
    return stack.cli.json("todo", "push", vend["slug"], title, "--queue", queue)["todo"]["id"]


@pytest.mark.parametrize("mode", ["auto", MODERN])
def test_a_webhook_delivery_rings_a_listener_and_the_queue_reads_it(stack, mode):
    vend = stack.vend(agent("listen"), "--queue", "work", "--queue", "other")
    hook = stack.cli.json("webhook", "create", "--endpoint", vend["slug"], "--source", "generic", "--queue", "work",
                          env={"SWITCHBOARD_BASE_URL": stack.base})

    async def scenario() -> None:
        async with connect(vend, mode=mode) as client:
            assert client.protocol_version == MODERN
            resources = sorted((r.uri, r.name, r.mime_type) for r in (await client.list_resources()).resources)
            assert resources == [(uri("other"), "other", "application/json"), (uri("work"), "work", "application/json")]
            assert await read(client, "work") == {"queue": "work", "pending": 0, "oldest": []}
            async with listening(client, "work") as received:
                async with httpx.AsyncClient(timeout=30) as http:
                    answer = await http.post(hook["ingest_url"], json={"kind": "build", "title": "red"})
                assert answer.status_code == 202, answer.text
                todo_id = answer.json()["id"]
                await rings(received, total=1)
                assert received == [uri("work")]
                waiting = await read(client, "work")
                assert waiting["pending"] == 1 and [t["id"] for t in waiting["oldest"]] == [todo_id]
                assert set(waiting["oldest"][0]) == {"id", "title", "created_at"}
                taken = await call(client, "claim_next", queue="work")
                assert taken["todo"]["id"] == todo_id
                await anyio.to_thread.run_sync(lambda: push(stack, vend, "elsewhere", queue="other"))
                await anyio.sleep(QUIET)
                assert received == [uri("work")]  # a queue it does not listen for never rings it
            assert await read(client, "work") == {"queue": "work", "pending": 0, "oldest": []}

    anyio.run(scenario)


def test_the_queue_resource_counts_what_is_claimable_and_shows_the_oldest_ten(stack):
    vend = stack.vend(agent("read"), "--queue", "work")
    todos = [push(stack, vend, f"todo {n}") for n in range(12)]

    async def scenario() -> None:
        async with connect(vend, mode="legacy") as legacy, connect(vend) as modern:
            for client in (legacy, modern):  # resources in both eras
                assert [r.uri for r in (await client.list_resources()).resources] == [uri("work")]
            waiting = await read(modern, "work")
            assert waiting["queue"] == "work" and waiting["pending"] == 12
            assert [t["id"] for t in waiting["oldest"]] == todos[:10]
            assert [t["title"] for t in waiting["oldest"]] == [f"todo {n}" for n in range(10)]
            assert all(t["created_at"].endswith("Z") for t in waiting["oldest"])
            await call(modern, "claim", id=todos[0])
            after = await read(legacy, "work")
            assert after["pending"] == 11 and [t["id"] for t in after["oldest"]] == todos[1:11]

    anyio.run(scenario)


def test_bad_uris_and_another_endpoints_queue_are_refused_with_invalid_params(stack):
    mine = stack.vend(agent("mine"), "--queue", "work")
    theirs = stack.vend(agent("theirs"), "--queue", "private")
    waiting = push(stack, theirs, "not yours", queue="private")

    async def refused(attempt: Any) -> MCPError:
        with pytest.raises(MCPError) as caught:
            await attempt
        assert caught.value.error.code == INVALID_PARAMS, caught.value.error
        return caught.value

    async def scenario() -> None:
        async with connect(mine) as client, connect(mine, mode="legacy") as legacy:
            for reader in (client, legacy):
                error = await refused(reader.read_resource(uri("private")))
                assert error.error.message == "Unknown resource" and error.error.data == {"uri": uri("private")}
                assert (await refused(reader.read_resource(uri("nowhere")))).error.message == "Unknown resource"
                assert (await refused(reader.read_resource(uri("quarantine")))).error.message == "Unknown resource"
                for bad in ("https://example.com/work", "switchboard://queues/", "switchboard://queues/Bad Name",
                            "switchboard://todos/work"):
                    error = await refused(reader.read_resource(bad))
                    assert error.error.message.startswith("Malformed resource URI"), bad
            error = await refused(client.listen(resource_subscriptions=[uri("work"), uri("private")]).__aenter__())
            assert error.error.message == "Unknown resource" and error.error.data == {"uri": uri("private")}
            error = await refused(client.listen(resource_subscriptions=["switchboard://queues/"]).__aenter__())
            assert error.error.message.startswith("Malformed resource URI")
        async with connect(theirs) as owner:  # nothing changed for the other endpoint
            assert (await read(owner, "private"))["oldest"][0]["id"] == waiting

    anyio.run(scenario)


def test_discover_advertises_resources_and_their_subscription_only_in_the_stateless_era(stack):
    vend = stack.vend(agent("caps"), "--queue", "work")

    async def scenario() -> None:
        async with connect(vend) as modern, connect(vend, mode="legacy") as legacy:
            caps = modern.server_capabilities
            assert caps.resources is not None and caps.resources.subscribe is True
            assert not caps.resources.list_changed and not caps.tools.list_changed
            assert "claude/channel" not in (caps.experimental or {})
            caps = legacy.server_capabilities
            assert caps.experimental == {"claude/channel": {}}
            assert caps.resources is not None and not caps.resources.subscribe

    anyio.run(scenario)


def test_a_listener_is_never_rung_for_another_endpoints_todo(stack):
    a, b = stack.vend(agent("a"), "--queue", "work"), stack.vend(agent("b"), "--queue", "work")

    async def scenario() -> None:
        async with connect(a) as on_a, connect(b) as on_b:
            async with listening(on_a, "work") as rung_a, listening(on_b, "work") as rung_b:
                for n in range(2):
                    await anyio.to_thread.run_sync(lambda: push(stack, b, f"for b {n}"))
                    await rings(rung_b, total=n + 1)
                await anyio.sleep(QUIET)
                assert rung_a == [] and rung_b == [uri("work")] * 2

    anyio.run(scenario)


def test_two_listeners_of_one_endpoint_take_turns_one_ring_per_todo(stack):
    vend = stack.vend(agent("pair"), "--queue", "work")

    async def scenario() -> None:
        async with connect(vend) as one, connect(vend, mode=MODERN) as two:
            async with listening(one, "work") as first, listening(two, "work") as second:
                for n in range(4):
                    await anyio.to_thread.run_sync(lambda: push(stack, vend, f"todo {n}"))
                    await rings(first, second, total=n + 1)
                await anyio.sleep(QUIET)
                assert len(first) == len(second) == 2  # one ring per todo, in turns

    anyio.run(scenario)


def test_a_handshake_session_and_a_listener_of_one_endpoint_take_turns(stack):
    vend = stack.vend(agent("mixed"), "--queue", "work")
    channel = ChannelListener()

    async def scenario() -> None:
        async with connect(vend, channel, mode="legacy") as legacy, connect(vend) as modern:
            await call(legacy, "list_todos")  # the session's handle; its GET stream opens meanwhile
            await anyio.sleep(0.5)
            async with listening(modern, "work") as listened:
                todos = []
                for n in range(4):
                    todos.append(await anyio.to_thread.run_sync(lambda: push(stack, vend, f"todo {n}")))
                    await rings(channel.received, listened, total=n + 1)
                await anyio.sleep(QUIET)
                assert len(channel.received) == len(listened) == 2
                rung = {ring.meta["todo_id"] for ring in channel.received}
                assert len(rung) == 2 and rung < set(todos)

    anyio.run(scenario)


# -- in-process: the schedule under a ManualClock, ring on attach, revocation ---------------------


@pytest.fixture
def manual(tmp_path) -> Iterator[tuple[InProcess, ManualClock]]:
    clock = ManualClock(datetime.now(timezone.utc).replace(microsecond=0))
    running = InProcess(tmp_path, clock=clock).start()
    try:
        yield running, clock
    finally:
        running.stop()


async def listeners_of(inproc: InProcess, endpoint: dict[str, Any]) -> list[str]:
    def read() -> list[str]:
        return [t.transport for t in inproc.gateway.registry.of_endpoint(endpoint["endpoint_id"])]

    return await inproc.on_loop(read)


async def gone(inproc: InProcess, endpoint: dict[str, Any]) -> None:
    """Waits until the endpoint has no session and no listen stream left in the registry."""
    with anyio.fail_after(5):
        while await listeners_of(inproc, endpoint):
            await anyio.sleep(0.02)


def test_a_listener_is_rung_again_on_the_schedule_and_on_attach(manual):
    inproc, clock = manual
    vend = inproc.vend("sched")
    app = inproc.container.app

    async def after(**delta: float) -> None:
        clock.advance(**delta)
        await anyio.to_thread.run_sync(inproc.gateway.doorbell.wake)

    async def scenario() -> None:
        waiting = app.push(vend["slug"], "already there", caller=Caller.cli())["todo"]["id"]
        async with connect(vend) as client, listening(client, "work") as received:
            await rings(received, total=1)  # ring on attach: the oldest claimable todo
            assert await listeners_of(inproc, vend) == ["listen"]
            await after(minutes=4)
            await anyio.sleep(QUIET)
            assert len(received) == 1  # its first re-ring is 5 min after it became claimable
            await after(minutes=1)
            await rings(received, total=2)
            await anyio.to_thread.run_sync(lambda: app.claim(waiting, caller=Caller.cli()))
            await after(minutes=20)
            await anyio.sleep(QUIET)
            assert received == [uri("work")] * 2  # claimed: no more
        await gone(inproc, vend)  # the stream left the registry

    anyio.run(scenario)


def test_revocation_ends_the_endpoints_listen_streams_with_its_sessions(manual):
    inproc, _ = manual
    vend = inproc.vend("revoked")
    channel = ChannelListener()

    async def scenario() -> None:
        async with connect_inproc(vend, channel), connect(vend) as client:
            await streaming(inproc, vend)
            async with client.listen(resource_subscriptions=[uri("work")]) as subscription:
                assert sorted(await listeners_of(inproc, vend)) == ["channel", "listen"]
                await anyio.to_thread.run_sync(lambda: inproc.container.app.revoke(vend["slug"], caller=Caller.cli()))
                with anyio.fail_after(5):
                    async for _ in subscription:  # the stream ends (gracefully) on revocation
                        pass
            await gone(inproc, vend)

    anyio.run(scenario)


def test_a_released_todo_rings_a_listener_again_and_a_cli_push_rings_within_a_second(stack):
    vend = stack.vend(agent("again"), "--queue", "work")

    async def scenario() -> None:
        async with connect(vend) as client, listening(client, "work") as received:
            todo_id = await anyio.to_thread.run_sync(lambda: push(stack, vend, "boomerang"))
            pushed_at = anyio.current_time()
            await rings(received, total=1, timeout=1.0)  # the CLI is another process
            assert anyio.current_time() - pushed_at < 1.0
            await call(client, "claim", id=todo_id)
            await call(client, "release", id=todo_id)
            await rings(received, total=2)
            await anyio.sleep(QUIET)
            assert received == [uri("work")] * 2

    anyio.run(scenario)


@pytest.mark.postgres
def test_two_servers_on_postgres_ring_listeners_on_either_once_per_todo(pg_url, tmp_path):
    stack = Stack(pg_url, tmp_path / "pg", secret_key=secrets.token_hex(32)).start()
    other = stack.another_server("second")
    try:
        vend = stack.vend("alpha", ["work"])
        second_url = f"{other.base}/mcp/{vend['slug']}"

        async def scenario() -> None:
            async with connect(vend) as on_first, connect_url(vend, second_url) as on_second:
                async with listening(on_first, "work") as first, listening(on_second, "work") as second:
                    todos = []
                    for n in range(4):
                        pushed = await anyio.to_thread.run_sync(
                            lambda: stack.cli.json("todo", "push", vend["slug"], f"todo {n}"))
                        todos.append(pushed["todo"]["id"])
                        await rings(first, second, total=n + 1, timeout=2.0)
                    await anyio.sleep(1.0)
                    assert len(first) + len(second) == 4  # each todo once, across both processes

        anyio.run(scenario)
    finally:
        other.stop()
        stack.close()
