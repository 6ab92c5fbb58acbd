"""The projection catch-up of `switchboard serve`, in a process of its own (docs/adr/0006).

Catching the tracked read models up is CPU work in Python (decode each event, build its rows);
in the serving process it competed for the GIL with HTTP and ingest. Here it runs beside it:
`serve` starts this module with the settings in the environment and writes a byte to its stdin
after each local commit (a wake-up, like the in-process worker's event); the worker also looks at
least once a second for what other processes committed. End of stdin — `serve` stopping, or
dying even by SIGKILL — ends this process. Tracking rows are locked while a page is applied, so
this process, other servers and readers catching up for themselves never apply an event twice.
"""

from __future__ import annotations

import logging
import sys
import threading

from application.background import ProjectionWorker
from application.errors import ConfigurationError, StoreUnavailable, first_line
from application.ports import SystemClock
from interfaces.settings import Settings
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
"""PostgreSQL connections this process opens at most: the catch-up reads and applies on one."""
OPEN_BACKOFF = (0.5, 1.0, 2.0, 4.0, 8.0)
"""Seconds between attempts to open the store (the last repeats): a database that is down or out
of connections costs one log line and a retry, never a crash and a restart by `serve`."""


def _open_store(settings: Settings, stop: threading.Event) -> SqlEventStore | None:
    """The store, once it can be opened; None if told to stop first. One line when it cannot, one
    when it finally can."""
    attempt, failing = 0, False
    while True:
        try:
            store = SqlEventStore(DatabaseUrl.parse(settings.database_url), SystemClock(), all_projections(),
                                  pool_size=POOL_SIZE, application_name="switchboard-projector").open()
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
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
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
    try:
        worker.run(stop)
    finally:
        store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
