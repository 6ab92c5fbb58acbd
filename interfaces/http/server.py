"""`switchboard serve`: check settings, connect, bootstrap the admin, run HTTP and background work."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import uvicorn

from application.errors import ConfigurationError, StoreUnavailable
from interfaces.bootstrap import Background, build
from interfaces.settings import Settings, write_private


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
        background = Background(container).start()
        from interfaces.http.app import create_app

        app = create_app(container)
        print(f"switchboard serving on http://{settings.host}:{settings.port}  board: {settings.base_url}/", flush=True)
        logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        config = uvicorn.Config(
            app, host=settings.host, port=settings.port, log_level="warning", timeout_graceful_shutdown=3,
            lifespan="on",
        )
        server = uvicorn.Server(config)
        server.run()
        return 0 if server.started else 1
    finally:
        if background is not None:
            background.close()
        container.close()
