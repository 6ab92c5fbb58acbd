"""`POST /webhooks/w/{token}` (CONTRACT §4): rate limit, size, token, signature, routing.

A delivery decided on kept copies (docs/adr/0031) is verified, parsed and routed on the event
loop, and its commit is awaited (docs/adr/0032). Work that would wait (a read of the store, the
rule engine, a body over 64 KiB to parse) runs on a worker thread instead, never on the loop: a
plain executor of the app's, not `anyio.to_thread` (80 µs of CPU a call against 26, measured).
A refusal (429, 413, 404, 401, 503) happens before anything is appended, so it stores nothing;
so does a sender's verified handshake (Slack's `url_verification`), answered 200 `{"challenge"}`.

The handler asks Litestar for the request alone (the token is read from its path parameters),
reads the body from `receive` itself and answers an `ASGIResponse` of bytes it encoded: no
path parameter to validate, no `Request.stream` generator, no `Response` to convert. Half of what
the route cost the event loop per delivery, measured in-process (docs/adr/0032). A plain ASGI mount
would cost less still, but Litestar matches a mount's path as a bare prefix: one at `/webhooks/w`
would also take the board's `/webhooks/wh_…` pages.
"""

from __future__ import annotations

import asyncio
import math
from concurrent.futures import Executor

import msgspec
from litestar import MediaType, Request, post
from litestar.exceptions import InternalServerException
from litestar.response.base import ASGIResponse

from application.webhooks import Webhooks
from interfaces.asgi_body import BodyTooLarge, read_body
from interfaces.http.errors import error_response
from interfaces.http.ratelimit import TokenBuckets, client_address

MAX_BODY = 5 * 1024 * 1024


def _refusal(request: Request, message: str, code: str, headers: dict[str, str] | None = None) -> ASGIResponse:
    """The error every route answers (`error_response`), as the handler's one response type: a
    refusal is rare, only the 202 needs to be cheap."""
    return error_response(message, code, headers=headers).to_asgi_response(None, request)


def ingest_route(webhooks: Webhooks, buckets: TokenBuckets, executor: Executor):
    """The ingest handler, closed over the application it calls and the threads it runs on."""

    def offload(work):
        return asyncio.get_running_loop().run_in_executor(executor, work)

    @post("/webhooks/w/{token:str}", status_code=202, media_type=MediaType.JSON, request_max_body_size=None,
          include_in_schema=False)
    async def ingest(request: Request) -> ASGIResponse:
        client = client_address(request)
        wait = buckets.take(client)
        if wait > 0:
            return _refusal(request, "rate limit exceeded", "rate_limited",
                            {"Retry-After": str(max(1, math.ceil(wait)))})
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > MAX_BODY:
            return _refusal(request, "payload too large", "payload_too_large")
        try:
            body, gone = await read_body(request.receive, MAX_BODY)
        except BodyTooLarge:
            return _refusal(request, "payload too large", "payload_too_large")
        if gone is not None:  # as `Request.stream` says it
            raise InternalServerException("client disconnected prematurely")
        answer = await webhooks.ingest_async(request.path_params["token"], request.headers, body,  # lowers the names
                                             remote_addr=client, offload=offload)
        status = 200 if "challenge" in answer else 202  # a sender's handshake is answered, not accepted
        return ASGIResponse(body=msgspec.json.encode(answer), status_code=status, media_type=MediaType.JSON)

    return ingest
