"""A TCP proxy between Switchboard and PostgreSQL that a test can break on purpose (real faults,
without touching the shared cluster).

- `refuse()`: the database is unreachable: every open connection is cut and new ones are refused
  (the listening socket is closed); `restore()` listens on the same port again.
- `blackhole()`: every open connection is cut and new ones are accepted but never answered (a
  network that drops packets); `restore()` ends it.
- `arm("after_commit")`: the next append of a writer connection (named `switchboard-writer-…` in
  its startup packet) reaches PostgreSQL and commits; the proxy drops PostgreSQL's answer to the
  COMMIT and cuts the writer's connection: the commit happened, its answer never arrived.
- `arm("after_commit", then_refuse=True)`: the same, and the database becomes unreachable at that
  very moment (before the writer sees its connection cut).
- `arm("hold", hold=s)`: the next append of a writer connection is held back and the writer's
  connection cut at once; after `s` seconds the proxy forwards what it held to PostgreSQL on the
  lost session (if it still lives) — a commit the server would process after the writer gave up.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from urllib.parse import urlparse, urlunparse

SYNC = b"S\x00\x00\x00\x04"
COMMIT_DONE = b"C\x00\x00\x00\x0bCOMMIT\x00"
WRITER = b"switchboard-writer-"


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()


class _Link:
    def __init__(self, proxy: PgProxy, client: socket.socket, upstream: socket.socket) -> None:
        self.proxy = proxy
        self.client = client
        self.upstream = upstream
        self.writer = False
        self.cut_on_commit: str | None = None
        threading.Thread(target=self._up, daemon=True).start()
        threading.Thread(target=self._down, daemon=True).start()

    def close(self) -> None:
        _close(self.client)
        _close(self.upstream)

    def _up(self) -> None:
        """Client to PostgreSQL."""
        try:
            while chunk := self.client.recv(65536):
                if not self.writer and WRITER in chunk:
                    self.writer = True
                if self.writer and SYNC in chunk:
                    mode = self.proxy._take_armed()
                    if mode in ("after_commit", "then_refuse"):
                        self.cut_on_commit = mode
                    elif mode is not None and mode[0] == "hold":
                        self.proxy.cuts += 1
                        _close(self.client)
                        time.sleep(mode[1])
                        with contextlib.suppress(OSError):
                            self.upstream.sendall(chunk)
                        time.sleep(1.0)  # let the lost session answer (if it still lives), then end it
                        _close(self.upstream)
                        return
                self.upstream.sendall(chunk)
        except OSError:
            pass
        self.close()

    def _down(self) -> None:
        """PostgreSQL to the client."""
        try:
            while chunk := self.upstream.recv(65536):
                if self.cut_on_commit and COMMIT_DONE in chunk:
                    self.proxy.cuts += 1
                    if self.cut_on_commit == "then_refuse":
                        self.proxy.refuse()
                    break  # committed; the answer is dropped and the client cut
                self.client.sendall(chunk)
        except OSError:
            pass
        self.close()


class PgProxy:
    """Listens on a free local port and forwards to PostgreSQL at (host, port)."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.port = 0
        self.links: list[_Link] = []
        self.cuts = 0
        self._armed: object = None
        self._holes: list[socket.socket] = []
        self.swallow = False
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self.restore()

    @classmethod
    def before(cls, url: str) -> tuple[PgProxy, str]:
        """A proxy in front of the database of `url`, and the URL that goes through it."""
        parsed = urlparse(url)
        proxy = cls(parsed.hostname or "127.0.0.1", parsed.port or 5432)
        netloc = f"{parsed.username}@127.0.0.1:{proxy.port}" if parsed.username else f"127.0.0.1:{proxy.port}"
        return proxy, urlunparse(parsed._replace(netloc=netloc))

    def restore(self) -> None:
        if self.swallow:
            self.swallow = False
            with self._lock:
                holes, self._holes = self._holes, []
            for hole in holes:
                _close(hole)
            return
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(128)
        self.port = listener.getsockname()[1]
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def refuse(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            _close(listener)
        with self._lock:
            links, self.links = self.links, []
        for link in links:
            link.close()

    def blackhole(self) -> None:
        self.swallow = True
        with self._lock:
            links, self.links = self.links, []
        for link in links:
            link.close()

    def arm(self, mode: str, *, hold: float = 1.5, then_refuse: bool = False) -> None:
        with self._lock:
            if mode == "after_commit":
                self._armed = "then_refuse" if then_refuse else "after_commit"
            else:
                self._armed = ("hold", hold)

    def _take_armed(self) -> object:
        with self._lock:
            armed, self._armed = self._armed, None
            return armed

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            if self.swallow:
                with self._lock:
                    self._holes.append(client)
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                _close(client)
                continue
            with self._lock:  # `refuse` may have run while this one was being connected
                live = self._listener is listener
                if live:
                    self.links.append(_Link(self, client, upstream))
            if not live:  # else it would outlive the refusal (a pool's connection opening just then)
                _close(client)
                _close(upstream)

    def close(self) -> None:
        self.refuse()
