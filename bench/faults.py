"""Throughput and answer times around each fault of the fault suite (tests/faults/, issue 11).

Run:  .venv/bin/python bench/faults.py [SCENARIO…] [--pre 5] [--post 8] [--ingest-threads 3] [--agents 2]

Scenarios (default: all): pg_restart, backends_killed, connections_exhausted, one_of_two_killed,
kill_cycles — the same code as the tests (tests/faults/_scenario.py): a disposable PostgreSQL
cluster made with `pg_createcluster` on a free port (dropped at the end, even on failure), real
`switchboard serve` processes, signed GitHub ingest threads and MCP agents (claim_next then
complete). The load runs `--pre` seconds, the fault is applied, the load runs `--post` seconds on.

Per scenario it prints:
- the pre-fault rate: 202s per second (and completes per second) over the last pre-fault
  seconds (the first second, a warm-up, left out);
- the post-fault rate of each second after the fault ended, the ratio of seconds 4-5 after it
  to the pre-fault rate, and the recovery time: from the fault's end to the first 1 s window
  (sliding by 0.1 s) whose rate is >= 90 % of the pre-fault rate (the issue's goal is within 5 s;
  measured here, not asserted);
- the answer times of requests asked while the fault lasted: p50, p99, max (and the contract's
  1 s);
- lost/ambiguous counts: requests whose connection failed mid-way or timed out (their outcome
  unknown to the client), and any answer the event log contradicts (a 202 not stored, a 503
  stored, a claim committed behind an error, a complete that lied).

Figures are for THIS machine while it runs (2 cores shared by the servers, PostgreSQL and the
clients, and whatever else runs): read the ratios, not the absolute rates.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.faults import _scenario as scenarios  # noqa: E402
from tests.faults._cluster import Cluster, unavailable_reason  # noqa: E402
from tests.faults._load import Answer  # noqa: E402

GOAL = 0.9  # of the pre-fault rate
WINDOW = 1.0


def rate(ends: list[float], start: float, stop: float) -> float:
    return sum(start <= t < stop for t in ends) / (stop - start) if stop > start else 0.0


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def recovery(ends: list[float], after: float, until: float, goal: float) -> float | None:
    """Seconds from `after` to the first 1 s window reaching `goal` per second, or None."""
    t = after
    while t + WINDOW <= until:
        if rate(ends, t, t + WINDOW) >= goal:
            return t - after
        t += 0.1
    return None


def report(o: scenarios.Outcome, pre: float) -> None:
    pre_from = o.began - (pre - 1.0)
    print(f"\n== {o.name}: fault lasted {o.ended - o.began:.2f} s  ({scenarios.summary(o)})")
    for kind, label in (("ingest", "deliveries/s (202)"), ("complete", "completes/s")):
        ends = [a.ended for a in o.of(kind) if a.outcome == "ok"]
        before = rate(ends, pre_from, o.began)
        seconds = int(o.load_ended - o.ended)
        after = [rate(ends, o.ended + i, o.ended + i + 1) for i in range(seconds)]
        ratio = (after[4] / before) if before and len(after) > 4 else float("nan")
        back = recovery(ends, o.ended, o.load_ended, GOAL * before) if before else None
        print(f"  {label}: pre-fault {before:.1f}; post-fault per second "
              + " ".join(f"{r:.0f}" for r in after)
              + f"; ratio (s 4-5 after) {ratio:.2f}; back to >= {GOAL:.0%} in "
              + (f"{back:.1f} s" if back is not None else f"not within {seconds} s"))
    asked = o.during_fault("ingest", "claim_next", "complete")
    times = [a.seconds for a in asked]
    over = [a for a in asked if a.seconds > 1.0]
    late = sum(scenarios.resolved_late(o, a) for a in over)
    print(f"  answers asked during the fault: {len(times)}; p50 {percentile(times, 0.5):.3f} s, "
          f"p99 {percentile(times, 0.99):.3f} s, max {max(times, default=float('nan')):.3f} s; over 1 s: {len(over)}"
          f" (of which asked before the store was surely gone and answered once it was back: {late})")
    by_outcome: dict[str, int] = {}
    for a in asked:
        by_outcome[f"{a.kind} {a.outcome}"] = by_outcome.get(f"{a.kind} {a.outcome}", 0) + 1
    print(f"  their outcomes: {by_outcome}")
    lost = [a for a in o.answers if a.outcome in ("lost", "timeout") and a.kind != "session"]
    print(f"  lost/ambiguous (connection cut or timed out): ingest {_count(lost, 'ingest')}, "
          f"claim_next {_count(lost, 'claim_next')}, complete {_count(lost, 'complete')}")
    contradicted = {
        "202 not stored": len(scenarios.unstored_202s(o)),
        "503 stored": len(scenarios.stored_503s(o)),
        "claims behind an error": len(scenarios.orphan_claims(o)),
        "completes untrue": len(scenarios.completes_untrue(o)),
        "doubles": len(scenarios.claimed_or_completed_twice(o)),
    }
    print(f"  answers the log contradicts: {contradicted}; projections verify exit {o.verify.code}")
    back = {kind: o.first_success_after(kind) for kind in ("ingest", "claim_next", "complete")}
    print("  first success after the fault: " + ", ".join(
        f"{k} {v:.2f} s" if v is not None else f"{k} never" for k, v in back.items()))
    lines = {name: len([line for line in text.splitlines() if line.strip()]) for name, text in o.fault_stderr.items()}
    tracebacks = {name: text.count("Traceback") for name, text in o.fault_stderr.items()}
    print(f"  stderr over the fault: lines {lines}, tracebacks {tracebacks}")
    if o.notes:
        print(f"  notes: {o.notes}")


def _count(answers: list[Answer], kind: str) -> int:
    return sum(a.kind == kind for a in answers)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenarios", nargs="*", metavar="SCENARIO",
                        help=f"any of {', '.join(scenarios.SCENARIOS)} (default: all)")
    parser.add_argument("--pre", type=float, default=5.0)
    parser.add_argument("--post", type=float, default=8.0)
    parser.add_argument("--ingest-threads", type=int, default=3)
    parser.add_argument("--agents", type=int, default=2)
    args = parser.parse_args()
    unknown = [name for name in args.scenarios if name not in scenarios.SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario {unknown[0]!r}: choose from {', '.join(scenarios.SCENARIOS)}")
    logging.getLogger("mcp").setLevel(logging.CRITICAL)  # the client's own log of a stream cut by a fault
    reason = unavailable_reason()
    if reason:
        print(f"cannot run: {reason}", file=sys.stderr)
        return 1
    names = args.scenarios or list(scenarios.SCENARIOS)
    cluster = Cluster(max_connections=100)
    started = time.monotonic()
    try:
        cluster.create()
        print(f"disposable cluster {cluster.name} on 127.0.0.1:{cluster.port}; load: {args.ingest_threads} "
              f"ingest threads, {args.agents} MCP agents; {args.pre:.0f} s before each fault, {args.post:.0f} s after")
        with tempfile.TemporaryDirectory(prefix="bench-faults-") as tmp:
            for name in names:
                try:
                    o = scenarios.run(name, cluster, Path(tmp) / name, pre=args.pre, post=args.post,
                                      ingest_threads=args.ingest_threads, agents=args.agents)
                except Exception as error:  # one scenario's failure does not hide the others' figures
                    print(f"\n== {name}: could not run: {type(error).__name__}: {error}")
                    continue
                report(o, args.pre)
    finally:
        cluster.drop()
    print(f"\n(total {time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
