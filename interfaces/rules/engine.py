"""`JqRuleEngine`: runs routing rules (CONTRACT §5) in killable worker processes.

libjq holds the GIL and cannot be interrupted, so no rule runs in the server's process. Each
worker (`worker.py`) is a fresh interpreter started with an explicit, secret-free environment.
A caller checks one worker out, sends it a request over a pipe and waits on the reply with a
deadline computed from the worker's shared progress block: the rule now running must finish
within `rule_budget` (50 ms) and the delivery within `delivery_budget` (250 ms). Past it, the
worker is SIGKILLed, a warm spare takes its place at once, a replacement is started in the
background, and the caller gets `Faulted(rule, "timeout")` a few milliseconds after the budget.

The parts: pool.py starts, replaces and hands out the worker processes (`WorkerPool`, which
`JqRuleEngine` is); handle.py is the parent's handle on one of them, with its deadlines and the
kill; programs.py the rule sets as a worker compiles them; protocol.py the wire between them.

`evaluate` serves ingest and dry runs (thread-safe, blocking: call it from a worker thread, not
from the event loop). `evaluate_many` serves replay and the save-time dry run: stored envelopes
go to the workers as JSON text in chunks, spread over every worker, each input parsed once for
both the candidate and the `compare_with` rules.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence

from domain.routing import Faulted, Matched, NoMatch, Outcome
from domain.rule_set import RuleError, RuleSet, rule_label
from interfaces.rules import protocol
from interfaces.rules.handle import CRASHED, WorkerHandle, WorkerLost
from interfaces.rules.pool import NoWorker, WorkerPool
from interfaces.rules.programs import ProgramCache, SetSpec

log = logging.getLogger(__name__)

DEFAULT_RULE_BUDGET = 0.050  # seconds per rule
DEFAULT_DELIVERY_BUDGET = 0.250  # seconds per delivery (all rules of one set)
CHECK_COMPILE_BUDGET = 0.5  # seconds per step at save: what saves must compile well within 2 s
CHUNK_ITEMS = 64  # envelopes per evaluate_many request
CHUNK_BYTES = 1 << 20
# An envelope at least this big whose reading alone outlasts the delivery budget faults as
# `too_large` rather than `timeout`: its size, not a rule, is what took the time (a 5 MiB
# envelope takes ~130-400 ms to parse here, measured; a 1 MiB one ~30 ms).
LARGE_ENVELOPE_BYTES = 1 << 20

NO_WORKER = "error: no rule worker available"


class JqRuleEngine(WorkerPool):
    """Evaluates rule sets in `workers` killable processes (plus a warm spare)."""

    def __init__(self, *, workers: int = 2, rule_budget: float = DEFAULT_RULE_BUDGET,
                 delivery_budget: float = DEFAULT_DELIVERY_BUDGET) -> None:
        super().__init__(workers)
        self.rule_budget = rule_budget
        self.delivery_budget = delivery_budget
        self._programs = ProgramCache()

    # -- the API -------------------------------------------------------------------------

    def check_compiles(self, rule_set: RuleSet) -> None:
        """Raises RuleError('invalid_expression') naming the first rule that does not compile."""
        if not rule_set.rules:
            return
        spec = self._spec(rule_set)
        for attempt in range(2):
            try:
                worker = self._checkout()
            except NoWorker:
                raise RuntimeError(NO_WORKER) from None
            healthy = False
            try:
                reply = worker.call(protocol.compile_request(spec.spec), (), rule_budget=self.rule_budget,
                                    delivery_budget=self.delivery_budget, compile_budget=CHECK_COMPILE_BUDGET)
                healthy = True
            except WorkerLost as lost:
                if lost.snapshot is None and lost.reason == CRASHED and attempt == 0:
                    continue  # died before it started: once more on another worker
                rule = lost.snapshot.rule if lost.snapshot is not None else -1
                label = rule_label(rule, rule_set.rules[rule].id) if 0 <= rule < len(rule_set.rules) else "the rules"
                why = (f"does not compile within {CHECK_COMPILE_BUDGET:g} s" if lost.reason == "timeout"
                       else "crashes the jq compiler")
                raise RuleError("invalid_expression", f"{label}: {why}") from None
            finally:
                self._checkin(worker, healthy)
            worker.remember(spec.key)
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

    def _evaluate(self, specs: list[SetSpec], texts: list[bytes]) -> list[list[Outcome]]:
        """Outcomes of each set on each text; survives kills by resending what was lost."""
        results: list[list[Outcome | None]] = [[None] * len(specs) for _ in texts]
        todo = [(index, protocol.MODE_BOTH) for index in range(len(texts))]
        idle_losses = 0
        while todo:
            try:
                worker = self._checkout()
            except NoWorker:
                for index, mode in todo:
                    for set_index in protocol.sets_of(mode, len(specs)):
                        results[index][set_index] = Faulted(None, NO_WORKER)
                break
            healthy = False
            try:
                reply = self._call_eval(worker, specs, [texts[i] for i, _ in todo], "".join(m for _, m in todo))
                decoded = _decode_results(reply, todo, len(specs), worker)
                healthy = True
            except WorkerLost as lost:
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

    def _call_eval(self, worker: WorkerHandle, specs: list[SetSpec], blobs: list[bytes], modes: str) -> dict:
        budgets = [self.rule_budget, self.delivery_budget]
        sets = [spec.spec if spec.key not in worker.known else {"key": spec.key} for spec in specs]
        reply = worker.call(protocol.eval_request(sets, modes, budgets), blobs,
                            rule_budget=self.rule_budget, delivery_budget=self.delivery_budget)
        if reply.get("need"):
            worker.known.clear()
            reply = worker.call(protocol.eval_request([s.spec for s in specs], modes, budgets), blobs,
                                rule_budget=self.rule_budget, delivery_budget=self.delivery_budget)
        for spec in specs:
            worker.remember(spec.key)
        return reply

    @staticmethod
    def _after_loss(lost: WorkerLost, todo: list[tuple[int, str]], results: list[list[Outcome | None]],
                    specs: list[SetSpec], idle_losses: int) -> tuple[list[tuple[int, str]], int]:
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

    def _spec(self, rule_set: RuleSet) -> SetSpec:
        """The worker's view of a rule set (programs.py)."""
        return self._programs.spec(rule_set)


def _as_bytes(text: str | bytes) -> bytes:
    return text.encode("utf-8", "surrogatepass") if isinstance(text, str) else bytes(text)


def _decode_results(reply: dict, todo: list[tuple[int, str]], set_count: int,
                    worker: WorkerHandle) -> list[list[Outcome | None]]:
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
        raise WorkerLost(CRASHED, None) from None


def _outcome(raw: list) -> Outcome:
    match raw:
        case [protocol.MATCHED, int(index)]:
            return Matched(index)
        case [protocol.NO_MATCH]:
            return NoMatch()
        case [protocol.FAULTED, int() | None as index, str(reason)]:
            return Faulted(index, reason)
    raise ValueError(f"unexpected outcome from a rule worker: {raw!r}")
