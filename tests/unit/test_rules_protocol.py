"""The rule workers' wire protocol (interfaces/rules/protocol.py): one definition, both sides.

Each message type is encoded by one side's own code and decoded by the other's: the engine's
`WorkerHandle` (its requests, its frame reader, its reply handling) talks over real pipes to the
worker module's `Worker` (its frame reader, handler and sender), run in a thread with real jq.
The worker process itself must load without the application.
"""

from __future__ import annotations

import itertools
import json
import mmap
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import jq
import pytest

from domain.routing import Faulted, Matched, NoMatch
from domain.rule_set import RuleError, RuleSet, parse_rule_set
from interfaces.rules import JqRuleEngine, protocol
from interfaces.rules import handle as handle_module
from interfaces.rules import worker as worker_module

ROOT = Path(__file__).resolve().parents[2]


def rules(*exprs: str) -> RuleSet:
    counter = itertools.count()
    return parse_rule_set(
        {"rules": [{"id": f"r{i}", "expr": e, "action": {"queue": f"q{i}"}} for i, e in enumerate(exprs)]},
        new_rule_id=lambda: f"rule_{next(counter):024x}",
    )


class Pair:
    """An engine-side `WorkerHandle` and a worker-side `Worker` joined by pipes and one progress block."""

    def __init__(self) -> None:
        request_read, request_write = os.pipe()
        self.response_read, self.response_write = os.pipe()
        self.block = mmap.mmap(-1, protocol.PROGRESS_SIZE)
        self.progress = worker_module.Progress.__new__(worker_module.Progress)
        self.progress.block, self.progress.req, self.progress._pack = self.block, 0, protocol.PROGRESS.pack_into
        self.worker = worker_module.Worker(jq, self.progress)
        self.requests = os.fdopen(request_read, "rb", buffering=1 << 16)
        self.sleeper = subprocess.Popen(["sleep", "60"])  # what the engine would kill should it time out
        self.engine_side = handle_module.WorkerHandle(self.sleeper, request_write, self.response_read, self.block)
        self.served: list[dict] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        """The worker's main loop, less the process set-up (limits, parent watch)."""
        while True:
            frame = protocol.read_frame(self.requests)
            if frame is None:
                return
            header, blob = frame
            self.served.append(header)
            self.progress.req = header["req"]
            reply = self.worker.handle(header, blob)
            reply["req"] = header["req"]
            worker_module._send(self.response_write, reply)

    def close(self) -> None:
        os.close(self.engine_side.requests)
        self._thread.join(5)
        self.sleeper.kill()
        self.sleeper.wait()
        for fd in (self.response_read, self.response_write):
            os.close(fd)
        self.requests.close()


@pytest.fixture
def pair() -> Iterator[Pair]:
    joined = Pair()
    yield joined
    joined.close()


@pytest.fixture
def engine(pair: Pair, monkeypatch) -> Iterator[JqRuleEngine]:
    """An engine whose only worker is the paired one (no process is started)."""
    started = JqRuleEngine(workers=1)
    monkeypatch.setattr(started, "_checkout", lambda: pair.engine_side)
    monkeypatch.setattr(started, "_checkin", lambda worker, healthy: None)
    monkeypatch.setattr(started, "_ensure_started", lambda: None)
    yield started


def test_the_ready_frame_the_worker_sends_is_the_one_the_engine_waits_for(pair):
    worker_module._send(pair.response_write, protocol.ready_reply(4242))
    hello = pair.engine_side.read_frame(lambda: (time.monotonic() + 5, None))
    assert hello.get("ready") is True and hello["pid"] == 4242


def test_a_ping_is_answered_with_a_pong(pair):
    reply = pair.engine_side.call(protocol.ping_request(), (), rule_budget=1.0, delivery_budget=1.0)
    assert reply == {"pong": True, "req": 1}
    assert pair.served == [{"op": "ping", "req": 1, "lens": []}]


def test_a_compile_request_and_its_errors_cross_both_ways(engine, pair):
    engine.check_compiles(rules(".a == 1", ".b"))
    assert pair.served[-1]["op"] == "compile" and pair.served[-1]["set"]["exprs"] == [".a == 1", ".b"]
    with pytest.raises(RuleError) as refused:
        engine.check_compiles(rules(".a == 1", ".b |||"))
    assert refused.value.code == "invalid_expression"
    assert str(refused.value).startswith("rule #2 (r1): does not compile: ")  # the worker's [index, message]


@pytest.mark.parametrize(("exprs", "expected"), [
    ((".n == 1", ".n == 2"), Matched(1)),
    ((".n == 5",), NoMatch()),
    ((".n | error(\"boom\")",), Faulted(0, "error: boom")),
    ((".n | undefined_function_here",), None),  # does not compile: a fault naming that rule
])
def test_every_outcome_the_worker_reports_is_the_one_the_engine_returns(engine, pair, exprs, expected):
    outcome = engine.evaluate(rules(*exprs), {"n": 2})
    if expected is None:
        assert isinstance(outcome, Faulted) and outcome.index == 0 and "does not compile" in outcome.reason
    else:
        assert outcome == expected
    request = pair.served[-1]
    assert request["op"] == "eval" and request["modes"] == "P" and request["lens"] == [len(b'{"n":2}')]


def test_an_eval_naming_a_set_the_worker_lost_gets_need_and_is_sent_again_in_full(engine, pair):
    rule_set = rules(".n == 2")
    assert engine.evaluate(rule_set, {"n": 2}) == Matched(0)
    pair.worker.sets.clear()  # the worker evicted it; the engine still thinks it is there
    assert engine.evaluate(rule_set, {"n": 2}) == Matched(0)
    named, again = pair.served[-2:]
    assert named["sets"] == [{"key": named["sets"][0]["key"]}]  # by key alone: answered "need"
    assert again["sets"][0]["exprs"] == [".n == 2"]


def test_a_pair_of_sets_in_one_request_answers_each_by_its_mode(engine, pair):
    specs = [engine._spec(rules(".n == 1")), engine._spec(rules(".n == 2"))]
    texts = [b'{"n":1}', b'{"n":2}']
    assert engine._evaluate(specs, texts) == [[Matched(0), NoMatch()], [NoMatch(), Matched(0)]]
    assert pair.served[-1]["modes"] == "PP"


def test_the_progress_the_worker_marks_is_the_snapshot_the_engine_reads(pair):
    pair.progress.req = 7
    pair.progress.mark(protocol.EVAL, 3, 1, 2, 10.5, 9.25)
    snapshot = pair.engine_side.snapshot()
    assert (snapshot.req, snapshot.phase, snapshot.item, snapshot.set_index, snapshot.rule) == (7, protocol.EVAL, 3, 1, 2)
    assert (snapshot.t_rule, snapshot.t_delivery) == (10.5, 9.25)


def test_a_reply_that_is_not_an_object_counts_as_a_crash(pair):
    body = json.dumps([1, 2]).encode()
    os.write(pair.response_write, protocol.FRAME.pack(len(body), 0) + body)
    with pytest.raises(handle_module.WorkerLost) as lost:
        pair.engine_side.read_frame(lambda: (time.monotonic() + 5, None))
    assert lost.value.reason == handle_module.CRASHED


def _modules_after(code: str, *args: str) -> set[str]:
    out = subprocess.run([sys.executable, *args, "-c", code], cwd=ROOT if not args else "/",
                         capture_output=True, text=True, check=True).stdout
    return set(out.split())


def _project(modules: set[str], *roots: str) -> set[str]:
    return {m for m in modules if m.split(".")[0] in roots}


def test_importing_the_worker_module_imports_neither_the_application_nor_litestar():
    modules = _modules_after("import sys, interfaces.rules.worker; print(*sys.modules)")
    assert "interfaces.rules.worker" in modules
    assert not _project(modules, "application", "litestar", "projections", "mcp", "psycopg", "eventsourcing")


def test_the_worker_started_as_the_engine_starts_it_loads_only_its_protocol():
    script = ROOT / "interfaces" / "rules" / "worker.py"
    modules = _modules_after(
        f"import runpy, sys; g = runpy.run_path({str(script)!r}, run_name='probe');"
        " print(g['protocol'].__name__, *sys.modules)", "-I")
    assert "switchboard_rules_protocol" in modules
    assert not _project(modules, "application", "domain", "interfaces", "projections", "litestar")
