"""The Litestar application, composed once from a built container (no import-time state)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from pathlib import Path
from urllib.parse import quote

from litestar import Litestar, MediaType, Request, Response, get
from litestar.openapi import OpenAPIConfig
from litestar.openapi.plugins import JsonRenderPlugin
from litestar.openapi.spec import Components, SecurityScheme
from litestar.exceptions import HTTPException
from litestar.logging import LoggingConfig
from litestar.response import Redirect
from litestar.static_files import create_static_files_router

from domain.endpoint import EndpointRevoked
from domain.doorbell import doorbell_news
from interfaces.bootstrap import Container
from application.feed import TransitionFeed
from interfaces.http.api import api_router
from interfaces.http.auth import BoardRedirect, SessionCodec, add_security_headers
from interfaces.http.board import NOT_BOARD, Board, board_routes
from interfaces.http.errors import EXCEPTION_HANDLERS, http_error_handler
from interfaces.http.hygiene import request_guard
from interfaces.http.ingest import ingest_route
from interfaces.http.ratelimit import TokenBuckets
from interfaces.http.metrics import metrics_route
from interfaces.logs import LOG_FORMAT
from interfaces.mcp import McpGateway, Services, mcp_route
from interfaces.mcp.doorbell import Doorbell
from interfaces.store.queues import SqlQueueLoad
from interfaces.store.rings import SqlRings
from interfaces.version import VERSION

HERE = Path(__file__).parent


def to_login(request: Request, error: BoardRedirect) -> Response:
    """A board page without a signed-in operator: sign in first, then come back."""
    target = error.next_path if error.next_path.startswith("/") and not error.next_path.startswith("//") else "/"
    return Redirect(f"/login?next={quote(target)}", status_code=303)


def openapi_config() -> OpenAPIConfig:
    """The operator API's schema at `/schema/openapi.json` (only `/api/v1` is in it)."""
    return OpenAPIConfig(
        title="Switchboard operator API", version=VERSION, path="/schema", render_plugins=[JsonRenderPlugin()],
        components=Components(security_schemes={
            "operatorToken": SecurityScheme(type="http", scheme="bearer", description="an `sbo_` operator API token"),
            "boardSession": SecurityScheme(
                type="apiKey", security_scheme_in="cookie", name="sb_session",
                description="the board session cookie; unsafe methods also need the X-CSRF-Token header",
            ),
        }),
    )


def litestar_logging() -> LoggingConfig:
    """Litestar's own `litestar` logger in the one LOG_FORMAT; the root logger is left to the process
    (`interfaces.logs.configure_logging`): Litestar's default replaces the root's handlers with its
    own format at INFO, so `serve` printed two formats (its lines and the projector child's)."""
    return LoggingConfig(configure_root_logger=False, formatters={"standard": {"format": LOG_FORMAT}})


# Deliveries prepared at once on threads in one process: those that must read the store, ask the
# rule engine or parse a large body (docs/adr/0032; the others are prepared on the event loop,
# and none holds a thread while it waits for the writer's commit). More queue for a thread; the
# other blocking handlers keep anyio's own threads, so ingest cannot starve the board or the API.
INGEST_THREADS = 32


def create_app(container: Container, *, on_startup: Sequence[Callable[[], None]] = ()) -> Litestar:
    """Builds the HTTP app around an already-built container."""

    @get("/healthz", media_type=MediaType.TEXT, sync_to_thread=True, include_in_schema=False)
    def healthz() -> Response[str]:
        if not container.store.db.ping():
            return Response("store down", status_code=503, media_type=MediaType.TEXT)
        return Response(f"ok {VERSION}", media_type=MediaType.TEXT)

    settings = container.settings
    buckets = TokenBuckets(settings.ingest_rate, settings.ingest_burst)
    ingest_threads = ThreadPoolExecutor(max_workers=INGEST_THREADS, thread_name_prefix="switchboard-ingest")
    store = container.store
    listen = ((store.url.conninfo(application_name="switchboard-doorbell"), store.recorder.channel_name)
              if store.url.dialect == "postgres" else None)
    mcp = McpGateway(
        Services(container.app, container.webhooks), base_url=settings.base_url,
        doorbell=lambda registry: Doorbell(registry, SqlRings(store.db), container.clock, listen=listen,
                                           queues=SqlQueueLoad(store.db)),
    )
    doorbell = mcp.doorbell

    feed = TransitionFeed(store)

    def on_commit(recorded) -> None:
        feed.wake()  # the board's live view: read the log now, not at the next poll
        doorbell.heard(doorbell_news([r.event for r in recorded]))  # scan at once, not at the next poll
        if any(isinstance(r.event, EndpointRevoked) for r in recorded):
            mcp.revocation_seen()  # end that endpoint's sessions and streams at once

    store.subscribe(on_commit)
    board = Board(container)

    def http_error(request: Request, error: HTTPException) -> Response:
        """No route: a browser's GET of a board path gets an HTML page; anything else the JSON error body."""
        if (error.status_code == 404 and request.method in ("GET", "HEAD")
                and not request.url.path.startswith(NOT_BOARD)):
            return board.not_found(request)
        return http_error_handler(request, error)

    route_handlers = [
        healthz, ingest_route(container.webhooks, buckets, ingest_threads), mcp_route(mcp),
        create_static_files_router(path="/static", directories=[HERE / "static"], include_in_schema=False),
        metrics_route(container),
        api_router(container.app, container.webhooks, feed, container.audit),
        *board_routes(container, board),
    ]
    app = Litestar(
        route_handlers=route_handlers,
        exception_handlers={**EXCEPTION_HANDLERS, HTTPException: http_error, BoardRedirect: to_login},
        openapi_config=openapi_config(), logging_config=litestar_logging(), on_startup=list(on_startup),
        # the feed's tailer ends before the store can close under it (application/feed.py)
        on_shutdown=[lambda: feed.close(), lambda: ingest_threads.shutdown(wait=True, cancel_futures=True)],
        lifespan=[mcp.lifespan],  # the MCP session manager runs once, for the app's lifetime
        before_send=[add_security_headers],
        middleware=[request_guard(settings.body_timeout)],  # 431, 408, JSON depth: before any route
    )
    app.state.mcp = mcp
    app.state.feed = feed
    app.state.switchboard = container.app
    app.state.sessions = SessionCodec(
        settings.resolved_secret_key(), secure=settings.base_url.startswith("https://"),
    )
    return app
