"""The composition root: builds every adapter from settings and wires the application.

Nothing connects at import time; `build()` connects, `Background` starts the threads.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from application.audit import STANDBY_AFTER, AuditLog, Sealer
from application.background import ProjectionWorker, TimerScheduler
from application.retention import RetentionService
from application.ports import Clock
from domain.todo import moves_timer
from application.service import Switchboard
from application.webhooks import Webhooks
from interfaces.clock import clock_of
from interfaces.crypto import DeferredSecretBox
from interfaces.projector_process import ProjectorProcess
from interfaces.rules import JqRuleEngine
from interfaces.security import Argon2Hasher
from interfaces.settings import Settings
from interfaces.store.chain import SqlChain, sorted_json
from interfaces.store.database import DatabaseUrl
from interfaces.store.eventstore import SqlEventStore
from interfaces.store.projector import Projector
from interfaces.store.views import SqlViews
from projections import all_projections


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
    audit: AuditLog
    retention: RetentionService

    def close(self) -> None:
        self.engine.close()
        self.store.close()


def build(settings: Settings, *, clock: Clock | None = None) -> Container:
    """Connects to the store named by the settings and assembles the application, with the
    process's one clock (the given one, else the settings' own)."""
    clock = clock or clock_of(settings.clock_file)
    store = SqlEventStore(DatabaseUrl.parse(settings.database_url), clock, all_projections(),
                          pool_size=settings.pg_pool_size).open()
    projector = Projector(store)
    views = SqlViews(store.db, projector)
    audit = AuditLog(SqlChain(store), clock, fast=sorted_json)
    app = Switchboard(store, views, clock, Argon2Hasher(), settings.base_url, audit)
    app.on_refused = store.queue_reads.count_refusal
    engine = JqRuleEngine()  # worker processes start on first use
    webhooks = Webhooks(app, engine, DeferredSecretBox(settings.resolved_secret_key))
    retention = RetentionService(store, views, clock)
    return Container(settings, clock, store, projector, views, app, engine, webhooks, audit, retention)


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
        # the hash chain (docs/adr/0022): sealed by the projector process when there is one, this
        # one standing by (docs/adr/0032); first: it seals what serve wrote at start
        sealer = Sealer(c.audit, standby=STANDBY_AFTER if self.projector_process else None)
        self._spawn("sealer", sealer.run)
        scheduler = TimerScheduler(c.app, c.views, c.clock)
        self.workers: tuple = (scheduler,)
        if self.projector_process:
            self.projector = ProjectorProcess(c.settings).start()
            wake_projections = self.projector.wake
        else:
            projections = ProjectionWorker(c.projector.catch_up)
            wake_projections = projections.wake.set
            self.workers = (scheduler, projections)
            self._spawn("projections", projections.run)

        def on_commit(recorded) -> None:
            wake_projections()
            if any(moves_timer(r.event) for r in recorded):  # not each delivery's TodoOpened
                scheduler.wake.set()

        c.store.subscribe(on_commit)
        self._spawn("scheduler", scheduler.run)
        self.workers = (*self.workers, sealer)
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
