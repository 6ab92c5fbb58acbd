"""`POST|GET|DELETE /mcp/{slug}`: authenticate, bound and steer each request, then hand it to the SDK.

Order of answers (docs/adr/0010-mcp-transport.md): path (404), method (405), bearer credential
(401 with `WWW-Authenticate`), slug (403), body size (413), JSON depth (400), protocol era (a
modern-era request is refused with JSON-RPC `-32022` naming the handshake versions, so the SDK
client falls back to `initialize`). Only then does the SDK's session manager see the request,
with the endpoint and its scoped `Caller` in the ASGI scope — except a plain `tools/call` on a
live session, which is authenticated and answered in one hop to a worker thread (ADR 18).
Blocking work runs in worker threads."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import anyio
import anyio.to_thread
import msgspec
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser, authorization_context
from mcp.server.auth.provider import AccessToken
from mcp.server.streamable_http import MCP_SESSION_ID_HEADER, StreamableHTTPServerTransport, check_accept_headers
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.inbound import MCP_PROTOCOL_VERSION_HEADER
from mcp_types import UNSUPPORTED_PROTOCOL_VERSION
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from litestar import asgi
from litestar.handlers import ASGIRouteHandler
from litestar.types import Receive as LitestarReceive
from litestar.types import Scope as LitestarScope
from litestar.types import Send as LitestarSend
from starlette.requests import Request
from starlette.types import Message, Receive, Scope, Send

from application.background import OutageLog
from application.errors import StoreUnavailable
from domain.errors import DomainError
from interfaces.asgi_body import BodyTooLarge, read_body
from interfaces.json_depth import TOO_DEEP, json_too_deep
from interfaces.mcp.doorbell import Doorbell
from interfaces.mcp.server import PRINCIPAL, Principal, build_server, call_tool
from interfaces.mcp.sessions import SessionManager, SessionRegistry
from interfaces.mcp.tools import Services

log = logging.getLogger("switchboard.mcp")

MAX_BODY = 1024 * 1024
REVOCATION_SWEEP_SECONDS = 1.0  # how late another process's revocation ends this process's streams
MAX_CREDENTIAL_CHARS = 256
MCP_THREADS = 16
"""Threads for the store work of MCP requests (authentication, tool calls): the gateway's own
executor, not anyio's thread limiter (a hand-off costs a third of the CPU, as for ingest)."""
METHODS = ("POST", "GET", "DELETE")
WWW_AUTHENTICATE = 'Bearer realm="switchboard"'
MAX_REMEMBERED = 10_000
"""Credentials (by digest) and endpoints remembered for the tools/call path, then forgotten at once."""
MAX_CHECKED = 1_000
"""Distinct Accept/Content-Type/Host/Origin values whose SDK checks are remembered."""
_SESSION_ID = MCP_SESSION_ID_HEADER.lower().encode()
_PROTOCOL_VERSION = MCP_PROTOCOL_VERSION_HEADER.lower().encode()
_CHECKED_HEADERS = (b"accept", b"content-type", b"host", b"origin")
_SLUG_PATH = re.compile(r"/([a-z0-9][a-z0-9-]{0,63})/?")
_LOCAL_HOSTS = ("127.0.0.1", "localhost", "[::1]")


def transport_security(base_url: str) -> TransportSecuritySettings:
    """DNS-rebinding protection on: the base URL's host plus the loopback names, any port."""
    hosts = list(_LOCAL_HOSTS)
    origins = [f"{scheme}://{host}" for host in _LOCAL_HOSTS for scheme in ("http", "https")]
    parts = urlsplit(base_url)
    if parts.hostname:
        host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
        if host not in hosts:
            hosts.append(host)
        origins.append(f"{parts.scheme}://{host}")
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=[*hosts, *(f"{h}:*" for h in hosts)],
        allowed_origins=[*origins, *(f"{o}:*" for o in origins)],
    )


async def _respond(send: Send, status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
    payload = json.dumps(body, separators=(",", ":")).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    raw += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": payload})


async def _refuse(send: Send, status: int, code: str, message: str, headers: dict[str, str] | None = None) -> None:
    await _respond(send, status, {"error": message, "code": code}, headers)


async def _unauthorized(send: Send) -> None:
    await _refuse(send, 401, "unauthorized", "missing, unknown, revoked or expired credential",
                  {"WWW-Authenticate": WWW_AUTHENTICATE})


def _first_headers(scope: Scope) -> dict[bytes, bytes]:
    """The request's headers by (lower-case) name, the first of each name as Starlette reads them."""
    return dict(reversed(scope.get("headers", ())))


def _header(scope: Scope, name: str) -> str | None:
    key = name.lower().encode()
    for k, v in scope.get("headers", ()):
        if k == key:
            return v.decode("latin-1")
    return None


def _bearer(scope: Scope) -> str | None:
    value = _header(scope, "authorization")
    if value is None:
        return None
    scheme, _, credential = value.strip().partition(" ")
    credential = credential.strip()
    if scheme.lower() != "bearer" or not credential or len(credential) > MAX_CREDENTIAL_CHARS:
        return None
    return credential


async def _read_body(headers: dict[bytes, bytes], receive: Receive) -> tuple[bytes, list[Message]]:
    """The whole body (at most MAX_BODY bytes, else BodyTooLarge) and any message read past it."""
    declared = headers.get(b"content-length")
    if declared is not None and declared.strip().isdigit() and int(declared) > MAX_BODY:
        raise BodyTooLarge
    body, gone = await read_body(receive, MAX_BODY)
    return body, [] if gone is None else [gone]


_TOOL_CALL_KEYS = frozenset({"jsonrpc", "id", "method", "params"})
_TOOL_PARAMS_KEYS = frozenset({"name", "arguments"})


def _tool_call(body: bytes) -> tuple[int | str, str, dict[str, Any] | None] | None:
    """(id, tool name, arguments) when the body is one plain JSON-RPC `tools/call` request (no
    `_meta`, so no progress token), else None: anything else is the SDK's to answer."""
    try:
        message = msgspec.json.decode(body)
    except (msgspec.DecodeError, RecursionError):
        return None
    if not isinstance(message, dict) or message.get("method") != "tools/call" or message.get("jsonrpc") != "2.0":
        return None
    request_id, params = message.get("id"), message.get("params")
    if (not message.keys() <= _TOOL_CALL_KEYS or isinstance(request_id, bool)
            or not isinstance(request_id, int | str) or not isinstance(params, dict)
            or not params.keys() <= _TOOL_PARAMS_KEYS):
        return None
    name, arguments = params.get("name"), params.get("arguments")
    if not isinstance(name, str) or not (arguments is None or isinstance(arguments, dict)):
        return None
    return request_id, name, arguments


@dataclass(frozen=True)
class _PlainCall:
    """A plain `tools/call` that passed every check of the SDK's transport not depending on who
    calls; the gateway answers it once the caller is known to own the session."""

    session_id: str
    transport: StreamableHTTPServerTransport
    owner: object
    """The SDK's record of who opened the session (compared as the SDK compares it)."""
    request_id: int | str
    name: str
    arguments: dict[str, Any] | None


def _request_id(body: bytes) -> Any:
    try:
        message = json.loads(body)
    except ValueError:
        return None
    return message.get("id") if isinstance(message, dict) else None


class McpGateway:
    """The ASGI app behind the `/mcp` mount: one SDK session manager for every endpoint."""

    def __init__(self, services: Services, *, base_url: str, revocation_sweep: float = REVOCATION_SWEEP_SECONDS,
                 doorbell: Callable[[SessionRegistry], Doorbell] | None = None) -> None:
        self.services = services
        self.registry = SessionRegistry()
        self.doorbell = doorbell(self.registry) if doorbell is not None else None
        self.threads = ThreadPoolExecutor(max_workers=MCP_THREADS, thread_name_prefix="switchboard-mcp")
        self.server = build_server(services, self.registry, self.threads)
        self.manager = SessionManager(
            self.server, registry=self.registry, security_settings=transport_security(base_url),
            max_request_body_size=MAX_BODY, json_response=True,
        )
        self.revocation_sweep = revocation_sweep
        self._users: dict[str, tuple[AuthenticatedUser, object]] = {}
        self._holders: dict[bytes, str] = {}
        """Credential digest → the endpoint it opened last: a hint on the loop, never trusted."""
        self._checked: dict[tuple[Any, ...], bool] = {}
        self._sweep_failed = False
        self._sweep_outage = OutageLog(log, "revocation sweep", f"sweeping again every {revocation_sweep:.0f} s")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: anyio.Event | None = None
        self._revoked: asyncio.Event | None = None

    @asynccontextmanager
    async def lifespan(self, _app: object = None) -> AsyncIterator[None]:
        """Runs the session manager (with the revocation sweep and the doorbell) for the host app's lifetime."""
        # the SDK logs every session id at INFO; keep its warnings only
        logging.getLogger("mcp").setLevel(logging.WARNING)
        self._loop, self._stopping, self._revoked = asyncio.get_running_loop(), anyio.Event(), asyncio.Event()
        async with self.manager.run():
            try:
                async with anyio.create_task_group() as tasks:
                    tasks.start_soon(self._sweep_revoked)
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
        loop, event = self._loop, self._revoked
        if loop is not None and event is not None and not loop.is_closed():
            loop.call_soon_threadsafe(event.set)

    async def _end_sessions_when_set(self, stopping: anyio.Event) -> None:
        await stopping.wait()
        await self.manager.end_all()

    async def _sweep_revoked(self) -> None:
        """Ends the live sessions of endpoints revoked or expired since (by any process)."""
        while True:
            with anyio.move_on_after(self.revocation_sweep):
                if self._revoked is not None:
                    await self._revoked.wait()
            if self._revoked is not None:
                self._revoked.clear()
            self.manager.forget_gone()
            self._sweep_failed = False
            for endpoint_id, slug in self.registry.endpoints().items():
                if await self._still_active(slug):
                    continue
                for session in self.registry.of_endpoint(endpoint_id):
                    log.info("ending MCP session %s of revoked endpoint %s", session.session_id[:8], slug)
                    await self.manager.end(session.session_id)
            if not self._sweep_failed:
                self._sweep_outage.succeeded()

    async def _still_active(self, slug: str) -> bool:
        try:
            await anyio.to_thread.run_sync(self.services.app.endpoint_caller, slug)
        except DomainError:
            return False
        except StoreUnavailable as error:  # an outage is not a revocation: one line, look again next sweep
            self._sweep_outage.failed(error)
            self._sweep_failed = True
        except Exception:  # any other failure is not a revocation either: look again on the next sweep
            log.warning("revocation sweep could not load endpoint %s", slug, exc_info=True)
        return True

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

    async def _authenticate(self, credential: str, slug: str, plain: _PlainCall | None) -> tuple[Principal | None, bytes | None]:
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
            return await _refuse(send, 404, "not_found", "not found")
        method = scope["method"]
        if method not in METHODS:
            return await _refuse(send, 405, "method_not_allowed", f"{method} is not allowed here",
                                 {"Allow": ", ".join(METHODS)})
        credential = _bearer(scope)
        if credential is None:
            return await _unauthorized(send)
        # The body is read before the credential is checked (the request guard has buffered it
        # already), so that a plain tools/call is authenticated and answered in one hop; the
        # answers keep their order: 401, 403, 413, 400, the era.
        headers = _first_headers(scope)
        body, rest, too_large = None, [], False
        if method == "POST":
            try:
                body, rest = await _read_body(headers, receive)
            except BodyTooLarge:
                too_large = True
        too_deep = body is not None and json_too_deep(body)  # the SDK's parser would recurse into a RecursionError
        version = headers.get(_PROTOCOL_VERSION)
        modern = version is not None and version.decode("latin-1") not in HANDSHAKE_PROTOCOL_VERSIONS
        digest = hashlib.sha256(credential.encode()).digest()
        plain = None
        if body is not None and not rest and not too_deep and not modern:
            plain = await self._plain_call(scope, headers, body, digest)
        try:
            if plain is not None:
                with self.manager.in_flight(plain.transport):
                    principal, answer = await self._authenticate(credential, match.group(1), plain)
            else:
                principal, answer = await self._authenticate(credential, match.group(1), None)
        except StoreUnavailable:
            return await self._store_down(send, body)
        if principal is None:
            return await _unauthorized(send)
        self._remember(digest, principal.endpoint.endpoint_id)
        if principal.endpoint.slug != match.group(1):
            return await _refuse(send, 403, "forbidden", "this credential does not open this endpoint")
        if too_large:
            return await _refuse(send, 413, "payload_too_large", f"request body over {MAX_BODY} bytes")
        if too_deep:
            return await _refuse(send, 400, "invalid_argument", TOO_DEEP)
        if modern:
            return await self._refuse_modern_era(send, version.decode("latin-1"), _request_id(body or b""))
        if answer is not None and plain is not None:
            await send({"type": "http.response.start", "status": 200, "headers": [
                (b"content-type", b"application/json"), (b"content-length", str(len(answer)).encode()),
                (_SESSION_ID, plain.session_id.encode("latin-1"))]})
            await send({"type": "http.response.body", "body": answer})
            return
        await self._dispatch(scope, receive, send, principal, body, rest)

    def _remember(self, digest: bytes, endpoint_id: str) -> None:
        """Which endpoint a credential opened last (a hint for the next request, never trusted)."""
        if self._holders.get(digest) != endpoint_id:
            if len(self._holders) >= MAX_REMEMBERED:
                self._holders.clear()
            self._holders[digest] = endpoint_id

    async def _plain_call(self, scope: Scope, headers: dict[bytes, bytes], body: bytes,
                          digest: bytes) -> _PlainCall | None:
        """A plain `tools/call` on a live, initialized session of the endpoint this credential
        opened on its previous request, with every check the SDK's transport makes on it that
        does not depend on who calls (ADR 18): its session table, its Accept check, its
        Host/Origin and Content-Type check. None when anything is off that path: the request then
        goes on as any other (403, or the SDK answers it itself)."""
        raw_session = headers.get(_SESSION_ID)
        if raw_session is None:
            return None
        call = _tool_call(body)
        if call is None:
            return None
        session_id = raw_session.decode("latin-1")
        live = self.registry.get(session_id)
        found = self.manager.live_session(session_id)
        if found is None or live is None or live.peer is None:
            return None
        # Only a session of the endpoint this credential opened last counts its request as one in
        # flight before the credential is checked (the check itself decides whether the tool runs).
        if self._holders.get(digest) != live.endpoint_id:
            return None
        transport, owner = found
        if not await self._passes_transport_checks(scope, headers, transport):
            return None
        return _PlainCall(session_id, transport, owner, *call)

    async def _passes_transport_checks(self, scope: Scope, headers: dict[bytes, bytes],
                                       transport: StreamableHTTPServerTransport) -> bool:
        """The SDK's Accept check and its Host/Origin/Content-Type check, as the SDK makes them: they
        read only these four headers (and the manager's one security setting), so each distinct
        set of values is checked once."""
        security = transport._security
        key = (id(security.settings), *(headers.get(name) for name in _CHECKED_HEADERS))
        passed = self._checked.get(key)
        if passed is None:
            request = Request(scope)
            passed = check_accept_headers(request)[0] and await security.validate_request(request, is_post=True) is None
            if len(self._checked) >= MAX_CHECKED:
                self._checked.clear()
            self._checked[key] = passed
        return passed

    @staticmethod
    async def _store_down(send: Send, body: bytes | None) -> None:
        """The credential cannot be checked while the store is down. A tool call is answered as the
        tool error `unavailable: store down` (CONTRACT §12: nothing was done), in the JSON-RPC
        answer the client waits for; anything else is the HTTP 503."""
        request_id = None
        try:
            message = json.loads(body) if body is not None else None
        except (ValueError, RecursionError):
            message = None
        if isinstance(message, dict) and message.get("method") == "tools/call":
            request_id = message.get("id")
        if request_id is None:
            return await _refuse(send, 503, "unavailable", "store down")
        await _respond(send, 200, {"jsonrpc": "2.0", "id": request_id, "result": {
            "content": [{"type": "text", "text": "unavailable: store down"}], "isError": True,
        }})

    @staticmethod
    async def _refuse_modern_era(send: Send, version: str, request_id: Any) -> None:
        """Switchboard speaks the handshake era only (stateful sessions with a GET stream, which the
        doorbell needs); this error makes the SDK client's `auto` mode fall back to `initialize`."""
        await _respond(send, 400, {"jsonrpc": "2.0", "id": request_id, "error": {
            "code": UNSUPPORTED_PROTOCOL_VERSION, "message": "Unsupported protocol version",
            "data": {"supported": list(HANDSHAKE_PROTOCOL_VERSIONS), "requested": version},
        }})

    async def _dispatch(self, scope: Scope, receive: Receive, send: Send, principal: Principal,
                        body: bytes | None, rest: list[Message]) -> None:
        endpoint = principal.endpoint
        # the SDK binds each session to the principal that opened it: another endpoint's request
        # naming this session id is answered like an unknown session (404)
        scope = {**scope, "user": self._user(endpoint.endpoint_id)[0], PRINCIPAL: principal}
        session_id = _header(scope, MCP_SESSION_ID_HEADER)
        method = scope["method"]
        pending: list[Message] = ([{"type": "http.request", "body": body, "more_body": False}] if body is not None
                                  else []) + rest

        async def replay() -> Message:
            return pending.pop(0) if pending else await receive()

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

class EndedSessionRace(logging.Filter):
    """The SDK logs its ClosedResourceError (python-sdk#2741) with a traceback before raising it,
    though the gateway handles it (`handle`): that record becomes the one-line INFO the gateway
    writes, not an ERROR with a traceback in the operator's log."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], anyio.ClosedResourceError):
            record.levelno, record.levelname = logging.INFO, "INFO"
            record.exc_info, record.exc_text = None, None
            record.msg, record.args = "%s (a session that ended under the request; handled)", (record.getMessage(),)
            return logging.getLogger(record.name).isEnabledFor(logging.INFO)
        return True


SDK_TRANSPORT_LOG = logging.getLogger("mcp.server.streamable_http")
SDK_TRANSPORT_LOG.addFilter(EndedSessionRace())


class AnsweredOnce:
    """An ASGI `send` that passes one response and drops anything sent after it completed.

    The MCP SDK answers a notification 202, then, finding the session's stream closed, starts a
    500 on the same request; uvicorn refuses that with a RuntimeError, which would hide the
    SDK's own ClosedResourceError (which the gateway handles) behind a 500 traceback.
    """

    def __init__(self, send: Send) -> None:
        self._send = send
        self.completed = False

    async def __call__(self, message: Message) -> None:
        if self.completed:
            log.debug("dropped %s after the response completed", message["type"])
            return
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            self.completed = True
        await self._send(message)


def mcp_route(gateway: McpGateway) -> ASGIRouteHandler:
    """The Litestar mount: `@asgi("/mcp/{slug}")` answers 500 in Litestar 2.25, so mount `/mcp`
    (with a copied scope) and read the slug from the remaining path."""

    @asgi("/mcp", is_mount=True, copy_scope=True, include_in_schema=False)
    async def mcp(scope: LitestarScope, receive: LitestarReceive, send: LitestarSend) -> None:
        await gateway(scope, receive, send)  # type: ignore[arg-type]

    return mcp
