"""Per-client token buckets: the ingest rate limit (CONTRACT §1) and the board's failed sign-ins."""

from __future__ import annotations

import threading
import time

from litestar.connection import ASGIConnection


def client_address(connection: ASGIConnection) -> str:
    """The key of a client's bucket: its address as the server sees it (behind a proxy, uvicorn's
    --forwarded-allow-ips decides whether that is the proxy's or the client's)."""
    return connection.client.host if connection.client else "unknown"


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
