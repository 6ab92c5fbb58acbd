"""The Litestar application, composed once from a built container (no import-time state)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from litestar import Litestar, MediaType, Response, get

from domain.endpoint import EndpointRevoked
from domain.todo import LeaseExpired, TodoOpened, TodoReleased, TodoRequeued
from interfaces.bootstrap import Container
from interfaces.http.errors import EXCEPTION_HANDLERS
from interfaces.http.ingest import TokenBuckets, ingest_route
from interfaces.mcp import McpGateway, Services, mcp_route
from interfaces.mcp.doorbell import Doorbell
from interfaces.store.rings import SqlRings
from interfaces.version import VERSION

# Events after which a todo may be pending: only they wake the doorbell's scan.
MAKES_PENDING = (TodoOpened, TodoReleased, LeaseExpired, TodoRequeued)


def create_app(container: Container, *, on_startup: Sequence[Callable[[], None]] = ()) -> Litestar:
    """Builds the HTTP app around an already-built container."""

    @get("/healthz", media_type=MediaType.TEXT, sync_to_thread=True)
    def healthz() -> Response[str]:
        if not container.store.db.ping(timeout=2.0):
            return Response("store down", status_code=503, media_type=MediaType.TEXT)
        return Response(f"ok {VERSION}", media_type=MediaType.TEXT)

    settings = container.settings
    buckets = TokenBuckets(settings.ingest_rate, settings.ingest_burst)
    store = container.store
    listen = (store.url.conninfo(), store.recorder.channel_name) if store.url.dialect == "postgres" else None
    mcp = McpGateway(
        Services(container.app, container.webhooks), base_url=settings.base_url,
        doorbell=lambda registry: Doorbell(registry, SqlRings(store.db), container.clock, listen=listen),
    )
    doorbell = mcp.doorbell

    def on_commit(recorded) -> None:
        if any(isinstance(r.event, MAKES_PENDING) for r in recorded):
            doorbell.wake()  # a local todo became claimable: scan at once, not at the next poll
        if any(isinstance(r.event, EndpointRevoked) for r in recorded):
            mcp.revocation_seen()  # end that endpoint's sessions and streams at once

    store.subscribe(on_commit)
    app = Litestar(
        route_handlers=[healthz, ingest_route(container.webhooks, buckets), mcp_route(mcp)],
        exception_handlers=EXCEPTION_HANDLERS, openapi_config=None, on_startup=list(on_startup),
        lifespan=[mcp.lifespan],  # the MCP session manager runs once, for the app's lifetime
    )
    app.state.mcp = mcp
    return app
