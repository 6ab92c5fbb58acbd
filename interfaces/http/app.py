"""The Litestar application, composed once from a built container (no import-time state)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from litestar import Litestar, MediaType, Response, get

from interfaces.bootstrap import Container
from interfaces.version import VERSION


def create_app(container: Container, *, on_startup: Sequence[Callable[[], None]] = ()) -> Litestar:
    """Builds the HTTP app around an already-built container."""

    @get("/healthz", media_type=MediaType.TEXT, sync_to_thread=True)
    def healthz() -> Response[str]:
        if not container.store.db.ping(timeout=2.0):
            return Response("store down", status_code=503, media_type=MediaType.TEXT)
        return Response(f"ok {VERSION}", media_type=MediaType.TEXT)

    return Litestar(route_handlers=[healthz], openapi_config=None, on_startup=list(on_startup))
