"""`JqRuleEngine`: runs routing rules (CONTRACT §5) in killable worker processes.

libjq holds the GIL and cannot be interrupted, so no rule runs in the server's process. Each
worker (`worker.py`) is a fresh interpreter started with an explicit, secret-free environment.
A caller checks one worker out, sends it a request over a pipe and waits on the reply with a
deadline computed from the worker's shared progress block: the rule now running must finish
within `rule_budget` (50 ms) and the delivery within `delivery_budget` (250 ms). Past it, the
worker is SIGKILLed, a warm spare takes its place at once, a replacement is started in the
background, and the caller gets `Faulted(rule, "timeout")` a few milliseconds after the budget.

`evaluate` serves ingest and dry runs (thread-safe, blocking: call it from a worker thread, not
from the event loop). `evaluate_many` serves replay and the save-time dry run: stored envelopes
go to the workers as JSON text in chunks, spread over every worker, each input parsed once for
both the candidate and the `compare_with` rules.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import mmap
import os
import queue
import select
import signal
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from domain.jq_scan import without_comments
from domain.routing import Faulted, Matched, NoMatch, Outcome
from domain.rule_set import RuleError, RuleSet, rule_label
from interfaces.rules import protocol

log = logging.getLogger(__name__)

WORKER_SCRIPT = Path(__file__).with_name("worker.py")
# The whole environment a worker gets: no secrets, no database URL, nothing for `$ENV`.
WORKER_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}

DEFAULT_RULE_BUDGET = 0.050  # seconds per rule
DEFAULT_DELIVERY_BUDGET = 0.250  # seconds per delivery (all rules of one set)
COMPILE_BUDGET = 2.0  # seconds per jq compilation step while evaluating
CHECK_COMPILE_BUDGET = 0.5  # seconds per step at save: what saves must compile well within 2 s
IDLE_BUDGET = 5.0  # seconds a worker may spend between steps (decoding a request, replying)
POLL_SLICE = 0.005  # seconds between looks at a worker that has not started evaluating
KILL_GRACE = 0.002  # seconds past a deadline before the kill, so a worker can report it itself
CONFIRM_DELAY = 0.0005  # seconds between the two reads of a worker's progress before a kill
SPAWN_TIMEOUT = 30.0  # seconds for a new worker to import jq and say it is ready
WORKER_WAIT = 10.0  # seconds a caller waits for a free worker before failing closed
SPARES = 1  # warm workers kept aside to replace a killed one without a cold start
CHUNK_ITEMS = 64  # envelopes per evaluate_many request
CHUNK_BYTES = 1 << 20
KNOWN_SETS = 96  # rule sets the parent assumes a worker still holds (the worker keeps 128)
# An envelope at least this big whose reading alone outlasts the delivery budget faults as
# `too_large` rather than `timeout`: its size, not a rule, is what took the time (a 5 MiB
# envelope takes ~130-400 ms to parse here, measured; a 1 MiB one ~30 ms).
LARGE_ENVELOPE_BYTES = 1 << 20

NO_WORKER = "error: no rule worker available"
CRASHED = "error: rule worker crashed"


@dataclass(frozen=True)
class _Snapshot:
    """What a worker said it was doing: request, phase, item, rule set, rule, and since when."""

    req: int
    phase: int
    item: int
    set_index: int
    rule: int
    t_rule: float
    t_delivery: float


class _WorkerLost(Exception):
    """Raised when a worker was killed past its deadline, or died, during a request."""

    def __init__(self, reason: str, snapshot: _Snapshot | None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.snapshot = snapshot


class _NoWorker(Exception):
    """Raised when no worker became free in time (or the engine is closed)."""


@dataclass(frozen=True)
class _SetSpec:
    key: str
    spec: dict  # what the worker needs to compile it: key, exprs, embedded, params
    size: int


class _Worker:
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

    def snapshot(self) -> _Snapshot:
        """What the worker last said it was doing (possibly a torn record: see `read_frame`)."""
        return _Snapshot(*protocol.PROGRESS.unpack_from(self.progress, 0))

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
            raise _WorkerLost(CRASHED, None) from None
        return self._reply(sent_at, rule_budget, delivery_budget, compile_budget or COMPILE_BUDGET)

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self.requests, view):]

    def _reply(self, sent_at: float, rule_budget: float, delivery_budget: float, compile_budget: float) -> dict:
        slice_ = min(POLL_SLICE, rule_budget / 4)

        def deadline() -> tuple[float, _Snapshot | None]:
            snapshot = self.snapshot()
            at = self._deadline(snapshot, sent_at, rule_budget, delivery_budget, compile_budget)
            if snapshot.req != self.req or snapshot.phase != protocol.EVAL:
                # not evaluating yet: its first rule's deadline will be sooner than this one
                at = min(at, time.monotonic() + slice_)
            return at, self._ours(snapshot)

        reply = self.read_frame(deadline)
        if reply.get("req") != self.req:
            self.kill()
            raise _WorkerLost(CRASHED, None)
        return reply

    def read_frame(self, deadline: Callable[[], tuple[float, _Snapshot | None]]) -> dict:
        """The next reply frame's header. Past `deadline()`, kills the worker and raises
        `_WorkerLost` with what it was doing."""
        buffer = bytearray()
        while True:
            size = protocol.frame_size(buffer)
            if size is not None and len(buffer) >= size:
                header_size, _ = protocol.FRAME.unpack_from(buffer)
                try:
                    return protocol.parse_header(bytes(buffer[protocol.FRAME.size:protocol.FRAME.size + header_size]))
                except ValueError:
                    self.kill()
                    raise _WorkerLost(CRASHED, None) from None
            at, snapshot = deadline()
            wait = at - time.monotonic()
            if wait <= 0:
                # the worker writes its progress without a lock: act only on a record that
                # reads the same twice, a moment apart (a torn read would not)
                time.sleep(CONFIRM_DELAY)
                if deadline() != (at, snapshot):
                    continue
                self.kill()
                raise _WorkerLost("timeout", snapshot)
            if self.poller.poll(math.ceil(wait * 1000)):
                chunk = os.read(self.responses, 1 << 16)
                if not chunk:
                    self.kill()
                    raise _WorkerLost(CRASHED, self._ours(self.snapshot()))
                buffer += chunk

    def _ours(self, snapshot: _Snapshot) -> _Snapshot | None:
        return snapshot if snapshot.req == self.req else None

    def _deadline(self, snapshot: _Snapshot, sent_at: float, rule_budget: float,
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


class JqRuleEngine:
    """Evaluates rule sets in `workers` killable processes (plus a warm spare)."""

    def __init__(self, *, workers: int = 2, rule_budget: float = DEFAULT_RULE_BUDGET,
                 delivery_budget: float = DEFAULT_DELIVERY_BUDGET) -> None:
        if workers < 1:
            raise ValueError("workers must be at least 1")
        self.workers = workers
        self.rule_budget = rule_budget
        self.delivery_budget = delivery_budget
        self._idle: queue.Queue[_Worker] = queue.Queue()
        self._spares: list[_Worker] = []
        self._missing = 0  # active slots waiting for a worker
        self._lock = threading.Lock()
        self._tasks: queue.Queue[tuple[str, object] | None] = queue.Queue()
        self._supervisor: threading.Thread | None = None
        self._ready = threading.Event()
        self._closed = False
        self._all: set[_Worker] = set()
        self._executor: ThreadPoolExecutor | None = None
        self._specs: OrderedDict[int, tuple[RuleSet, _SetSpec]] = OrderedDict()

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

    def _reap(self, worker: _Worker) -> None:
        worker.kill()
        try:
            worker.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            log.warning("rule worker %s did not exit after SIGKILL", worker.pid)
        worker.release()
        with self._lock:
            self._all.discard(worker)

    def __enter__(self) -> JqRuleEngine:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the API -------------------------------------------------------------------------

    def check_compiles(self, rule_set: RuleSet) -> None:
        """Raises RuleError('invalid_expression') naming the first rule that does not compile."""
        if not rule_set.rules:
            return
        spec = self._spec(rule_set)
        for attempt in range(2):
            try:
                worker = self._checkout()
            except _NoWorker:
                raise RuntimeError(NO_WORKER) from None
            healthy = False
            try:
                reply = worker.call(protocol.compile_request(spec.spec), (), rule_budget=self.rule_budget,
                                    delivery_budget=self.delivery_budget, compile_budget=CHECK_COMPILE_BUDGET)
                healthy = True
            except _WorkerLost as lost:
                if lost.snapshot is None and lost.reason == CRASHED and attempt == 0:
                    continue  # died before it started: once more on another worker
                rule = lost.snapshot.rule if lost.snapshot is not None else -1
                label = rule_label(rule, rule_set.rules[rule].id) if 0 <= rule < len(rule_set.rules) else "the rules"
                why = (f"does not compile within {CHECK_COMPILE_BUDGET:g} s" if lost.reason == "timeout"
                       else "crashes the jq compiler")
                raise RuleError("invalid_expression", f"{label}: {why}") from None
            finally:
                self._checkin(worker, healthy)
            self._remember(worker, spec.key)
            errors = reply["errors"]
            if errors:
                index, message = errors[0]
                rule = rule_set.rules[index]
                raise RuleError("invalid_expression", f"{rule_label(index, rule.id)}: does not compile: {message}")
            return
        raise RuntimeError(CRASHED)

    def evaluate(self, rule_set: RuleSet, envelope: dict) -> Outcome:
        """The first rule that matches the envelope, no match, or a fault (error or timeout)."""
        if not rule_set.rules:
            return NoMatch()
        text = json.dumps(envelope, separators=(",", ":")).encode()
        return self._evaluate([self._spec(rule_set)], [text])[0][0]

    def evaluate_many(self, rule_set: RuleSet, envelopes_json: Sequence[str | bytes], *,
                      compare_with: RuleSet | None = None) -> list[tuple[Outcome, Outcome | None]]:
        """(outcome of rule_set, outcome of compare_with or None) for each stored envelope, in order."""
        texts = envelopes_json
        if not texts:
            return []
        specs = [self._spec(rule_set)] + ([self._spec(compare_with)] if compare_with is not None else [])
        if all(spec.size == 0 for spec in specs):
            return [(NoMatch(), NoMatch() if compare_with is not None else None) for _ in texts]
        chunks: list[tuple[int, int]] = []
        start = size = 0
        for index, text in enumerate(texts):
            if index > start and (index - start >= CHUNK_ITEMS or size + len(text) > CHUNK_BYTES):
                chunks.append((start, index))
                start, size = index, 0
            size += len(text)
        chunks.append((start, len(texts)))

        def run(chunk: tuple[int, int]) -> list[list[Outcome]]:
            return self._evaluate(specs, [_as_bytes(text) for text in texts[chunk[0]:chunk[1]]])

        self._ensure_started()
        executor = self._executor
        if executor is None:
            raise RuntimeError("the rule engine is closed")
        results: list[tuple[Outcome, Outcome | None]] = []
        for part in executor.map(run, chunks):
            results.extend((pair[0], pair[1] if compare_with is not None else None) for pair in part)
        return results

    # -- evaluation ----------------------------------------------------------------------

    def _evaluate(self, specs: list[_SetSpec], texts: list[bytes]) -> list[list[Outcome]]:
        """Outcomes of each set on each text; survives kills by resending what was lost."""
        results: list[list[Outcome | None]] = [[None] * len(specs) for _ in texts]
        todo = [(index, protocol.MODE_BOTH) for index in range(len(texts))]
        idle_losses = 0
        while todo:
            try:
                worker = self._checkout()
            except _NoWorker:
                for index, mode in todo:
                    for set_index in protocol.sets_of(mode, len(specs)):
                        results[index][set_index] = Faulted(None, NO_WORKER)
                break
            healthy = False
            try:
                reply = self._call_eval(worker, specs, [texts[i] for i, _ in todo], "".join(m for _, m in todo))
                decoded = _decode_results(reply, todo, len(specs), worker)
                healthy = True
            except _WorkerLost as lost:
                todo, idle_losses = self._after_loss(lost, todo, results, specs, idle_losses)
                continue
            finally:
                self._checkin(worker, healthy)
            for (index, mode), outcomes in zip(todo, decoded):
                for set_index in protocol.sets_of(mode, len(specs)):
                    results[index][set_index] = outcomes[set_index]
            todo = []
        return [[self._sized(outcome, len(text)) for outcome in row] for row, text in zip(results, texts)]

    def _sized(self, outcome: Outcome | None, size: int) -> Outcome:
        """A timeout while reading a large envelope, before any rule ran, is `too_large`."""
        if (isinstance(outcome, Faulted) and outcome.index is None and outcome.reason == "timeout"
                and size >= LARGE_ENVELOPE_BYTES):
            return Faulted(None, f"too_large: the {size:,}-byte envelope could not be read within the"
                                 f" {self.delivery_budget * 1000:g} ms delivery budget")
        return outcome  # type: ignore[return-value]

    def _call_eval(self, worker: _Worker, specs: list[_SetSpec], blobs: list[bytes], modes: str) -> dict:
        budgets = [self.rule_budget, self.delivery_budget]
        sets = [spec.spec if spec.key not in worker.known else {"key": spec.key} for spec in specs]
        reply = worker.call(protocol.eval_request(sets, modes, budgets), blobs,
                            rule_budget=self.rule_budget, delivery_budget=self.delivery_budget)
        if reply.get("need"):
            worker.known.clear()
            reply = worker.call(protocol.eval_request([s.spec for s in specs], modes, budgets), blobs,
                                rule_budget=self.rule_budget, delivery_budget=self.delivery_budget)
        for spec in specs:
            self._remember(worker, spec.key)
        return reply

    @staticmethod
    def _after_loss(lost: _WorkerLost, todo: list[tuple[int, str]], results: list[list[Outcome | None]],
                    specs: list[_SetSpec], idle_losses: int) -> tuple[list[tuple[int, str]], int]:
        """Records the fault of the item the worker was on; what it finished before is sent again."""
        snapshot = lost.snapshot
        set_count = len(specs)
        if snapshot is not None and snapshot.phase == protocol.EVAL and 0 <= snapshot.item < len(todo):
            index, mode = todo[snapshot.item]
            if snapshot.rule < 0:  # parsing the input: every set it was running is blamed
                for set_index in protocol.sets_of(mode, set_count):
                    results[index][set_index] = Faulted(None, lost.reason) if specs[set_index].size else NoMatch()
                rest = ""
            else:
                results[index][snapshot.set_index] = Faulted(snapshot.rule, lost.reason)
                # the other set of a pair still needs its outcome, from a run of its own
                rest = protocol.SET_MODES[1 - snapshot.set_index] if mode == protocol.MODE_BOTH and set_count > 1 else ""
            again = [(index, rest)] if rest else []
            return todo[:snapshot.item] + again + todo[snapshot.item + 1:], idle_losses
        if idle_losses < 1:
            return todo, idle_losses + 1  # lost between steps (or before starting): try once more
        for index, mode in todo:
            for set_index in protocol.sets_of(mode, set_count):
                results[index][set_index] = Faulted(None, lost.reason)
        return [], idle_losses

    # -- rule set specs ------------------------------------------------------------------

    def _spec(self, rule_set: RuleSet) -> _SetSpec:
        """The worker's view of a rule set, keyed by a hash of its expressions and params."""
        with self._lock:
            cached = self._specs.get(id(rule_set))
            if cached is not None and cached[0] is rule_set:
                self._specs.move_to_end(id(rule_set))
                return cached[1]
        exprs = [rule.expr for rule in rule_set.rules]
        identity = json.dumps([exprs, rule_set.params], sort_keys=True, separators=(",", ":"))
        key = hashlib.sha256(identity.encode("utf-8", "surrogatepass")).hexdigest()[:32]
        spec = _SetSpec(key, {"key": key, "exprs": exprs, "embedded": [without_comments(e) for e in exprs],
                              "params": rule_set.params}, len(exprs))
        with self._lock:
            self._specs[id(rule_set)] = (rule_set, spec)  # holding the set keeps its id unique
            while len(self._specs) > 256:
                self._specs.popitem(last=False)
        return spec

    @staticmethod
    def _remember(worker: _Worker, key: str) -> None:
        worker.known[key] = None
        worker.known.move_to_end(key)
        while len(worker.known) > KNOWN_SETS:
            worker.known.popitem(last=False)

    # -- the pool ------------------------------------------------------------------------

    def _ensure_started(self) -> None:
        if self._closed:
            raise RuntimeError("the rule engine is closed")
        if self._supervisor is None:
            self.start()

    def _checkout(self) -> _Worker:
        self._ensure_started()
        deadline = time.monotonic() + WORKER_WAIT
        while True:
            try:
                worker = self._idle.get(timeout=max(deadline - time.monotonic(), 0))
            except queue.Empty:
                raise _NoWorker() from None
            if not worker.dead and worker.proc.poll() is None:
                return worker
            self._replace(worker)  # died while idle

    def _checkin(self, worker: _Worker, healthy: bool) -> None:
        if healthy and not worker.dead and not self._closed:
            self._idle.put(worker)
        else:
            self._replace(worker)

    def _replace(self, worker: _Worker) -> None:
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

    def _supervise(self) -> None:
        """Starts and reaps workers; the only thread that forks them (they die when it ends)."""
        while True:
            task = self._tasks.get()
            if task is None:
                return
            kind, worker = task
            try:
                if kind == "reap" and isinstance(worker, _Worker):
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

    def _spawn(self) -> _Worker:
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
        worker = _Worker(proc, request_write, response_read, progress)
        ready_by = time.monotonic() + SPAWN_TIMEOUT
        try:
            hello = worker.read_frame(lambda: (ready_by, None))
        except _WorkerLost:
            hello = {}
        if not hello.get("ready"):
            worker.kill()
            proc.wait()
            worker.release()
            raise RuntimeError("a rule worker failed to start")
        return worker


def _as_bytes(text: str | bytes) -> bytes:
    return text.encode("utf-8", "surrogatepass") if isinstance(text, str) else bytes(text)


def _decode_results(reply: dict, todo: list[tuple[int, str]], set_count: int,
                    worker: _Worker) -> list[list[Outcome | None]]:
    """The outcomes in a worker's reply; a reply that does not make sense counts as a crash."""
    try:
        rows = reply["results"]
        if len(rows) != len(todo):
            raise ValueError("wrong number of results")
        decoded = []
        for (_, mode), row in zip(todo, rows):
            outcomes: list[Outcome | None] = [None] * set_count
            for set_index in protocol.sets_of(mode, set_count):
                outcomes[set_index] = _outcome(row[set_index])
            decoded.append(outcomes)
        return decoded
    except (KeyError, IndexError, TypeError, ValueError):
        log.error("rule worker %s sent a malformed reply; killed", worker.pid)
        worker.kill()
        raise _WorkerLost(CRASHED, None) from None


def _outcome(raw: list) -> Outcome:
    match raw:
        case [protocol.MATCHED, int(index)]:
            return Matched(index)
        case [protocol.NO_MATCH]:
            return NoMatch()
        case [protocol.FAULTED, int() | None as index, str(reason)]:
            return Faulted(index, reason)
    raise ValueError(f"unexpected outcome from a rule worker: {raw!r}")
