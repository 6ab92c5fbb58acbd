"""The program a worker compiles for a rule set, as the parent sends it (`SetSpec`), and their cache.

A rule set goes to a worker as its expressions (and the same without comments, to embed in one
program), its params and a key: a hash of expressions and params, by which a worker that has
compiled it once is sent only the key again (`WorkerHandle.known`).
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from dataclasses import dataclass

from domain.jq_scan import without_comments
from domain.rule_set import RuleSet

SPECS_KEPT = 256  # rule sets whose spec is remembered, by object


@dataclass(frozen=True)
class SetSpec:
    """A rule set as a worker compiles it; `size` is its number of rules."""

    key: str
    spec: dict  # what the worker needs to compile it: key, exprs, embedded, params
    size: int


class ProgramCache:
    """The spec of each recently seen rule set, by the set object (which it holds, to keep ids unique)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._specs: OrderedDict[int, tuple[RuleSet, SetSpec]] = OrderedDict()

    def spec(self, rule_set: RuleSet) -> SetSpec:
        """The worker's view of a rule set, keyed by a hash of its expressions and params."""
        with self._lock:
            cached = self._specs.get(id(rule_set))
            if cached is not None and cached[0] is rule_set:
                self._specs.move_to_end(id(rule_set))
                return cached[1]
        exprs = [rule.expr for rule in rule_set.rules]
        identity = json.dumps([exprs, rule_set.params], sort_keys=True, separators=(",", ":"))
        key = hashlib.sha256(identity.encode("utf-8", "surrogatepass")).hexdigest()[:32]
        spec = SetSpec(key, {"key": key, "exprs": exprs, "embedded": [without_comments(e) for e in exprs],
                             "params": rule_set.params}, len(exprs))
        with self._lock:
            self._specs[id(rule_set)] = (rule_set, spec)  # holding the set keeps its id unique
            while len(self._specs) > SPECS_KEPT:
                self._specs.popitem(last=False)
        return spec
