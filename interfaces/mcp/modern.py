"""The stateless era (protocol 2026-07-28) on `/mcp/{slug}`, beside the handshake era
(docs/adr/0038-both-mcp-eras-on-one-url.md).

`era_of` tells which era a request is in, from what it is: the protocol version in its body's
`params._meta` first, then its `MCP-Protocol-Version` header, then whether it is an `initialize`
or names a session. A request in neither era, or naming a version Switchboard does not serve, is
refused before anything runs (`refuse_era`: JSON-RPC -32022 with the versions served).

`ModernEra` answers a modern request, already authenticated by the gateway (the principal is in the
ASGI scope, where every tool reads it), with the SDK's single-exchange handler: the same
low-level `Server`, so the same tool functions, inputs, outputs and error codes as the handshake
era. That handler lives in a private SDK module; tests/unit/test_mcp_sdk_seams.py fails loudly if
the SDK moves or reshapes it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

import msgspec

# Private SDK module (the one entry for 2026-07-28 over HTTP; the SDK's session manager calls it
# too): pinned by `mcp>=2.3,<3` and guarded by tests/unit/test_mcp_sdk_seams.py.
from mcp.server._streamable_http_modern import handle_modern_request
from mcp.server.lowlevel.server import Server
from mcp.server.streamable_http import MCP_SESSION_ID_HEADER
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.inbound import MCP_PROTOCOL_VERSION_HEADER
from mcp_types import PROTOCOL_VERSION_META_KEY, SERVER_INFO_META_KEY, UNSUPPORTED_PROTOCOL_VERSION
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from starlette.types import Receive, Scope, Send

from interfaces.mcp.wire import respond

HANDSHAKE_VERSIONS = ("2025-06-18", "2025-11-25")
"""The handshake-era versions Switchboard names (CONTRACT §16); the SDK's handshake also accepts
the older ones it knows, unchanged from before."""
MODERN_VERSIONS = ("2026-07-28",)
SUPPORTED_VERSIONS = (*HANDSHAKE_VERSIONS, *MODERN_VERSIONS)
"""Named in every era refusal (`error.data.supported`), oldest first."""

_PROTOCOL_VERSION = MCP_PROTOCOL_VERSION_HEADER.lower().encode()
_SESSION_ID = MCP_SESSION_ID_HEADER.lower().encode()
_META_KEY = PROTOCOL_VERSION_META_KEY.encode()
_NO_VERSION = object()


class Era(enum.Enum):
    HANDSHAKE = "handshake"
    MODERN = "modern"


@dataclass(frozen=True)
class WrongEra:
    """A request in neither era, or naming a protocol version not served."""

    requested: Any
    """The version it named (None when it named none)."""


def _decoded(body: bytes) -> Any:
    try:
        return msgspec.json.decode(body)
    except (msgspec.DecodeError, RecursionError):
        return None


def _meta_version(message: Any) -> Any:
    """`params._meta["io.modelcontextprotocol/protocolVersion"]`, or _NO_VERSION."""
    params = message.get("params") if isinstance(message, dict) else None
    meta = params.get("_meta") if isinstance(params, dict) else None
    if isinstance(meta, dict) and PROTOCOL_VERSION_META_KEY in meta:
        return meta[PROTOCOL_VERSION_META_KEY]
    return _NO_VERSION


def era_of(headers: dict[bytes, bytes], body: bytes | None) -> Era | WrongEra:
    """The era a request is in. A modern version in its body's `_meta` decides first (the SDK's
    ladder then checks that the header agrees), a version neither era serves there is refused;
    then its version header; without either, an `initialize`, a session id or a body the SDK
    must refuse as JSON is the handshake era's, and any other message is in neither era."""
    message = _decoded(body) if body is not None and _META_KEY in body else None
    version = _meta_version(message)
    if version in MODERN_VERSIONS:
        return Era.MODERN
    if version is not _NO_VERSION and version not in HANDSHAKE_PROTOCOL_VERSIONS:
        return WrongEra(version)  # a handshake version in _meta means nothing: the header decides
    raw = headers.get(_PROTOCOL_VERSION)
    if raw is not None:
        header = raw.decode("latin-1")
        if header in MODERN_VERSIONS:
            return Era.MODERN
        if header in HANDSHAKE_PROTOCOL_VERSIONS:
            return Era.HANDSHAKE
        return WrongEra(header)
    if body is None or headers.get(_SESSION_ID) is not None:
        return Era.HANDSHAKE
    message = _decoded(body)
    if not isinstance(message, dict) or message.get("method") == "initialize":
        return Era.HANDSHAKE
    return WrongEra(None)


async def refuse_era(send: Send, wrong: WrongEra, body: bytes | None) -> None:
    """JSON-RPC -32022 (HTTP 400) naming the versions served: nothing ran. The SDK client's
    `auto` mode retries `server/discover` at the modern version named here."""
    message = _decoded(body) if body is not None else None
    call_id = message.get("id") if isinstance(message, dict) else None
    data: dict[str, Any] = {"supported": list(SUPPORTED_VERSIONS)}
    if wrong.requested is not None:
        data["requested"] = wrong.requested
    await respond(send, 400, {"jsonrpc": "2.0", "id": call_id, "error": {
        "code": UNSUPPORTED_PROTOCOL_VERSION, "message": "Unsupported protocol version", "data": data,
    }})


class ModernEra:
    """Answers an authenticated 2026-07-28 request with the SDK's single-exchange handler: one
    JSON-RPC request in, one JSON answer out, no session, nothing kept between requests (so any
    `serve` process of one store answers it alike)."""

    def __init__(self, server: Server[Any], security_settings: TransportSecuritySettings) -> None:
        self.server = server
        self.security_settings = security_settings

    def result(self, result: dict[str, Any]) -> dict[str, Any]:
        """A result the gateway writes itself (`unavailable: store down`), as the SDK writes one in
        this era: `resultType` and the `serverInfo` stamp, which the SDK client requires."""
        return {**result, "resultType": "complete", "_meta": {SERVER_INFO_META_KEY: self.server.server_info_stamp}}

    async def handle(self, scope: Scope, receive: Receive, send: Send, lifespan_state: Any) -> None:
        # The modern era has no sessions: a session id header must not reach the SDK's middleware
        # (which would take this one exchange for a handshake session's connection).
        headers = [(k, v) for k, v in scope.get("headers", ()) if k != _SESSION_ID]
        await handle_modern_request(self.server, self.security_settings, True, lifespan_state,
                                    {**scope, "headers": headers}, receive, send)
