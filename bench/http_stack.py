"""`switchboard serve` on two HTTP stacks in one run: uvicorn's h11 parser on asyncio's loop against
httptools on uvloop (what `uvicorn[standard]` adds), for ingest and for MCP.

Run:  .venv/bin/python bench/http_stack.py [--rounds 3] [--seconds 6] [--senders 8] [--todos 600]
                                           [--sessions 8] [--pg-url URL]

Each round and stack: a fresh PostgreSQL database and data dir, `switchboard serve` started with
that stack (HTTP_STACK of interfaces/http/server.py replaced for that process only), then
(1) ingest: the signed GitHub delivery from `--senders` keep-alive threads, deliveries/s over
`--seconds` after a warm-up, as bench/ingest.py drives it; (2) MCP: `--todos` todos drained by
`--sessions` sessions of the official client, as bench/mcp_drain.py does, todos/s and the
server's CPU per tool call. The two stacks alternate (their order swaps each round); the
ratios httptools+uvloop / h11+asyncio per round and their medians are printed with the load
average. Needs httptools and uvloop installed (the dev extras).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.claim_complete import Databases, log  # noqa: E402
from bench.ingest import BENCH_SECRET_KEY, FIXTURE, Server, clean_env, drive, free_port, setup_switchboard  # noqa: E402
from bench.mcp_drain import load, mcp_drain, push_round, setup_server_db  # noqa: E402
from tests.fixtures import fixture  # noqa: E402

ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/test"
STACKS = {"h11+asyncio": ("h11", "asyncio"), "httptools+uvloop": ("httptools", "uvloop")}
SERVE_ON = (
    "import sys; import interfaces.http.server as s; s.HTTP_STACK.update(http=sys.argv[1], loop=sys.argv[2]);"
    " from interfaces.cli.main import main; sys.exit(main(sys.argv[3:]))"
)


def serve_on(stack: str, label: str, database_url: str, data_dir: str) -> Server:
    http, loop = STACKS[stack]
    port = free_port()
    env = clean_env(SWITCHBOARD_DATABASE_URL=database_url, SWITCHBOARD_DATA_DIR=data_dir, SWITCHBOARD_INGEST_RATE="0",
                    SWITCHBOARD_SECRET_KEY=BENCH_SECRET_KEY, PYTHONPATH=str(ROOT))
    return Server(label, [sys.executable, "-c", SERVE_ON, http, loop, "serve", "--port", str(port)], env, data_dir,
                  port)


def ingest_round(stack: str, dbs: Databases, tmp: str, tag: str, args: argparse.Namespace) -> float:
    url = dbs.create(f"ingest_{tag}")
    data_dir = os.path.join(tmp, f"ingest-{tag}")
    os.makedirs(data_dir)
    token, secret = setup_switchboard(url, data_dir, with_rule=False)
    server = serve_on(stack, f"ingest-{tag}", url, data_dir).start()
    try:
        result = drive(stack, server, token, secret, fixture(FIXTURE), senders=args.senders, warmup=1.0,
                       seconds=args.seconds)
    finally:
        server.stop()
        dbs.drop(url)
    if result.failures:
        log(f"    ! {result.failures[:3]}")
    return result.rate


def mcp_round(stack: str, dbs: Databases, tmp: str, tag: str, args: argparse.Namespace) -> dict[str, Any]:
    url = dbs.create(f"mcp_{tag}")
    data_dir = os.path.join(tmp, f"mcp-{tag}")
    os.makedirs(data_dir)
    setup = setup_server_db(url, data_dir)
    server = serve_on(stack, f"mcp-{tag}", url, data_dir).start()
    try:
        push_round(url, data_dir, setup["drain"]["slug"], args.todos, start_at=1)
        return mcp_drain(server, setup["drain"], args.sessions)
    finally:
        server.stop()
        dbs.drop(url)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=6.0, help="measured ingest seconds per round and stack")
    parser.add_argument("--senders", type=int, default=8)
    parser.add_argument("--todos", type=int, default=600, help="todos drained over MCP per round and stack")
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--pg-url", default=ADMIN_URL)
    args = parser.parse_args()
    dbs = Databases(args.pg_url)
    ingest: dict[str, list[float]] = {s: [] for s in STACKS}
    mcp: dict[str, list[dict[str, Any]]] = {s: [] for s in STACKS}
    log(f"http stack bench: {args.rounds} rounds; {os.cpu_count()} cores, load average {load()}")
    with tempfile.TemporaryDirectory(prefix="sb-stack-bench-") as tmp:
        try:
            for r in range(args.rounds):
                order = list(STACKS) if r % 2 == 0 else list(STACKS)[::-1]
                for stack in order:
                    ingest[stack].append(ingest_round(stack, dbs, tmp, f"{r}_{stack[:4]}", args))
                    log(f"[{r + 1}] ingest {stack:17s} {ingest[stack][-1]:8.1f} deliveries/s  (load {load()})")
                for stack in order:
                    m = mcp_round(stack, dbs, tmp, f"{r}_{stack[:4]}", args)
                    mcp[stack].append(m)
                    log(f"[{r + 1}] mcp    {stack:17s} {m['rate']:8.1f} todos/s  server cpu"
                        f" {m['cpu_per_call'] * 1000:.2f} ms/call  (load {load()})")
        finally:
            dbs.drop_all()
    old, new = STACKS
    ingest_ratio = statistics.median(n / o for n, o in zip(ingest[new], ingest[old]))
    mcp_ratio = statistics.median(n["rate"] / o["rate"] for n, o in zip(mcp[new], mcp[old]))
    cpu_ratio = statistics.median(n["cpu_per_call"] / o["cpu_per_call"] for n, o in zip(mcp[new], mcp[old]))
    log("\n================ SUMMARY ================")
    log(f"ingest: {new} {statistics.median(ingest[new]):.1f}/s, {old} {statistics.median(ingest[old]):.1f}/s"
        f" (medians); ratio {new}/{old} = {ingest_ratio:.3f} (median of the rounds' ratios)")
    log(f"mcp:    {new} {statistics.median(m['rate'] for m in mcp[new]):.1f} todos/s, {old}"
        f" {statistics.median(m['rate'] for m in mcp[old]):.1f} todos/s; ratio {new}/{old} = {mcp_ratio:.3f};"
        f" server cpu per call ratio {cpu_ratio:.3f}")
    log(f"load average at the end {load()}; {os.cpu_count()} cores")
    return 0


if __name__ == "__main__":
    sys.exit(main())
