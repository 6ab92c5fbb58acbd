"""Request hygiene (CONTRACT §12): one ASGI guard in front of every route, whatever HTTP parser
uvicorn runs (h11 or httptools), since it sees only the ASGI scope and messages.

- a header block over 64 KiB → 431, before any body is read;
- a body not fully received within the body timeout (SWITCHBOARD_BODY_TIMEOUT, 30 s) → 408, and
  the route never runs, so nothing is stored.

The guard reads the body itself (at most what the route accepts; the route's own size check
stays the route's), then hands the app the same messages. JSON nesting is checked after
authentication, by the API router and the MCP gateway (interfaces/json_depth.py).
See docs/adr/0015-running-it-for-real.md.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from interfaces.http.ingest import MAX_BODY as INGEST_MAX_BODY
from interfaces.mcp.wire import MAX_BODY as MCP_MAX_BODY

MAX_HEADER_BYTES = 64 * 1024
# The guard buffers no more than the route accepts: past that it hands over what it has and the
# route refuses the rest by its own size check (413), as early as it would without the guard —
# a declared length over the limit is never waited for.
BUFFER_LIMIT = 10 * 1024 * 1024  # Litestar's default request_max_body_size
ROUTE_LIMITS = ((b"/webhooks/w/", INGEST_MAX_BODY), (b"/mcp/", MCP_MAX_BODY))
BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def header_bytes(scope: dict[str, Any]) -> int:
    """The size of the request's header block as sent: request line and `name: value\\r\\n` lines."""
    line = (len(scope.get("method", "")) + len(scope.get("raw_path") or b"") + len(scope.get("query_string", b""))
            + len(" ? HTTP/1.1\r\n"))
    return line + sum(len(name) + len(value) + 4 for name, value in scope.get("headers", ()))


async def _refuse(send, status: int, code: str, message: str) -> None:
    body = json.dumps({"error": message, "code": code}).encode()
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ]})
    await send({"type": "http.response.body", "body": body})


class RequestGuard:
    """The ASGI middleware; `body_timeout` in seconds."""

    def __init__(self, app, *, body_timeout: float) -> None:
        self.app = app
        self.body_timeout = body_timeout

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if header_bytes(scope) > MAX_HEADER_BYTES:
            return await _refuse(send, 431, "headers_too_large",
                                 f"request header block over {MAX_HEADER_BYTES // 1024} KiB")
        if scope["method"] not in BODY_METHODS:
            return await self.app(scope, receive, send)
        limit = _limit(scope)
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            return await self.app(scope, receive, send)  # the route refuses it by its size, unread
        try:
            async with asyncio.timeout(self.body_timeout):  # no task per request, unlike wait_for before 3.12
                messages = await _buffer(receive, limit)
        except TimeoutError:
            return await _refuse(send, 408, "request_timeout",
                                 f"request body not received within {self.body_timeout:g} s")

        async def replay():
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)


def _limit(scope) -> int:
    path = scope.get("raw_path") or scope.get("path", "").encode()
    return next((limit for prefix, limit in ROUTE_LIMITS if path.startswith(prefix)), BUFFER_LIMIT)


async def _buffer(receive, limit: int) -> list[dict]:
    """The body's messages, whole or until they pass `limit` bytes."""
    messages, size = [], 0
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            return messages  # the client left: the app sees the disconnect
        size += len(message.get("body", b""))
        if not message.get("more_body", False) or size > limit:
            return messages


def _content_length(scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            return int(value) if value.strip().isdigit() else None
    return None


def request_guard(body_timeout: float):
    """The guard as a Litestar middleware factory."""
    return lambda app: RequestGuard(app, body_timeout=body_timeout)
