"""The doorbell for the stateless era: `subscriptions/listen` streams rung by the one doorbell
(CONTRACT §16, docs/adr/0041-the-doorbell-over-listen.md).

A 2026-07-28 client opens `subscriptions/listen` for some of its queue resources
(`switchboard://queues/{queue}`, interfaces/mcp/resources.py); the request's response is the
stream. Each open stream is a `Listener`: a doorbell target in the session registry beside the
endpoint's handshake sessions, so the doorbell (interfaces/mcp/doorbell.py) chooses between both
kinds in one rotation, rings one target per todo on the same schedule, never across endpoints,
and takes each ring once across processes as before. Ringing a listener sends
`notifications/resources/updated` with the queue's URI on its stream.

The stream itself is the SDK's `ListenHandler` (the acknowledgment first, the subscription id on
every frame, a bounded backlog, the graceful close), given one `Listener` as its
`SubscriptionBus`: the bus of one stream, whose `subscribe` is the moment the stream opens (the
listener joins the registry and is rung on attach) and whose `publish` is a ring. The SDK's
in-memory bus fans every event out to every stream; the doorbell must reach exactly one.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import anyio.lowlevel
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.subscriptions import ListenHandler, ResourceUpdated, ServerEvent
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR

from domain.endpoint import Endpoint
from interfaces.mcp.resources import queue_of, queue_uri
from interfaces.mcp.sessions import SessionRegistry
from interfaces.store.rings import DueRing

MAX_LISTENERS = 1024
"""Open listen streams one process holds at most (a further listen is refused before its ack)."""
BACKLOG = 16
"""Rings one stream may have unsent (as a GET stream's buffer): a stream whose client stopped
reading is ended at the cap by the SDK; the client re-listens and reads its queues again."""
ID_PREFIX = "listen-"


@dataclass(eq=False)
class Listener:
    """One open listen stream of one endpoint, for some of its queues; the `SubscriptionBus` of
    that one stream."""

    transport: ClassVar[str] = "listen"
    session_id: str
    endpoint_id: str
    slug: str
    queues: tuple[str, ...]
    registry: SessionRegistry
    attached: Callable[[Listener], None] | None = None
    opened_at: float = field(default_factory=time.monotonic)
    handler: ListenHandler | None = None
    _deliver: Callable[[ServerEvent], None] | None = None

    @property
    def has_stream(self) -> bool:
        return self._deliver is not None

    @property
    def ready(self) -> bool:
        return self._deliver is not None

    async def ring(self, ring: DueRing) -> bool:
        """Rings the stream: `notifications/resources/updated` for the ring's queue."""
        if self._deliver is None:
            return False
        await self.publish(ResourceUpdated(uri=queue_uri(ring.queue)))
        return True

    def end(self) -> None:
        """Ends the stream gracefully (its result is the last frame): revocation, shutdown."""
        if self.handler is not None:
            self.handler.close()

    # -- SubscriptionBus (mcp.server.subscriptions), for the one stream this listener is --------

    async def publish(self, event: ServerEvent) -> None:
        deliver = self._deliver
        if deliver is not None:
            deliver(event)
        await anyio.lowlevel.checkpoint()

    def subscribe(self, listener: Callable[[ServerEvent], None]) -> Callable[[], None]:
        """The stream opens (before its acknowledgment is written, so a ring meanwhile waits in
        its backlog): it joins the endpoint's doorbell targets and is rung on attach."""
        self._deliver = listener
        self.registry.listening(self)
        if self.attached is not None:
            self.attached(self)

        def unsubscribe() -> None:
            self._deliver = None
            self.registry.closed(self.session_id)

        return unsubscribe


class Listens:
    """Serves `subscriptions/listen` (the low-level server's `on_subscriptions_listen`, through
    interfaces/mcp/server.py, which passes the request's endpoint)."""

    def __init__(self, registry: SessionRegistry, *, limit: int = MAX_LISTENERS) -> None:
        self.registry = registry
        self.limit = limit
        self.attached: Callable[[Listener], None] | None = None
        """The doorbell's `attach` (ring on attach), set by the gateway when it runs a doorbell."""

    async def listen(self, ctx: ServerRequestContext[Any, Any], params: types.SubscriptionsListenRequestParams,
                     endpoint: Endpoint) -> types.SubscriptionsListenResult:
        """One listen stream, until the client leaves or the stream is ended. Every URI must be a
        queue resource of the endpoint's scope (else -32602 before the ack, nothing opened); only
        the queue resources are honored (the ack says so): no other change is ever announced."""
        uris = list(params.notifications.resource_subscriptions or ())
        queues = tuple(dict.fromkeys(queue_of(uri, endpoint) for uri in uris))
        if len(self.registry.listeners()) >= self.limit:
            raise MCPError(INTERNAL_ERROR, "Subscription limit reached")
        listener = Listener(ID_PREFIX + secrets.token_hex(12), endpoint.endpoint_id, endpoint.slug, queues,
                            self.registry, self.attached)
        listener.handler = ListenHandler(listener, max_subscriptions=1, max_buffered_events=BACKLOG)
        honored = params.model_copy(update={
            "notifications": types.SubscriptionFilter(resource_subscriptions=list(dict.fromkeys(uris)) or None)})
        return await listener.handler(ctx, honored)
