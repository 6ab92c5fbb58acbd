"""The audit hash chain's costs: verify rate, sealing rate against the append rate, in one run.

Run:  .venv/bin/python bench/audit.py [--events 100000] [--seconds 5] [--writers 4] [--pg-url URL]

On SQLite (a fresh file) and, when reachable, PostgreSQL (a fresh database, dropped at the end):

1. A log of N real events (per todo: TodoOpened with a ~1 KB JSON payload, TodoClaimed,
   TodoCompleted with a result; every tenth todo comes with a DeliveryAccepted of a 10.5 KB
   GitHub body), appended through the store's recorder in batches of 999 (the stored format,
   without the writer's per-command work, so building the log is quick).
2. Sealing it from position 1, as the first start after an upgrade does: events/s.
3. `audit verify` over the store, `audit verify --file` over its export (the CLI's code), and the
   stdlib-only docs/audit_verify.py over the same file: events/s (goal for the store ≥ 50,000/s).
4. The append rate through the real command path (`push`, W writer threads, S seconds) with no
   sealer, then again with the serve process's Sealer thread running beside it: the sealing
   rate (events sealed per second the sealer was busy), the append rate with and without it,
   and how far behind the sealer was at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from application.audit import AuditLog, Sealer, verify_lines  # noqa: E402
from application.service import Caller  # noqa: E402
from domain.delivery import DeliveryAccepted  # noqa: E402
from domain.todo import TodoClaimed, TodoCompleted, TodoOpened  # noqa: E402
from interfaces.bootstrap import build  # noqa: E402
from interfaces.cli.audit import JsonLines  # noqa: E402
from interfaces.store.chain import sorted_json  # noqa: E402
from interfaces.settings import Settings  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BODY = (ROOT / "tests" / "fixtures" / "github_issues_opened.json").read_bytes()
CLI = Caller.cli()
KEY = "5b" * 32


def log_of(n: int):
    """About n events of the usual mix, in batches for one insert each."""
    t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
    payload = {"action": "opened", "issue": {"number": 1, "title": "t" * 60, "body": "lorem ipsum " * 60,
                                             "labels": [{"name": "bug", "id": 1}]}}
    batch, made, k = [], 0, 0
    while made < n:
        k += 1
        now = t0 + timedelta(seconds=k)
        todo = uuid.uuid4()
        if k % 10 == 0:
            batch.append(DeliveryAccepted(
                originator_id=uuid.uuid4(), originator_version=1, timestamp=now, actor="webhook:wh_x", cause="ingest",
                webhook_id="wh_x", endpoint_id="ep_x", source="github", kind="issues.opened", trust_mode="signed",
                verified=True, remote_addr="192.0.2.1", content_type="application/json", size=len(BODY),
                headers={"x-github-event": "issues"}, body=BODY.decode(), body_encoding="utf-8",
                delivery_key=f"wh_x:{k}", disposition="routed", routing={"trace": []},
                todos=[{"id": f"td_{todo.hex}"}]))
        batch += [
            TodoOpened(originator_id=todo, originator_version=1, timestamp=now, actor="operator:cli", cause="push",
                       endpoint_id="ep_x", queue="work", source="operator", kind=None, title=f"todo {k}",
                       trust_mode="operator", payload={**payload, "n": k}, payload_size=1000),
            TodoClaimed(originator_id=todo, originator_version=2, timestamp=now, actor="endpoint:w", cause="claim",
                        attempt=1, attempt_seq=1, holder="w", claimant=None, lease_expires_at=now + timedelta(minutes=5)),
            TodoCompleted(originator_id=todo, originator_version=3, timestamp=now, actor="endpoint:w", cause="complete",
                          result={"ok": True, "n": k}, summary="done"),
        ]
        made = made + 4 if k % 10 == 0 else made + 3
        if len(batch) >= 999:
            yield batch
            batch = []
    if batch:
        yield batch


def timed(fn):
    """The result, and the CPU seconds this process spent on it (not wall time: the machine is shared)."""
    started = time.process_time()
    result = fn()
    return result, time.process_time() - started


def child_cpu(fn):
    """The result, and the CPU seconds of the child processes it ran."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = fn()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return result, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def container_on(url: str, data_dir: str):
    return build(Settings(database_url=url, data_dir=data_dir, secret_key=None if url.startswith("sqlite") else KEY))


def log_phases(label: str, url: str, data_dir: str, n: int) -> None:
    c = container_on(url, data_dir)
    try:
        total = 0
        for batch in log_of(n):
            c.store.recorder.insert_events([c.store.codec.to_stored_event(e) for e in batch])
            total += len(batch)
        sealed, seconds = timed(c.audit.seal)
        print(f"{label}: {total} events; sealing from position 1 (first start after an upgrade): "
              f"{sealed / seconds:,.0f} events per CPU second ({seconds:.2f} s)")
        verdict, seconds = timed(c.audit.verify)
        print(f"{label}: audit verify (store): {verdict.count / seconds:,.0f} events per CPU second ({seconds:.2f} s) "
              f"[goal >= 50,000/s: {'met' if verdict.count / seconds >= 50_000 else 'NOT met'}]")
        path = Path(data_dir) / "export.jsonl"
        with open(path, "w") as out:
            for record in c.audit.export():
                out.write(json.dumps(record, separators=(",", ":")) + "\n")
        size = path.stat().st_size

        def lines():
            with open(path) as handle:
                yield from handle

        verdict, seconds = timed(lambda: verify_lines(lines, JsonLines().parse, sorted_json))
        print(f"{label}: audit verify --file ({size / 1e6:.0f} MB): {verdict.count / seconds:,.0f} events per CPU second "
              f"({seconds:.2f} s)")
        script, seconds = child_cpu(lambda: subprocess.run(
            [sys.executable, "-I", str(ROOT / "docs" / "audit_verify.py"), str(path)], capture_output=True, text=True))
        assert script.returncode == 0, script.stdout + script.stderr
        print(f"{label}: docs/audit_verify.py (stdlib): {verdict.count / seconds:,.0f} events per CPU second "
              f"({seconds:.2f} s)")
    finally:
        c.close()


def append_run(c, vended: dict, seconds: float, writers: int) -> int:
    stop = time.monotonic() + seconds
    counts = [0] * writers

    def write(i: int) -> None:
        while time.monotonic() < stop:
            c.app.push(vended["slug"], f"w{i}", caller=CLI, payload={"i": i, "pad": "x" * 500})
            counts[i] += 1

    threads = [threading.Thread(target=write, args=(i,)) for i in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts)


class TimedAudit(AuditLog):
    """The real AuditLog, keeping the CPU seconds its seals took (on the sealer's thread) and what they sealed."""

    busy = 0.0
    sealed = 0

    def seal(self) -> int:
        started = time.thread_time()
        n = super().seal()
        self.busy += time.thread_time() - started
        self.sealed += n
        return n


def append_phases(label: str, url: str, data_dir: str, seconds: float, writers: int, rounds: int = 3) -> None:
    """Rounds alternate: pushes alone, then pushes with the Sealer thread beside them (as in serve)."""
    c = container_on(url, data_dir)
    try:
        c.app.ensure_admin()
        vended = c.app.vend("bench", queues=["work"], caller=CLI)
        c.audit.seal()
        alone, beside, rates, busy, behind = [], [], [], [], []
        for _ in range(rounds):
            alone.append(append_run(c, vended, seconds, writers) / seconds)
            audit = TimedAudit(c.audit.chain, c.clock, fast=sorted_json)
            audit.seal()
            audit.busy, audit.sealed = 0.0, 0
            stop = threading.Event()
            sealer = Sealer(audit)
            thread = threading.Thread(target=sealer.run, args=(stop,))
            thread.start()
            beside.append(append_run(c, vended, seconds, writers) / seconds)
            behind.append(audit.unsealed())
            stop.set()
            sealer.wake.set()
            thread.join()
            rates.append(audit.sealed / audit.busy if audit.busy else float("nan"))
            busy.append(audit.busy / seconds)
        median = statistics.median
        print(f"{label}: append (push, {writers} writers, {rounds} x {seconds:g} s alternating): median "
              f"{median(alone):,.0f} todos/s without the sealer, {median(beside):,.0f} with it "
              f"(ratio {median(beside) / median(alone):.2f}; rounds {[round(a) for a in alone]} vs "
              f"{[round(b) for b in beside]})")
        print(f"{label}: sealing rate median {median(rates):,.0f} events per CPU second vs append "
              f"{median(beside):,.0f} events/s (ratio {median(rates) / median(beside):.1f}); the sealer used "
              f"{median(busy):.1%} of a core; unsealed at the end of each round: {behind}")
    finally:
        c.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--writers", type=int, default=4)
    parser.add_argument("--pg-url", default=os.environ.get("SWITCHBOARD_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-audit-") as tmp:
        for phase, name in ((log_phases, "log.db"), (append_phases, "append.db")):
            extra = (args.events,) if phase is log_phases else (args.seconds, args.writers)
            phase("sqlite", f"sqlite:///{tmp}/{name}", tmp, *extra)
        try:
            psycopg.connect(args.pg_url, connect_timeout=3).close()
        except psycopg.Error as error:
            print(f"postgres: skipped ({str(error).strip().splitlines()[0]})")
            return 0
        base = args.pg_url.rsplit("/", 1)[0]
        for phase in (log_phases, append_phases):
            name = f"bench_audit_{uuid.uuid4().hex[:10]}"
            with psycopg.connect(args.pg_url, autocommit=True) as conn:
                conn.execute(f'CREATE DATABASE "{name}"')
            try:
                extra = (args.events,) if phase is log_phases else (args.seconds, args.writers)
                phase("postgres", f"{base}/{name}", tmp, *extra)
            finally:
                with psycopg.connect(args.pg_url, autocommit=True) as conn:
                    conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    return 0


if __name__ == "__main__":
    sys.exit(main())
