"""The projection catch-up of `switchboard serve`, in a process of its own (docs/adr/0006), and
the audit chain's sealer (docs/adr/0032; `serve`'s own stands by).

Catching the tracked read models up is CPU work in Python (decode each event, build its rows);
in the serving process it competed for the GIL with HTTP and ingest. Here it runs beside it:
`serve` starts this module with the settings in the environment and writes a byte to its stdin
after a local commit (a wake-up, like the in-process worker's event; at most one per WAKE_EVERY);
the worker also looks at least once a second for what other processes committed. End of stdin —
`serve` stopping, or dying even by SIGKILL — ends this process. Tracking rows are locked while a
page is applied, so this process, other servers and readers catching up for themselves never
apply an event twice.

`ProjectorProcess` is `serve`'s side: it starts this module, wakes it, and restarts it should it
die (its supervisor thread lives and stops with it).
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import threading
import time

from application.audit import AuditLog, Sealer
from application.background import ProjectionWorker
from application.errors import ConfigurationError, StoreUnavailable, first_line
from interfaces.clock import clock_of
from interfaces.logs import configure_logging
from interfaces.runtime import tune_gc
from interfaces.settings import Settings
from interfaces.store.chain import SqlChain, sorted_json
from interfaces.store.database import DatabaseUrl
from interfaces.store.eventstore import SqlEventStore
from interfaces.store.projector import Projector
from projections import all_projections

log = logging.getLogger("switchboard.background")


def _follow_parent(wake: threading.Event, stop: threading.Event) -> None:
    """Each byte on stdin is a wake-up; end of file means the parent is gone."""
    while True:
        try:
            data = sys.stdin.buffer.read1(4096)
        except (OSError, ValueError):
            data = b""
        if not data:
            stop.set()
            wake.set()
            return
        wake.set()


POOL_SIZE = 2
"""PostgreSQL connections this process opens at most: the catch-up reads and applies on one, the
sealer reads and seals on the other."""
WAKE_EVERY = ProjectionWorker.GATHER / 2
"""Seconds between two wake-ups `serve` sends at most (one per commit was ~1/5 of this process's
CPU under ingest, reading them; measured)."""
OPEN_BACKOFF = (0.5, 1.0, 2.0, 4.0, 8.0)
"""Seconds between attempts to open the store (the last repeats): a database that is down or out
of connections costs one log line and a retry, never a crash and a restart by `serve`."""


def _open_store(settings: Settings, stop: threading.Event) -> SqlEventStore | None:
    """The store, once it can be opened; None if told to stop first. One line when it cannot, one
    when it finally can."""
    attempt, failing = 0, False
    while True:
        try:
            store = SqlEventStore(DatabaseUrl.parse(settings.database_url), clock_of(settings.clock_file),
                                  all_projections(), pool_size=POOL_SIZE,
                                  application_name="switchboard-projector").open()
        except StoreUnavailable as error:
            if not failing:
                log.warning("projector: store unavailable (%s); retrying with back-off", first_line(error))
                failing = True
            if stop.wait(OPEN_BACKOFF[min(attempt, len(OPEN_BACKOFF) - 1)]):
                return None
            attempt += 1
            continue
        if failing:
            log.warning("projector: store is back")
        return store


def main() -> int:
    configure_logging()
    try:
        settings = Settings.from_env()
        DatabaseUrl.parse(settings.database_url)
    except ConfigurationError as error:
        print(f"switchboard projector: {error}", file=sys.stderr)
        return 1
    wake, stop = threading.Event(), threading.Event()
    threading.Thread(target=_follow_parent, args=(wake, stop), name="parent", daemon=True).start()
    store = _open_store(settings, stop)
    if store is None:
        return 0
    worker = ProjectionWorker(Projector(store).catch_up)
    worker.wake = wake
    # the hash chain's sealer (docs/adr/0022), here rather than in `serve`, whose own stands by
    sealer = Sealer(AuditLog(SqlChain(store), store.clock, fast=sorted_json))
    sealing = threading.Thread(target=sealer.run, args=(stop,), name="sealer", daemon=True)
    sealing.start()
    tune_gc()
    try:
        worker.run(stop)
    finally:
        stop.set()
        sealer.wake.set()
        sealing.join(timeout=5)
        store.close()
    return 0


class ProjectorProcess:
    """`serve`'s handle on this module's process, and its supervisor.

    Woken by a byte on its stdin after a local commit, at most one per WAKE_EVERY (never blocking
    this side: a full pipe already means a wake-up is pending); restarted if it dies; its stdin
    closed, it exits.
    """

    RESTART_DELAY = 1.0
    MAX_RESTART_DELAY = 60.0

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.proc: subprocess.Popen | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._supervisor: threading.Thread | None = None
        self._woken = -WAKE_EVERY

    def start(self) -> ProjectorProcess:
        """Starts the child and the thread that restarts it should it die."""
        self._spawn()
        self._supervisor = threading.Thread(target=self._supervise, args=(self._stop,),
                                            name="switchboard-projector", daemon=True)
        self._supervisor.start()
        return self

    def _spawn(self) -> None:
        env = dict(os.environ, SWITCHBOARD_DATABASE_URL=self.settings.database_url,
                   SWITCHBOARD_DATA_DIR=self.settings.data_dir)
        proc = subprocess.Popen([sys.executable, "-m", "interfaces.projector_process"], stdin=subprocess.PIPE, env=env)
        os.set_blocking(proc.stdin.fileno(), False)
        with self._lock:
            self.proc = proc

    def wake(self) -> None:
        """Tells the child there is something new. At most one byte per WAKE_EVERY: the child
        reads the log only GATHER after a wake, so a commit made within WAKE_EVERY of the last
        byte is read by the catch-up that byte starts (or, if one was already under way, by the
        next, which the pending wake starts)."""
        now = time.monotonic()
        if now - self._woken < WAKE_EVERY:
            return
        self._woken = now
        with self._lock:
            proc = self.proc
        if proc is None or proc.stdin is None:
            return
        try:
            os.write(proc.stdin.fileno(), b".")
        except (BlockingIOError, BrokenPipeError, OSError, ValueError):
            pass  # a full pipe: it will wake anyway; a dead child: `_supervise` restarts it

    def _supervise(self, stop: threading.Event) -> None:
        """Restarts a child that died, waiting longer after each quick death (a child that keeps
        failing costs a line per restart at most every MAX_RESTART_DELAY seconds, not a loop)."""
        delay, started = self.RESTART_DELAY, time.monotonic()
        while not stop.wait(self.RESTART_DELAY):
            with self._lock:
                proc = self.proc
            if proc is not None and proc.poll() is not None:
                lived = time.monotonic() - started
                delay = self.RESTART_DELAY if lived > self.MAX_RESTART_DELAY else min(delay * 2, self.MAX_RESTART_DELAY)
                log.warning("projector process exited with %s; starting another in %.0f s", proc.returncode, delay)
                if stop.wait(delay):
                    return
                self._spawn()
                started = time.monotonic()

    def close(self) -> None:
        """Stops the supervisor, then ends the child (closing its stdin; killed after 5 s)."""
        self._stop.set()
        if self._supervisor is not None:
            self._supervisor.join(timeout=5)
        with self._lock:
            proc, self.proc = self.proc, None
        if proc is None:
            return
        with contextlib.suppress(OSError):
            proc.stdin.close()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


if __name__ == "__main__":
    sys.exit(main())
