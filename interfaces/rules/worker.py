"""A rule worker process: compiles and runs jq routing rules for `JqRuleEngine`.

Started by the engine as ``python -I worker.py PROGRESS_FD REQUEST_FD RESPONSE_FD PARENT_PID``
with a minimal environment. It imports only the standard library, jq and the wire protocol
(protocol.py, loaded by its path), never the application.

Why a process: libjq holds the GIL and cannot be interrupted, so a slow rule can only be cut
by killing the process that runs it. The parent cannot see inside jq, so before each step
(parsing an input, running rule r of set s) this process writes what it is doing and since
when into a small shared memory block (`PROGRESS`); the parent computes the step's deadline
from it and SIGKILLs this process when the deadline passes, naming the rule that was running.

One program per rule set, the input parsed once. The rules are embedded in a single jq
program that emits one boolean per rule, lazily, and stops at the first match::

    . as $__sb_in | null, (if R0 then true else (false, (if R1 then true else (false, R2) end)) end)

where ``Ri = ($__sb_in | [first(Ei)] | length > 0 and (.[0] | . != null and . != false))``.
The leading ``null`` is emitted once the input is parsed; each following ``next()`` runs exactly
one rule, so per-rule budgets, first-match-wins, and the index of a rule that raises stay exact.
A second rule set (replay's `compare_with`) follows in the same program with its own
``$params``, so one parse serves both.

The frames and messages it reads and writes are defined in protocol.py, shared with the engine.
"""

from __future__ import annotations

import mmap
import os
import resource
import sys
import time
from collections import OrderedDict


def _load_protocol():
    """protocol.py, this file's sibling: from the package when imported as part of it, else by
    its path (``python -I`` puts no project directory on the path)."""
    if __package__:
        from interfaces.rules import protocol

        return protocol
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "switchboard_rules_protocol", os.path.join(os.path.dirname(os.path.abspath(__file__)), "protocol.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


protocol = _load_protocol()
PROGRESS, PROGRESS_SIZE = protocol.PROGRESS, protocol.PROGRESS_SIZE
IDLE, COMPILE, EVAL = protocol.IDLE, protocol.COMPILE, protocol.EVAL
CACHE_SETS = 128
CACHE_PROGRAMS = 128
MEMORY_LIMIT = 1 << 30
CPU_SECONDS_PER_REQUEST = 30
REASON_MAX_CHARS = 300

monotonic = time.monotonic


class Progress:
    """The shared block the parent reads to know what this worker is doing, and since when.

    One unsynchronised write per step: the parent may read a torn record, so it only acts on
    a record it has read twice, a moment apart (see `WorkerHandle.read_frame` in handle.py)."""

    def __init__(self, fd: int) -> None:
        self.block = mmap.mmap(fd, PROGRESS_SIZE)
        self.req = 0
        self._pack = PROGRESS.pack_into

    def mark(self, phase: int, item: int = -1, set_index: int = -1, rule: int = -1,
             t_rule: float = 0.0, t_delivery: float = 0.0) -> None:
        self._pack(self.block, 0, self.req, phase, item, set_index, rule, t_rule, t_delivery)


def clean_message(error: BaseException) -> str:
    """The first line of a jq message, without its `jq: error: ` prefix, cut to a sane length (and
    without the colon that introduced the program excerpt jq prints below a compile error)."""
    lines = str(error).strip().splitlines() or ["unknown error"]
    line = lines[0]
    if line.startswith("jq: error: "):
        line = line[len("jq: error: "):]
    if len(lines) > 1 and line.endswith(":"):
        line = line[:-1]
    if len(line) > REASON_MAX_CHARS:
        line = line[: REASON_MAX_CHARS - 1] + "…"
    return line


def _test(expr: str) -> str:
    return f"($__sb_in | [first(\n{expr}\n)] | length > 0 and (.[0] | . != null and . != false))"


def chain(exprs: list[str]) -> str:
    """One boolean per rule, lazily, stopping after the first true."""
    text = _test(exprs[-1])
    for expr in reversed(exprs[:-1]):
        text = f"if {_test(expr)} then true else (false, {text}) end"
    return text


def program_text(chains: list[list[str]]) -> str:
    """The program for one or two non-empty rule sets (the second reads `$__sb_pb` as `$params`)."""
    parts = [f"({chain(chains[0])})"]
    if len(chains) > 1:
        parts.append(f"($__sb_pb as $params | {chain(chains[1])})")
    return ". as $__sb_in | null, " + ", ".join(parts)


class RuleSetDef:
    """A rule set as sent by the parent: its expressions (as written and without comments), params."""

    def __init__(self, spec: dict) -> None:
        self.key: str = spec["key"]
        self.exprs: list[str] = spec["exprs"]
        self.embedded: list[str] = spec["embedded"]
        self.params = spec["params"]


class NeedDefinitions(Exception):
    """Raised when a request names a rule set this worker has not compiled (or has evicted)."""


class Worker:
    def __init__(self, jq, progress: Progress) -> None:
        self.jq = jq
        self.progress = progress
        self.sets: OrderedDict[str, RuleSetDef] = OrderedDict()
        self.programs: OrderedDict[tuple[str, ...], object] = OrderedDict()

    # -- requests ------------------------------------------------------------------------

    def handle(self, header: dict, blob: bytes) -> dict:
        op = header["op"]
        if op == "compile":
            return protocol.compile_reply(self.check(self.rule_set(header["set"])))
        if op == "eval":
            try:
                sets = [self.rule_set(spec) for spec in header["sets"]]
            except NeedDefinitions:
                return protocol.need_reply()
            return protocol.eval_reply(self.evaluate(sets, header, blob))
        if op == "ping":
            return protocol.pong_reply()
        raise ValueError(f"unknown op {op!r}")

    def rule_set(self, spec: dict) -> RuleSetDef:
        key = spec["key"]
        if "exprs" in spec:
            self.sets[key] = RuleSetDef(spec)
        found = self.sets.get(key)
        if found is None:
            raise NeedDefinitions(key)
        self.sets.move_to_end(key)
        while len(self.sets) > CACHE_SETS:
            self.sets.popitem(last=False)
        return found

    # -- compiling -----------------------------------------------------------------------

    def check(self, rule_set: RuleSetDef) -> list[list]:
        """[index, message] for each rule that does not compile, on its own or (for example a
        `module` directive, which must come first) inside the combined program."""
        errors: list[list] = []
        args = {"params": rule_set.params}
        for index, expr in enumerate(rule_set.exprs):
            self.progress.mark(COMPILE, rule=index, t_rule=monotonic())
            try:
                self.jq.compile(expr, args=args)
            except ValueError as error:
                errors.append([index, clean_message(error)])
        if errors or not rule_set.exprs:
            return errors
        compiled = self.program([rule_set])
        if isinstance(compiled, tuple):
            for index, expr in enumerate(rule_set.embedded):
                self.progress.mark(COMPILE, rule=index, t_rule=monotonic())
                try:
                    self.jq.compile(program_text([[expr]]), args=args)
                except ValueError as error:
                    errors.append([index, "cannot be combined with other rules: " + clean_message(error)])
            if not errors:
                errors.append([compiled[1], compiled[2]])
        return errors

    def program(self, sets: list[RuleSetDef]):
        """The compiled program for these non-empty sets, or the (index, message) of a rule
        that keeps it from compiling."""
        key = tuple(s.key for s in sets)
        found = self.programs.get(key)
        if found is None:
            self.progress.mark(COMPILE, rule=-1, t_rule=monotonic())
            args = {"params": sets[0].params}
            if len(sets) > 1:
                args["__sb_pb"] = sets[1].params
            try:
                found = self.jq.compile(program_text([s.embedded for s in sets]), args=args)
            except ValueError as error:
                found = self.blame(sets, error)
            self.programs[key] = found
            while len(self.programs) > CACHE_PROGRAMS:
                self.programs.popitem(last=False)
        else:
            self.programs.move_to_end(key)
        return found

    def blame(self, sets: list[RuleSetDef], error: ValueError) -> tuple[int, int, str]:
        """(set index, rule index, message) of the first rule that does not compile alone."""
        for set_index, rule_set in enumerate(sets):
            for index, expr in enumerate(rule_set.exprs):
                self.progress.mark(COMPILE, rule=index, t_rule=monotonic())
                try:
                    self.jq.compile(expr, args={"params": rule_set.params})
                except ValueError as alone:
                    return (set_index, index, clean_message(alone))
        return (0, 0, "the rules cannot be combined: " + clean_message(error))

    # -- evaluating ----------------------------------------------------------------------

    def evaluate(self, sets: list[RuleSetDef], header: dict, blob: bytes) -> list[list]:
        rule_budget, delivery_budget = header["budgets"]
        results: list[list] = []
        offset = 0
        for item, (length, mode) in enumerate(zip(header["lens"], header["modes"])):
            text = blob[offset:offset + length].decode("utf-8", "replace")
            offset += length
            wanted = [i for i in range(len(sets)) if mode == protocol.MODE_BOTH or mode == protocol.SET_MODES[i]]
            outcomes: list = [None] * len(sets)
            while wanted:
                done = self.run(item, text, sets, wanted, rule_budget, delivery_budget)
                for set_index, outcome in done.items():
                    outcomes[set_index] = outcome
                wanted = [i for i in wanted if outcomes[i] is None]
            results.append(outcomes)
        return results

    def run(self, item: int, text: str, sets: list[RuleSetDef], wanted: list[int],
            rule_budget: float, delivery_budget: float) -> dict[int, list]:
        """Outcomes for some of the wanted sets on one input: all of them, or those up to and
        including the first that faulted (the rest need a run of their own)."""
        done: dict[int, list] = {}
        live = []
        for set_index in wanted:
            if sets[set_index].exprs:
                live.append(set_index)
            else:
                done[set_index] = protocol.no_match()
        if not live:
            return done
        compiled = self.program([sets[i] for i in live])
        if isinstance(compiled, tuple):
            culprit, index, message = compiled
            for position, set_index in enumerate(live):
                blamed = index if position == culprit else None
                done[set_index] = protocol.faulted(blamed, "error: does not compile: " + message)
            return done
        mark = self.progress.mark
        t_delivery = monotonic()
        mark(EVAL, item, live[0], -1, t_delivery, t_delivery)
        results = iter(compiled.input_text(text))
        try:
            next(results)
        except ValueError as error:
            for set_index in live:
                done[set_index] = protocol.faulted(None, "error: " + clean_message(error))
            return done
        if monotonic() - t_delivery > delivery_budget:
            for set_index in live:
                done[set_index] = protocol.faulted(None, "timeout")
            return done
        for position, set_index in enumerate(live):
            if position:
                t_delivery = monotonic()
            outcome: list = protocol.no_match()
            for rule in range(len(sets[set_index].exprs)):
                t_rule = monotonic()
                mark(EVAL, item, set_index, rule, t_rule, t_delivery)
                try:
                    value = next(results)
                except ValueError as error:
                    outcome = protocol.faulted(rule, "error: " + clean_message(error))
                    break
                except StopIteration:
                    outcome = protocol.faulted(rule, "error: the rule program ended early")
                    break
                now = monotonic()
                if now - t_rule > rule_budget or now - t_delivery > delivery_budget:
                    outcome = protocol.faulted(rule, "timeout")
                    break
                if value is True:
                    outcome = protocol.matched(rule)
                    break
            done[set_index] = outcome
            if outcome[0] == protocol.FAULTED:
                return done  # the iterator is spent or out of step: later sets run on their own
        return done


# -- process plumbing ---------------------------------------------------------------------


def _die_with_parent(parent_pid: int) -> None:
    """SIGKILL this process when the thread that started it exits (Linux), and check it is alive."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG, SIGKILL
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent_pid:
        os._exit(0)


def _limit_resources() -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    try:
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        if hard == resource.RLIM_INFINITY or hard > MEMORY_LIMIT:
            resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, hard))
    except (ValueError, OSError):
        pass


def _bound_cpu() -> None:
    """A backstop should the parent fail to kill: SIGXCPU after 30 more CPU seconds."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    used = int(usage.ru_utime + usage.ru_stime) + 1
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    soft = used + CPU_SECONDS_PER_REQUEST
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


def _send(fd: int, header: dict) -> None:
    data = memoryview(protocol.frame_head(header))
    while data:
        written = os.write(fd, data)
        data = data[written:]


def main(argv: list[str]) -> int:
    progress_fd, request_fd, response_fd, parent_pid = (int(arg) for arg in argv[1:5])
    _die_with_parent(parent_pid)
    _limit_resources()
    import jq  # after the limits, so that libjq lives under them

    progress = Progress(progress_fd)
    worker = Worker(jq, progress)
    requests = os.fdopen(request_fd, "rb", buffering=1 << 16)
    _send(response_fd, protocol.ready_reply(os.getpid()))
    while True:
        frame = protocol.read_frame(requests)
        if frame is None:
            return 0  # the parent closed the pipe (or died)
        header, blob = frame
        progress.req = header["req"]
        progress.mark(IDLE, t_rule=monotonic())
        _bound_cpu()
        reply = worker.handle(header, blob)
        progress.mark(IDLE, t_rule=monotonic())
        reply["req"] = header["req"]
        _send(response_fd, reply)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
