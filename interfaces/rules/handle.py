"""`WorkerHandle`: the parent's handle on one rule worker process (worker.py).

A request goes down a pipe; the reply is awaited with a deadline computed from the worker's
shared progress block: the rule now running must finish within its rule budget and the delivery
within its delivery budget, compilation within a compile budget, and the steps between them
within IDLE_BUDGET. Past the deadline the worker is SIGKILLed and the caller gets `WorkerLost`
with what the worker was doing (`Snapshot`). The handle also remembers which rule sets its
worker holds compiled.
"""

from __future__ import annotations

import math
import mmap
import os
import select
import signal
import subprocess
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from interfaces.rules import protocol

COMPILE_BUDGET = 2.0  # seconds per jq compilation step while evaluating
IDLE_BUDGET = 5.0  # seconds a worker may spend between steps (decoding a request, replying)
POLL_SLICE = 0.005  # seconds between looks at a worker that has not started evaluating
KILL_GRACE = 0.002  # seconds past a deadline before the kill, so a worker can report it itself
CONFIRM_DELAY = 0.0005  # seconds between the two reads of a worker's progress before a kill
KNOWN_SETS = 96  # rule sets the parent assumes a worker still holds (the worker keeps 128)

CRASHED = "error: rule worker crashed"


@dataclass(frozen=True)
class Snapshot:
    """What a worker said it was doing: request, phase, item, rule set, rule, and since when."""

    req: int
    phase: int
    item: int
    set_index: int
    rule: int
    t_rule: float
    t_delivery: float


class WorkerLost(Exception):
    """Raised when a worker was killed past its deadline, or died, during a request."""

    def __init__(self, reason: str, snapshot: Snapshot | None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.snapshot = snapshot


class WorkerHandle:
    """The parent's handle on one worker process: pipes, progress block, what it has compiled."""

    def __init__(self, proc: subprocess.Popen, requests: int, responses: int, progress: mmap.mmap) -> None:
        self.proc = proc
        self.requests = requests
        self.responses = responses
        self.progress = progress
        self.poller = select.poll()
        self.poller.register(responses, select.POLLIN | select.POLLERR | select.POLLHUP)
        self.req = 0
        self.known: OrderedDict[str, None] = OrderedDict()
        self.dead = False

    @property
    def pid(self) -> int:
        return self.proc.pid

    def snapshot(self) -> Snapshot:
        """What the worker last said it was doing (possibly a torn record: see `read_frame`)."""
        return Snapshot(*protocol.PROGRESS.unpack_from(self.progress, 0))

    def call(self, header: dict, blobs: Sequence[bytes], *, rule_budget: float, delivery_budget: float,
             compile_budget: float = 0.0) -> dict:
        """Sends one request and returns the reply; kills the worker past the deadline."""
        self.req += 1
        header = {**header, "req": self.req, "lens": [len(b) for b in blobs]}
        blob = b"".join(blobs)
        sent_at = time.monotonic()
        try:
            self._write(protocol.frame_head(header, len(blob)))
            if blob:
                self._write(blob)
        except OSError:
            self.kill()
            raise WorkerLost(CRASHED, None) from None
        return self._reply(sent_at, rule_budget, delivery_budget, compile_budget or COMPILE_BUDGET)

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self.requests, view):]

    def _reply(self, sent_at: float, rule_budget: float, delivery_budget: float, compile_budget: float) -> dict:
        slice_ = min(POLL_SLICE, rule_budget / 4)

        def deadline() -> tuple[float, Snapshot | None]:
            snapshot = self.snapshot()
            at = self._deadline(snapshot, sent_at, rule_budget, delivery_budget, compile_budget)
            if snapshot.req != self.req or snapshot.phase != protocol.EVAL:
                # not evaluating yet: its first rule's deadline will be sooner than this one
                at = min(at, time.monotonic() + slice_)
            return at, self._ours(snapshot)

        reply = self.read_frame(deadline)
        if reply.get("req") != self.req:
            self.kill()
            raise WorkerLost(CRASHED, None)
        return reply

    def read_frame(self, deadline: Callable[[], tuple[float, Snapshot | None]]) -> dict:
        """The next reply frame's header. Past `deadline()`, kills the worker and raises
        `WorkerLost` with what it was doing."""
        buffer = bytearray()
        while True:
            size = protocol.frame_size(buffer)
            if size is not None and len(buffer) >= size:
                header_size, _ = protocol.FRAME.unpack_from(buffer)
                try:
                    return protocol.parse_header(bytes(buffer[protocol.FRAME.size:protocol.FRAME.size + header_size]))
                except ValueError:
                    self.kill()
                    raise WorkerLost(CRASHED, None) from None
            at, snapshot = deadline()
            wait = at - time.monotonic()
            if wait <= 0:
                # the worker writes its progress without a lock: act only on a record that
                # reads the same twice, a moment apart (a torn read would not)
                time.sleep(CONFIRM_DELAY)
                if deadline() != (at, snapshot):
                    continue
                self.kill()
                raise WorkerLost("timeout", snapshot)
            if self.poller.poll(math.ceil(wait * 1000)):
                chunk = os.read(self.responses, 1 << 16)
                if not chunk:
                    self.kill()
                    raise WorkerLost(CRASHED, self._ours(self.snapshot()))
                buffer += chunk

    def _ours(self, snapshot: Snapshot) -> Snapshot | None:
        return snapshot if snapshot.req == self.req else None

    def _deadline(self, snapshot: Snapshot, sent_at: float, rule_budget: float,
                  delivery_budget: float, compile_budget: float) -> float:
        if snapshot.req != self.req:
            return sent_at + IDLE_BUDGET  # still reading the request
        if snapshot.phase == protocol.COMPILE:
            return snapshot.t_rule + compile_budget
        if snapshot.phase == protocol.EVAL:
            deadline = snapshot.t_delivery + delivery_budget
            if snapshot.rule >= 0:
                deadline = min(deadline, snapshot.t_rule + rule_budget)
            return deadline + KILL_GRACE
        return max(sent_at, snapshot.t_rule) + IDLE_BUDGET

    def kill(self) -> None:
        if not self.dead:
            self.dead = True
            try:
                os.kill(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def release(self) -> None:
        """Closes the parent's ends; the process must already be killed (or be told to exit)."""
        for fd in (self.requests, self.responses):
            try:
                os.close(fd)
            except OSError:
                pass
        try:
            self.progress.close()
        except (BufferError, ValueError):
            pass

    def remember(self, key: str) -> None:
        """Notes that the worker now holds the rule set `key` compiled (the newest KNOWN_SETS)."""
        self.known[key] = None
        self.known.move_to_end(key)
        while len(self.known) > KNOWN_SETS:
            self.known.popitem(last=False)
