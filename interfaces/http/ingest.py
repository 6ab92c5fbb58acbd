"""`POST /webhooks/w/{token}` (CONTRACT §4): rate limit, size, token, signature, routing.

The blocking work (store, rule worker) runs in a worker thread, never on the event loop. A
refusal (429, 413, 404, 401, 503) happens before anything is appended, so it stores nothing.
"""

from __future__ import annotations

import math
import threading
import time

import anyio
from litestar import MediaType, Request, Response, post
from litestar.params import FromPath

from application.webhooks import Webhooks
from interfaces.http.errors import error_response

MAX_BODY = 5 * 1024 * 1024


class TokenBuckets:
    """A token bucket per client address: `rate` requests/s with bursts of `burst`; 0 disables.

    Process-local by design: with N processes behind a balancer a client gets up to N times the
    rate (docs/adr/0008-ingest.md).
    """

    def __init__(self, rate: float, burst: int, *, clock=time.monotonic, max_clients: int = 100_000) -> None:
        self.rate = rate
        self.burst = max(burst, 1)
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()
        self._max_clients = max_clients

    def take(self, client: str) -> float:
        """0 when admitted, else the seconds until a token is available."""
        return self._use(client, take=True)

    def wait(self, client: str) -> float:
        """Like `take`, without taking: 0 when a token is there, else the seconds until one is."""
        return self._use(client, take=False)

    def _use(self, client: str, *, take: bool) -> float:
        if self.rate <= 0:
            return 0.0
        now = self._clock()
        with self._lock:
            tokens, stamp = self._buckets.get(client, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - stamp) * self.rate)
            admitted = tokens >= 1.0
            if take:
                self._remember(client, tokens - 1.0 if admitted else tokens, now)
            return 0.0 if admitted else (1.0 - tokens) / self.rate

    def _remember(self, client: str, tokens: float, now: float) -> None:
        if len(self._buckets) >= self._max_clients and client not in self._buckets:
            full = [c for c, (t, s) in self._buckets.items() if t + (now - s) * self.rate >= self.burst]
            for c in full or list(self._buckets)[: self._max_clients // 10]:
                del self._buckets[c]
        self._buckets[client] = (tokens, now)


def ingest_route(webhooks: Webhooks, buckets: TokenBuckets):
    """The ingest handler, closed over the application it calls."""

    @post("/webhooks/w/{token:str}", status_code=202, media_type=MediaType.JSON, request_max_body_size=None,
          include_in_schema=False)
    async def ingest(request: Request, token: FromPath[str]) -> Response:
        client = request.client.host if request.client else "unknown"
        wait = buckets.take(client)
        if wait > 0:
            return error_response("rate limit exceeded", "rate_limited",
                                  headers={"Retry-After": str(max(1, math.ceil(wait)))})
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > MAX_BODY:
            return error_response("payload too large", "payload_too_large")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > MAX_BODY:
                return error_response("payload too large", "payload_too_large")
            chunks.append(chunk)
        body = b"".join(chunks)
        headers = {name.lower(): value for name, value in request.headers.items()}
        answer = await anyio.to_thread.run_sync(
            lambda: webhooks.ingest(token, headers, body, remote_addr=client)
        )
        return Response(answer, status_code=202, media_type=MediaType.JSON)

    return ingest
