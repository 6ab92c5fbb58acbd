"""MCP drain throughput and doorbell latency against a real `switchboard serve` on PostgreSQL.

Run:  .venv/bin/python bench/mcp_drain.py [--todos 2000] [--sessions 8] [--rate 50] [--seconds 10]
                                          [--pg-url URL] [--quick]

Every PostgreSQL database used here is created fresh on the admin URL (`bench_<run id>_...`)
and dropped at the end, even on failure; the server started here is stopped in `finally`.
Phases, all in one run:

1. MCP drain: a fresh database and data dir; one endpoint (queue "work") and, on a second
   endpoint, one GitHub webhook, created in-process; N todos pushed in-process
   (`app.push(..., caller=Caller.cli())`, from 8 threads, untimed). Then `switchboard serve`
   as a subprocess on a free port. S sessions of the official `mcp` client (default mode:
   Streamable HTTP, handshake era, GET stream open, bearer credential) connect in one event
   loop of this process; once all are initialized, each loops `claim_next` + `complete`
   until `{"empty": true}`: todos/s from the release to the last session done.
2. Application layer: the same workload on a fresh database in-process (as
   bench/claim_complete.py): S threads calling `app.claim_next(caller=app.endpoint_caller(slug))`
   + `app.complete(...)`: todos/s; the ratio MCP/app is the protocol's overhead.
3. Doorbell latency (same server as 1, the doorbell endpoint): one MCP session with its GET
   stream open and a client extension bound to `notifications/claude/channel`; signed GitHub
   deliveries (unique X-GitHub-Delivery, each mints a todo) POSTed at R/s for T seconds from a
   keep-alive `http.client` thread. Latency per todo = ring arrival at the client (matched by
   meta.todo_id) minus the instant just before its POST; p50/p99/max, and how many rang
   (each exactly once expected). Nothing is claimed in this phase.

Figures are for THIS machine: the clients, the server and PostgreSQL share its cores.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import sys
import tempfile
import time
import uuid
from collections import Counter
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio
import httpx2
from mcp.client import Client, ClientExtension, NotificationBinding
from mcp.client.streamable_http import streamable_http_client
from pydantic import BaseModel

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from application.service import Caller  # noqa: E402
from bench.claim_complete import (  # noqa: E402
    Databases, drain, log, make_container, pg_settings, push_todos, setup_endpoint,
)
from bench.ingest import BENCH_SECRET_KEY, Server, cpu_delta, percentile, postgres_cpu, switchboard_server  # noqa: E402
from interfaces.bootstrap import build  # noqa: E402
from interfaces.settings import Settings  # noqa: E402
from tests.fixtures import fixture, sign  # noqa: E402

ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/test"
CHANNEL = "notifications/claude/channel"
FIXTURE = "github_issues_opened.json"
PUSH_THREADS = 8


# -- MCP client pieces -------------------------------------------------------------------


class ChannelParams(BaseModel):
    content: str
    meta: dict[str, str] = {}


class ChannelListener(ClientExtension):
    """Binds the doorbell's notification (the SDK drops unknown methods otherwise); stamps arrivals."""

    identifier = "dev.switchboard/bench-channel"

    def __init__(self) -> None:
        self.arrivals: list[tuple[str, float]] = []  # (todo id, perf_counter at arrival)

    def notifications(self) -> list[NotificationBinding[Any]]:
        async def handle(params: ChannelParams) -> None:
            self.arrivals.append((params.meta.get("todo_id", ""), time.perf_counter()))

        return [NotificationBinding(method=CHANNEL, params_type=ChannelParams, handler=handle)]


async def open_session(stack: AsyncExitStack, url: str, credential: str, listener: ChannelListener) -> Client:
    """The official client in its default (auto) mode, with the bearer credential, as the vended mcp_json says."""
    http = await stack.enter_async_context(httpx2.AsyncClient(
        headers={"Authorization": f"Bearer {credential}"}, timeout=httpx2.Timeout(30, read=300)))
    return await stack.enter_async_context(
        Client(streamable_http_client(url, http_client=http), extensions=[listener]))


async def call(client: Client, verb: str, **arguments: Any) -> dict[str, Any]:
    result = await client.call_tool(verb, arguments)
    if result.is_error:
        text = result.content[0].text if result.content else ""
        raise RuntimeError(f"{verb}: {text}")
    return result.structured_content


# -- setup -------------------------------------------------------------------------------


def setup_server_db(database_url: str, data_dir: str, todos: int) -> dict[str, Any]:
    """Admin; the drain endpoint with `todos` pending todos; the doorbell endpoint and its GitHub webhook."""
    container = build(Settings(database_url=database_url, data_dir=data_dir, secret_key=BENCH_SECRET_KEY))
    try:
        cli = Caller.cli()
        app = container.app
        app.ensure_admin()
        drain_ep = app.vend("mcp-drain", queues=["work"], caller=cli)
        bell_ep = app.vend("mcp-doorbell", queues=["inbox"], caller=cli)
        hook = container.webhooks.create(caller=cli, endpoint=bell_ep["slug"], source_type="github",
                                         target_queue="inbox")
        push_seconds = push_todos(container, drain_ep["slug"], todos, PUSH_THREADS)
        return {"drain": drain_ep, "bell": bell_ep, "token": hook["ingest_url"].rsplit("/", 1)[1],
                "secret": hook["signing_secret"], "push_rate": todos / push_seconds}
    finally:
        container.close()


# -- phase 1: MCP drain ------------------------------------------------------------------


def mcp_drain(server: Server, endpoint: dict[str, Any], sessions: int) -> dict[str, Any]:
    url = f"http://127.0.0.1:{server.port}/mcp/{endpoint['slug']}"
    listeners = [ChannelListener() for _ in range(sessions)]
    done = [0] * sessions
    calls = [0] * sessions
    out: dict[str, Any] = {}

    async def scenario() -> None:
        async with AsyncExitStack() as stack:
            started = time.perf_counter()
            clients = []
            for i in range(sessions):
                clients.append(await open_session(stack, url, endpoint["credential"], listeners[i]))
            out["connect"] = time.perf_counter() - started
            go = anyio.Event()

            async def worker(i: int) -> None:
                client = clients[i]
                await go.wait()
                while True:
                    claimed = await call(client, "claim_next")
                    calls[i] += 1
                    if claimed.get("empty"):
                        return
                    await call(client, "complete", id=claimed["todo"]["id"])
                    calls[i] += 1
                    done[i] += 1

            async with anyio.create_task_group() as tasks:
                for i in range(sessions):
                    tasks.start_soon(worker, i)
                await anyio.sleep(0.3)  # every session initialized; let the GET streams settle
                cpu0, client0, pg0 = server.cpu_seconds(), time.process_time(), postgres_cpu()
                out["t0"] = time.perf_counter()
                go.set()
            out["seconds"] = time.perf_counter() - out["t0"]
            out["server_cpu"] = (server.cpu_seconds() - cpu0) / out["seconds"]
            out["client_cpu"] = (time.process_time() - client0) / out["seconds"]
            out["pg_cpu"] = cpu_delta(pg0, postgres_cpu()) / out["seconds"]

    anyio.run(scenario)
    total = sum(done)
    out.update(done=total, per_session=done, calls=sum(calls),
               rate=total / out["seconds"] if out["seconds"] else 0.0,
               rings=sum(len(listener.arrivals) for listener in listeners))
    return out


# -- phase 2: application layer ----------------------------------------------------------


def app_drain(url: str, data_dir: str, todos: int, workers: int) -> dict[str, Any]:
    container = make_container(url, data_dir)
    try:
        slug = setup_endpoint(container)
        push_todos(container, slug, todos, PUSH_THREADS)
        client0, pg0 = time.process_time(), postgres_cpu()
        seconds, done, errors = drain(container, slug, workers)
        return {"rate": done / seconds if seconds else 0.0, "seconds": seconds, "done": done, "errors": errors,
                "cpu": (time.process_time() - client0) / seconds, "pg_cpu": cpu_delta(pg0, postgres_cpu()) / seconds}
    finally:
        container.close()


# -- phase 3: doorbell latency -----------------------------------------------------------


def doorbell(server: Server, endpoint: dict[str, Any], token: str, secret: str, rate: float,
             seconds: float) -> dict[str, Any]:
    url = f"http://127.0.0.1:{server.port}/mcp/{endpoint['slug']}"
    body = fixture(FIXTURE)
    headers = {"Content-Type": "application/json", "User-Agent": "GitHub-Hookshot/bench", "X-GitHub-Event": "issues",
               "X-GitHub-Hook-ID": "424242", "Connection": "keep-alive", **sign("github", secret, body)}
    path = f"/webhooks/w/{token}"
    listener = ChannelListener()
    sent: dict[str, float] = {}  # todo id -> perf_counter just before its POST
    post_latency: list[float] = []
    statuses: Counter = Counter()
    failures: list[str] = []
    lag = [0.0]

    def post_one(conn: http.client.HTTPConnection) -> tuple[str | None, float, http.client.HTTPConnection]:
        h = dict(headers)
        h["X-GitHub-Delivery"] = str(uuid.uuid4())
        started = time.perf_counter()
        try:
            conn.request("POST", path, body=body, headers=h)
            response = conn.getresponse()
            answer = response.read()
        except (OSError, http.client.HTTPException) as error:
            failures.append(f"{type(error).__name__}: {error}")
            conn.close()
            return None, started, http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        post_latency.append(time.perf_counter() - started)
        statuses[response.status] += 1
        if response.status != 202:
            failures.append(f"HTTP {response.status}: {answer[:200]!r}")
            return None, started, conn
        doc = json.loads(answer)
        if doc.get("created") != 1:
            failures.append(f"202 without a new todo: {answer[:200]!r}")
        return doc.get("id"), started, conn

    def sender() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        try:
            n = int(round(rate * seconds))
            t0 = time.perf_counter()
            for i in range(n):
                due = t0 + i / rate
                wait = due - time.perf_counter()
                if wait > 0:
                    time.sleep(wait)
                else:
                    lag[0] = max(lag[0], -wait)
                todo_id, started, conn = post_one(conn)
                if todo_id:
                    sent[todo_id] = started
        finally:
            conn.close()

    out: dict[str, Any] = {}

    async def scenario() -> None:
        async with AsyncExitStack() as stack:
            await open_session(stack, url, endpoint["credential"], listener)
            # warm-up: one delivery whose ring proves the GET stream is open and registered (not measured)
            with anyio.fail_after(10):
                while True:
                    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
                    warm_id, _, conn = await anyio.to_thread.run_sync(post_one, conn)
                    conn.close()
                    with anyio.move_on_after(1.0):
                        while not any(t == warm_id for t, _ in listener.arrivals):
                            await anyio.sleep(0.01)
                    if any(t == warm_id for t, _ in listener.arrivals):
                        break
            listener.arrivals.clear()
            statuses.clear()
            post_latency.clear()
            cpu0, pg0 = server.cpu_seconds(), postgres_cpu()
            started = time.perf_counter()
            await anyio.to_thread.run_sync(sender)
            out["send_seconds"] = time.perf_counter() - started
            # wait for the stragglers (up to 3 s), then 1 s more to see any duplicate ring
            with anyio.move_on_after(3.0):
                while len({t for t, _ in listener.arrivals} & sent.keys()) < len(sent):
                    await anyio.sleep(0.02)
            await anyio.sleep(1.0)
            out["server_cpu"] = (server.cpu_seconds() - cpu0) / out["send_seconds"]
            out["pg_cpu"] = cpu_delta(pg0, postgres_cpu()) / out["send_seconds"]

    anyio.run(scenario)
    arrivals = list(listener.arrivals)
    per_todo = Counter(t for t, _ in arrivals)
    first: dict[str, float] = {}
    for todo_id, at in arrivals:
        first.setdefault(todo_id, at)
    latencies = sorted(first[t] - sent[t] for t in sent if t in first)
    post_latency.sort()
    out.update(
        posted=len(sent), statuses=statuses, failures=failures, rang=len(latencies),
        once=sum(1 for t in sent if per_todo[t] == 1), more=sum(1 for t in sent if per_todo[t] > 1),
        never=sum(1 for t in sent if per_todo[t] == 0), foreign=sum(1 for t in per_todo if t not in sent),
        rings=len(arrivals),
        p50=percentile(latencies, 0.50), p99=percentile(latencies, 0.99),
        max=latencies[-1] if latencies else 0.0, min=latencies[0] if latencies else 0.0,
        post_p50=percentile(post_latency, 0.50), post_p99=percentile(post_latency, 0.99), lag=lag[0],
    )
    return out


# -- main --------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--todos", type=int, default=2000, help="todos to drain in each drain phase (default 2000)")
    parser.add_argument("--sessions", type=int, default=8, help="MCP sessions / app worker threads (default 8)")
    parser.add_argument("--rate", type=float, default=50.0, help="doorbell deliveries per second (default 50)")
    parser.add_argument("--seconds", type=float, default=10.0, help="doorbell sending seconds (default 10)")
    parser.add_argument("--pg-url", default=ADMIN_URL, help=f"admin URL used to create databases (default {ADMIN_URL})")
    parser.add_argument("--quick", action="store_true", help="well under a minute: 600 todos, 4 s of deliveries")
    args = parser.parse_args()
    if args.quick:
        args.todos, args.seconds = min(args.todos, 600), min(args.seconds, 4.0)

    dbs = Databases(args.pg_url)
    tmp = tempfile.TemporaryDirectory(prefix="sb-mcp-bench-")
    server: Server | None = None
    total_started = time.perf_counter()
    log(f"mcp drain bench: {args.todos} todos, {args.sessions} sessions/threads; doorbell {args.rate:g}/s for"
        f" {args.seconds:g}s; run id {dbs.run_id}")
    pg = pg_settings(args.pg_url)
    log("postgres: " + ", ".join(f"{k}={v}" for k, v in sorted(pg.items())))
    log("machine: %d cores, load average %.2f %.2f %.2f (clients, server and PostgreSQL share them)"
        % (os.cpu_count() or 0, *os.getloadavg()))
    mcp: dict[str, Any] = {}
    app: dict[str, Any] = {}
    bell: dict[str, Any] = {}
    try:
        # 1. MCP drain
        url = dbs.create("mcp")
        data_dir = os.path.join(tmp.name, "serve")
        os.makedirs(data_dir)
        setup = setup_server_db(url, data_dir, args.todos)
        log(f"setup: {args.todos} todos pushed in-process ({setup['push_rate']:.0f}/s, untimed)")
        server = switchboard_server("switchboard-mcp", url, data_dir)
        server.start()
        mcp = mcp_drain(server, setup["drain"], args.sessions)
        log(f"[1] mcp drain:   {mcp['rate']:8.1f} todos/s  ({mcp['done']} in {mcp['seconds']:.2f}s; {mcp['calls']} tool"
            f" calls; per session {mcp['per_session']}; {args.sessions} sessions connected in {mcp['connect']:.2f}s;"
            f" rings received by the drainers {mcp['rings']})")
        log(f"    cpu (share of one core): server {mcp['server_cpu']:.0%}, postgres {mcp['pg_cpu']:.0%},"
            f" mcp clients (this process) {mcp['client_cpu']:.0%}")

        # 3. doorbell, same server (nothing claimed; the drained endpoint has no sessions left)
        bell = doorbell(server, setup["bell"], setup["token"], setup["secret"], args.rate, args.seconds)
        log(f"[3] doorbell:    p50 {bell['p50'] * 1000:.1f} ms  p99 {bell['p99'] * 1000:.1f} ms"
            f"  max {bell['max'] * 1000:.1f} ms  min {bell['min'] * 1000:.1f} ms; {bell['rang']}/{bell['posted']}"
            f" todos rang (once {bell['once']}, more than once {bell['more']}, never {bell['never']};"
            f" rings {bell['rings']}, foreign {bell['foreign']})")
        log(f"    POST->202 p50 {bell['post_p50'] * 1000:.1f} ms p99 {bell['post_p99'] * 1000:.1f} ms; statuses"
            f" {dict(bell['statuses'])}; sent over {bell['send_seconds']:.2f}s (worst pacing lag"
            f" {bell['lag'] * 1000:.1f} ms); cpu: server {bell['server_cpu']:.0%}, postgres {bell['pg_cpu']:.0%}")
        for failure in bell["failures"][:5]:
            log(f"    ! {failure}")
        server.stop()
        server = None
        dbs.drop(url)

        # 2. application layer, fresh database
        url = dbs.create("app")
        app = app_drain(url, os.path.join(tmp.name), args.todos, args.sessions)
        dbs.drop(url)
        log(f"[2] app drain:   {app['rate']:8.1f} todos/s  ({app['done']} in {app['seconds']:.2f}s;"
            f" errors {len(app['errors'])}; cpu: this process {app['cpu']:.0%}, postgres {app['pg_cpu']:.0%})")
        for error in app["errors"][:3]:
            log(f"    error: {error!r}")
    finally:
        if server is not None:
            try:
                server.stop()
            except Exception as error:  # noqa: BLE001 - still drop the databases
                print(f"  ! could not stop {server.label}: {error}", file=sys.stderr)
        dbs.drop_all()
        tmp.cleanup()

    log("\n================ SUMMARY ================")
    log(f"workload: {args.todos} todos, {args.sessions} sessions/threads, claim_next + complete until empty;"
        f" PostgreSQL {pg.get('server_version', '?')}")
    if mcp and app:
        ratio = mcp["rate"] / app["rate"] if app["rate"] else 0.0
        log(f"mcp (streamable http, {args.sessions} sessions): {mcp['rate']:8.1f} todos/s ({mcp['done']} completed)")
        log(f"app layer (in-process, {args.sessions} threads): {app['rate']:8.1f} todos/s ({app['done']} completed)")
        log(f"ratio mcp/app = {ratio:.3f}  (protocol overhead: {(1 - ratio) * 100:.0f}% of the app-layer rate;"
            f" {1000 * (1 / mcp['rate'] - 1 / app['rate']) if mcp['rate'] and app['rate'] else 0:.2f} ms more per todo"
            f" across the pool)")
    if bell:
        verdict = "MEETS" if bell["p99"] < 0.050 else "MISSES"
        log(f"doorbell: {bell['posted']} deliveries at {args.rate:g}/s; rang {bell['rang']}/{bell['posted']}"
            f" (exactly once {bell['once']}, duplicates {bell['more']}, never {bell['never']});"
            f" latency p50 {bell['p50'] * 1000:.1f} ms, p99 {bell['p99'] * 1000:.1f} ms, max {bell['max'] * 1000:.1f} ms"
            f" (target p99 < 50 ms: {verdict})")
    log(f"total wall time: {time.perf_counter() - total_started:.0f}s; load average at the end %.2f %.2f %.2f"
        % os.getloadavg())
    return 0


if __name__ == "__main__":
    sys.exit(main())
