"""Claim/complete throughput of Switchboard against a raw-SQL queue, plus projection rebuild speed.

Run:  .venv/bin/python bench/claim_complete.py [--todos 5000] [--workers 8] [--pg-url URL] [--quick]

Every PostgreSQL database used here is created fresh on the admin URL (`bench_<run id>_...`)
and dropped at the end, even on failure. Phases, all in one run:

1. Switchboard on PostgreSQL: vend one endpoint (queue "work"), push N todos (not timed,
   from the worker threads to be quick), then time W threads each looping
   `claim_next` + `complete` until the queue is empty.
2. Raw SQL baseline on the same server: one table, W threads with their own autocommit
   connection, `FOR UPDATE SKIP LOCKED` claim in one transaction, complete in another.
3. Phases 1 and 2 alternate `--rounds` times (default 2); each ratio, the best and the median
   (the target is on the median). Unless `--batch 0`, each round also runs the batch pair:
   `claim_next(max=B)` + `complete` of each against a raw `FOR UPDATE SKIP LOCKED ... LIMIT B`
   claim + one UPDATE per todo (B = 10 by default).
   With `--checkpoint`, each round also runs the Switchboard drain with a `heartbeat` carrying a
   1 KiB checkpoint (CONTRACT §18) before each `complete`, and prints its rate over the same
   round's plain drain (claim + heartbeat with checkpoint + complete ÷ claim + complete).
   With `--max-in-flight N`, each round also runs the Switchboard drain with the queue's
   `max_in_flight` set to N (queue controls, CONTRACT §13; N high enough not to bind measures
   what admission costs the hot path), against the same round's raw SQL.
4. The same Switchboard workload on a temporary SQLite file.
5. `Projector.rebuild()` speed (events/s) on PostgreSQL (~100k events) and on SQLite.

`--profile DIR` also writes cProfile files (one per worker thread and one for the writer
thread) for the first Switchboard/PostgreSQL round, and prints the top functions.
Each drain also prints the CPU it used per todo: this process (all its threads), its child
processes, and the PostgreSQL backends of its database (`CpuMeter`), and of the process's part, the
store's writer thread alone, the one every command waits for; on a busy machine that is steadier
than the rates.
`--split` times each writer batch of round 1's drains (the single one and the batch one): its size,
the handlers, encoding and ops, the append's one round trip, and the statements it sent
(`BatchSplit`); batches that claimed and the others apart, as their costs differ several times.
"""

from __future__ import annotations

import argparse
import cProfile
import logging
import os
import pstats
import secrets
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from application.service import Caller  # noqa: E402
from interfaces.bootstrap import Container, build  # noqa: E402
from interfaces.settings import Settings  # noqa: E402

ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/test"
CHECKPOINT_1K = {"notes": "x" * (1024 - len('{"notes":""}'))}  # 1024 bytes as compact JSON


# -- helpers ---------------------------------------------------------------------------


class Databases:
    """Fresh PostgreSQL databases for this run; all dropped by `drop_all()`."""

    def __init__(self, admin_url: str) -> None:
        self.admin_url = admin_url
        self.base = admin_url.rsplit("/", 1)[0]
        self.run_id = secrets.token_hex(4)
        self.names: list[str] = []

    def create(self, label: str) -> str:
        name = f"bench_{self.run_id}_{label}"
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        self.names.append(name)
        return f"{self.base}/{name}"

    def drop(self, url: str) -> None:
        name = url.rsplit("/", 1)[1]
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        if name in self.names:
            self.names.remove(name)

    def drop_all(self) -> None:
        for name in list(self.names):
            try:
                with psycopg.connect(self.admin_url, autocommit=True) as conn:
                    conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                self.names.remove(name)
            except psycopg.Error as error:  # pragma: no cover - best effort
                print(f"  ! could not drop {name}: {error}", file=sys.stderr)


def log(message: str = "") -> None:
    print(message, flush=True)


PG_SETTINGS = ("synchronous_commit", "fsync", "wal_sync_method", "commit_delay", "shared_buffers", "server_version",
               "autovacuum")


def pg_settings(url: str) -> dict[str, str]:
    """The PostgreSQL settings that move the figures, to print beside them."""
    with psycopg.connect(url) as conn:
        return dict(conn.execute("SELECT name, setting FROM pg_settings WHERE name = ANY(%s)",
                                 (list(PG_SETTINGS),)).fetchall())


TICK = os.sysconf("SC_CLK_TCK")


def _pid_cpu(pid: int | str) -> float:
    """CPU seconds (user + system) a process has used; 0 if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK


def _children(task: Path) -> list[str]:
    """The child process ids of one of this process's threads (none if it has just ended)."""
    try:
        return (task / "children").read_text().split()
    except FileNotFoundError:
        return []


def _thread_cpu(thread: threading.Thread | None) -> float:
    """CPU seconds (user + system) one thread of this process has used (0 if it has not started)."""
    if thread is None or thread.native_id is None:
        return 0.0
    return _pid_cpu(f"self/task/{thread.native_id}")


class CpuMeter:
    """CPU used during a drain, by whom: this process (every thread), its child processes (the
    projector), and the PostgreSQL backends connected to the drain's database. Per todo, it is
    what the machine's other work skews least (a throughput is a share of a busy machine)."""

    def __init__(self, url: str) -> None:
        self.url, self.dbname = url, url.rsplit("/", 1)[1]

    def _others(self) -> dict[str, dict[int, float]]:
        kids = [int(p) for task in Path("/proc/self/task").iterdir() for p in _children(task)]
        backends: list[int] = []
        if not self.url.startswith("sqlite:"):  # SQLite runs in this process: no backends
            with psycopg.connect(self.url, autocommit=True) as conn:
                backends = [row[0] for row in conn.execute(
                    "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()", (self.dbname,))]
        return {"children": {p: _pid_cpu(p) for p in kids}, "backends": {p: _pid_cpu(p) for p in backends}}

    def __enter__(self) -> CpuMeter:
        self._before, self._own = self._others(), time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        own = time.process_time() - self._own
        after = self._others()
        self.used = {"process": own} | {
            kind: sum(cpu - self._before[kind].get(pid, 0.0) for pid, cpu in after[kind].items())
            for kind in after}

    def per_todo(self, todos: int) -> str:
        """`process 212 + projector 0 + postgres 95 = 307 µs` per todo."""
        if not todos:
            return "-"
        parts = [f"{kind} {self.used[kind] / todos * 1e6:.0f}" for kind in ("process", "children", "backends")]
        return " + ".join(parts).replace("children", "projector").replace("backends", "postgres") \
            + f" = {sum(self.used.values()) / todos * 1e6:.0f} µs CPU per todo"


def run_threads(count: int, target: Callable[[int, threading.Barrier], int]) -> tuple[float, list[int], list[BaseException]]:
    """Starts `count` threads that wait on a barrier; returns (seconds from release to last done, results, errors)."""
    barrier = threading.Barrier(count + 1)
    results = [0] * count
    errors: list[BaseException] = []

    def body(i: int) -> None:
        try:
            results[i] = target(i, barrier)
        except BaseException as error:  # noqa: BLE001 - report, never hang
            errors.append(error)
            try:
                barrier.abort()
            except threading.BrokenBarrierError:
                pass

    threads = [threading.Thread(target=body, args=(i,), name=f"bench-worker-{i}") for i in range(count)]
    for t in threads:
        t.start()
    try:
        barrier.wait()
    except threading.BrokenBarrierError:
        pass
    start = time.perf_counter()
    for t in threads:
        t.join()
    return time.perf_counter() - start, results, errors


def payload_for(i: int) -> dict:
    return {"n": i, "kind": "bench", "text": "x" * 64}


# -- Switchboard -----------------------------------------------------------------------


def make_container(url: str, data_dir: str) -> Container:
    return build(Settings(database_url=url, data_dir=data_dir))


def setup_endpoint(container: Container, max_in_flight: int | None = None) -> str:
    app = container.app
    app.ensure_admin()
    slug = app.vend("bench", queues=["work"], caller=Caller.cli())["slug"]
    if max_in_flight is not None:
        app.set_queue_controls(slug, "work", caller=Caller.cli(), max_in_flight=max_in_flight)
    return slug


def push_todos(container: Container, slug: str, count: int, threads: int, start_at: int = 0) -> float:
    app, cli = container.app, Caller.cli()
    started = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        for _ in pool.map(
            lambda i: app.push(slug, f"todo {i}", caller=cli, payload=payload_for(i)),
            range(start_at, start_at + count),
        ):
            pass
    return time.perf_counter() - started


def drain(container: Container, slug: str, workers: int, profile_dir: str | None = None,
          batch: int | None = None, checkpoint: object = None) -> tuple[float, int, list[BaseException]]:
    """W threads loop claim_next + complete until empty (with `batch`: claim_next(max=batch), then
    complete each; with `checkpoint`: a heartbeat carrying it before each complete); returns
    (seconds, todos completed, errors)."""
    app = container.app
    caller = app.endpoint_caller(slug)  # authenticated once, as an MCP session is

    def work(i: int, barrier: threading.Barrier) -> int:
        profiler = cProfile.Profile() if profile_dir else None
        barrier.wait()
        if profiler:
            profiler.enable()
        done = 0
        try:
            while True:
                claimed = app.claim_next(caller=caller, max_todos=batch)
                if claimed["empty"]:
                    return done
                for todo in claimed["todos"] if batch else [claimed["todo"]]:
                    if checkpoint is not None:
                        app.heartbeat(todo["id"], caller=caller, checkpoint=checkpoint)
                    app.complete(todo["id"], caller=caller)
                    done += 1
        finally:
            if profiler:
                profiler.disable()
                profiler.dump_stats(os.path.join(profile_dir, f"worker-{i}.prof"))

    seconds, results, errors = run_threads(workers, work)
    return seconds, sum(results), errors


def profile_writer(container: Container, profile_dir: str) -> None:
    """Wraps the store's writer loop (before it starts) in a cProfile profiler."""
    writer = container.store.writer
    original = writer._loop

    def profiled() -> None:
        profiler = cProfile.Profile()
        profiler.enable()
        try:
            original()
        finally:
            profiler.disable()
            profiler.dump_stats(os.path.join(profile_dir, "writer.prof"))

    writer._loop = profiled  # type: ignore[method-assign]


class BatchSplit:
    """Where each writer batch's time goes (one drain): wraps the writer's and the recorder's
    methods on this container only, and counts the statements of each append."""

    def __init__(self, container: Container) -> None:
        from interfaces.store import recorders

        self.rows: list[dict] = []
        self._row: dict = {}
        writer, recorder = container.store.writer, container.store.recorder
        self._recorders, self._coalesce = recorders, recorders.coalesce_ops
        handle, finish, commit, append, insert = (writer._handle, writer._finish, writer._commit, writer._append,
                                                  recorder.append)

        def timed(function: Callable, key: str) -> Callable:
            def run(*args, **kwargs):
                started, cpu = time.perf_counter(), time.thread_time()
                try:
                    return function(*args, **kwargs)
                finally:
                    self._row[key] = self._row.get(key, 0.0) + time.perf_counter() - started
                    self._row[key + " cpu"] = self._row.get(key + " cpu", 0.0) + time.thread_time() - cpu
            return run

        def handled(run, job, attempt):  # the writer runs each job's handler as it takes the job
            if "finishing" in self._row:  # a re-run within the batch: part of its commit's time
                return handle(run, job, attempt)
            self._row["size"] = self._row.get("size", 0) + 1
            if "claim_next" in getattr(job.handler, "__qualname__", ""):
                self._row["claims"] = self._row.get("claims", 0) + 1
            return timed(handle, "handlers")(run, job, attempt)

        def finished(run, attempt):
            if "finishing" in self._row:
                return finish(run, attempt)
            self._row["finishing"] = True
            started = time.perf_counter()
            try:
                return finish(run, attempt)
            finally:
                self._row["finish"] = time.perf_counter() - started
                self.rows.append(self._row)
                self._row = {}

        def coalesce(ops):
            out = self._coalesce(ops)
            self._row["statements"] = self._row.get("statements", 0) + len(out) + 4  # + BEGIN, LOCK, INSERT, COMMIT
            return out

        def recorder_append(stored, **kwargs):
            if kwargs.get("notify"):  # the doorbell's NOTIFY, sent only by some commits (ADR 11)
                self._row["statements"] = self._row.get("statements", 0) + 1
            return timed(insert, "round trip")(stored, **kwargs)

        writer._handle, writer._finish, writer._commit = handled, finished, timed(commit, "commit")
        writer._append, recorder.append = timed(append, "append"), recorder_append
        recorders.coalesce_ops = coalesce

    def close(self) -> None:
        self._recorders.coalesce_ops = self._coalesce

    def report(self, drain: str) -> None:
        rows = [r for r in self.rows if "round trip" in r]
        if not rows:
            return
        claimed = [r for r in rows if r.get("claims")]
        groups = [("", rows)]
        if claimed and len(claimed) < len(rows):
            groups += [("batches that claimed: ", claimed), ("the others: ", [r for r in rows if not r.get("claims")])]
        for label, group in groups:
            self._report(f"{drain}, {label}" if label else f"{drain}: ", group)

    def _report(self, title: str, rows: list[dict]) -> None:
        log(f"\n--- writer batch split ({title}{len(rows)} batches that appended,"
            f" {statistics.mean(r['size'] for r in rows):.2f} commands each (mean),"
            f" {statistics.mean(r.get('claims', 0) for r in rows):.2f} of them claims) ---")
        columns = (
            ("handlers + commit", lambda r: r.get("handlers", 0.0) + r["finish"]),
            ("handlers", lambda r: r.get("handlers", 0.0)),
            ("encode + ops", lambda r: r.get("append", 0.0) - r["round trip"]),
            ("append round trip", lambda r: r["round trip"]),
            ("  of it writer CPU", lambda r: r["round trip cpu"]),
            ("after the append", lambda r: r.get("commit", 0.0) - r.get("append", 0.0)),
        )
        for label, value in columns:
            values = [value(r) for r in rows]
            log(f"  {label:18s} median {statistics.median(values) * 1000:6.2f} ms  mean {statistics.mean(values) * 1000:6.2f} ms"
                f"  total {sum(values):6.2f} s")
        log(f"  statements per append: mean {statistics.mean(r.get('statements', 0) for r in rows):.1f}"
            " (the tracking update not counted)")


def switchboard_round(url: str, todos: int, workers: int, data_dir: str, *, profile_dir: str | None = None,
                      keep: bool = False, batch: int | None = None, max_in_flight: int | None = None,
                      split: bool = False, checkpoint: object = None) -> dict:
    container = make_container(url, data_dir)
    try:
        slug = setup_endpoint(container, max_in_flight)
        push_seconds = push_todos(container, slug, todos, workers)
        if container.store.url.dialect == "postgres":
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("CHECKPOINT")  # same as before the raw drain
        if profile_dir:
            # the writer thread already runs; restart it under the profiler
            writer = container.store.writer
            writer.jobs.put(None)
            writer._thread.join()
            writer._thread = None
            profile_writer(container, profile_dir)
        splitter = BatchSplit(container) if split and container.store.url.dialect == "postgres" else None
        try:
            writer_before = _thread_cpu(container.store.writer._thread)  # 0 if restarted for the profiler
            with CpuMeter(url) as cpu:
                seconds, done, errors = drain(container, slug, workers, profile_dir, batch=batch, checkpoint=checkpoint)
            writer_used = _thread_cpu(container.store.writer._thread) - writer_before
        finally:
            if splitter is not None:
                splitter.close()
                splitter.report(f"round 1's drain, claim_next(max={batch})" if batch else "round 1's drain")
        events = container.store.max_position()
        if profile_dir:
            writer = container.store.writer
            writer.jobs.put(None)
            writer._thread.join()
            writer._thread = None
            del writer._loop  # back to the unprofiled loop
        result = {
            "rate": done / seconds if seconds else 0.0, "seconds": seconds, "done": done,
            "errors": errors, "push_rate": todos / push_seconds, "events": events,
            "cpu": f"{cpu.per_todo(done)} (of which the writer thread {writer_used / done * 1e6:.0f})"
            if container.store.url.dialect == "postgres" and done else "-",
        }
        if keep:
            result["container"] = container
            result["slug"] = slug
        return result
    finally:
        if not keep:
            container.close()


# -- raw SQL baseline ------------------------------------------------------------------

RAW_DDL = (
    "CREATE TABLE q (id bigserial PRIMARY KEY, queue text NOT NULL, state text NOT NULL,"
    " payload jsonb, claimed_by text, lease_expires_at timestamptz, created_at timestamptz NOT NULL DEFAULT now())",
    "CREATE INDEX q_pending ON q (id) WHERE state = 'pending'",
)
RAW_CLAIM = (
    "UPDATE q SET state = 'claimed', claimed_by = %s, lease_expires_at = now() + interval '5 min'"
    " WHERE id = (SELECT id FROM q WHERE state = 'pending' ORDER BY id FOR UPDATE SKIP LOCKED LIMIT 1)"
    " RETURNING id, payload"
)
RAW_CLAIM_MANY = (
    "UPDATE q SET state = 'claimed', claimed_by = %s, lease_expires_at = now() + interval '5 min'"
    " WHERE id IN (SELECT id FROM q WHERE state = 'pending' ORDER BY id FOR UPDATE SKIP LOCKED LIMIT %s)"
    " RETURNING id, payload"
)
RAW_COMPLETE = "UPDATE q SET state = 'done' WHERE id = %s"


def raw_round(url: str, todos: int, workers: int, batch: int | None = None) -> dict:
    """The raw queue: claim one (or `batch` in one statement), then complete each on its own."""
    with psycopg.connect(url, autocommit=True) as conn:
        for statement in RAW_DDL:
            conn.execute(statement)
        with conn.cursor() as cur:
            with cur.copy("COPY q (queue, state, payload) FROM STDIN") as copy:
                for i in range(todos):
                    copy.write_row(("work", "pending", psycopg.types.json.Jsonb(payload_for(i))))
        conn.execute("CHECKPOINT")  # same as before the Switchboard drain

    connections = [psycopg.connect(url, autocommit=True) for _ in range(workers)]
    for c in connections:
        c.execute("SET synchronous_commit = on")

    def work(i: int, barrier: threading.Barrier) -> int:
        conn, me = connections[i], f"worker-{i}"
        barrier.wait()
        done = 0
        while True:
            if batch:
                rows = conn.execute(RAW_CLAIM_MANY, (me, batch), prepare=True).fetchall()
            else:
                rows = conn.execute(RAW_CLAIM, (me,), prepare=True).fetchall()
            if not rows:
                return done
            for row in rows:
                conn.execute(RAW_COMPLETE, (row[0],), prepare=True)
                done += 1

    try:
        with CpuMeter(url) as cpu:
            seconds, results, errors = run_threads(workers, work)
    finally:
        for c in connections:
            c.close()
    done = sum(results)
    return {"rate": done / seconds if seconds else 0.0, "seconds": seconds, "done": done, "errors": errors,
            "cpu": cpu.per_todo(done)}


# -- rebuild ---------------------------------------------------------------------------


def top_up(container: Container, slug: str, target_events: int, threads: int, chunk: int) -> float:
    """Adds events through the application until the log holds about `target_events`.

    Three quarters as push/claim/complete cycles (3 events a todo), pushed and drained in
    chunks so the queue stays as shallow as in the timed rounds; the rest as plain pushes.
    """
    started = time.perf_counter()
    missing = target_events - container.store.max_position()
    if missing <= 0:
        return 0.0
    cycles = (missing * 3 // 4) // 3
    pushes = missing - 3 * cycles
    base = container.store.max_position() + 1_000_000
    done = 0
    while done < cycles:
        n = min(chunk, cycles - done)
        push_todos(container, slug, n, threads, start_at=base + done)
        drain(container, slug, threads)
        done += n
    if pushes > 0:
        push_todos(container, slug, pushes, threads, start_at=base + cycles)
    return time.perf_counter() - started


def time_rebuild(container: Container) -> dict:
    events = container.store.max_position()
    started = time.perf_counter()
    counts = container.projector.rebuild()
    seconds = time.perf_counter() - started
    applied = max(counts.values()) if counts else 0
    return {"events": events, "applied": applied, "seconds": seconds, "rate": applied / seconds if seconds else 0.0}


# -- profile report --------------------------------------------------------------------


def print_profile(profile_dir: str, top: int) -> None:
    files = sorted(Path(profile_dir).glob("*.prof"))
    writer = [str(f) for f in files if f.name == "writer.prof"]
    workers = [str(f) for f in files if f.name.startswith("worker-")]
    for label, group in (("writer thread", writer), ("worker threads (all merged)", workers)):
        if not group:
            continue
        log(f"\n--- cProfile: {label}, by own time ---")
        stats = pstats.Stats(*group)
        stats.sort_stats("tottime").print_stats(top)
        log(f"--- cProfile: {label}, by cumulative time ---")
        stats.sort_stats("cumulative").print_stats(top)


# -- main ------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--todos", type=int, default=5000, help="todos per PostgreSQL round (default 5000)")
    parser.add_argument("--workers", type=int, default=8, help="worker threads (default 8)")
    parser.add_argument("--rounds", type=int, default=2, help="alternating switchboard/raw pairs (default 2)")
    parser.add_argument("--pg-url", default=ADMIN_URL, help=f"admin URL used to create databases (default {ADMIN_URL})")
    parser.add_argument("--sqlite-todos", type=int, default=2000, help="todos for the SQLite round (default 2000)")
    parser.add_argument("--rebuild-events", type=int, default=100_000, help="events for the PostgreSQL rebuild (default 100000)")
    parser.add_argument("--sqlite-rebuild-events", type=int, default=20_000, help="events for the SQLite rebuild (default 20000)")
    parser.add_argument("--fill-threads", type=int, default=8, help="threads that generate rebuild events (default 8)")
    parser.add_argument("--batch", type=int, default=10,
                        help="also a batch pair per round: claim_next(max=B) against SKIP LOCKED LIMIT B (0: none)")
    parser.add_argument("--max-in-flight", type=int, metavar="N",
                        help="each round also drains a queue with max_in_flight N (queue controls)")
    parser.add_argument("--checkpoint", action="store_true",
                        help="each round also drains with a heartbeat carrying a 1 KiB checkpoint before each complete")
    parser.add_argument("--skip-sqlite", action="store_true", help="skip the SQLite phases")
    parser.add_argument("--skip-rebuild", action="store_true", help="skip the rebuild phases")
    parser.add_argument("--profile", metavar="DIR", help="cProfile the first Switchboard/PostgreSQL drain into DIR")
    parser.add_argument("--profile-top", type=int, default=25, help="rows of each profile table (default 25)")
    parser.add_argument("--split", action="store_true",
                        help="time each writer batch of round 1's Switchboard/PostgreSQL drains (handlers, encoding,"
                             " round trip), batches that claimed and the others apart")
    parser.add_argument("--quick", action="store_true",
                        help="well under a minute: 1500 todos, 2 rounds, 600 SQLite todos, 20k/6k rebuild events")
    args = parser.parse_args()
    if args.quick:
        args.todos, args.rounds, args.sqlite_todos = min(args.todos, 1500), min(args.rounds, 2), min(args.sqlite_todos, 600)
        args.rebuild_events, args.sqlite_rebuild_events = min(args.rebuild_events, 20_000), min(args.sqlite_rebuild_events, 6_000)

    logging.basicConfig(level=logging.WARNING)
    if args.profile:
        os.makedirs(args.profile, exist_ok=True)
    dbs = Databases(args.pg_url)
    tmp = tempfile.TemporaryDirectory(prefix="sb-bench-")
    summary: dict = {"pairs": []}
    total_started = time.perf_counter()
    log(f"claim/complete bench: {args.todos} todos, {args.workers} workers, {args.rounds} round(s), "
        f"PostgreSQL via {args.pg_url}, run id {dbs.run_id}")
    settings = pg_settings(args.pg_url)
    log("server: " + ", ".join(f"{k}={v}" for k, v in sorted(settings.items())))
    log("machine: %d cores, load average %.2f %.2f %.2f (other work on the machine skews every figure)"
        % (os.cpu_count() or 0, *os.getloadavg()))

    keep_for_rebuild = None
    try:
        # 1-3: alternate switchboard and raw
        for r in range(1, args.rounds + 1):
            url = dbs.create(f"sb{r}")
            last = r == args.rounds and not args.skip_rebuild
            sb = switchboard_round(url, args.todos, args.workers, tmp.name,
                                   profile_dir=args.profile if r == 1 else None, keep=last, split=args.split and r == 1)
            log(f"[round {r}] switchboard/pg: {sb['rate']:8.1f} todos/s  ({sb['done']} in {sb['seconds']:.2f}s;"
                f" push {sb['push_rate']:.0f}/s untimed; {sb['events']} events; errors {len(sb['errors'])})")
            for e in sb["errors"][:3]:
                log(f"    error: {e!r}")
            if last:
                keep_for_rebuild = (sb.pop("container"), sb.pop("slug"), url)
            else:
                dbs.drop(url)

            url = dbs.create(f"raw{r}")
            raw = raw_round(url, args.todos, args.workers)
            dbs.drop(url)
            log(f"[round {r}] raw sql/pg:     {raw['rate']:8.1f} todos/s  ({raw['done']} in {raw['seconds']:.2f}s;"
                f" errors {len(raw['errors'])})")
            log(f"[round {r}] cpu: switchboard {sb['cpu']}; raw sql {raw['cpu']}")
            ratio = sb["rate"] / raw["rate"] if raw["rate"] else 0.0
            log(f"[round {r}] ratio switchboard/raw = {ratio:.3f}  (load %.2f)" % os.getloadavg()[0])
            summary["pairs"].append((sb["rate"], raw["rate"], ratio, sb["done"], raw["done"]))
            if args.checkpoint:  # claim + heartbeat(1 KiB checkpoint) + complete, against the plain drain
                url = dbs.create(f"sb_checkpoint{r}")
                ck = switchboard_round(url, args.todos, args.workers, tmp.name, checkpoint=CHECKPOINT_1K)
                dbs.drop(url)
                ratio_c = ck["rate"] / sb["rate"] if sb["rate"] else 0.0
                log(f"[round {r}] with a 1 KiB checkpoint: switchboard/pg {ck['rate']:8.1f} todos/s"
                    f" ({ck['done']}; errors {len(ck['errors'])}) | with ÷ without {ratio_c:.3f}"
                    f" | ratio to raw {ck['rate'] / raw['rate'] if raw['rate'] else 0.0:.3f}  (load %.2f)"
                    % os.getloadavg()[0])
                log(f"[round {r}] checkpoint cpu: switchboard {ck['cpu']}")
                summary.setdefault("checkpoint_pairs", []).append((ck["rate"], sb["rate"], ratio_c))
            if args.max_in_flight:
                url = dbs.create(f"sb_limited{r}")
                lim = switchboard_round(url, args.todos, args.workers, tmp.name, max_in_flight=args.max_in_flight)
                dbs.drop(url)
                ratio_l = lim["rate"] / raw["rate"] if raw["rate"] else 0.0
                log(f"[round {r}] max_in_flight {args.max_in_flight}: switchboard/pg {lim['rate']:8.1f} todos/s"
                    f" ({lim['done']}; errors {len(lim['errors'])}) | ratio to raw {ratio_l:.3f}  (load %.2f)"
                    % os.getloadavg()[0])
                summary.setdefault("limited_pairs", []).append((lim["rate"], raw["rate"], ratio_l))

            if args.batch:  # claim_next(max=B) + complete each, against SKIP LOCKED ... LIMIT B
                url = dbs.create(f"raw_batch{r}")
                raw_b = raw_round(url, args.todos, args.workers, batch=args.batch)
                dbs.drop(url)
                url = dbs.create(f"sb_batch{r}")
                sb_b = switchboard_round(url, args.todos, args.workers, tmp.name, batch=args.batch,
                                         split=args.split and r == 1)
                dbs.drop(url)
                ratio_b = sb_b["rate"] / raw_b["rate"] if raw_b["rate"] else 0.0
                log(f"[round {r}] batch of {args.batch}: switchboard/pg {sb_b['rate']:8.1f} todos/s"
                    f" ({sb_b['done']}; errors {len(sb_b['errors'])}) | raw sql {raw_b['rate']:8.1f} todos/s"
                    f" ({raw_b['done']}) | ratio {ratio_b:.3f}  (load %.2f)" % os.getloadavg()[0])
                log(f"[round {r}] batch cpu: switchboard {sb_b['cpu']}; raw sql {raw_b['cpu']}")
                summary.setdefault("batch_pairs", []).append((sb_b["rate"], raw_b["rate"], ratio_b))

        if args.profile:
            print_profile(args.profile, args.profile_top)

        # 4: SQLite
        if not args.skip_sqlite:
            path = os.path.join(tmp.name, "bench.db")
            sq = switchboard_round(f"sqlite:///{path}", args.sqlite_todos, args.workers, tmp.name,
                                   keep=not args.skip_rebuild)
            log(f"switchboard/sqlite: {sq['rate']:8.1f} todos/s  ({sq['done']} in {sq['seconds']:.2f}s;"
                f" push {sq['push_rate']:.0f}/s untimed; errors {len(sq['errors'])})")
            summary["sqlite"] = sq["rate"], sq["done"]
            if not args.skip_rebuild:
                container, slug = sq.pop("container"), sq.pop("slug")
                try:
                    fill = top_up(container, slug, args.sqlite_rebuild_events, args.fill_threads, args.sqlite_todos)
                    log(f"sqlite: topped up to {container.store.max_position()} events in {fill:.1f}s (untimed)")
                    rb = time_rebuild(container)
                    log(f"rebuild/sqlite: {rb['rate']:8.0f} events/s  ({rb['applied']} events in {rb['seconds']:.2f}s)")
                    summary["rebuild_sqlite"] = rb
                finally:
                    container.close()

        # 5: PostgreSQL rebuild
        if keep_for_rebuild is not None:
            container, slug, url = keep_for_rebuild
            try:
                fill = top_up(container, slug, args.rebuild_events, args.fill_threads, args.todos)
                log(f"postgres: topped up to {container.store.max_position()} events in {fill:.1f}s (untimed)")
                rb = time_rebuild(container)
                log(f"rebuild/pg: {rb['rate']:8.0f} events/s  ({rb['applied']} events in {rb['seconds']:.2f}s)")
                summary["rebuild_pg"] = rb
            finally:
                container.close()
                dbs.drop(url)
    finally:
        dbs.drop_all()
        tmp.cleanup()

    # summary
    pairs = summary["pairs"]
    ratios = [p[2] for p in pairs]
    log("\n================ SUMMARY ================")
    log(f"workload: {args.todos} todos per PostgreSQL round, {args.workers} worker threads, claim_next + complete")
    for i, (sb, raw, ratio, sb_done, raw_done) in enumerate(pairs, 1):
        log(f"round {i}: switchboard/pg {sb:8.1f} todos/s | raw sql {raw:8.1f} todos/s | ratio {ratio:.3f}"
            f"  (completed {sb_done}/{raw_done})")
    if ratios:
        sb_rates = [p[0] for p in pairs]
        raw_rates = [p[1] for p in pairs]
        log(f"switchboard/pg median {statistics.median(sb_rates):8.1f} todos/s, best {max(sb_rates):8.1f}")
        log(f"raw sql/pg     median {statistics.median(raw_rates):8.1f} todos/s, best {max(raw_rates):8.1f}")
        verdict = "MEETS" if statistics.median(ratios) >= 0.5 else "BELOW"
        log(f"ratio switchboard/raw: best {max(ratios):.3f}, median {statistics.median(ratios):.3f}"
            f"  (target: median >= 0.5: {verdict})")
    if summary.get("limited_pairs"):
        limited = summary["limited_pairs"]
        log(f"max_in_flight {args.max_in_flight}: switchboard/pg median {statistics.median(p[0] for p in limited):8.1f}"
            f" todos/s; ratio to raw median {statistics.median(p[2] for p in limited):.3f}"
            f" (without controls: {statistics.median(ratios):.3f})")
    if summary.get("checkpoint_pairs"):
        checked = summary["checkpoint_pairs"]
        log(f"with a 1 KiB checkpoint heartbeat per todo: switchboard/pg median"
            f" {statistics.median(p[0] for p in checked):8.1f} todos/s; claim+checkpoint+complete ÷ claim+complete"
            f" median {statistics.median(p[2] for p in checked):.3f}")
    if summary.get("batch_pairs"):
        batch = summary["batch_pairs"]
        median_b = statistics.median(p[2] for p in batch)
        log(f"batch of {args.batch}: switchboard/pg median {statistics.median(p[0] for p in batch):8.1f} todos/s,"
            f" raw sql median {statistics.median(p[1] for p in batch):8.1f} todos/s; ratio median {median_b:.3f}"
            f"  (target >= 0.5: {'MEETS' if median_b >= 0.5 else 'BELOW'})")
    if "sqlite" in summary:
        rate, done = summary["sqlite"]
        log(f"switchboard/sqlite: {rate:8.1f} todos/s ({done} todos)")
    for key, label in (("rebuild_pg", "rebuild/pg"), ("rebuild_sqlite", "rebuild/sqlite")):
        if key in summary:
            rb = summary[key]
            log(f"{label}: {rb['rate']:8.0f} events/s ({rb['applied']} events in {rb['seconds']:.2f}s)")
    log(f"total wall time: {time.perf_counter() - total_started:.0f}s; load average at the end %.2f %.2f %.2f"
        % os.getloadavg())
    return 0


if __name__ == "__main__":
    sys.exit(main())
