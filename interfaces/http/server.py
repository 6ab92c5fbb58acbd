"""`switchboard serve`: check settings, connect, bootstrap the admin, run HTTP and background work."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import tempfile
from collections.abc import Callable
from itertools import takewhile
from pathlib import Path
from types import FrameType

import uvicorn

from application.errors import ConfigurationError, StoreUnavailable
from application.service import Caller
from interfaces.bootstrap import Background, build
from interfaces.logs import configure_logging
from interfaces.runtime import tune_gc
from interfaces.settings import Settings, write_new_private
from interfaces.store.database import DatabaseUrl

SERVE = Caller("system", "serve")
# Header blocks up to this size reach the app, which answers 431 above 64 KiB (interfaces/http/hygiene.py);
# uvicorn's h11 parser refuses larger ones itself (400), with no body to read.
H11_MAX_HEADER_BYTES = 1024 * 1024


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


def _strerror(error: OSError) -> str:
    return (error.strerror or str(error)).lower()  # "address already in use", "read-only file system"


def check_writable_dir(path: Path, what: str, created: list[Path]) -> None:
    """Creates the directory if need be and proves a file can be written in it (root ignores modes);
    the directories it made are added to `created`, outermost first."""
    missing = list(takewhile(lambda d: not d.exists(), (path, *path.parents)))
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ConfigurationError(f"cannot create {what} {path}: {_strerror(error)}") from None
    created.extend(reversed(missing))
    try:
        with tempfile.NamedTemporaryFile(dir=path, prefix=".switchboard-write-check-"):
            pass
    except OSError as error:
        raise ConfigurationError(f"cannot write {what} {path}: {_strerror(error)}") from None


def check_paths(settings: Settings, created: list[Path]) -> None:
    """The data dir, and the SQLite file with its directory (journal files live beside it), are
    writable; the directories this made are added to `created`."""
    check_writable_dir(Path(settings.data_dir), "data dir", created)
    url = DatabaseUrl.parse(settings.database_url)
    if url.dialect != "sqlite" or url.path in ("", ":memory:"):
        return
    path = Path(url.path)
    check_writable_dir(path.parent, "database directory", created)
    if path.exists():
        try:
            os.close(os.open(path, os.O_RDWR))
        except OSError as error:
            raise ConfigurationError(f"cannot write database file {path}: {_strerror(error)}") from None


def remove_empty(directories: list[Path]) -> None:
    """Removes the directories a refused start made, innermost first, each only if still empty."""
    for directory in reversed(directories):
        with contextlib.suppress(OSError):  # not empty (or already gone): what is in it stays
            directory.rmdir()


def listen(host: str, port: int) -> socket.socket:
    """Binds and listens before anything starts, so a taken port is one line, not uvicorn's error later."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)
            sock.listen(2048)
        except BaseException:
            sock.close()
            raise
    except OSError as error:
        raise ConfigurationError(f"cannot listen on {host}:{port}: {_strerror(error)}") from None
    return sock


def check_key_opens_secrets(settings: Settings, container) -> None:
    """The key opens every signing secret sealed in the store (never generating one that cannot)."""
    sealed = container.webhooks.sealed_webhooks()
    key_file = Path(settings.data_dir) / "secret-key"
    if sealed and settings.secret_key is None and not key_file.exists():
        raise ConfigurationError(
            f"{key_file} is missing and {len(sealed)} webhook signing secret(s) are sealed in the store:"
            " put the key back there or set SWITCHBOARD_SECRET_KEY to it")
    container.webhooks.check_secrets_open(sealed)


def uvicorn_config(app, settings: Settings, **options) -> uvicorn.Config:
    """How `serve` runs uvicorn (tests start the same configuration in-process, per HTTP parser).

    No access log: at `log_level="warning"` its INFO lines were never written, but uvicorn still
    built each one's arguments (the client address, the quoted path) on every response."""
    return uvicorn.Config(
        app, host=settings.host, port=settings.port, log_level="warning", access_log=False,
        timeout_graceful_shutdown=3, lifespan="on", h11_max_incomplete_event_size=H11_MAX_HEADER_BYTES,
        **{**HTTP_STACK, **options},
    )


def serve(settings: Settings) -> int:
    """Runs until interrupted; a bad setting, a taken port, an unwritable path or an unreachable
    store is one line and exit 1, before anything says "serving". The port is bound before any
    path is created, and a start refused before the store opens removes the directories it made."""
    sock = None
    created: list[Path] = []
    try:
        settings.check()
        sock = listen(settings.host, settings.port)
        check_paths(settings, created)
        container = build(settings)
    except (ConfigurationError, StoreUnavailable) as error:
        if sock is not None:
            sock.close()
        remove_empty(created)
        print(f"switchboard: {error}", file=sys.stderr)
        return 1
    background = None
    app = None
    try:
        try:
            check_key_opens_secrets(settings, container)
            settings.resolved_secret_key()  # a malformed key file: one line now, not at the first session
            # the admin's password hash (~0.5 s) before the first commit: what serve appends at start
            # is sealed by its sealer within 1 s (docs/adr/0022)
            password = container.app.ensure_admin()
            container.app.record_base_url(settings.base_url, caller=SERVE)
        except (ConfigurationError, StoreUnavailable) as error:
            print(f"switchboard: {error}", file=sys.stderr)
            return 1
        if password is not None:
            path = Path(settings.data_dir) / "admin-password"
            if write_new_private(path, password + "\n"):
                print(f"created operator admin with password: {password}  (also in {path}, mode 0600)", flush=True)
            else:  # another store's admin password: never overwritten
                print(f"created operator admin with password: {password}  (not written to {path}: it exists"
                      " already, from another store)", flush=True)
        if settings.clock_file is not None:  # a test hook: say so, every start (docs/operations.md)
            print(f"switchboard: the clock is wall time plus the seconds in {settings.clock_file}"
                  " (SWITCHBOARD_CLOCK_FILE, a test hook: not for production)", file=sys.stderr, flush=True)
        background = Background(container, projector_process=True).start()
        from interfaces.http.app import create_app

        def announce() -> None:
            print(f"switchboard serving on http://{settings.host}:{settings.port}  board: {settings.base_url}/", flush=True)

        app = create_app(container, on_startup=[announce])
        configure_logging()
        config = uvicorn_config(app, settings)
        def stopping() -> None:  # end MCP sessions and board streams, so open connections close at once
            app.state.mcp.stopping()
            app.state.feed.close(wait=False)  # the app's shutdown waits for its tailer

        server = _Uvicorn(config, on_exit=stopping)
        tune_gc()  # after start-up: what it left alive is never scanned again
        try:
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, _raise_stopped)
            server.run(sockets=[sock])
        except _Stopped:  # a graceful stop by signal: clean up below, exit 0, no traceback
            return 0
        except SystemExit as stop:  # uvicorn exits 3 when it cannot bind; a refused start is 1 here
            return 1 if stop.code else 0
        return 0 if server.started else 1
    finally:
        if app is not None:  # a forced exit (a second Ctrl+C) skips the app's shutdown, which waits for it
            app.state.feed.close()
        if background is not None:
            background.close()
        container.close()
        sock.close()
