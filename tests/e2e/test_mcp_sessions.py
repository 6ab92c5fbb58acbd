"""The per-process session registry the doorbell uses, seen from inside a real server.

The app runs under uvicorn in a thread of the test process (so the registry can be inspected on
the server's event loop) and is driven over real HTTP by the official `mcp` client in its
default mode, with a client extension bound to `notifications/claude/channel`.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import anyio
import httpx2
import pytest
import uvicorn
from mcp.client import Client, ClientExtension, NotificationBinding
from mcp.client.streamable_http import streamable_http_client
from pydantic import BaseModel

from application.ports import Clock
from application.service import Caller
from interfaces.bootstrap import build
from interfaces.http.app import create_app
from interfaces.mcp import McpGateway
from interfaces.settings import Settings
from tests.e2e._support import free_port

T = TypeVar("T")
CHANNEL = "notifications/claude/channel"


class ChannelParams(BaseModel):
    content: str
    meta: dict[str, str] = {}


class ChannelListener(ClientExtension):
    """What an agent host registers to receive the doorbell (the SDK drops unknown methods otherwise)."""

    identifier = "dev.switchboard/test-channel"

    def __init__(self) -> None:
        self.received: list[ChannelParams] = []

    def notifications(self) -> list[NotificationBinding[Any]]:
        async def handle(params: ChannelParams) -> None:
            self.received.append(params)

        return [NotificationBinding(method=CHANNEL, params_type=ChannelParams, handler=handle)]


class InProcess:
    def __init__(self, tmp_path, clock: Clock | None = None) -> None:
        port = free_port()
        self.base = f"http://127.0.0.1:{port}"
        self.url = f"sqlite:///{tmp_path}/s.db"
        self.container = build(Settings(database_url=self.url, data_dir=str(tmp_path),
                                        base_url=self.base, port=port), clock=clock)
        self.container.app.ensure_admin()
        self.app = create_app(self.container)
        self.gateway: McpGateway = self.app.state.mcp
        self.gateway.revocation_sweep = 0.2
        self.server = uvicorn.Server(uvicorn.Config(self.app, port=port, log_level="warning",
                                                    timeout_graceful_shutdown=2))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def start(self) -> InProcess:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.container.close()

    async def on_loop(self, fn: Callable[[], Awaitable[T] | T]) -> T:
        """Runs `fn` on the server's event loop (the registry is confined to it)."""
        async def run() -> T:
            result = fn()
            return await result if inspect.isawaitable(result) else result

        future = asyncio.run_coroutine_threadsafe(run(), self.gateway._loop)
        return await asyncio.wrap_future(future)

    async def sessions(self, endpoint_id: str) -> list[tuple[str, int, bool]]:
        async def read() -> list[tuple[str, int, bool]]:
            return [(s.session_id, s.streams, s.peer is not None) for s in self.gateway.registry.of_endpoint(endpoint_id)]

        return await self.on_loop(read)

    async def wait_for(self, endpoint_id: str, predicate: Callable[[list[tuple[str, int, bool]]], bool]) -> list:
        with anyio.fail_after(5):
            while not predicate(sessions := await self.sessions(endpoint_id)):
                await anyio.sleep(0.02)
        return sessions

    def vend(self, agent: str) -> dict[str, Any]:
        return self.container.app.vend(agent, queues=["work"], caller=Caller.cli())


@pytest.fixture
def inproc(tmp_path) -> Iterator[InProcess]:
    server = InProcess(tmp_path).start()
    try:
        yield server
    finally:
        server.stop()


@asynccontextmanager
async def connect(vend: dict[str, Any], listener: ChannelListener, url: str | None = None) -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {vend['credential']}"}
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=300)) as http:
        # the channel doorbell rides a handshake-era session (CONTRACT §7); the default mode picks
        # the stateless era (ADR 38), where it is rung over subscriptions/listen instead (ADR 41,
        # tests/e2e/test_doorbell_listen.py)
        async with Client(streamable_http_client(url or vend["mcp_url"], http_client=http),
                          extensions=[listener], mode="legacy") as client:
            yield client


def test_registry_tracks_sessions_streams_and_can_push_to_one(inproc):
    a, b = inproc.vend("alpha"), inproc.vend("beta")
    first, second, other = ChannelListener(), ChannelListener(), ChannelListener()

    async def scenario() -> None:
        async with connect(a, first), connect(a, second), connect(b, other):
            both = await inproc.wait_for(a["endpoint_id"], lambda s: len(s) == 2 and all(n == 1 and p for _, n, p in s))
            assert len(await inproc.wait_for(b["endpoint_id"], lambda s: len(s) == 1)) == 1

            async def ring() -> bool:  # what stage 2's doorbell will do: one chosen session of one endpoint
                chosen = inproc.gateway.registry.of_endpoint(a["endpoint_id"])[1]
                return await chosen.notify(CHANNEL, {"content": "switchboard: todo td_1 ready", "meta": {"queue": "work"}})

            assert await inproc.on_loop(ring) is True
            with anyio.fail_after(5):
                while not (first.received or second.received):
                    await anyio.sleep(0.02)
            await anyio.sleep(0.2)
            assert [len(first.received), len(second.received), len(other.received)] == [0, 1, 0]
            assert second.received[0].content == "switchboard: todo td_1 ready"
            assert second.received[0].meta == {"queue": "work"}
            endpoints = await inproc.on_loop(inproc.gateway.registry.endpoints)
            assert endpoints == {a["endpoint_id"]: a["slug"], b["endpoint_id"]: b["slug"]}
            assert both[0][0] != both[1][0]
        # each client DELETEs its session on exit; the registry forgets them
        await inproc.wait_for(a["endpoint_id"], lambda s: s == [])
        await inproc.wait_for(b["endpoint_id"], lambda s: s == [])

    anyio.run(scenario)


def test_revocation_ends_the_endpoints_sessions_only(inproc):
    doomed, kept = inproc.vend("doomed"), inproc.vend("kept")
    inproc.gateway.revocation_sweep = 30  # so only the revocation's own commit can end the session in time

    async def scenario() -> None:
        async with connect(doomed, ChannelListener()), connect(kept, ChannelListener()):
            await inproc.wait_for(doomed["endpoint_id"], lambda s: len(s) == 1 and s[0][1] == 1)
            await inproc.wait_for(kept["endpoint_id"], lambda s: len(s) == 1 and s[0][1] == 1)
            await anyio.to_thread.run_sync(lambda: inproc.container.app.revoke(doomed["slug"], caller=Caller.cli()))
            revoked_at = time.monotonic()
            await inproc.wait_for(doomed["endpoint_id"], lambda s: s == [])
            # ended by the revocation itself (a local commit), not by the once-a-second sweep
            assert time.monotonic() - revoked_at < 0.5
            assert len(await inproc.sessions(kept["endpoint_id"])) == 1

    anyio.run(scenario)

