"""One `switchboard serve` against two on one PostgreSQL, in one run: ingest and MCP drain.

Run:  .venv/bin/python bench/scaling.py [--rounds 3] [--seconds 6] [--senders 8] [--todos 600]
                                        [--sessions 8] [--app-todos 4000] [--app-processes 2,3]
                                        [--pg-url URL]

Each round: a fresh database and data dir per workload (both processes share the data dir, so
the same secret key); the one-process and the two-process runs alternate, their order swapping
each round. Ingest: `--senders` keep-alive threads POST the signed GitHub delivery, sender i to
process i mod n (a round-robin split of the senders, as a load balancer spreading connections
would); deliveries/s after a warm-up. MCP: `--todos` todos drained by `--sessions` sessions of
the official client, session i opened on process i mod n and kept there (sticky per session, as
ADR 10 asks of a load balancer). Ratios two/one per round, their medians, the machine's core
count and load average: the scaling the README claims, measured on THIS machine, where the
servers, PostgreSQL and the clients share its cores. Claims at the application layer (no HTTP):
`--app-todos` todos drained with claim_next + complete by `--sessions` threads in one process,
against two processes with half the threads each (two writers racing for one queue's head:
docs/adr/0035), and against each count of `--app-processes` (e.g. `2,3`: three with a third each).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.claim_complete import Databases, drain, log, make_container, push_todos, setup_endpoint  # noqa: E402
from bench.ingest import FIXTURE, Server, drive, setup_switchboard, switchboard_server  # noqa: E402
from bench.mcp_drain import load, mcp_drain, push_round, setup_server_db  # noqa: E402
from tests.fixtures import fixture  # noqa: E402

ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/test"


def start(processes: int, label: str, url: str, data_dir: str) -> list[Server]:
    servers: list[Server] = []
    try:
        for n in range(processes):
            servers.append(switchboard_server(f"{label}-{n}", url, data_dir).start())
    except BaseException:
        stop(servers)
        raise
    return servers


def stop(servers: list[Server]) -> None:
    for server in servers:
        server.stop()


def ingest_round(processes: int, dbs: Databases, tmp: str, tag: str, args: argparse.Namespace) -> float:
    url = dbs.create(f"ingest_{tag}")
    data_dir = os.path.join(tmp, f"ingest-{tag}")
    os.makedirs(data_dir)
    token, secret = setup_switchboard(url, data_dir, with_rule=False)
    servers = start(processes, f"ingest-{tag}", url, data_dir)
    try:
        result = drive(f"{processes}p", servers, token, secret, fixture(FIXTURE), senders=args.senders, warmup=1.0,
                       seconds=args.seconds)
    finally:
        stop(servers)
        dbs.drop(url)
    if result.failures:
        log(f"    ! {result.failures[:3]}")
    return result.rate


def mcp_round(processes: int, dbs: Databases, tmp: str, tag: str, args: argparse.Namespace) -> dict[str, Any]:
    url = dbs.create(f"mcp_{tag}")
    data_dir = os.path.join(tmp, f"mcp-{tag}")
    os.makedirs(data_dir)
    setup = setup_server_db(url, data_dir)
    servers = start(processes, f"mcp-{tag}", url, data_dir)
    try:
        push_round(url, data_dir, setup["drain"]["slug"], args.todos, start_at=1)
        return mcp_drain(servers, setup["drain"], args.sessions)
    finally:
        stop(servers)
        dbs.drop(url)


def _app_claimer(url: str, data_dir: str, slug: str, threads: int, barrier: Any, out: Any) -> None:
    """One process: its own container (writer, cache, pools), `threads` claimers until empty."""
    container = make_container(url, data_dir)
    try:
        barrier.wait()
        seconds, done, errors = drain(container, slug, threads)
        out.put((done, seconds, [repr(e) for e in errors[:3]]))
    finally:
        container.close()


def app_round(processes: int, dbs: Databases, tmp: str, tag: str, args: argparse.Namespace) -> float:
    url = dbs.create(f"app_{tag}")
    data_dir = os.path.join(tmp, f"app-{tag}")
    os.makedirs(data_dir)
    try:
        container = make_container(url, data_dir)
        try:
            slug = setup_endpoint(container)
            push_todos(container, slug, args.app_todos, 8)  # the claimers' caches start cold, as a serve's do
        finally:
            container.close()
        ctx = multiprocessing.get_context("spawn")
        barrier, out = ctx.Barrier(processes), ctx.Queue()
        shares = [args.sessions // processes + (i < args.sessions % processes) for i in range(processes)]
        children = [ctx.Process(target=_app_claimer, args=(url, data_dir, slug, share, barrier, out))
                    for share in shares]
        for child in children:
            child.start()
        results = [out.get(timeout=600) for _ in children]
        for child in children:
            child.join()
    finally:
        dbs.drop(url)
    done = sum(n for n, _, _ in results)
    if done != args.app_todos or any(errors for _, _, errors in results):
        log(f"    ! {done} of {args.app_todos} todos completed; errors {[e for _, _, es in results for e in es]}")
    return done / max(seconds for _, seconds, _ in results)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=6.0, help="measured ingest seconds per run")
    parser.add_argument("--senders", type=int, default=8)
    parser.add_argument("--todos", type=int, default=600, help="todos drained over MCP per run")
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--app-todos", type=int, default=4000,
                        help="todos drained at the application layer per run (0: no such round)")
    parser.add_argument("--app-processes", default="2",
                        help="process counts the application-layer claims are split over, each against one"
                             " (comma-separated, e.g. 2,3: docs/adr/0035)")
    parser.add_argument("--pg-url", default=ADMIN_URL)
    args = parser.parse_args()
    dbs = Databases(args.pg_url)
    ingest: dict[int, list[float]] = {1: [], 2: []}
    mcp: dict[int, list[dict[str, Any]]] = {1: [], 2: []}
    splits = [int(n) for n in args.app_processes.split(",")]
    claims: dict[int, list[float]] = {n: [] for n in (1, *splits)}
    log(f"scaling bench: {args.rounds} rounds; machine: {os.cpu_count()} cores, load average {load()}")
    with tempfile.TemporaryDirectory(prefix="sb-scaling-bench-") as tmp:
        try:
            for r in range(args.rounds):
                order = (1, 2) if r % 2 == 0 else (2, 1)
                for n in order:
                    ingest[n].append(ingest_round(n, dbs, tmp, f"{r}_{n}", args))
                    log(f"[{r + 1}] ingest, {n} process(es): {ingest[n][-1]:8.1f} deliveries/s  (load {load()})")
                for n in ((1, *splits) if r % 2 == 0 else (*splits, 1)) if args.app_todos else ():
                    claims[n].append(app_round(n, dbs, tmp, f"{r}_{n}", args))
                    log(f"[{r + 1}] claims, {n} process(es): {claims[n][-1]:8.1f} todos/s at the application layer"
                        f"  (load {load()})")
                for n in order:
                    m = mcp_round(n, dbs, tmp, f"{r}_{n}", args)
                    mcp[n].append(m)
                    log(f"[{r + 1}] mcp,    {n} process(es): {m['rate']:8.1f} todos/s, per session {m['per_session']},"
                        f" server cpu {m['cpu_per_call'] * 1000:.2f} ms/call  (load {load()})")
        finally:
            dbs.drop_all()
    ingest_ratio = statistics.median(b / a for a, b in zip(ingest[1], ingest[2]))
    mcp_ratio = statistics.median(b["rate"] / a["rate"] for a, b in zip(mcp[1], mcp[2]))
    log("\n================ SUMMARY ================")
    log(f"machine: {os.cpu_count()} cores, shared by the servers, PostgreSQL and the clients")
    log(f"ingest: 1 process {statistics.median(ingest[1]):.1f}/s, 2 processes {statistics.median(ingest[2]):.1f}/s"
        f" (medians); ratio two/one = {ingest_ratio:.3f} (median of the rounds' ratios)")
    log(f"mcp:    1 process {statistics.median(m['rate'] for m in mcp[1]):.1f} todos/s, 2 processes"
        f" {statistics.median(m['rate'] for m in mcp[2]):.1f} todos/s; ratio two/one = {mcp_ratio:.3f}")
    for n in splits if args.app_todos else ():
        claims_ratio = statistics.median(b / a for a, b in zip(claims[1], claims[n]))
        log(f"claims: 1 process {statistics.median(claims[1]):.1f} todos/s, {n} processes"
            f" {statistics.median(claims[n]):.1f} todos/s (application layer, the {args.sessions} claimers split);"
            f" ratio {n}/one = {claims_ratio:.3f}")
    log(f"load average at the end {load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
