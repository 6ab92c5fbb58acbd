"""The composition root: builds every adapter from settings and wires the application.

Nothing connects at import time; `build()` connects, `Background` starts the threads.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

from application.background import ProjectionWorker, TimerScheduler
from application.retention import RetentionService
from application.ports import Clock, SystemClock
from domain.todo import MOVES_TIMER
from application.service import Switchboard
from application.webhooks import Webhooks
from interfaces.crypto import DeferredSecretBox
from interfaces.rules import JqRuleEngine
from interfaces.security import Argon2Hasher
from interfaces.settings import Settings
from interfaces.store.database import DatabaseUrl
from interfaces.store.eventstore import SqlEventStore
from interfaces.store.projector import Projector
from interfaces.store.views import SqlViews
from projections import all_projections


log = logging.getLogger("switchboard.background")



@dataclass
class Container:
    settings: Settings
    clock: Clock
    store: SqlEventStore
    projector: Projector
    views: SqlViews
    app: Switchboard
    engine: JqRuleEngine
    webhooks: Webhooks
    retention: RetentionService

    def close(self) -> None:
        self.engine.close()
        self.store.close()


def build(settings: Settings, *, clock: Clock | None = None) -> Container:
    """Connects to the store named by the settings and assembles the application."""
    clock = clock or SystemClock()
    store = SqlEventStore(DatabaseUrl.parse(settings.database_url), clock, all_projections(),
                          pool_size=settings.pg_pool_size).open()
    projector = Projector(store)
    views = SqlViews(store.db, projector)
    app = Switchboard(store, views, clock, Argon2Hasher(), settings.base_url)
    engine = JqRuleEngine()  # worker processes start on first use
    webhooks = Webhooks(app, engine, DeferredSecretBox(settings.resolved_secret_key))
    retention = RetentionService(store, views, clock)
    return Container(settings, clock, store, projector, views, app, engine, webhooks, retention)


@dataclass
class Background:
    """The work `serve` runs beside the HTTP server: the timer scheduler (a thread) and the
    projection catch-up — in a child process (`projector_process`), or a thread when
    `projector_process=False` (tests that drive a container without `serve`)."""

    container: Container
    projector_process: bool = False
    stop: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> Background:
        c = self.container
        scheduler = TimerScheduler(c.app, c.views, c.clock)
        self.workers: tuple = (scheduler,)
        if self.projector_process:
            self.projector = ProjectorProcess(c.settings).start()
            wake_projections = self.projector.wake
            self._spawn("projector", self.projector.supervise)
        else:
            projections = ProjectionWorker(c.projector.catch_up)
            wake_projections = projections.wake.set
            self.workers = (scheduler, projections)
            self._spawn("projections", projections.run)

        def on_commit(recorded) -> None:
            wake_projections()
            if any(isinstance(r.event, MOVES_TIMER) for r in recorded):
                scheduler.wake.set()

        c.store.subscribe(on_commit)
        self._spawn("scheduler", scheduler.run)
        if c.settings.retention_days is not None:
            days = c.settings.retention_days
            self._spawn("retention", lambda stop: c.retention.run_daily(days, stop))
        return self

    def _spawn(self, name: str, run) -> None:
        thread = threading.Thread(target=run, args=(self.stop,), name=f"switchboard-{name}", daemon=True)
        thread.start()
        self.threads.append(thread)

    def close(self) -> None:
        self.stop.set()
        for worker in self.workers:
            worker.wake.set()
        if self.projector_process:
            self.projector.close()
        for thread in self.threads:
            thread.join(timeout=5)


class ProjectorProcess:
    """The child process that catches the tracked projections up (interfaces/projector_process.py).

    Woken by a byte on its stdin per local commit (never blocking this side: a full pipe already
    means a wake-up is pending); restarted if it dies; its stdin closed, it exits.
    """

    RESTART_DELAY = 1.0
    MAX_RESTART_DELAY = 60.0

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.proc: subprocess.Popen | None = None
        self._lock = threading.Lock()

    def start(self) -> ProjectorProcess:
        env = dict(os.environ, SWITCHBOARD_DATABASE_URL=self.settings.database_url,
                   SWITCHBOARD_DATA_DIR=self.settings.data_dir)
        proc = subprocess.Popen([sys.executable, "-m", "interfaces.projector_process"], stdin=subprocess.PIPE, env=env)
        os.set_blocking(proc.stdin.fileno(), False)
        with self._lock:
            self.proc = proc
        return self

    def wake(self) -> None:
        with self._lock:
            proc = self.proc
        if proc is None or proc.stdin is None:
            return
        try:
            os.write(proc.stdin.fileno(), b".")
        except (BlockingIOError, BrokenPipeError, OSError, ValueError):
            pass  # a full pipe: it will wake anyway; a dead child: `supervise` restarts it

    def supervise(self, stop: threading.Event) -> None:
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
                self.start()
                started = time.monotonic()

    def close(self) -> None:
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
