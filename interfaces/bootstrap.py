"""The composition root: builds every adapter from settings and wires the application.

Nothing connects at import time; `build()` connects, `Background` starts the threads.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from application.background import ProjectionWorker, TimerScheduler
from application.ports import Clock, SystemClock
from domain.todo import (
    LeaseExpired, LeaseRenewed, TodoClaimed, TodoCompleted, TodoFailed, TodoReleased, TodoRequeued,
)
from application.service import Switchboard
from application.webhooks import Webhooks
from interfaces.crypto import AesGcmSecretBox
from interfaces.rules import JqRuleEngine
from interfaces.security import Argon2Hasher
from interfaces.settings import Settings
from interfaces.store.database import DatabaseUrl
from interfaces.store.eventstore import SqlEventStore
from interfaces.store.projector import Projector
from interfaces.store.views import SqlViews
from projections import all_projections


# Events that set, move or clear a lease or retry timer: only they wake the scheduler.
TIMER_EVENTS = (TodoClaimed, LeaseRenewed, TodoFailed, TodoCompleted, TodoReleased, LeaseExpired, TodoRequeued)


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

    def close(self) -> None:
        self.engine.close()
        self.store.close()


def build(settings: Settings, *, clock: Clock | None = None) -> Container:
    """Connects to the store named by the settings and assembles the application."""
    clock = clock or SystemClock()
    store = SqlEventStore(DatabaseUrl.parse(settings.database_url), clock, all_projections()).open()
    projector = Projector(store)
    views = SqlViews(store.db, projector)
    app = Switchboard(store, views, clock, Argon2Hasher(), settings.base_url)
    engine = JqRuleEngine()  # worker processes start on first use
    webhooks = Webhooks(app, engine, AesGcmSecretBox(settings.resolved_secret_key()))
    return Container(settings, clock, store, projector, views, app, engine, webhooks)


@dataclass
class Background:
    """The threads `serve` runs beside the HTTP server."""

    container: Container
    stop: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> Background:
        c = self.container
        scheduler = TimerScheduler(c.app, c.views, c.clock)
        projections = ProjectionWorker(c.projector.catch_up)

        def on_commit(recorded) -> None:
            projections.wake.set()
            if any(isinstance(r.event, TIMER_EVENTS) for r in recorded):
                scheduler.wake.set()

        c.store.subscribe(on_commit)
        for name, worker in (("scheduler", scheduler), ("projections", projections)):
            thread = threading.Thread(target=worker.run, args=(self.stop,), name=f"switchboard-{name}", daemon=True)
            thread.start()
            self.threads.append(thread)
        self.workers = (scheduler, projections)
        return self

    def close(self) -> None:
        self.stop.set()
        for worker in getattr(self, "workers", ()):
            worker.wake.set()
        for thread in self.threads:
            thread.join(timeout=5)
