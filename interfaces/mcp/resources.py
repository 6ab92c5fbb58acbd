"""An endpoint's queues as MCP resources (CONTRACT §16, docs/adr/0041-the-doorbell-over-listen.md).

Each queue in an endpoint's scope is the resource `switchboard://queues/{queue}`, listed by
`resources/list` and read by `resources/read` in both eras: `{queue, pending, oldest: [{id,
title, created_at}…]}` (JSON text), what is claimable in it now. A stateless-era client listens
for those URIs (interfaces/mcp/listeners.py) and is rung with `notifications/resources/updated`.

A URI that is not a queue resource, or names a queue outside the endpoint's scope (another
endpoint's queue reads exactly like one that does not exist), is refused with JSON-RPC `-32602`
(invalid params, as the SDK answers an unknown resource: SEP-2164) and `data.uri`; nothing runs.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import Executor
from functools import partial
from typing import Any

import mcp_types as types
import msgspec
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR, INVALID_PARAMS

from application.errors import StoreUnavailable
from domain.endpoint import Endpoint
from domain.errors import InvalidArgument, NotFound
from domain.names import QUARANTINE, check_queue_name
from interfaces.mcp.tools import Services

SCHEME = "switchboard://queues/"
MIME = "application/json"
UNKNOWN = "Unknown resource"
MALFORMED = "Malformed resource URI: give switchboard://queues/{queue}"


def queue_uri(queue: str) -> str:
    return SCHEME + queue


def refused(message: str, uri: object) -> MCPError:
    """The one refusal of a resource URI (resources/read, subscriptions/listen): -32602."""
    return MCPError(INVALID_PARAMS, message, {"uri": uri})


def queue_of(uri: object, endpoint: Endpoint) -> str:
    """The queue a resource URI names, if it is in the endpoint's scope; else the refusal."""
    if not isinstance(uri, str) or not uri.startswith(SCHEME):
        raise refused(MALFORMED, uri)
    queue = uri[len(SCHEME):]
    try:
        check_queue_name(queue, allow_quarantine=True)
    except InvalidArgument:
        raise refused(MALFORMED, uri) from None
    if queue == QUARANTINE or queue not in endpoint.queues:
        raise refused(UNKNOWN, uri)
    return queue


def list_queues(endpoint: Endpoint) -> types.ListResourcesResult:
    return types.ListResourcesResult(resources=[
        types.Resource(uri=queue_uri(queue), name=queue, title=f"queue {queue}", mime_type=MIME,
                       description=f"todos claimable now in queue {queue}: how many, and the oldest 10"
                                   " (subscriptions/listen for it to be rung when one becomes claimable)")
        for queue in endpoint.queues
    ])


def _read(services: Services, principal: Any, queue: str) -> dict[str, Any]:
    return services.app.queue_waiting(queue, caller=principal.caller)


async def read_queue(services: Services, threads: Executor, principal: Any, uri: str) -> types.ReadResourceResult:
    """`resources/read` of a queue resource, on `threads` (the store read)."""
    queue = queue_of(uri, principal.endpoint)
    try:
        answer = await asyncio.get_running_loop().run_in_executor(threads, partial(_read, services, principal, queue))
    except NotFound:  # the scope changed under the request
        raise refused(UNKNOWN, uri) from None
    except StoreUnavailable:
        raise MCPError(INTERNAL_ERROR, "unavailable: store down") from None
    return types.ReadResourceResult(contents=[
        types.TextResourceContents(uri=uri, mime_type=MIME, text=msgspec.json.encode(answer).decode())])
