"""A request body read whole from ASGI `receive`, up to a limit: the ingest route and the MCP
gateway read theirs this way (the request guard, interfaces/http/hygiene.py, has buffered the
messages already; a route only joins them)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any


class BodyTooLarge(Exception):
    """The body passed the limit (what was read of it is dropped)."""


async def read_body(receive: Callable[[], Awaitable[Any]], limit: int) -> tuple[bytes, Any]:
    """The body (at most `limit` bytes, else `BodyTooLarge`) and, if the client left before it
    was whole, the message that said so (else None); the body is then what came before it."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks), message
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks), None
