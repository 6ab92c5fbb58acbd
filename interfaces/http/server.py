"""`switchboard serve`: check settings, connect, bootstrap the admin, run HTTP and background work."""

from __future__ import annotations

import logging
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType

import uvicorn

from application.errors import ConfigurationError, StoreUnavailable
from interfaces.bootstrap import Background, build
from interfaces.settings import Settings, write_private


HTTP_STACK = {"http": "httptools", "loop": "uvloop"}
"""uvicorn's HTTP parser and event loop for `serve`, named rather than left to uvicorn's "auto" (which
picks whatever happens to be installed); every bench reference runs on the same. httptools on
uvloop against h11 on asyncio: ingest x1.4, MCP x1.05 in one run (bench/http_stack.py, ADR 7)."""


class _Stopped(Exception):
    """SIGINT or SIGTERM: uvicorn stops gracefully, restores these handlers, then re-raises the signal."""


def _raise_stopped(signum: int, frame: object) -> None:
    raise _Stopped(signum)


class _Uvicorn(uvicorn.Server):
    """Tells the app the moment a stop is asked for, before uvicorn waits for open connections:
    the MCP gateway then ends its sessions, so their GET streams close cleanly and at once."""

    def __init__(self, config: uvicorn.Config, on_exit: Callable[[], None]) -> None:
        super().__init__(config)
        self._on_exit = on_exit

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self._on_exit()
        super().handle_exit(sig, frame)


def serve(settings: Settings) -> int:
    """Runs until interrupted; a bad setting or an unreachable store is one line and exit 1."""
    try:
        settings.check()
        container = build(settings)
    except (ConfigurationError, StoreUnavailable) as error:
        print(f"switchboard: {error}", file=sys.stderr)
        return 1
    background = None
    try:
        settings.resolved_secret_key()
        password = container.app.ensure_admin()
        if password is not None:
            path = Path(settings.data_dir) / "admin-password"
            write_private(path, password + "\n")
            print(f"created operator admin with password: {password}  (also in {path}, mode 0600)", flush=True)
        background = Background(container, projector_process=True).start()
        from interfaces.http.app import create_app

        def announce() -> None:
            print(f"switchboard serving on http://{settings.host}:{settings.port}  board: {settings.base_url}/", flush=True)

        app = create_app(container, on_startup=[announce])
        logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        config = uvicorn.Config(
            app, host=settings.host, port=settings.port, log_level="warning", timeout_graceful_shutdown=3,
            lifespan="on", **HTTP_STACK,
        )
        def stopping() -> None:  # end MCP sessions and board streams, so open connections close at once
            app.state.mcp.stopping()
            app.state.feed.close()

        server = _Uvicorn(config, on_exit=stopping)
        try:
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, _raise_stopped)
            server.run()
        except _Stopped:  # a graceful stop by signal: clean up below, exit 0, no traceback
            return 0
        except SystemExit as stop:  # uvicorn exits 3 when it cannot bind; a refused start is 1 here
            return 1 if stop.code else 0
        return 0 if server.started else 1
    finally:
        if background is not None:
            background.close()
        container.close()
