"""The parts of the mcp SDK the stateless era relies on that the SDK does not promise (ADR 38), and
the era of a request (interfaces/mcp/modern.py).

`handle_modern_request` lives in the private module `mcp.server._streamable_http_modern`: if an
SDK upgrade moves, renames or reshapes it, or serves another modern version, these tests fail by
name before any client does."""

from __future__ import annotations

import importlib
import inspect
import json

import pytest
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp_types import PROTOCOL_VERSION_META_KEY, UNSUPPORTED_PROTOCOL_VERSION
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS

from interfaces.mcp.modern import HANDSHAKE_VERSIONS, MODERN_VERSIONS, SUPPORTED_VERSIONS, Era, WrongEra, era_of
from interfaces.mcp.server import build_server
from interfaces.mcp.sessions import SessionManager, SessionRegistry
from interfaces.mcp.tools import INPUT_SCHEMAS


def test_the_sdk_still_has_the_single_exchange_handler_with_the_signature_we_call():
    module = importlib.import_module("mcp.server._streamable_http_modern")
    handler = getattr(module, "handle_modern_request", None)
    assert handler is not None, "mcp moved handle_modern_request: see docs/adr/0038-both-mcp-eras-on-one-url.md"
    assert inspect.iscoroutinefunction(handler)
    assert list(inspect.signature(handler).parameters) == [
        "app", "security_settings", "json_response", "lifespan_state", "scope", "receive", "send"]
    # it reads the server's schema lookup for the Mcp-Param-* check, which we set from the verb table
    assert "get_tool_input_schema" in inspect.getsource(module)


def test_the_sdk_serves_the_versions_we_name():
    assert tuple(MODERN_PROTOCOL_VERSIONS) == MODERN_VERSIONS, "a new modern era is a decision (ADR 38), not an upgrade"
    assert set(HANDSHAKE_VERSIONS) <= set(HANDSHAKE_PROTOCOL_VERSIONS)
    assert SUPPORTED_VERSIONS == ("2025-06-18", "2025-11-25", "2026-07-28")
    assert UNSUPPORTED_PROTOCOL_VERSION == -32022
    assert PROTOCOL_VERSION_META_KEY == "io.modelcontextprotocol/protocolVersion"


def test_the_session_manager_keeps_its_lifespan_state_where_we_read_it():
    manager = SessionManager(build_server(None, SessionRegistry(), None), registry=SessionRegistry())  # type: ignore[arg-type]
    assert isinstance(manager, StreamableHTTPSessionManager)
    assert manager.lifespan_state is None  # set by run(); the attribute exists before


def test_the_server_looks_tool_schemas_up_in_the_verb_table():
    server = build_server(None, SessionRegistry(), None)  # type: ignore[arg-type]
    assert server.get_tool_input_schema("claim_next") == INPUT_SCHEMAS["claim_next"]
    assert server.get_tool_input_schema("drop_tables") is None


def test_the_listen_handler_takes_one_listener_as_its_bus_and_can_close_it():
    """ADR 41: one ListenHandler per listen stream, its bus the stream's Listener (subscribe when
    the stream opens, before the ack; publish a ring), close() the graceful end."""
    from mcp.server.subscriptions import ListenHandler, SubscriptionBus

    from interfaces.mcp.listeners import Listener

    assert list(inspect.signature(ListenHandler).parameters) == ["bus", "max_subscriptions", "max_buffered_events"]
    assert callable(getattr(ListenHandler, "close", None))
    source = inspect.getsource(ListenHandler.__call__)
    assert source.index("self._bus.subscribe(") < source.index("SubscriptionsAcknowledgedNotification(")
    for name in ("publish", "subscribe"):
        assert callable(getattr(SubscriptionBus, name)) and callable(getattr(Listener, name))
    assert inspect.iscoroutinefunction(Listener.publish) and inspect.iscoroutinefunction(SubscriptionBus.publish)


def test_discover_advertises_what_a_listen_stream_delivers():
    server = build_server(None, SessionRegistry(), None)  # type: ignore[arg-type]
    modern = server.get_capabilities(protocol_version="2026-07-28")
    assert (modern.resources.subscribe, modern.resources.list_changed, modern.tools.list_changed) == (True, False, False)
    assert modern.experimental is None
    handshake = server.create_initialization_options().capabilities
    assert handshake.experimental == {"claude/channel": {}}
    assert (handshake.resources.subscribe, handshake.resources.list_changed) == (False, False)


def _body(method: str, version: object = None, **params: object) -> bytes:
    if version is not None:
        params["_meta"] = {PROTOCOL_VERSION_META_KEY: version}
    return json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).encode()


@pytest.mark.parametrize(("headers", "body", "era"), [
    ({}, _body("initialize"), Era.HANDSHAKE),
    ({b"mcp-session-id": b"abc"}, _body("tools/list"), Era.HANDSHAKE),
    ({b"mcp-protocol-version": b"2025-11-25"}, _body("tools/list"), Era.HANDSHAKE),
    ({b"mcp-protocol-version": b"2025-03-26"}, _body("tools/list"), Era.HANDSHAKE),  # older, as before
    ({}, None, Era.HANDSHAKE),  # a GET or DELETE without a version: the handshake era's to answer
    ({}, b"{not json", Era.HANDSHAKE),  # the SDK's parse error
    ({b"mcp-protocol-version": b"2026-07-28"}, _body("server/discover", "2026-07-28"), Era.MODERN),
    ({b"mcp-protocol-version": b"2026-07-28"}, None, Era.MODERN),  # a modern GET: the SDK's 405
    ({}, _body("tools/call", "2026-07-28"), Era.MODERN),  # the SDK's ladder answers the missing header
    ({b"mcp-protocol-version": b"2025-11-25"}, _body("tools/call", "2026-07-28"), Era.MODERN),  # and a mismatch
    ({b"mcp-protocol-version": b"2099-01-01"}, _body("tools/call", "2099-01-01"), WrongEra("2099-01-01")),
    # a handshake version in _meta is no envelope: the header and the session decide
    ({b"mcp-session-id": b"abc"}, _body("tools/call", "2025-11-25"), Era.HANDSHAKE),
    ({}, _body("tools/call", "2025-11-25"), WrongEra(None)),
    ({b"mcp-protocol-version": b"2099-01-01"}, _body("tools/list"), WrongEra("2099-01-01")),
    ({}, _body("tools/call"), WrongEra(None)),  # neither era
    ({}, json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}).encode(), WrongEra(None)),
    ({}, _body("tools/call", arguments={"note": PROTOCOL_VERSION_META_KEY}), WrongEra(None)),  # not in _meta
])
def test_the_era_of_a_request(headers, body, era):
    assert era_of(headers, body) == era


def test_a_result_the_gateway_writes_itself_in_the_stateless_era_is_shaped_as_the_sdk_shapes_one():
    from mcp_types import SERVER_INFO_META_KEY

    from interfaces.mcp.modern import ModernEra
    from interfaces.mcp.wire import transport_security

    server = build_server(None, SessionRegistry(), None)  # type: ignore[arg-type]
    result = ModernEra(server, transport_security("http://127.0.0.1:8080")).result({"content": [], "isError": True})
    assert result["resultType"] == "complete"
    assert result["_meta"][SERVER_INFO_META_KEY]["name"] == "switchboard"
