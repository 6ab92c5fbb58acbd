"""What every resource module of the operator API shares: the JSON value type of its bodies, the
worker-thread call of an application method, and the error answers documented on every route."""

from __future__ import annotations

from typing import Any

import anyio.to_thread
import msgspec
from litestar.openapi import ResponseSpec
from litestar.openapi.spec import SecurityRequirement

Json = Any  # any JSON value
SECURITY: list[SecurityRequirement] = [{"operatorToken": []}, {"boardSession": []}]


class ErrorBody(msgspec.Struct):
    """Every error answer (CONTRACT §3); `code` is the error table's (interfaces/http/errors.py)."""

    error: str
    code: str


# Documented on every route, replacing Litestar's default 400 schema (`{status_code, detail}`),
# which is not what the error handlers send.
ERROR_RESPONSES = {
    status: ResponseSpec(data_container=ErrorBody, description=description, generate_examples=False)
    for status, description in (
        (400, "Invalid input"), (401, "No valid operator token or board session"),
        (403, "Forbidden, or the board session's X-CSRF-Token header is missing or wrong"),
        (404, "Not found (another operator's ids too)"), (409, "Conflict with the current state"),
        (413, "Request body too large"), (422, "The request does not fit the schema (fields named)"),
    )
}


async def run(fn, *args, **kwargs):
    """An application method called in a worker thread (it reads and writes the store)."""
    return await anyio.to_thread.run_sync(lambda: fn(*args, **kwargs))
