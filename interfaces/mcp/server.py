"""The MCP server: `initialize` identity, `tools/list` per endpoint, `tools/call` through the verb
table, the endpoint's queues as resources (`resources/list`, `resources/read`) and, in the
stateless era, `subscriptions/listen` for them (the doorbell there: interfaces/mcp/listeners.py).

One low-level SDK `Server` serves every endpoint. Who calls is not part of the MCP session: the
gateway authenticates each HTTP request and puts the endpoint and its scoped `Caller` in the ASGI
scope, which handlers read through `ctx.request` — so a revoked credential fails on its next
request, whatever session it uses.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import Executor
from dataclasses import dataclass
from functools import partial
from typing import Any

import mcp_types as types
import msgspec
from mcp.server import Server
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import NotificationOptions
from mcp.server.models import InitializationOptions
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from application.service import Caller
from domain.endpoint import Endpoint
from interfaces.mcp.errors import tool_error
from interfaces.mcp.listeners import Listens
from interfaces.mcp.resources import list_queues, read_queue
from interfaces.mcp.sessions import SessionRegistry
from interfaces.mcp.tools import INPUT_SCHEMAS, VERBS, Services, parse_arguments
from interfaces.version import VERSION

SERVER_NAME = "switchboard"
CHANNEL_CAPABILITY = "claude/channel"
PRINCIPAL = "switchboard.principal"
INSTRUCTIONS = (
    "Switchboard is your durable work queue: webhooks and operators turn into todos that you claim, "
    "work on and finish. The queue is the record; a doorbell is only a hint. A "
    "notifications/claude/channel message ('switchboard: todo … ready on queue …') may arrive late, "
    "twice, or for a todo another of your sessions already took; when your stream opens you are rung "
    "once for the oldest todo already waiting, not for each. So never act on a notification itself: "
    "call claim_next to take "
    "the oldest available todo ({empty: true} means there is none), call it when you start and again "
    "after each todo you finish, heartbeat while you work past the lease, then complete or fail the "
    "todo (or release it to give it back). Errors read '<code>: <message>'. Without a session (protocol "
    "2026-07-28) the doorbell is notifications/resources/updated for a switchboard://queues/<queue> resource "
    "on a subscriptions/listen stream: the same hint, the same answer (claim_next)."
)


@dataclass(frozen=True)
class Principal:
    """The endpoint behind one authenticated HTTP request, and the caller it acts as."""

    endpoint: Endpoint
    caller: Caller


class SwitchboardServer(Server[Any]):
    """Advertises `capabilities.experimental["claude/channel"]` in the handshake era, which the SDK
    has no setting for, and in the stateless era only what a listen stream delivers."""

    def get_capabilities(self, notification_options: NotificationOptions | None = None,
                         experimental_capabilities: dict[str, dict[str, Any]] | None = None,
                         extensions: dict[str, dict[str, Any]] | None = None, *,
                         protocol_version: str | None = None) -> types.ServerCapabilities:
        """In the stateless era the SDK says every list may change once `subscriptions/listen` is
        served; a listen stream here announces queue resources being updated (the doorbell) and
        nothing else: resources `subscribe`, no `listChanged` anywhere."""
        capabilities = super().get_capabilities(notification_options, experimental_capabilities, extensions,
                                                protocol_version=protocol_version)
        if protocol_version not in MODERN_PROTOCOL_VERSIONS:
            return capabilities
        return capabilities.model_copy(update={
            "tools": types.ToolsCapability(list_changed=False),
            "resources": types.ResourcesCapability(subscribe=True, list_changed=False),
        })

    def create_initialization_options(
        self,
        notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
    ) -> InitializationOptions:
        experimental = {CHANNEL_CAPABILITY: {}, **(experimental_capabilities or {})}
        return super().create_initialization_options(notification_options, experimental, extensions)


def principal_of(ctx: ServerRequestContext[Any, Any]) -> Principal:
    """The principal the gateway attached to this request (every MCP request passes the gateway)."""
    principal = ctx.request.scope.get(PRINCIPAL) if ctx.request is not None else None
    if not isinstance(principal, Principal):
        raise RuntimeError("MCP request without an authenticated principal")
    return principal


@dataclass(frozen=True)
class ToolOutcome:
    """What one tools/call answers: the text content, and the JSON object unless it failed (with
    its JSON text, encoded once: the text content and the structured content are the same bytes)."""

    text: str
    structured: dict[str, Any] | None
    encoded: bytes | None = None

    @property
    def is_error(self) -> bool:
        return self.structured is None

    def result(self) -> types.CallToolResult:
        return types.CallToolResult(content=[types.TextContent(text=self.text)], structured_content=self.structured,
                                    is_error=self.is_error)

    def answer(self, request_id: int | str) -> bytes:
        """The JSON-RPC answer to request `request_id`, in the shape the SDK writes a
        `CallToolResult`, with the structured content spliced in as already encoded."""
        result: dict[str, Any] = {"content": [{"type": "text", "text": self.text}], "isError": self.is_error}
        if self.encoded is not None:
            result["structuredContent"] = msgspec.Raw(self.encoded)
        return msgspec.json.encode({"jsonrpc": "2.0", "id": request_id, "result": result})


def tool_result(answer: dict[str, Any]) -> ToolOutcome:
    encoded = msgspec.json.encode(answer)
    return ToolOutcome(encoded.decode(), answer, encoded)


def tool_failure(code: str, message: str) -> ToolOutcome:
    return ToolOutcome(f"{code}: {message}", None)


def call_tool(services: Services, principal: Principal, name: str, arguments: dict[str, Any] | None) -> ToolOutcome:
    """One tools/call as the principal, in the calling (worker) thread: the verb's scope check,
    its arguments, the application."""
    verb = VERBS.get(name)
    if verb is None or name not in principal.endpoint.verbs:
        return tool_failure("forbidden", f"tool {name} is not granted to endpoint {principal.endpoint.slug}")
    try:
        return tool_result(verb.run(services, principal.caller, parse_arguments(verb, arguments)))
    except Exception as error:  # every failure is a tool error; unexpected ones are logged as internal
        return tool_failure(*tool_error(error, verb=name))


async def run_tool(services: Services, threads: Executor, principal: Principal, name: str,
                   arguments: dict[str, Any] | None) -> ToolOutcome:
    """`call_tool` on `threads`."""
    return await asyncio.get_running_loop().run_in_executor(
        threads, partial(call_tool, services, principal, name, arguments))


def build_server(services: Services, registry: SessionRegistry, threads: Executor,
                 listens: Listens | None = None) -> SwitchboardServer:
    """The SDK server whose handlers adapt MCP calls to the application (run on `threads`)."""
    listens = listens if listens is not None else Listens(registry)

    async def list_tools(ctx: ServerRequestContext[Any, Any], params: Any) -> types.ListToolsResult:
        verbs = principal_of(ctx).endpoint.verbs
        return types.ListToolsResult(tools=[
            types.Tool(name=name, description=VERBS[name].description, input_schema=INPUT_SCHEMAS[name])
            for name in verbs if name in VERBS
        ])

    async def call_tool(ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams) -> types.CallToolResult:
        outcome = await run_tool(services, threads, principal_of(ctx), params.name, params.arguments)
        return outcome.result()

    async def list_resources(ctx: ServerRequestContext[Any, Any], params: Any) -> types.ListResourcesResult:
        return list_queues(principal_of(ctx).endpoint)

    async def read_resource(ctx: ServerRequestContext[Any, Any], params: types.ReadResourceRequestParams,
                            ) -> types.ReadResourceResult:
        return await read_queue(services, threads, principal_of(ctx), params.uri)

    async def listen(ctx: ServerRequestContext[Any, Any], params: types.SubscriptionsListenRequestParams,
                     ) -> types.SubscriptionsListenResult:
        return await listens.listen(ctx, params, principal_of(ctx).endpoint)

    server = SwitchboardServer(
        SERVER_NAME, version=VERSION, instructions=INSTRUCTIONS, on_list_tools=list_tools, on_call_tool=call_tool,
        on_list_resources=list_resources, on_read_resource=read_resource, on_subscriptions_listen=listen,
        # the stateless era checks a call's Mcp-Param-* headers against the tool's schema: from the
        # table, not from a tools/list run for each call
        get_tool_input_schema=INPUT_SCHEMAS.get,
    )
    server.middleware.append(registry.remember_peer)
    return server
