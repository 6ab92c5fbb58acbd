"""`WorkerPool`: the rule worker processes, each checked out by one caller at a time.

Each worker (worker.py) is a fresh interpreter started with an explicit, secret-free
environment. A supervisor thread, the only one that forks them (they die when it ends), starts
`workers` of them plus a warm spare; a killed worker's slot goes to the spare at once and a
replacement is started in the background. The pool also owns the threads that callers of
`evaluate_many` run their chunks on.
"""

from __future__ import annotations

import logging
import mmap
import os
import queue
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Self

from interfaces.rules import protocol
from interfaces.rules.handle import WorkerHandle, WorkerLost

log = logging.getLogger("interfaces.rules.engine")  # the engine's log: its lines keep their name

WORKER_SCRIPT = Path(__file__).with_name("worker.py")
# The whole environment a worker gets: no secrets, no database URL, nothing for `$ENV`.
WORKER_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}

SPAWN_TIMEOUT = 30.0  # seconds for a new worker to import jq and say it is ready
WORKER_WAIT = 10.0  # seconds a caller waits for a free worker before failing closed
SPARES = 1  # warm workers kept aside to replace a killed one without a cold start


class NoWorker(Exception):
    """Raised when no worker became free in time (or the engine is closed)."""


class WorkerPool:
    """`workers` worker processes (plus a warm spare), started on first use or by `start`."""

    def __init__(self, workers: int) -> None:
        if workers < 1:
            raise ValueError("workers must be at least 1")
        self.workers = workers
        self._idle: queue.Queue[WorkerHandle] = queue.Queue()
        self._spares: list[WorkerHandle] = []
        self._missing = 0  # active slots waiting for a worker
        self._lock = threading.Lock()
        self._tasks: queue.Queue[tuple[str, object] | None] = queue.Queue()
        self._supervisor: threading.Thread | None = None
        self._ready = threading.Event()
        self._closed = False
        self._all: set[WorkerHandle] = set()
        self._executor: ThreadPoolExecutor | None = None  # the threads evaluate_many's chunks run on

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        """Starts the worker processes (from one long-lived thread, which they die with)."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the rule engine is closed")
            if self._supervisor is not None:
                return
            self._missing = self.workers
            self._executor = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="sb-rules")
            self._supervisor = threading.Thread(target=self._supervise, name="sb-rules-supervisor", daemon=True)
            self._supervisor.start()
        self._tasks.put(("fill", None))
        if not self._ready.wait(SPAWN_TIMEOUT):
            raise RuntimeError("rule workers did not start")

    def close(self) -> None:
        """Kills every worker; later calls raise RuntimeError. A worker busy with a request is
        killed too, and its caller gets a fault."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            spares, self._spares = self._spares, []
            supervisor = self._supervisor
        self._tasks.put(None)
        if supervisor is not None:
            supervisor.join(timeout=SPAWN_TIMEOUT)
        idle = []
        while True:
            try:
                idle.append(self._idle.get_nowait())
            except queue.Empty:
                break
        for worker in idle + spares:
            self._reap(worker)
        with self._lock:
            busy = list(self._all)
        for worker in busy:
            worker.kill()  # its caller's thread reaps it
        if self._executor is not None:
            self._executor.shutdown(wait=False)

    def _reap(self, worker: WorkerHandle) -> None:
        worker.kill()
        try:
            worker.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            log.warning("rule worker %s did not exit after SIGKILL", worker.pid)
        worker.release()
        with self._lock:
            self._all.discard(worker)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- checking workers out and in -----------------------------------------------------

    def _ensure_started(self) -> None:
        if self._closed:
            raise RuntimeError("the rule engine is closed")
        if self._supervisor is None:
            self.start()

    def _checkout(self) -> WorkerHandle:
        self._ensure_started()
        deadline = time.monotonic() + WORKER_WAIT
        while True:
            try:
                worker = self._idle.get(timeout=max(deadline - time.monotonic(), 0))
            except queue.Empty:
                raise NoWorker() from None
            if not worker.dead and worker.proc.poll() is None:
                return worker
            self._replace(worker)  # died while idle

    def _checkin(self, worker: WorkerHandle, healthy: bool) -> None:
        if healthy and not worker.dead and not self._closed:
            self._idle.put(worker)
        else:
            self._replace(worker)

    def _replace(self, worker: WorkerHandle) -> None:
        """A killed worker's slot goes to a warm spare now; a new spare is started meanwhile."""
        worker.kill()
        with self._lock:
            self._all.discard(worker)
            closed = self._closed
            spare = self._spares.pop() if self._spares and not closed else None
            if not closed and spare is None:
                self._missing += 1
        if closed:
            self._reap(worker)
            return
        if spare is not None:
            self._idle.put(spare)
        self._tasks.put(("reap", worker))
        self._tasks.put(("fill", None))

    # -- the supervisor ------------------------------------------------------------------

    def _supervise(self) -> None:
        """Starts and reaps workers; the only thread that forks them (they die when it ends)."""
        while True:
            task = self._tasks.get()
            if task is None:
                return
            kind, worker = task
            try:
                if kind == "reap" and isinstance(worker, WorkerHandle):
                    self._reap(worker)
                elif kind == "fill":
                    self._fill()
            except Exception:  # this thread must outlive any one failure: the workers die with it
                log.exception("rule worker supervisor: %s failed", kind)

    def _fill(self) -> None:
        while True:
            with self._lock:
                if self._closed:
                    return
                if self._missing == 0:
                    self._ready.set()
                    if len(self._spares) >= SPARES:
                        return
            try:
                worker = self._spawn()
            except (OSError, RuntimeError) as error:
                log.error("cannot start a rule worker: %s", error)
                time.sleep(1)
                continue
            with self._lock:
                place = "discard" if self._closed else "idle" if self._missing > 0 else "spare"
                if place == "idle":
                    self._missing -= 1
                elif place == "spare":
                    self._spares.append(worker)
                if place != "discard":
                    self._all.add(worker)
            if place == "discard":
                self._reap(worker)
            elif place == "idle":
                self._idle.put(worker)

    def _spawn(self) -> WorkerHandle:
        progress_fd = os.memfd_create("sb-rules-progress")
        request_read, request_write = os.pipe()
        response_read, response_write = os.pipe()
        try:
            os.ftruncate(progress_fd, protocol.PROGRESS_SIZE)
            progress = mmap.mmap(progress_fd, protocol.PROGRESS_SIZE)
            proc = subprocess.Popen(
                [sys.executable, "-I", str(WORKER_SCRIPT), str(progress_fd), str(request_read),
                 str(response_write), str(os.getpid())],
                env=WORKER_ENV, cwd="/", stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                pass_fds=(progress_fd, request_read, response_write), start_new_session=True,
            )
        except BaseException:
            for fd in (request_write, response_read):
                os.close(fd)
            raise
        finally:
            for fd in (progress_fd, request_read, response_write):
                os.close(fd)
        worker = WorkerHandle(proc, request_write, response_read, progress)
        ready_by = time.monotonic() + SPAWN_TIMEOUT
        try:
            hello = worker.read_frame(lambda: (ready_by, None))
        except WorkerLost:
            hello = {}
        if not hello.get("ready"):
            worker.kill()
            proc.wait()
            worker.release()
            raise RuntimeError("a rule worker failed to start")
        return worker
