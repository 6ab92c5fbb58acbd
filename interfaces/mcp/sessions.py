"""The MCP sessions this process holds, by endpoint, and the SDK session manager that owns them.

The doorbell (interfaces/mcp/doorbell.py) uses the registry to pick one of an endpoint's sessions
with an open GET stream and push `notifications/claude/channel` to it through `LiveSession.peer`,
or one of its stateless-era listen streams (interfaces/mcp/listeners.py, `Listener`): both kinds
are an endpoint's doorbell targets, in one list, so they rotate together (docs/adr/0041). The
registry is confined to the event loop that serves MCP: every change happens there, so it needs
no lock. Sessions and listeners live in this process's memory only (docs/adr/0010-mcp-transport.md).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import anyio

from mcp.server.context import CallNext, ServerRequestContext
from mcp.server.session import ServerSession
from mcp.server.streamable_http import MCP_SESSION_ID_HEADER, StreamableHTTPServerTransport
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from pydantic import BaseModel

from domain.doorbell import ring_message
from domain.endpoint import Endpoint
from interfaces.store.rings import DueRing

CHANNEL = "notifications/claude/channel"


class RingTarget(Protocol):
    """What the doorbell rings: a handshake session (`LiveSession`) or a listen stream (`Listener`)."""

    session_id: str
    endpoint_id: str
    slug: str
    queues: tuple[str, ...]
    transport: ClassVar[str]

    @property
    def has_stream(self) -> bool: ...

    @property
    def ready(self) -> bool: ...

    async def ring(self, ring: DueRing) -> bool: ...

    def end(self) -> None: ...


@dataclass(eq=False)
class LiveSession:
    """One initialized MCP session of one endpoint."""

    transport: ClassVar[str] = "channel"
    session_id: str
    endpoint_id: str
    slug: str
    queues: tuple[str, ...]
    opened_at: float = field(default_factory=time.monotonic)
    streams: int = 0
    """Open GET notification streams (0 or 1: the SDK answers a second one 409)."""
    peer: ServerSession | None = None
    """Set on the session's first message after `initialize`; its `send_notification` (without a
    related request id) writes to the session's standalone stream, i.e. the GET stream."""

    @property
    def has_stream(self) -> bool:
        return self.streams > 0

    @property
    def ready(self) -> bool:
        """It can take a ring now: an open GET stream and a handle on its connection."""
        return self.streams > 0 and self.peer is not None

    async def ring(self, ring: DueRing) -> bool:
        """Pushes one ring as `notifications/claude/channel` (CONTRACT §7)."""
        return await self.notify(CHANNEL, ring_message(ring.todo_id, ring.queue, ring.title, ring.kind, ring.source))

    def end(self) -> None:
        """Nothing: the session manager ends a session (`SessionManager.end`)."""

    async def notify(self, method: str, params: dict[str, Any]) -> bool:
        """Sends a server notification on this session's standalone stream (its GET stream);
        False when the session has no handle yet. Best effort, like the SDK: without an open GET
        stream the notification is dropped, and a full stream buffer makes this wait, so a
        caller bounds it with a timeout."""
        if self.peer is None:
            return False
        await self.peer.send_notification(_Notification(method=method, params=params))  # type: ignore[arg-type]
        return True


class _Notification(BaseModel):
    """Any server notification: the SDK's typed union has no vendor methods such as
    `notifications/claude/channel`, and `send_notification` only serialises what it is given."""

    method: str
    params: dict[str, Any] | None = None


class SessionRegistry:
    """Live sessions of this process: opened on a successful `initialize`, closed when the SDK
    discards the session (DELETE, idle timeout, revocation, shutdown)."""

    def __init__(self) -> None:
        self._sessions: dict[str, LiveSession] = {}
        self._listeners: dict[str, RingTarget] = {}
        self._by_endpoint: dict[str, dict[str, RingTarget]] = {}

    def __len__(self) -> int:
        return len(self._sessions)

    def session_ids(self) -> set[str]:
        """The handshake sessions' ids (the SDK's session table holds the same)."""
        return set(self._sessions)

    def listeners(self) -> list[RingTarget]:
        """The open listen streams (interfaces/mcp/listeners.py)."""
        return list(self._listeners.values())

    def listening(self, listener: RingTarget) -> None:
        """A listen stream opened: one more doorbell target of its endpoint. Its id is never a
        session id (`get` and the session header never reach it)."""
        self._listeners[listener.session_id] = listener
        self._by_endpoint.setdefault(listener.endpoint_id, {})[listener.session_id] = listener

    def holds(self, target: RingTarget) -> bool:
        """The target is still registered (its session or stream has not ended)."""
        return self._by_endpoint.get(target.endpoint_id, {}).get(target.session_id) is target

    def get(self, session_id: str) -> LiveSession | None:
        return self._sessions.get(session_id)

    def opened(self, session_id: str, endpoint: Endpoint) -> LiveSession:
        session = LiveSession(session_id, endpoint.endpoint_id, endpoint.slug, tuple(endpoint.queues))
        self._sessions[session_id] = session
        self._by_endpoint.setdefault(endpoint.endpoint_id, {})[session_id] = session
        return session

    def closed(self, session_id: str) -> None:
        """A session or a listen stream ended."""
        session = self._sessions.pop(session_id, None) or self._listeners.pop(session_id, None)
        if session is None:
            return
        of_endpoint = self._by_endpoint.get(session.endpoint_id, {})
        of_endpoint.pop(session_id, None)
        if not of_endpoint:
            self._by_endpoint.pop(session.endpoint_id, None)

    def stream_opened(self, session_id: str) -> None:
        if (session := self._sessions.get(session_id)) is not None:
            session.streams += 1

    def stream_closed(self, session_id: str) -> None:
        if (session := self._sessions.get(session_id)) is not None:
            session.streams = max(0, session.streams - 1)

    def of_endpoint(self, endpoint_id: str) -> list[RingTarget]:
        """The endpoint's sessions and listen streams, oldest first."""
        return list(self._by_endpoint.get(endpoint_id, {}).values())

    def endpoints(self) -> dict[str, str]:
        """endpoint id → slug, for every endpoint with at least one live session."""
        return {eid: next(iter(s.values())).slug for eid, s in self._by_endpoint.items() if s}

    async def remember_peer(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> Any:
        """SDK middleware: keeps a handle on each session's connection for server-initiated messages."""
        request = ctx.request
        session_id = request.headers.get(MCP_SESSION_ID_HEADER) if request is not None else None
        if session_id is not None:
            session = self._sessions.get(session_id)
            if session is not None and session.peer is None:
                session.peer = ctx.session
        return await call_next(ctx)


class SessionManager(StreamableHTTPSessionManager):
    """The SDK's stateful session manager, telling the registry when a session ends and able to
    end sessions itself (a revoked endpoint's, or all of them at shutdown).

    Overrides `_discard_session`, the one place the SDK forgets a session however it ends, and
    reads the session table, its owners and a transport's idle bookkeeping for the tools/call
    fast path (docs/adr/0018-mcp-per-call-cost.md); pinned by `mcp>=2.3,<3` and covered by
    the end-to-end tests.
    """

    def __init__(self, *args: Any, registry: SessionRegistry, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.registry = registry

    @property
    def lifespan_state(self) -> Any:
        """The server's lifespan state, entered once in `run()` (the modern era's requests need it)."""
        return self._lifespan_state

    async def _discard_session(self, session_id: str, transport: StreamableHTTPServerTransport) -> None:
        try:
            await super()._discard_session(session_id, transport)
        finally:
            self.registry.closed(session_id)

    async def end(self, session_id: str) -> None:
        """Terminates one session: its streams close and its id answers 404 from now on. A listen
        stream's id ends that stream (its graceful close)."""
        transport = self._server_instances.get(session_id)
        if transport is not None:
            await self._discard_session(session_id, transport)
        else:
            for listener in self.registry.listeners():
                if listener.session_id == session_id:
                    listener.end()
            self.registry.closed(session_id)

    def live_session(self, session_id: str) -> tuple[StreamableHTTPServerTransport, object] | None:
        """The transport of a live session (the SDK's own session table) and the owner the SDK
        bound it to, to be compared with `authorization_context` of the caller as the SDK
        compares them; None when the SDK would not serve the session."""
        transport = self._server_instances.get(session_id)
        if transport is None or transport.is_terminated:
            return None
        if transport.idle_scope is not None and transport.idle_scope.cancel_called:
            return None
        return transport, self._session_owners.get(session_id)

    @staticmethod
    @contextmanager
    def in_flight(transport: StreamableHTTPServerTransport) -> Iterator[None]:
        """A request served beside the transport holds its session as one served by it does: the
        idle countdown is suspended meanwhile and restarts when the last request completes
        (the SDK's `StreamableHTTPServerTransport.handle_request`)."""
        idle, timeout = transport.idle_scope, transport._idle_timeout
        if idle is None or timeout is None:
            yield
            return
        transport._requests_in_flight += 1
        idle.deadline = math.inf
        try:
            yield
        finally:
            transport._requests_in_flight -= 1
            if not transport._requests_in_flight:
                idle.deadline = anyio.current_time() + timeout

    def forget_gone(self) -> None:
        """Drops registry entries the SDK no longer holds (a session that failed while opening)."""
        for session_id in self.registry.session_ids() - set(self._server_instances):
            self.registry.closed(session_id)

    async def end_all(self) -> None:
        for session_id in list(self._server_instances):
            await self.end(session_id)
        for listener in self.registry.listeners():
            await self.end(listener.session_id)
