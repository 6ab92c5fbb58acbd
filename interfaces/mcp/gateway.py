"""`POST|GET|DELETE /mcp/{slug}`: authenticate, bound and steer each request, then hand it to the SDK.

Order of answers (docs/adr/0010-mcp-transport.md): path (404), method (405), bearer credential
(401 with `WWW-Authenticate`), slug (403), body size (413), JSON depth (400), protocol era (a
request in neither era, or naming a version not served, is refused with JSON-RPC `-32022` naming
the versions served). Only then does the SDK see the request, with the endpoint and its scoped
`Caller` in the ASGI scope: a handshake-era request (2025-06-18, 2025-11-25) goes to its session
manager — except a plain `tools/call` on a live session, which is authenticated and answered in
one hop to a worker thread (ADR 18, interfaces/mcp/plain_calls.py) — and a stateless-era request
(2026-07-28) to its single-exchange handler (ADR 38, interfaces/mcp/modern.py). Blocking work runs
in worker threads."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager

import anyio
from litestar import asgi
from litestar.handlers import ASGIRouteHandler
from litestar.types import Receive as LitestarReceive
from litestar.types import Scope as LitestarScope
from litestar.types import Send as LitestarSend
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser, authorization_context
from mcp.server.auth.provider import AccessToken
from mcp.server.streamable_http import MCP_SESSION_ID_HEADER
from starlette.types import Message, Receive, Scope, Send

from application.errors import StoreUnavailable
from domain.errors import DomainError
from interfaces.asgi_body import BodyTooLarge
from interfaces.json_depth import TOO_DEEP, json_too_deep
from interfaces.mcp.doorbell import Doorbell
from interfaces.mcp.listeners import Listens
from interfaces.mcp.modern import Era, ModernEra, WrongEra, era_of, refuse_era
from interfaces.mcp.plain_calls import MAX_REMEMBERED, PlainCall, PlainCalls
from interfaces.mcp.revocations import REVOCATION_SWEEP_SECONDS, RevocationSweep
from interfaces.mcp.sdk_guards import AnsweredOnce
from interfaces.mcp.server import PRINCIPAL, Principal, build_server, call_tool
from interfaces.mcp.sessions import SessionManager, SessionRegistry
from interfaces.mcp.tools import Services
from interfaces.mcp.wire import (
    MAX_BODY, bearer, first_headers, header, read_limited_body, refuse, respond, transport_security, unauthorized,
)

log = logging.getLogger("switchboard.mcp")

MCP_THREADS = 16
"""Threads for the store work of MCP requests (authentication, tool calls): the gateway's own
executor, not anyio's thread limiter (a hand-off costs a third of the CPU, as for ingest)."""
METHODS = ("POST", "GET", "DELETE")
_SESSION_ID = MCP_SESSION_ID_HEADER.lower().encode()
_SLUG_PATH = re.compile(r"/([a-z0-9][a-z0-9-]{0,63})/?")


class McpGateway:
    """The ASGI app behind the `/mcp` mount: one SDK session manager for every endpoint."""

    def __init__(self, services: Services, *, base_url: str, revocation_sweep: float = REVOCATION_SWEEP_SECONDS,
                 doorbell: Callable[[SessionRegistry], Doorbell] | None = None) -> None:
        self.services = services
        self.registry = SessionRegistry()
        self.doorbell = doorbell(self.registry) if doorbell is not None else None
        self.threads = ThreadPoolExecutor(max_workers=MCP_THREADS, thread_name_prefix="switchboard-mcp")
        self.listens = Listens(self.registry)
        if self.doorbell is not None:
            self.listens.attached = self.doorbell.attach  # a listen stream is rung on attach
        self.server = build_server(services, self.registry, self.threads, self.listens)
        self.manager = SessionManager(
            self.server, registry=self.registry, security_settings=transport_security(base_url),
            max_request_body_size=MAX_BODY, json_response=True,
        )
        self.plain_calls = PlainCalls(self.registry, self.manager)
        self.modern = ModernEra(self.server, transport_security(base_url))
        self.revocations = RevocationSweep(services, self.registry, self.manager, revocation_sweep)
        self._users: dict[str, tuple[AuthenticatedUser, object]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: anyio.Event | None = None

    @property
    def revocation_sweep(self) -> float:
        """Seconds between two sweeps for other processes' revocations."""
        return self.revocations.every

    @revocation_sweep.setter
    def revocation_sweep(self, seconds: float) -> None:
        self.revocations.every = seconds

    @asynccontextmanager
    async def lifespan(self, _app: object = None) -> AsyncIterator[None]:
        """Runs the session manager (with the revocation sweep and the doorbell) for the host app's lifetime."""
        # the SDK logs every session id at INFO; keep its warnings only
        logging.getLogger("mcp").setLevel(logging.WARNING)
        self._loop, self._stopping = asyncio.get_running_loop(), anyio.Event()
        async with self.manager.run():
            try:
                async with anyio.create_task_group() as tasks:
                    tasks.start_soon(self.revocations.run)
                    tasks.start_soon(self._end_sessions_when_set, self._stopping)
                    if self.doorbell is not None:
                        tasks.start_soon(self.doorbell.run)
                    try:
                        yield
                    finally:
                        tasks.cancel_scope.cancel()
            finally:
                self._loop = None
                await self.manager.end_all()
                self.threads.shutdown(wait=False, cancel_futures=True)

    def stopping(self) -> None:
        """The server is about to stop (safe from a signal handler or another thread): end every
        session now, so open GET streams finish cleanly instead of holding up the shutdown."""
        loop, event = self._loop, self._stopping
        if loop is not None and event is not None and not loop.is_closed():
            loop.call_soon_threadsafe(event.set)

    def revocation_seen(self) -> None:
        """A revocation was committed here (safe from any thread): sweep now, not at the next tick."""
        loop, event = self._loop, self.revocations.woken
        if loop is not None and event is not None and not loop.is_closed():
            loop.call_soon_threadsafe(event.set)

    async def _end_sessions_when_set(self, stopping: anyio.Event) -> None:
        await stopping.wait()
        await self.manager.end_all()

    def _user(self, endpoint_id: str) -> tuple[AuthenticatedUser, object]:
        """The SDK user an endpoint's requests carry, and the owner context the SDK binds its
        sessions to (built once per endpoint: both name only the endpoint id)."""
        known = self._users.get(endpoint_id)
        if known is None:
            if len(self._users) >= MAX_REMEMBERED:
                self._users.clear()
            user = AuthenticatedUser(AccessToken(token=endpoint_id, client_id=endpoint_id, scopes=[]))
            known = self._users[endpoint_id] = (user, authorization_context(user))
        return known

    async def _authenticate(self, credential: str, slug: str, plain: PlainCall | None) -> tuple[Principal | None, bytes | None]:
        """The request's principal (None: 401) and, for a plain call, its JSON-RPC answer — both in
        one hop to a worker thread. The tool runs only when the principal opens this slug and owns
        the call's session, exactly as the SDK decides ownership; else the answer is None."""
        app = self.services.app

        def work() -> tuple[Principal | None, bytes | None]:
            endpoint = app.authenticate_endpoint(credential)
            if endpoint is None:
                return None, None
            try:
                principal = Principal(endpoint, app.endpoint_caller(endpoint))
            except DomainError:  # revoked between the two reads
                return None, None
            if plain is None or endpoint.slug != slug or self._user(endpoint.endpoint_id)[1] != plain.owner:
                return principal, None
            return principal, call_tool(self.services, principal, plain.name, plain.arguments).answer(plain.request_id)

        return await asyncio.get_running_loop().run_in_executor(self.threads, work)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # the mount also sees websockets: refuse them
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008})
            return
        match = _SLUG_PATH.fullmatch(scope.get("path", ""))
        if match is None:
            return await refuse(send, 404, "not_found", "not found")
        method = scope["method"]
        if method not in METHODS:
            return await refuse(send, 405, "method_not_allowed", f"{method} is not allowed here",
                                {"Allow": ", ".join(METHODS)})
        credential = bearer(scope)
        if credential is None:
            return await unauthorized(send)
        # The body is read before the credential is checked (the request guard has buffered it
        # already), so that a plain tools/call is authenticated and answered in one hop; the
        # answers keep their order: 401, 403, 413, 400, the era.
        headers = first_headers(scope)
        body, rest, too_large = None, [], False
        if method == "POST":
            try:
                body, rest = await read_limited_body(headers, receive)
            except BodyTooLarge:
                too_large = True
        too_deep = body is not None and json_too_deep(body)  # the SDK's parser would recurse into a RecursionError
        era = era_of(headers, body) if not too_deep and not too_large else Era.HANDSHAKE
        digest = hashlib.sha256(credential.encode()).digest()
        plain = None
        if body is not None and not rest and not too_deep and era is Era.HANDSHAKE:
            plain = await self.plain_calls.find(scope, headers, body, digest)
        try:
            if plain is not None:
                with self.manager.in_flight(plain.transport):
                    principal, answer = await self._authenticate(credential, match.group(1), plain)
            else:
                principal, answer = await self._authenticate(credential, match.group(1), None)
        except StoreUnavailable:
            return await self._store_down(send, body, era)
        if principal is None:
            return await unauthorized(send)
        self.plain_calls.remember(digest, principal.endpoint.endpoint_id)
        if principal.endpoint.slug != match.group(1):
            return await refuse(send, 403, "forbidden", "this credential does not open this endpoint")
        if too_large:
            return await refuse(send, 413, "payload_too_large", f"request body over {MAX_BODY} bytes")
        if too_deep:
            return await refuse(send, 400, "invalid_argument", TOO_DEEP)
        if isinstance(era, WrongEra):
            return await refuse_era(send, era, body)
        if answer is not None and plain is not None:
            await send({"type": "http.response.start", "status": 200, "headers": [
                (b"content-type", b"application/json"), (b"content-length", str(len(answer)).encode()),
                (_SESSION_ID, plain.session_id.encode("latin-1"))]})
            await send({"type": "http.response.body", "body": answer})
            return
        if era is Era.MODERN:
            scope = {**scope, PRINCIPAL: principal}
            return await self.modern.handle(scope, _replay(body, rest, receive), send, self.manager.lifespan_state)
        await self._dispatch(scope, receive, send, principal, body, rest)

    async def _store_down(self, send: Send, body: bytes | None, era: Era | WrongEra) -> None:
        """The credential cannot be checked while the store is down. A tool call is answered as the
        tool error `unavailable: store down` (CONTRACT §12: nothing was done), in the JSON-RPC
        answer the client waits for, shaped for its era; anything else is the HTTP 503."""
        call_id = None
        try:
            message = json.loads(body) if body is not None else None
        except (ValueError, RecursionError):
            message = None
        if isinstance(message, dict) and message.get("method") == "tools/call":
            call_id = message.get("id")
        if call_id is None:
            return await refuse(send, 503, "unavailable", "store down")
        result = {"content": [{"type": "text", "text": "unavailable: store down"}], "isError": True}
        await respond(send, 200, {"jsonrpc": "2.0", "id": call_id,
                                  "result": self.modern.result(result) if era is Era.MODERN else result})

    async def _dispatch(self, scope: Scope, receive: Receive, send: Send, principal: Principal,
                        body: bytes | None, rest: list[Message]) -> None:
        endpoint = principal.endpoint
        # the SDK binds each session to the principal that opened it: another endpoint's request
        # naming this session id is answered like an unknown session (404)
        scope = {**scope, "user": self._user(endpoint.endpoint_id)[0], PRINCIPAL: principal}
        session_id = header(scope, MCP_SESSION_ID_HEADER)
        method = scope["method"]
        replay = _replay(body, rest, receive)
        stream_open = False

        async def watch(message: Message) -> None:
            nonlocal stream_open
            if message["type"] == "http.response.start" and message["status"] == 200:
                if method == "POST" and session_id is None:
                    opened = dict(message.get("headers", ())).get(MCP_SESSION_ID_HEADER.encode())
                    if opened:
                        self.registry.opened(opened.decode("latin-1"), endpoint)
                elif method == "GET" and session_id is not None and not stream_open:
                    stream_open = True
                    self.registry.stream_opened(session_id)
            await send(message)
            if stream_open and message["type"] == "http.response.start" and self.doorbell is not None:
                self.doorbell.attached(session_id)  # ring on attach (CONTRACT §13)

        try:
            await self.manager.handle_request(scope, replay, AnsweredOnce(watch))
        except anyio.ClosedResourceError:
            # The session ended while this request was on its way in (python-sdk#2741): a
            # notification was already answered 202 before the SDK found the session's stream
            # closed, and the SDK's second answer was dropped by AnsweredOnce. Nothing is lost:
            # the client has its answer, and the session is gone for everyone.
            log.info("mcp session %s ended under a %s notification, already answered", session_id, method)
        finally:
            if stream_open:
                self.registry.stream_closed(session_id)


def _replay(body: bytes | None, rest: list[Message], receive: Receive) -> Receive:
    """The request's `receive` again from its start: the body the gateway read, then the rest."""
    pending: list[Message] = ([{"type": "http.request", "body": body, "more_body": False}] if body is not None
                              else []) + rest

    async def replay() -> Message:
        return pending.pop(0) if pending else await receive()

    return replay


def mcp_route(gateway: McpGateway) -> ASGIRouteHandler:
    """The Litestar mount: `@asgi("/mcp/{slug}")` answers 500 in Litestar 2.25, so mount `/mcp`
    (with a copied scope) and read the slug from the remaining path."""

    @asgi("/mcp", is_mount=True, copy_scope=True, include_in_schema=False)
    async def mcp(scope: LitestarScope, receive: LitestarReceive, send: LitestarSend) -> None:
        await gateway(scope, receive, send)  # type: ignore[arg-type]

    return mcp
