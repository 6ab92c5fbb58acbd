"""The `tools/call` answered beside the SDK (docs/adr/0018-mcp-per-call-cost.md): a plain JSON-RPC
`tools/call` on a live, initialized session of the caller, once it passed every check the SDK's
transport would make on it. Anything off that path is the SDK's to answer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec
from mcp.server.streamable_http import MCP_SESSION_ID_HEADER, StreamableHTTPServerTransport, check_accept_headers
from starlette.requests import Request
from starlette.types import Scope

from interfaces.mcp.sessions import SessionManager, SessionRegistry

MAX_REMEMBERED = 10_000
"""Credentials (by digest) remembered for the tools/call path, then forgotten at once."""
MAX_CHECKED = 1_000
"""Distinct Accept/Content-Type/Host/Origin values whose SDK checks are remembered."""
_SESSION_ID = MCP_SESSION_ID_HEADER.lower().encode()
_CHECKED_HEADERS = (b"accept", b"content-type", b"host", b"origin")

_TOOL_CALL_KEYS = frozenset({"jsonrpc", "id", "method", "params"})
_TOOL_PARAMS_KEYS = frozenset({"name", "arguments"})


def tool_call(body: bytes) -> tuple[int | str, str, dict[str, Any] | None] | None:
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
class PlainCall:
    """A plain `tools/call` that passed every check of the SDK's transport not depending on who
    calls; the gateway answers it once the caller is known to own the session."""

    session_id: str
    transport: StreamableHTTPServerTransport
    owner: object
    """The SDK's record of who opened the session (compared as the SDK compares it)."""
    request_id: int | str
    name: str
    arguments: dict[str, Any] | None


class PlainCalls:
    """Finds the plain calls the gateway may answer itself; confined to the event loop."""

    def __init__(self, registry: SessionRegistry, manager: SessionManager) -> None:
        self.registry = registry
        self.manager = manager
        self._holders: dict[bytes, str] = {}
        """Credential digest → the endpoint it opened last: a hint on the loop, never trusted."""
        self._checked: dict[tuple[Any, ...], bool] = {}

    def remember(self, digest: bytes, endpoint_id: str) -> None:
        """Which endpoint a credential opened last (a hint for the next request, never trusted)."""
        if self._holders.get(digest) != endpoint_id:
            if len(self._holders) >= MAX_REMEMBERED:
                self._holders.clear()
            self._holders[digest] = endpoint_id

    async def find(self, scope: Scope, headers: dict[bytes, bytes], body: bytes,
                   digest: bytes) -> PlainCall | None:
        """A plain `tools/call` on a live, initialized session of the endpoint this credential
        opened on its previous request, with every check the SDK's transport makes on it that
        does not depend on who calls (ADR 18): its session table, its Accept check, its
        Host/Origin and Content-Type check. None when anything is off that path: the request then
        goes on as any other (403, or the SDK answers it itself)."""
        raw_session = headers.get(_SESSION_ID)
        if raw_session is None:
            return None
        call = tool_call(body)
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
        return PlainCall(session_id, transport, owner, *call)

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

